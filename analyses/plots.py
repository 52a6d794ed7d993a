"""Figures for the analyses (matplotlib; call `matplotlib.use("Agg")` for files). Each returns its `Figure`, laid
out with matplotlib's constrained layout so that nothing is cut off; `analyses.figure_checks` tests them.

- `plot_attention_patterns`: every head's pattern on `[BOS] + R + R`, one row per layer, one column per head;
- `plot_token_patterns`: given patterns on a text, with the tokens on the axes when they fit;
- `plot_score_heatmap`, `plot_score_panels`: `[n_layers, n_heads]` score tables (induction, previous-token, …);
- `plot_eigenvalues`: each head's full-OV-circuit eigenvalues in the complex plane (copying = right half);
- `plot_composition`: Q/K/V composition scores minus the random baseline;
- `plot_positivity`: the Framework's (QK positivity, OV positivity) scatter of layer ≥ 1 heads;
- `plot_position_loss`: mean loss by token position (in-context learning: loss falls along the context);
- `plot_ablation`: loss increase per head under pattern-preserving ablation, with standard errors.
"""

from __future__ import annotations

import math
import textwrap

import torch

from circuits.eigen import eigenvalues
from circuits.factored import full_ov_circuit
from models.arch.model import head_label

from .labels import figure_text
from .sequences import repeated_tokens
from .util import weight_view

#: Colours of `plot_eigenvalues` by the head's OV copying score: copying (≥ 0.5), weakly positive, negative.
EIGEN_COLOURS = (("tab:blue", "copying score ≥ 0.5 (OV-positive)"), ("tab:olive", "0 ≤ copying score < 0.5"),
                 ("tab:red", "copying score < 0"))


def _plt():
    import matplotlib.pyplot as plt

    return plt


#: Width of a character as a fraction of the font size (DejaVu Sans averages about 0.55 em; wide glyphs and
#: capitals reach 0.7): fixed margins are sized from the longest label with this.
EM_PER_CHAR = 0.65


def text_inches(text: str, points: float) -> float:
    """An upper estimate of the width in inches of one line of `text` at `points`."""
    return len(text) * EM_PER_CHAR * points / 72


def tick_label_inches(axis, points: float = 10) -> float:
    """An upper estimate of the width in inches of `axis`'s widest major tick label at `points`, from the labels its
    formatter gives for the ticks in view (no text is drawn or measured)."""
    lo, hi = sorted(axis.get_view_interval())
    ticks = [t for t in axis.get_majorticklocs() if lo <= t <= hi]
    labels = axis.get_major_formatter().format_ticks(ticks) if ticks else []
    return max((text_inches(x, points) for x in labels), default=0.0)


def fixed_layout(fig, left: float, right: float, bottom: float, top: float, wspace: float = 0.0,
                 hspace: float = 0.0) -> None:
    """Lay the figure's subplot grid out with fixed margins and gaps between panels, all in inches (one
    `subplots_adjust`), sized by the caller from its labels. Used instead of the constrained-layout solver, which
    measures every text twice before the figure is drawn and costs about as much again as drawing it
    (benchmarks/README.md, "circuits report"); `analyses.figure_checks` tests that nothing is cut off or overlaps."""
    W, H = fig.get_size_inches()
    nr, nc = fig.axes[0].get_subplotspec().get_gridspec().get_geometry()
    aw = (W - left - right - wspace * (nc - 1)) / nc
    ah = (H - top - bottom - hspace * (nr - 1)) / nr
    fig.subplots_adjust(left=left / W, right=1 - right / W, bottom=bottom / H, top=1 - top / H,
                        wspace=wspace / aw, hspace=hspace / ah)


def side_colorbar(fig, im, label: str, pad: float = 0.2, width: float = 0.15, shrink: float = 0.8):
    """A colour bar `width` inches wide, `pad` inches right of the subplot grid (`fixed_layout` leaves the room),
    over `shrink` of the grid's height, labelled `label`."""
    W, _ = fig.get_size_inches()
    sp = fig.subplotpars
    h = (sp.top - sp.bottom) * shrink
    cax = fig.add_axes((sp.right + pad / W, sp.bottom + (sp.top - sp.bottom - h) / 2, width / W, h))
    return fig.colorbar(im, cax=cax, label=label)


#: Room in inches right of the grid for `side_colorbar` with 10 pt tick labels ("0.25") and its 10 pt label.
COLORBAR_ROOM = 1.15


_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def log_axis_labels(axis) -> None:
    """Label a log-scaled `axis` (`ax.xaxis`) at its powers of ten as 10¹, 10², … in plain text (minor ticks
    unlabelled), as matplotlib's default labels read, without mathtext: its parser costs 0.2–0.4 s of CPU to build
    in each process that draws one. Call after `set_xscale("log")`, which resets the formatters."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    def label(v, _pos) -> str:
        e = round(math.log10(v)) if v > 0 else None
        return f"10{str(e).translate(_SUPERSCRIPT)}" if e is not None and math.isclose(v, 10.0**e) else ""

    axis.set_major_formatter(FuncFormatter(label))
    axis.set_minor_formatter(NullFormatter())


def _layer_head_grid(L: int, H: int, size: float, extra_w: float = 0.0, extra_h: float = 0.6,
                     layout: str | None = "constrained", **kw):
    """A figure with one row per layer and one column per head, `size` inches a panel (at most 16 in of panels in a
    row) plus `extra_w` / `extra_h` inches: (fig, axes [L, H]), laid out by `layout` (None: the caller does, e.g.
    with `fixed_layout`)."""
    size = min(size, 16.0 / max(H, 1))
    return _plt().subplots(L, H, figsize=(size * H + extra_w, size * L + extra_h), squeeze=False, layout=layout, **kw)


@torch.no_grad()
def plot_attention_patterns(model, seq_len: int = 50, seed: int = 0, tokens=None, tokens_from=None):
    """Each head's attention pattern (query rows, key columns) on one `[BOS] + R + R` sequence, |R| = `seq_len`
    (50 as the induction score; shrunk to fit n_ctx), R drawn as the induction score draws it (`tokens_from`), or
    on `tokens`. One row per layer, one column per head, one colour bar (attention weight, 0–1). Previous-token
    heads show the sub-diagonal, induction heads a stripe `seq_len − 1` below the diagonal in the second copy
    (dotted lines: where it starts), heads resting on BOS the first column."""
    from matplotlib.ticker import MaxNLocator

    from .scores import attention_patterns

    if tokens is None:
        seq_len = min(seq_len, (model.cfg.n_ctx - 1) // 2)
        t = repeated_tokens(model, seq_len, 2, 1, seed, tokens_from)
    else:
        t, seq_len = torch.as_tensor(tokens).reshape(1, -1), None
    pat = attention_patterns(model, t)[:, 0]  # [layer, head, q, k]
    L, H = pat.shape[:2]
    what = f"[BOS] + R + R, |R| = {seq_len} (second copy from position {seq_len + 1})" if seq_len else "the tokens"
    fig, axes = _layer_head_grid(L, H, 2.3, extra_w=0.6 + 0.15 * (H - 1) + COLORBAR_ROOM, extra_h=0.95 + 0.3 * (L - 1),
                                 layout=None, sharex=True, sharey=True)
    width = fig.get_size_inches()[0]
    title = textwrap.fill(f"Attention patterns on {what}", max(30, int(width * 11)))
    fixed_layout(fig, left=0.6, right=COLORBAR_ROOM, bottom=0.45, top=0.3 + 0.2 * (title.count("\n") + 1),
                 wspace=0.15, hspace=0.3)
    for l in range(L):
        for h in range(H):
            ax = axes[l, h]
            im = ax.imshow(pat[l, h].numpy(), cmap="viridis", vmin=0, vmax=1, interpolation="nearest")
            ax.set_title(head_label(l, h), fontsize=9)
            if seq_len is not None:
                for f in (ax.axhline, ax.axvline):
                    f(seq_len + 0.5, color="w", ls=":", lw=0.7, alpha=0.7)
            ax.xaxis.set_major_locator(MaxNLocator(4, integer=True))
            ax.yaxis.set_major_locator(MaxNLocator(4, integer=True))
            ax.tick_params(labelsize=7)
        axes[l, 0].set_ylabel(f"layer {l}\nquery position", fontsize=8)
    for ax in axes[-1]:
        ax.set_xlabel("key position", fontsize=8)
    side_colorbar(fig, im, "attention weight")
    fig.suptitle(title, fontsize=10, y=1 - 0.08 / fig.get_size_inches()[1], va="top")
    return fig


def plot_token_patterns(pattern, labels: list[str], titles: list[str]):
    """One heatmap per head (`pattern`: a list of `[query, key]` arrays, rows query tokens, columns key tokens), four
    per row, one colour bar (`circuits attention` draws it, and `analyses.interactive.attention_view`'s static
    twin). Token labels (7 pt or more) on the outer panels only, when they fit: up to 48 tokens for one head, 24 for
    a grid; position numbers otherwise."""
    from matplotlib.ticker import MaxNLocator

    plt = _plt()
    n = len(titles)
    cols = min(n, 4)
    rows = math.ceil(n / cols)
    P = len(labels)
    named = P <= (48 if n == 1 else 24)
    size = max(3.0, min(8.0, 0.15 * P + 1.2)) if named else 2.8
    fig, axes = plt.subplots(rows, cols, figsize=(size * cols + 1.2, size * rows + 0.6), squeeze=False,
                             sharex=True, sharey=True, layout="constrained")
    for ax in axes.flat[n:]:
        ax.axis("off")
    for i, (ax, pat, title) in enumerate(zip(axes.flat, pattern, titles)):
        im = ax.imshow(pat, cmap="viridis", vmin=0, vmax=1)
        ax.set_title(title, fontsize=10)
        if named:
            shown = [figure_text(x) for x in labels]
            ax.set_xticks(range(P), shown, rotation=90, fontsize=8 if n == 1 else 7)
            ax.set_yticks(range(P), shown, fontsize=8 if n == 1 else 7)
        else:
            for axis in (ax.xaxis, ax.yaxis):
                axis.set_major_locator(MaxNLocator(5, integer=True))
        if i % cols == 0:
            ax.set_ylabel("query (destination)", fontsize=8)
        if i + cols >= n:
            ax.set_xlabel("key (source)", fontsize=8)
            ax.xaxis.set_tick_params(labelbottom=True)
    fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.8, label="attention weight")
    return fig


def _annotated_heatmap(ax, s: torch.Tensor, threshold: float | None, vmin=0.0, vmax=1.0, cmap="viridis",
                       fontsize: float = 7):
    """imshow of a `[layers, heads]` table with its values written in and cells ≥ `threshold` boxed."""
    plt = _plt()
    L, H = s.shape
    im = ax.imshow(s.numpy(), cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
    span = (vmax - vmin) if vmin is not None and vmax is not None else 1.0
    for l in range(L):
        for h in range(H):
            v = float(s[l, h])
            dark = vmin is not None and (v - vmin) / (span or 1) < 0.6
            ax.text(h, l, f"{v:.2f}", ha="center", va="center", fontsize=fontsize, color="w" if dark else "k")
            if threshold is not None and v >= threshold:
                ax.add_patch(plt.Rectangle((h - 0.5, l - 0.5), 1, 1, fill=False, ec="red", lw=1.5))
    ax.set_xticks(range(H))
    ax.set_yticks(range(L))
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    return im


def plot_score_heatmap(scores: torch.Tensor, title: str, threshold: float | None = None, cmap: str = "viridis",
                       vmin: float | None = 0.0, vmax: float | None = 1.0, label: str = "score"):
    """A `[n_layers, n_heads]` table as a heatmap with the values written in; cells ≥ `threshold` boxed; `label`
    names the colour bar's quantity (and unit)."""
    s = torch.as_tensor(scores, dtype=torch.float32)
    L, H = s.shape
    fig, ax = _plt().subplots(figsize=(max(4.0, 0.7 * H + 2.0), max(2.2, 0.6 * L + 1.4)), layout="constrained")
    im = _annotated_heatmap(ax, s, threshold, vmin, vmax, cmap, fontsize=8)
    ax.set_title(title + (f" (boxed: ≥ {threshold})" if threshold is not None else ""), fontsize=10)
    fig.colorbar(im, ax=ax, label=label)
    return fig


def plot_score_panels(panels: dict[str, torch.Tensor], threshold: float | None = 0.4):
    """Several `[n_layers, n_heads]` score tables side by side (one heatmap each, values written in, cells
    ≥ `threshold` boxed), on one shared 0–1 colour scale with its colour bar."""
    plt = _plt()
    n = len(panels)
    L, H = next(iter(panels.values())).shape
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    ylab = 0.45 + text_inches(str(L - 1), 10)  # "layer" and the layer numbers left of each panel
    fig, axes = plt.subplots(rows, cols, figsize=(max(3.0, 0.55 * H + 1.2) * cols + COLORBAR_ROOM,
                                                  max(2.2, 0.55 * L + 1.4) * rows), squeeze=False)
    fixed_layout(fig, left=ylab, right=COLORBAR_ROOM, bottom=0.55, top=0.3, wspace=ylab + 0.1, hspace=0.85)
    for ax in axes.flat[n:]:
        ax.axis("off")
    for ax, (title, s) in zip(axes.flat, panels.items()):
        im = _annotated_heatmap(ax, torch.as_tensor(s, dtype=torch.float32), threshold)
        ax.set_title(title, fontsize=10)
    side_colorbar(fig, im, "score" + (f" (boxed: ≥ {threshold})" if threshold is not None else ""), shrink=0.9)
    return fig


def _eigen_colour(score: float) -> str:
    return EIGEN_COLOURS[0 if score >= 0.5 else (1 if score >= 0 else 2)][0]


@torch.no_grad()
def plot_eigenvalues(model):
    """Eigenvalues of every head's full OV circuit `W_E W_OV W_U` in the complex plane, scaled by the head's
    largest |λ| (unit circle drawn), one row per layer. Copying heads have their eigenvalues on the positive real
    side; each title gives the copying score Σλ/Σ|λ|, and the colour says which side of 0.5 and 0 it lies on."""
    from matplotlib.lines import Line2D

    m = weight_view(model)
    L, H = m.cfg.n_layers, m.cfg.n_heads
    size = 2.1 if H <= 5 else 1.5  # 8 heads: about 12 in
    title = textwrap.fill("Full OV circuit eigenvalues λ / max|λ| in the complex plane (title: copying score "
                          "Σλ/Σ|λ|)", max(30, int(min(size, 16.0 / max(H, 1)) * H * 11)))
    top = 0.3 + 0.2 * (title.count("\n") + 1)
    ncol = 3 if H >= 3 else 1  # a narrow figure stacks the legend's three entries
    bottom = 0.45 + 0.2 * (3 // ncol - 1)
    fig, axes = _layer_head_grid(L, H, size, extra_w=0.2 + 0.1 * (H - 1), extra_h=top + bottom + 0.3 * (L - 1),
                                 layout=None)
    fixed_layout(fig, left=0.1, right=0.1, bottom=bottom, top=top, wspace=0.1, hspace=0.3)
    t = torch.linspace(0, 2 * math.pi, 200)
    for l in range(L):
        lam_all = eigenvalues(full_ov_circuit(m, l)).cpu()  # [head, d_head]
        for h in range(H):
            ax, lam = axes[l, h], lam_all[h]
            scale = float(lam.abs().max()) or 1.0
            z = lam / scale
            score = float(lam.sum().real / lam.abs().sum()) if float(lam.abs().sum()) else 0.0
            ax.plot(t.cos(), t.sin(), color="0.8", lw=0.8)
            ax.axhline(0, color="0.85", lw=0.6)
            ax.axvline(0, color="0.85", lw=0.6)
            ax.scatter(z.real.numpy(), z.imag.numpy(), s=9, c=_eigen_colour(score))
            ax.set_xlim(-1.1, 1.1)
            ax.set_ylim(-1.1, 1.1)
            ax.set_aspect("equal")
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_title(f"{head_label(l, h)}: {score:+.2f}", fontsize=9)
    handles = [Line2D([], [], ls="", marker="o", color=c, label=lab) for c, lab in EIGEN_COLOURS]
    fig.legend(handles=handles, loc="lower center", ncol=ncol, fontsize=8, frameon=False,
               borderaxespad=0.1)
    fig.suptitle(title, fontsize=10, y=1 - 0.08 / fig.get_size_inches()[1], va="top")
    return fig


def plot_composition(study):
    """Q-, K- and V-composition scores minus the random baseline: rows earlier heads, columns later heads
    (pairs with l1 ≥ l2 greyed out), values written in, one colour scale for the three panels whose limits
    sit 20 % beyond the largest |excess| (so the strongest pairs are told apart, not saturated).
    `study` is an `analyses.two_layer.CompositionStudy`."""
    plt = _plt()
    kinds = ("q", "k", "v")
    L, H = study.scores["k"].shape[:2]
    n = (L - 1) * H
    side = max(3.2, 0.5 * n + 1.4)
    labels = 0.35 + text_inches(head_label(L - 1, H - 1), 7)  # tick labels (7 pt) and the axis label (10 pt)
    fig, axes = plt.subplots(1, 3, figsize=(3 * side + 1.0, side + 0.4))
    # the colour bar's ticks read like "−0.075": 0.2 in more than COLORBAR_ROOM
    fixed_layout(fig, left=labels, right=COLORBAR_ROOM + 0.2, bottom=labels, top=0.35, wspace=labels + 0.1)
    ex = {k: study.excess(k) for k in kinds}
    vmax = 1.2 * (max(float(e.abs().max()) for e in ex.values()) or 1.0)
    l1 = torch.arange(L - 1).repeat_interleave(H)
    l2 = torch.arange(1, L).repeat_interleave(H)
    rows = [head_label(int(a), i % H) for i, a in enumerate(l1)]
    cols = [head_label(int(a), i % H) for i, a in enumerate(l2)]
    for ax, k in zip(axes, kinds):
        M = ex[k][: L - 1, :, 1:, :].reshape(n, n).clone()
        M[l1[:, None] >= l2[None, :]] = float("nan")
        im = ax.imshow(M.numpy(), cmap="RdBu_r", vmin=-vmax, vmax=vmax)
        if n <= 16:
            for i in range(n):
                for j in range(n):
                    v = float(M[i, j])
                    if not math.isnan(v):
                        ax.text(j, i, f"{v:+.3f}", ha="center", va="center", fontsize=7,
                                color="w" if abs(v) > 0.6 * vmax else "k")
        ax.set_yticks(range(n), rows, fontsize=7)
        ax.set_xticks(range(n), cols, fontsize=7, rotation=90)
        ax.set_ylabel("earlier head (writes)")
        ax.set_xlabel("later head (reads)")
        ax.set_title(f"{k.upper()}-composition − baseline {study.baselines[k]:.3f}", fontsize=10)
    side_colorbar(fig, im, "score − random baseline")
    return fig


def _cluster(points: dict, tol: float = 0.04, tol_y: float | None = None) -> list[tuple[float, float, list]]:
    """Points closer than `tol` across and `tol_y` (default `tol`) up (data units) merged into one labelled spot:
    [(x, y, [keys])]."""
    tol_y = tol if tol_y is None else tol_y
    groups: list[tuple[float, float, list]] = []
    for key, (x, y) in sorted(points.items()):
        for g in groups:
            if abs(g[0] - x) < tol and abs(g[1] - y) < tol_y:
                g[2].append(key)
                break
        else:
            groups.append((x, y, [key]))
    return groups


def plot_positivity(circuit):
    """(QK positivity, OV positivity) of each layer ≥ 1 head — Σλ/Σ|λ| of its K-composition circuit with its
    previous-token partner and of its full OV circuit (Framework, induction-head figure); induction heads red.
    Heads whose labels would overlap (within 0.25 across, 0.08 up: a label's size at 8 pt on these axes) share one
    label, placed inside the axes."""
    from matplotlib.lines import Line2D

    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.2, 5.2))
    fixed_layout(fig, left=0.85, right=0.15, bottom=0.55, top=0.35)
    induction = set(circuit.induction.heads)
    for (l, h), (qk, ov) in circuit.positivity.items():
        ax.scatter([qk], [ov], c="tab:red" if (l, h) in induction else "tab:gray", s=40, zorder=3)
    for x, y, keys in _cluster(circuit.positivity, 0.25, 0.08):
        label = ", ".join(head_label(*k) for k in keys)
        dx = -6 if x > 0.6 else 6  # labels run right (so neighbours' labels don't meet), left only near the edge
        dy = -10 if y > 0.8 else 6
        ax.annotate(label, (x, y), fontsize=8, xytext=(dx, dy), textcoords="offset points",
                    ha="right" if dx < 0 else "left", va="top" if dy < 0 else "bottom")
    ax.axhline(0, color="0.8", lw=0.8)
    ax.axvline(0, color="0.8", lw=0.8)
    ax.set_xlim(-1.05, 1.05)
    ax.set_ylim(-1.05, 1.05)
    ax.set_xlabel("QK positivity (K-composition circuit, Σλ/Σ|λ|)")
    ax.set_ylabel("OV positivity (copying, Σλ/Σ|λ|)")
    ax.legend(handles=[Line2D([], [], ls="", marker="o", color="tab:red", label="induction head"),
                       Line2D([], [], ls="", marker="o", color="tab:gray", label="other layer ≥ 1 head")],
              loc="lower left", fontsize=8)
    ax.set_title("Induction heads sit in the top-right corner", fontsize=10)
    return fig


def plot_position_loss(model, tokens, marks: tuple[int, int] | None = None, losses: torch.Tensor | None = None):
    """Mean next-token loss at each position of `tokens [batch, pos]` (x: the position of the predicted token, log
    scale), unsmoothed, with a band of ± one standard error over the sequences; `marks` (early, late) draws the
    in-context-learning score's two positions; `losses` (from `position_losses`) skips the forward passes."""
    from .scores import position_losses

    plt = _plt()
    per = (position_losses(model, tokens) if losses is None else losses).double()  # [batch, pos - 1]
    mean = per.mean(0)
    se = per.std(0) / per.shape[0] ** 0.5 if per.shape[0] > 1 else torch.zeros_like(mean)
    fig, ax = plt.subplots(figsize=(7, 3.8))
    x = torch.arange(1, mean.numel() + 1).numpy()
    ax.fill_between(x, (mean - se).numpy(), (mean + se).numpy(), color="tab:blue", alpha=0.25, lw=0,
                    label="± 1 standard error")
    ax.plot(x, mean.numpy(), lw=1.2, color="tab:blue", marker=".", ms=3,
            label=f"mean over {per.shape[0]} sequences")
    if marks is not None:
        early, late = marks
        ax.axvline(early, color="tab:orange", ls="--", lw=1, label=f"token {early}")
        ax.axvline(late, color="tab:red", ls="--", lw=1, label=f"token {late} (ICL score: loss at {late} − at {early})")
    ax.set_xscale("log")
    log_axis_labels(ax.xaxis)
    ax.set_xlabel("token position in context (log scale)")
    ax.set_ylabel("loss (nats)")
    ax.set_title("Loss by position: in-context learning lowers later tokens' loss", fontsize=10)
    ax.legend(fontsize=8)
    fixed_layout(fig, left=0.4 + tick_label_inches(ax.yaxis), right=0.15, bottom=0.55, top=0.35)
    return fig


def plot_ablation(result):
    """Bar chart of `analyses.one_layer.AblationResult.delta` (loss increase per head, nats), with ± one
    standard error over the sequences when the result has one."""
    plt = _plt()
    d = result.delta
    labels = [head_label(l, h) for l in range(d.shape[0]) for h in range(d.shape[1])]
    fig, ax = plt.subplots(figsize=(max(5.5, 0.45 * len(labels) + 1.5), 3.6))
    se = getattr(result, "se", None)
    ax.bar(range(len(labels)), d.reshape(-1).numpy(), color="tab:blue",
           yerr=None if se is None else se.reshape(-1).numpy(), capsize=3)
    ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=8)
    ax.set_ylabel("loss increase (nats)")
    n = getattr(result, "n_sequences", None)
    ax.set_title("Pattern-preserving ablation of each head\n"
                 f"clean loss {result.clean_loss:.3f} nats" + (f", {n} sequences, bars ± 1 s.e." if n else ""),
                 fontsize=10)
    fixed_layout(fig, left=0.4 + tick_label_inches(ax.yaxis), right=0.15,
                 bottom=0.3 + max(text_inches(x, 8) for x in labels), top=0.6)
    return fig

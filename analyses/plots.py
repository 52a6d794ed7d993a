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


def _layer_head_grid(L: int, H: int, size: float, extra_w: float = 0.0, extra_h: float = 0.6, **kw):
    """A constrained-layout figure with one row per layer and one column per head: (fig, axes [L, H])."""
    size = min(size, 16.0 / max(H, 1))
    return _plt().subplots(L, H, figsize=(size * H + extra_w, size * L + extra_h), squeeze=False,
                           layout="constrained", **kw)


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
    fig, axes = _layer_head_grid(L, H, 2.3, extra_w=0.9, sharex=True, sharey=True)
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
    fig.colorbar(im, ax=axes, shrink=0.8, label="attention weight")
    what = f"[BOS] + R + R, |R| = {seq_len} (second copy from position {seq_len + 1})" if seq_len else "the tokens"
    width = fig.get_size_inches()[0]
    fig.suptitle(textwrap.fill(f"Attention patterns on {what}", max(30, int(width * 11))), fontsize=10)
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
    fig, axes = plt.subplots(rows, cols, figsize=(max(3.0, 0.55 * H + 1.2) * cols + 0.8,
                                                  max(2.2, 0.55 * L + 1.4) * rows), squeeze=False, layout="constrained")
    for ax in axes.flat[n:]:
        ax.axis("off")
    for ax, (title, s) in zip(axes.flat, panels.items()):
        im = _annotated_heatmap(ax, torch.as_tensor(s, dtype=torch.float32), threshold)
        ax.set_title(title, fontsize=10)
    fig.colorbar(im, ax=axes[:, :].ravel().tolist(), shrink=0.9, label="score" + (
        f" (boxed: ≥ {threshold})" if threshold is not None else ""))
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
    fig, axes = _layer_head_grid(L, H, 2.1 if H <= 5 else 1.5, extra_h=1.0)  # 8 heads: about 12 in
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
    wide = fig.get_figwidth() >= 7  # a model of few heads: a narrow figure, so the legend stacks, the title wraps
    fig.legend(handles=handles, loc="outside lower center", ncol=3 if wide else 1, fontsize=8, frameon=False)
    fig.suptitle(textwrap.fill("Full OV circuit eigenvalues λ / max|λ| in the complex plane (title: copying score "
                               "Σλ/Σ|λ|)", max(30, int(10 * fig.get_figwidth()))), fontsize=10)
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
    fig, axes = plt.subplots(1, 3, figsize=(3 * side + 1.0, side + 0.4), layout="constrained")
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
    fig.colorbar(im, ax=axes.tolist(), shrink=0.8, label="score − random baseline")
    return fig


def _cluster(points: dict, tol: float = 0.04) -> list[tuple[float, float, list]]:
    """Points closer than `tol` (data units) merged into one labelled spot: [(x, y, [keys])]."""
    groups: list[tuple[float, float, list]] = []
    for key, (x, y) in sorted(points.items()):
        for g in groups:
            if abs(g[0] - x) < tol and abs(g[1] - y) < tol:
                g[2].append(key)
                break
        else:
            groups.append((x, y, [key]))
    return groups


def plot_positivity(circuit):
    """(QK positivity, OV positivity) of each layer ≥ 1 head — Σλ/Σ|λ| of its K-composition circuit with its
    previous-token partner and of its full OV circuit (Framework, induction-head figure); induction heads red.
    Heads at the same spot (within 0.04) share one label, placed inside the axes."""
    from matplotlib.lines import Line2D

    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.2, 5.2), layout="constrained")
    induction = set(circuit.induction.heads)
    for (l, h), (qk, ov) in circuit.positivity.items():
        ax.scatter([qk], [ov], c="tab:red" if (l, h) in induction else "tab:gray", s=40, zorder=3)
    for x, y, keys in _cluster(circuit.positivity):
        label = ", ".join(head_label(*k) for k in keys)
        dx = -6 if x > 0.4 else 6  # point the label towards the middle so it stays inside
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
    fig, ax = plt.subplots(figsize=(7, 3.8), layout="constrained")
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
    ax.set_xlabel("token position in context (log scale)")
    ax.set_ylabel("loss (nats)")
    ax.set_title("Loss by position: in-context learning lowers later tokens' loss", fontsize=10)
    ax.legend(fontsize=8)
    return fig


def plot_ablation(result):
    """Bar chart of `analyses.one_layer.AblationResult.delta` (loss increase per head, nats), with ± one
    standard error over the sequences when the result has one."""
    plt = _plt()
    d = result.delta
    labels = [head_label(l, h) for l in range(d.shape[0]) for h in range(d.shape[1])]
    fig, ax = plt.subplots(figsize=(max(5.5, 0.45 * len(labels) + 1.5), 3.6), layout="constrained")
    se = getattr(result, "se", None)
    ax.bar(range(len(labels)), d.reshape(-1).numpy(), color="tab:blue",
           yerr=None if se is None else se.reshape(-1).numpy(), capsize=3)
    ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=8)
    ax.set_ylabel("loss increase (nats)")
    n = getattr(result, "n_sequences", None)
    ax.set_title("Pattern-preserving ablation of each head\n"
                 f"clean loss {result.clean_loss:.3f} nats" + (f", {n} sequences, bars ± 1 s.e." if n else ""),
                 fontsize=10)
    return fig

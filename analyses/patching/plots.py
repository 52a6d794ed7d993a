"""Figures of the causal tools (matplotlib; each returns its `Figure`).

- `plot_patching`: a `PatchResult` as heatmaps of the share of the clean–corrupted difference each cell carries, one
  panel per entry of its first axis when it has three (components of a path sweep, layers of a by-position head
  sweep), on one symmetric colour scale;
- `plot_attribution`: attribution-patching estimates against exact activation patching, with the y = x line;
- `plot_dla`: direct logit attribution per component;
- `plot_logit_lens`: the probability of the actual next token at every layer and position, top prediction written in.
"""

from __future__ import annotations

import math
import textwrap

import torch

from ..labels import figure_text
from ..plots import COLORBAR_ROOM, EM_PER_CHAR, fixed_layout, side_colorbar, text_inches


def _plt():
    import matplotlib.pyplot as plt

    return plt


def _share_label(result) -> str:
    if result.kind == "path":
        what = ("restored when only this path carries the senders' clean output" if result.direction == "denoising"
                else "lost when only this path carries the senders' corrupted output")
    else:
        what = ("restored by patching in the clean activation" if result.direction == "denoising" else
                "lost by patching in the corrupted activation")
    return f"share of the clean−corrupted {result.metric} difference {what}"


def _visible(token: str) -> str:
    """A token's text as a figure label: whitespace and control characters made visible
    (`analyses.labels.token_label`), `$` escaped (`figure_text`)."""
    from ..labels import figure_text, token_label

    return figure_text(token_label(token, max_len=10**6))


def _short(label: str, n: int = 14) -> str:
    return label if len(label) <= n else label[: n - 1] + "…"


def plot_patching(result, title: str | None = None, annotate: bool | None = None):
    """Heatmap(s) of `result.share()`: red cells carry the effect, blue ones work against it (shared scale, ±the
    largest |share|, at least ±1 when the shares reach it). 2 axes: one panel (rows: first axis); 3 axes: one panel per
    entry of the first. NaN cells (not measured) are dark grey. `annotate`: write the values (default when the
    grid is small)."""
    plt = _plt()
    share = result.share().float()
    if share.ndim == 2:
        share = share[None]
        panel_names = [""]
        rows_axis, cols_axis = 0, 1
    elif share.ndim == 3:
        titles = {"component": lambda x: f"through the receiver's {x.upper()}", "layer": lambda x: f"layer {x}"}
        panel_names = [titles.get(result.axes[0], str)(lab) for lab in result.labels[0]]
        rows_axis, cols_axis = 1, 2
    else:
        raise ValueError(f"plot_patching draws results with 2 or 3 axes, got {result.axes}")
    if result.axes[rows_axis] == "pos":  # positions always run along the x axis
        share = share.transpose(1, 2)
        rows_axis, cols_axis = cols_axis, rows_axis
    rows, cols = result.labels[rows_axis], result.labels[cols_axis]
    finite = share[~torch.isnan(share)]
    vmax = max(float(finite.abs().max()) if finite.numel() else 1.0, 1e-9)
    annotate = len(cols) <= 16 and len(rows) <= 24 if annotate is None else annotate
    n = share.shape[0]
    ncol = min(n, 3)
    nrow = math.ceil(n / ncol)
    ylabels = [figure_text(_short(r)) for r in rows]
    step = max(1, math.ceil(len(cols) / 48))
    xlabels = [figure_text(_short(c)) for c in cols[::step]]
    # fixed margins sized from the labels (`analyses.plots.fixed_layout`): 7 pt tick labels, 8 pt axis labels
    left = 0.3 + max(text_inches(x, 7) for x in ylabels)
    bottom = 0.3 + max(text_inches(x, 7) for x in xlabels)  # the column labels stand rotated
    aw = min(max(1.6, (0.42 if annotate else 0.2) * len(cols)), 9.6 / ncol)  # a panel: at most 12.4 in in all
    ah = max(1.9, 0.4 * len(rows))  # at least the colour bar's label (10 pt) tall
    W = ncol * aw + ncol * left + (ncol - 1) * 0.15 + COLORBAR_ROOM
    text = title or (f"{result.kind} patching ({result.direction}): {_share_label(result)}; clean {result.metric} "
                     f"{result.clean_value:.3f}, corrupted {result.corrupt_value:.3f}")
    text = textwrap.fill(text, int(W * 72 / (9 * EM_PER_CHAR)))
    named = any(panel_names)
    top = 0.2 + 0.18 * (text.count("\n") + 1) + (0.25 if named else 0.0)
    hspace = bottom + (0.25 if named else 0.0) + 0.1
    H = nrow * ah + (nrow - 1) * hspace + top + bottom
    fig, axes = plt.subplots(nrow, ncol, figsize=(W, H), squeeze=False)
    fixed_layout(fig, left=left, right=COLORBAR_ROOM, bottom=bottom, top=top, wspace=left + 0.15, hspace=hspace)
    for ax in axes.flat[n:]:
        ax.axis("off")
    cmap = plt.get_cmap("bwr")  # white exactly at 0
    cmap = cmap.with_extremes(bad="0.45")  # not measured: dark grey, unlike any near-zero cell
    for ax, name, grid in zip(axes.flat, panel_names, share):
        im = ax.imshow(grid.numpy(), cmap=cmap, vmin=-vmax, vmax=vmax, aspect="auto")
        if annotate:
            for i in range(grid.shape[0]):
                for j in range(grid.shape[1]):
                    v = float(grid[i, j])
                    if not math.isnan(v):
                        ax.text(j, i, f"{v:.2f}".replace("-0.00", "0.00"), ha="center", va="center", fontsize=7,
                                color="w" if abs(v) > 0.6 * vmax else "k")
        ax.set_xticks(range(0, len(cols), step), xlabels, rotation=90, fontsize=7)
        ax.set_yticks(range(len(rows)), ylabels, fontsize=7)
        ax.set_xlabel(result.axes[cols_axis], fontsize=8)
        ax.set_ylabel(result.axes[rows_axis], fontsize=8)
        if name:
            ax.set_title(name, fontsize=9)
    side_colorbar(fig, im, "share of the effect", shrink=0.95)
    fig.suptitle(text, fontsize=9, y=1 - 0.1 / H, va="top")
    return fig


def plot_attribution(attribution, title: str | None = None):
    """Scatter of estimated against exact effects (patched metric minus the base run's), one point per cell, with
    y = x and Pearson's r. Needs an `AttributionResult` computed with `compare=True`."""
    plt = _plt()
    if attribution.exact is None:
        raise ValueError("plot_attribution needs an AttributionResult computed with compare=True")
    est, ex = attribution.estimate, attribution.exact
    base = est.corrupt_value if est.direction == "denoising" else est.clean_value
    a = (est.values - base).reshape(-1).float()
    b = (ex.values - base).reshape(-1).float()
    fig, ax = plt.subplots(figsize=(4.8, 4.4))
    lim = float(torch.cat([a, b]).abs().max()) * 1.08 or 1.0
    ax.plot([-lim, lim], [-lim, lim], color="0.7", lw=1, label="y = x")
    ax.scatter(b.numpy(), a.numpy(), s=14, color="tab:blue")
    ax.set_xlim(-lim, lim)
    ax.set_ylim(-lim, lim)
    ax.set_xlabel(f"exact activation patching: Δ {est.metric}")
    ax.set_ylabel(f"attribution patching: Δ {est.metric}")
    ax.set_title(title or f"{est.kind} ({est.direction}): r = {attribution.correlation:.3f}", fontsize=10)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    return fig


def plot_dla(dla, title: str | None = None):
    """Bar chart of a `DirectLogitAttribution` (averaged over the prompts and positions it holds)."""
    plt = _plt()
    v = dla.attribution.detach().float()
    v = v.reshape(v.shape[0], -1).mean(-1)
    fig, ax = plt.subplots(figsize=(max(4.5, 0.42 * len(dla.labels) + 1.5), 3.4))
    ax.bar(range(len(v)), v.numpy(), color=["tab:red" if x > 0 else "tab:blue" for x in v.tolist()])
    ax.axhline(0, color="0.5", lw=0.8)
    ax.set_xticks(range(len(v)), [_visible(x) for x in dla.labels], rotation=90, fontsize=8)
    ax.set_ylabel("direct logit attribution")
    ax.set_title(title or f"Direct logit attribution by {dla.unit}", fontsize=10)
    fig.tight_layout()
    return fig


def plot_logit_lens(lens, title: str | None = None, max_pos: int = 48):
    """The probability the logit lens gives to the token that actually follows, `[stack entry, position]` (0–1
    colour scale), with the lens' top prediction written in each cell; at most the last `max_pos` positions. At
    most 12 in wide (900 px at 72 dpi, the width a notebook shows unscaled)."""
    plt = _plt()
    p = lens.next_prob[:, -max_pos:]
    start = lens.next_prob.shape[1] - p.shape[1]
    tops = lens.top_ids[:, start: start + p.shape[1], 0]
    fig, ax = plt.subplots(figsize=(min(max(5.0, 0.62 * p.shape[1] + 2.4), 12.0), 0.5 * p.shape[0] + 2.2),
                           layout="constrained")
    im = ax.imshow(p.numpy(), cmap="viridis", vmin=0, vmax=1, aspect="auto")
    for e in range(p.shape[0]):
        for j in range(p.shape[1]):
            s = lens.top_strings[e][start + j][0] if lens.top_strings else f"#{int(tops[e, j])}"
            ax.text(j, e, _short(_visible(s), 4), ha="center", va="center", fontsize=7,
                    color="k" if float(p[e, j]) > 0.6 else "w")
    strings = lens.strings[start + 1: start + 1 + p.shape[1]] if lens.strings else [str(int(t)) for t in
                                                                                  lens.tokens[start + 1:]]
    ax.set_xticks(range(p.shape[1]), [_short(_visible(s), 8) for s in strings], rotation=90, fontsize=7)
    ax.set_yticks(range(p.shape[0]), lens.labels, fontsize=8)
    ax.set_xlabel("token to predict (top prediction written in each cell)")
    ax.set_ylabel("residual stream read")
    fig.colorbar(im, ax=ax, label="probability of the actual next token")
    through = (f"the final norm ({lens.final_norm}) and W_U" if lens.final_norm else
               "W_U (this model has no final norm)")
    title = title or f"Logit lens: each row reads the residual stream there through {through}"
    ax.set_title(textwrap.fill(title, max(40, int(10 * fig.get_figwidth()))), fontsize=10)  # within the figure
    return fig


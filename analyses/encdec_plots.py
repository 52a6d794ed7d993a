"""Figures of encoder–decoder models' cross-attention: patterns with their alignment marked, full OV circuits and
the positional part of the full QK circuits, one panel per cross-attention head, colour scales shared and shown."""

from __future__ import annotations

import torch

from .labels import figure_text
from .plots import _layer_head_grid


def _ticks(ax, labels_x, labels_y, fontsize=7):
    rotate = max(map(len, labels_x), default=0) > 2
    ax.set_xticks(range(len(labels_x)), [figure_text(x) for x in labels_x], fontsize=fontsize,
                  rotation=90 if rotate else 0)
    ax.set_yticks(range(len(labels_y)), [figure_text(y) for y in labels_y], fontsize=fontsize)


def plot_cross_patterns(patterns: torch.Tensor, aligned: torch.Tensor | None, src_labels: list[str],
                        tgt_labels: list[str], scores: torch.Tensor | None = None, ylabel: str = "predicts"):
    """`patterns [layers, heads, tgt_pos, src_pos]` of one sequence (or a mean), 0–1 on one colour scale; the
    cells of `aligned [tgt_pos, src_pos]` (where each predicted token comes from) outlined in red; `scores
    [layers, heads]` (alignment scores) in the titles. Rows are labelled by the token each decoder position
    predicts (`ylabel`); `aligned=None` marks nothing."""
    L, H, T, S = patterns.shape
    fig, axes = _layer_head_grid(L, H, max(2.6, 0.32 * S + 1.2), extra_w=1.0, extra_h=0.8)
    ys, xs = torch.nonzero(aligned, as_tuple=True) if aligned is not None else (None, None)
    for layer in range(L):
        for head in range(H):
            ax = axes[layer, head]
            im = ax.imshow(patterns[layer, head].numpy(), vmin=0, vmax=1, cmap="viridis", aspect="auto")
            if aligned is not None:
                ax.scatter(xs.numpy(), ys.numpy(), marker="s", s=60, facecolors="none", edgecolors="red", linewidths=1)
            title = f"C{layer}H{head}" + ("" if scores is None else f": alignment {float(scores[layer, head]):.2f}")
            ax.set_title(title, fontsize=9)
            _ticks(ax, src_labels, tgt_labels)
            ax.set_xlabel("source position (token)", fontsize=8)
            ax.set_ylabel(ylabel, fontsize=8)
    fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.8,
                 label="attention" + (" (red: aligned source)" if aligned is not None else ""))
    return fig


def _signed_grid(mats: torch.Tensor, labels_x, labels_y, xlabel: str, ylabel: str, bar: str, titles):
    """`mats [layers, heads, rows, cols]` on one symmetric red–blue scale."""
    L, H, R, C = mats.shape
    vmax = float(mats.abs().max()) or 1.0
    fig, axes = _layer_head_grid(L, H, max(2.6, 0.3 * C + 1.2), extra_w=1.0, extra_h=0.8)
    for layer in range(L):
        for head in range(H):
            ax = axes[layer, head]
            im = ax.imshow(mats[layer, head].numpy(), vmin=-vmax, vmax=vmax, cmap="RdBu_r", aspect="auto")
            ax.set_title(titles(layer, head), fontsize=9)
            _ticks(ax, labels_x, labels_y)
            ax.set_xlabel(xlabel, fontsize=8)
            ax.set_ylabel(ylabel, fontsize=8)
    fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.8, label=bar)
    return fig


def plot_full_cross_ov(ov: torch.Tensor, labels: list[str], copying: torch.Tensor | None = None):
    """Full cross-attention OV circuits `W_E_src W_OV W_U`, `[layers, heads, d_vocab_src, d_vocab_tgt]` (source
    token rows, target logit columns), copying scores in the titles."""
    return _signed_grid(ov, labels, labels, "target logit", "attended source token", "logit change",
                        lambda l, h: f"C{l}H{h}" + ("" if copying is None else f": copying {float(copying[l, h]):.2f}"))


def plot_positional_cross_qk(pos_pos: torch.Tensor, n_tgt: int, n_src: int):
    """The positional part `W_pos_tgt W_QK W_pos_srcᵀ / √d_head` of each cross-attention head's full QK circuit,
    `[layers, heads, tgt_pos, src_pos]`: rows are decoder positions (0 holds BOS), columns source positions."""
    return _signed_grid(pos_pos[..., :n_tgt, :n_src], [str(j) for j in range(n_src)], [str(i) for i in range(n_tgt)],
                        "source position", "decoder position", "attention score", lambda l, h: f"C{l}H{h}")

"""Figures for the analyses (matplotlib; call `matplotlib.use("Agg")` for files). Each returns its `Figure`.

- `plot_attention_patterns`: every head's pattern on a repeated random sequence `[BOS] + R + R`;
- `plot_score_heatmap`, `plot_score_panels`: `[n_layers, n_heads]` score tables (induction, previous-token, …);
- `plot_eigenvalues`: each head's full-OV-circuit eigenvalues in the complex plane (copying = right half);
- `plot_composition`: Q/K/V composition scores minus the random baseline;
- `plot_positivity`: the Framework's (QK positivity, OV positivity) scatter of layer ≥ 1 heads;
- `plot_position_loss`: mean loss by token position (in-context learning: loss falls along the context);
- `plot_ablation`: loss increase per head under pattern-preserving ablation.
"""

from __future__ import annotations

import math

import torch

from circuits.eigen import eigenvalues
from circuits.factored import full_ov_circuit
from models.model import head_label

from .sequences import repeated_tokens
from .util import weight_view


def _plt():
    import matplotlib.pyplot as plt

    return plt


def _grid(n: int, size: float = 2.6, max_cols: int = 6):
    plt = _plt()
    cols = min(n, max_cols)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(size * cols, size * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.axis("off")
    return fig, list(axes.flat[:n])


@torch.no_grad()
def plot_attention_patterns(model, seq_len: int = 20, seed: int = 0, tokens=None, max_heads: int = 24):
    """Each head's attention pattern (query rows, key columns) on one `[BOS] + R + R` sequence (|R| = `seq_len`,
    shrunk to fit n_ctx): previous-token heads show the sub-diagonal, induction heads a stripe `seq_len − 1`
    below the diagonal in the second half, positional/BOS heads column 0."""
    from .scores import attention_patterns

    seq_len = min(seq_len, (model.cfg.n_ctx - 1) // 2)
    t = repeated_tokens(model, seq_len, 2, 1, seed) if tokens is None else torch.as_tensor(tokens).reshape(1, -1)
    pat = attention_patterns(model, t)[:, 0]  # [layer, head, q, k]
    heads = [(l, h) for l in range(pat.shape[0]) for h in range(pat.shape[1])][:max_heads]
    fig, axes = _grid(len(heads))
    for ax, (l, h) in zip(axes, heads):
        ax.imshow(pat[l, h].numpy(), cmap="viridis", vmin=0, vmax=1)
        ax.set_title(head_label(l, h), fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle(f"Attention patterns on [BOS] + R + R (|R| = {seq_len}); rows: query, columns: key")
    fig.tight_layout()
    return fig


def plot_score_heatmap(scores: torch.Tensor, title: str, threshold: float | None = None, cmap: str = "viridis",
                       vmin: float | None = 0.0, vmax: float | None = 1.0):
    """A `[n_layers, n_heads]` table as a heatmap with the values written in; cells ≥ `threshold` boxed."""
    plt = _plt()
    s = torch.as_tensor(scores, dtype=torch.float32)
    L, H = s.shape
    fig, ax = plt.subplots(figsize=(max(4.0, 0.7 * H + 1.5), max(2.0, 0.6 * L + 1.2)))
    im = ax.imshow(s.numpy(), cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
    for l in range(L):
        for h in range(H):
            v = float(s[l, h])
            ax.text(h, l, f"{v:.2f}", ha="center", va="center", fontsize=8, color="w" if v < 0.6 else "k")
            if threshold is not None and v >= threshold:
                ax.add_patch(plt.Rectangle((h - 0.5, l - 0.5), 1, 1, fill=False, ec="red", lw=2))
    ax.set_xticks(range(H))
    ax.set_yticks(range(L))
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(title + (f" (boxed: ≥ {threshold})" if threshold is not None else ""), fontsize=10)
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    return fig


def plot_score_panels(panels: dict[str, torch.Tensor], threshold: float | None = 0.4):
    """Several `[n_layers, n_heads]` score tables side by side (one heatmap each, values written in, cells
    ≥ `threshold` boxed), on a shared 0–1 colour scale."""
    plt = _plt()
    n = len(panels)
    L, H = next(iter(panels.values())).shape
    cols = min(n, 3 if H > 4 else 5)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(max(3.0, 0.55 * H + 1.2) * cols, max(2.2, 0.55 * L + 1.4) * rows),
                             squeeze=False)
    for ax in axes.flat[n:]:
        ax.axis("off")
    for ax, (title, s) in zip(axes.flat, panels.items()):
        s = torch.as_tensor(s, dtype=torch.float32)
        ax.imshow(s.numpy(), cmap="viridis", vmin=0, vmax=1, aspect="auto")
        for l in range(L):
            for h in range(H):
                v = float(s[l, h])
                ax.text(h, l, f"{v:.2f}", ha="center", va="center", fontsize=7, color="w" if v < 0.6 else "k")
                if threshold is not None and v >= threshold:
                    ax.add_patch(plt.Rectangle((h - 0.5, l - 0.5), 1, 1, fill=False, ec="red", lw=1.5))
        ax.set_xticks(range(H))
        ax.set_yticks(range(L))
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


@torch.no_grad()
def plot_eigenvalues(model, max_heads: int = 24):
    """Eigenvalues of every head's full OV circuit `W_E W_OV W_U` in the complex plane, scaled by the largest
    |λ| (unit circle drawn). Copying heads have their eigenvalues on the positive real side; the title gives the
    copying score Σλ/Σ|λ|."""
    m = weight_view(model)
    heads = [(l, h) for l in range(m.cfg.n_layers) for h in range(m.cfg.n_heads)][:max_heads]
    fig, axes = _grid(len(heads))
    for ax, (l, h) in zip(axes, heads):
        lam = eigenvalues(full_ov_circuit(m, l, h)).cpu()
        scale = float(lam.abs().max()) or 1.0
        z = lam / scale
        score = float(lam.sum().real / lam.abs().sum()) if scale else 0.0
        t = torch.linspace(0, 2 * math.pi, 200)
        ax.plot(t.cos(), t.sin(), color="0.8", lw=0.8)
        ax.axhline(0, color="0.85", lw=0.6)
        ax.axvline(0, color="0.85", lw=0.6)
        ax.scatter(z.real.numpy(), z.imag.numpy(), s=10, c="tab:blue" if score >= 0 else "tab:red")
        ax.set_xlim(-1.1, 1.1)
        ax.set_ylim(-1.1, 1.1)
        ax.set_aspect("equal")
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_title(f"{head_label(l, h)}: {score:+.2f}", fontsize=9)
    fig.suptitle("Full OV circuit eigenvalues / max |λ| (title: copying score Σλ/Σ|λ|)")
    fig.tight_layout()
    return fig


def plot_composition(study):
    """Q-, K- and V-composition scores minus the random baseline: rows earlier heads, columns later heads
    (pairs with l1 ≥ l2 greyed out). `study` is an `analyses.two_layer.CompositionStudy`."""
    plt = _plt()
    kinds = ("q", "k", "v")
    s = study.scores["k"]
    L, H = s.shape[:2]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6))
    ex = {k: study.excess(k) for k in kinds}
    vmax = max(float(e.abs().max()) for e in ex.values()) or 1.0
    for ax, k in zip(axes, kinds):
        M = ex[k][: L - 1, :, 1:, :].reshape((L - 1) * H, (L - 1) * H).clone()
        l1 = torch.arange(L - 1).repeat_interleave(H)
        l2 = torch.arange(1, L).repeat_interleave(H)
        M[l1[:, None] >= l2[None, :]] = float("nan")
        im = ax.imshow(M.numpy(), cmap="RdBu_r", vmin=-vmax, vmax=vmax)
        ax.set_yticks(range((L - 1) * H), [head_label(int(a), i % H) for i, a in enumerate(l1)], fontsize=7)
        ax.set_xticks(range((L - 1) * H), [head_label(int(a), i % H) for i, a in enumerate(l2)], fontsize=7,
                      rotation=90)
        ax.set_ylabel("earlier head (writes)")
        ax.set_xlabel("later head (reads)")
        ax.set_title(f"{k.upper()}-composition − baseline {study.baselines[k]:.3f}")
        fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    return fig


def plot_positivity(circuit):
    """(QK positivity, OV positivity) of each layer ≥ 1 head — Σλ/Σ|λ| of its K-composition circuit with its
    previous-token partner and of its full OV circuit (Framework, induction-head figure); induction heads red."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 5))
    induction = set(circuit.induction.heads)
    for (l, h), (qk, ov) in circuit.positivity.items():
        c = "tab:red" if (l, h) in induction else "tab:gray"
        ax.scatter([qk], [ov], c=c, s=40)
        ax.annotate(head_label(l, h), (qk, ov), fontsize=8, xytext=(3, 3), textcoords="offset points")
    ax.axhline(0, color="0.8", lw=0.8)
    ax.axvline(0, color="0.8", lw=0.8)
    ax.set_xlim(-1.05, 1.05)
    ax.set_ylim(-1.05, 1.05)
    ax.set_xlabel("QK positivity (K-composition circuit, Σλ/Σ|λ|)")
    ax.set_ylabel("OV positivity (copying, Σλ/Σ|λ|)")
    ax.set_title("Induction heads sit in the top-right corner (red)")
    fig.tight_layout()
    return fig


def plot_position_loss(model, tokens, marks: tuple[int, int] | None = None, losses: torch.Tensor | None = None):
    """Mean next-token loss at each position of `tokens [batch, pos]` (x: the position of the predicted token);
    `marks` (early, late) draws the in-context-learning score's two positions; `losses` (from
    `position_losses`) skips the forward passes."""
    from .scores import position_losses

    plt = _plt()
    loss = (position_losses(model, tokens) if losses is None else losses).float().mean(0)
    fig, ax = plt.subplots(figsize=(7, 3.6))
    x = torch.arange(1, loss.numel() + 1)
    ax.plot(x.numpy(), loss.numpy(), lw=0.8, color="0.6", label="per position")
    k = max(1, loss.numel() // 40)
    if loss.numel() > 2 * k:
        smooth = torch.nn.functional.avg_pool1d(loss[None, None], 2 * k + 1, 1, k, count_include_pad=False)[0, 0]
        ax.plot(x.numpy(), smooth.numpy(), lw=2, color="tab:blue", label="smoothed")
    if marks is not None:
        for p in marks:
            ax.axvline(p, color="tab:red", ls="--", lw=1)
    ax.set_xscale("log")
    ax.set_xlabel("token position in context")
    ax.set_ylabel("loss (nats)")
    ax.set_title("Loss by position: in-context learning lowers later tokens' loss")
    ax.legend()
    fig.tight_layout()
    return fig


def plot_ablation(result):
    """Bar chart of `analyses.one_layer.AblationResult.delta` (loss increase per head, nats)."""
    plt = _plt()
    d = result.delta
    labels = [head_label(l, h) for l in range(d.shape[0]) for h in range(d.shape[1])]
    fig, ax = plt.subplots(figsize=(max(5, 0.45 * len(labels) + 1), 3.4))
    ax.bar(range(len(labels)), d.reshape(-1).numpy(), color="tab:blue")
    ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=8)
    ax.set_ylabel("loss increase (nats)")
    ax.set_title(f"Pattern-preserving ablation of each head (clean loss {result.clean_loss:.3f})")
    fig.tight_layout()
    return fig

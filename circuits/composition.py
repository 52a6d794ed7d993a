"""Q-, K- and V-composition scores between heads, from small Gram matrices (no d_model × d_model products).

Frobenius norms of low-rank products: with `L = A1 B1` and `R = A2 B2` (inner dims r1, r2 ≪ d_model),
`‖L R‖_F² = tr(Xᵀ G X H)` where `X = B1 A2` `[r1, r2]`, `G = A1ᵀ A1` `[r1, r1]` and `H = B2 B2ᵀ` `[r2, r2]`;
`‖L‖_F² = tr(G · B1 B1ᵀ)`. Everything in float64.
"""

from __future__ import annotations

import functools

import torch
from transformer_lens import FactoredMatrix

from .interface import f64, warn_if_unfolded

KINDS = ("q", "k", "v")


def _check_kind(kind: str) -> str:
    k = str(kind).lower()
    if k not in KINDS:
        raise ValueError(f"kind={kind!r} is not a composition kind; allowed: 'q', 'k', 'v'")
    return k


def _gram_score(G: torch.Tensor, X: torch.Tensor, H: torch.Tensor, left_sq: torch.Tensor,
                right_sq: torch.Tensor) -> torch.Tensor:
    """`sqrt(tr(Xᵀ G X H)) / sqrt(left_sq · right_sq)`, the arithmetic behind `composition_score`."""
    prod_sq = ((G @ X) * (X @ H)).sum((-2, -1)).clamp_min(0)
    denom = (left_sq * right_sq).sqrt()
    return torch.where(denom > 0, prod_sq.sqrt() / denom.clamp_min(1e-300), torch.zeros_like(denom))


def composition_score(left: FactoredMatrix, right: FactoredMatrix) -> torch.Tensor:
    """Composition score `‖L R‖_F / (‖L‖_F ‖R‖_F)` of a writing circuit L = `W_OV^{h1}` (earlier head) with a
    reading circuit R of a later head (Elhage et al. 2021, "Framework", §"Virtual Attention Heads /
    Composition"), row form:

    - Q-composition: `R = W_QK^{h2}`  (h1's output read by h2's queries),
    - K-composition: `R = (W_QK^{h2})ᵀ` (read by h2's keys),
    - V-composition: `R = W_OV^{h2}`  (read by h2's values).

    In [0, 1] (sub-multiplicativity of the Frobenius norm). This is exactly TransformerLens'
    `utilities.composition_scores(left, right)` and `TransformerBridge.all_composition_scores(mode)` (same left
    and right factors), computed from d_head × d_head Gram matrices in float64. Leading dims broadcast
    elementwise; 0 where a factor is zero."""
    A1, B1, A2, B2 = (f64(t) for t in (left.A, left.B, right.A, right.B))
    G = A1.transpose(-2, -1) @ A1
    H = B2 @ B2.transpose(-2, -1)
    left_sq = (G * (B1 @ B1.transpose(-2, -1))).sum((-2, -1))
    right_sq = ((A2.transpose(-2, -1) @ A2) * H).sum((-2, -1))
    return _gram_score(G, B1 @ A2, H, left_sq, right_sq)


def composition_scores(model, kind: str, subtract_baseline: bool = False, baseline_samples: int = 64,
                       seed: int = 0) -> torch.Tensor:
    """`composition_score` for every (earlier head, later head) pair: `[n_layers, n_heads, n_layers, n_heads]`
    float64, indexed `[l1, h1, l2, h2]`; zero unless `l1 < l2` (TransformerLens' layout and mask).

    `kind` is "q", "k" or "v" (see `composition_score` for the three right-hand circuits). Only the `l1 < l2`
    blocks are computed: per earlier layer, one `[n_heads·d_head, d_model] @ [d_model, n_later·d_head]` product
    `X = W_O^{h1} W_{Q|K|V}^{h2}`, then d_head × d_head Gram arithmetic. With `subtract_baseline=True` the
    random-matrix expectation `composition_baseline(d_model, d_head, kind, baseline_samples, seed)` is
    subtracted on the `l1 < l2` entries (the Framework's presentation); the result may then be negative."""
    kind = _check_kind(kind)
    warn_if_unfolded(model)
    W_Q, W_K, W_V, W_O = (f64(getattr(model, n)) for n in ("W_Q", "W_K", "W_V", "W_O"))
    L, Hn, dm, dh = W_V.shape
    G = W_V.transpose(-2, -1) @ W_V  # left A = W_V: [L, H, dh, dh]
    OOt = W_O @ W_O.transpose(-2, -1)  # left B = W_O
    left_sq = (G * OOt).sum((-2, -1))
    A2, H2 = {"q": (W_Q, W_K.transpose(-2, -1) @ W_K), "k": (W_K, W_Q.transpose(-2, -1) @ W_Q),
              "v": (W_V, OOt)}[kind]
    right_sq = ((A2.transpose(-2, -1) @ A2) * H2).sum((-2, -1))
    out = torch.zeros(L, Hn, L, Hn, dtype=torch.float64, device=W_V.device)
    for l1 in range(L - 1):
        n2 = L - l1 - 1
        later = A2[l1 + 1:].permute(2, 0, 1, 3).reshape(dm, n2 * Hn * dh)  # [d_model, (l2, h2, e)]
        X = (W_O[l1].reshape(Hn * dh, dm) @ later).view(Hn, dh, n2, Hn, dh).permute(0, 2, 3, 1, 4)
        score = _gram_score(G[l1][:, None, None], X, H2[l1 + 1:][None], left_sq[l1][:, None, None],
                            right_sq[l1 + 1:][None])  # [h1, l2, h2]
        out[l1, :, l1 + 1:] = score
        if subtract_baseline:
            out[l1, :, l1 + 1:] -= composition_baseline(dm, dh, kind, baseline_samples, seed)
    return out.to(model.W_E.device)


@functools.lru_cache(maxsize=64)
def composition_baseline(d_model: int, d_head: int, kind: str = "k", n_samples: int = 64, seed: int = 0) -> float:
    """Expected `composition_score` of random heads with these shapes: the mean over `n_samples` pairs of
    heads whose W_Q, W_K, W_V `[d_model, d_head]` and W_O `[d_head, d_model]` have i.i.d. standard normal
    entries (seeded; float64; the per-pair spread is ≈ 0.0004 at d_model 768, so 64 samples pin the mean to
    ≈ 5e-5). ≈ 1/√d_model (0.036 for d_model 768): the Framework subtracts this expectation
    before comparing composition scores (Elhage et al. 2021, "Two-Layer Models", composition-score figure)."""
    kind = _check_kind(kind)
    if n_samples < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples}")
    gen = torch.Generator().manual_seed(seed)
    total, chunk = 0.0, 32
    for start in range(0, n_samples, chunk):
        n = min(chunk, n_samples - start)
        r = lambda *shape, n=n: torch.randn(n, *shape, generator=gen, dtype=torch.float64)
        left = FactoredMatrix(r(d_model, d_head), r(d_head, d_model))  # W_V^{h1} W_O^{h1}
        if kind == "v":
            right = FactoredMatrix(r(d_model, d_head), r(d_head, d_model))
        else:  # W_Q W_Kᵀ or its transpose: the same distribution
            right = FactoredMatrix(r(d_model, d_head), r(d_model, d_head).transpose(-2, -1))
        total += float(composition_score(left, right).sum())
    return total / n_samples

"""Q-, K- and V-composition scores between heads, from d_head-sized factors (no d_model × d_model products).

Frobenius norms of low-rank products: with `L = A1 B1` and `R = A2 B2` (inner dims r1, r2 ≪ d_model), take
square roots of the r × r Gram matrices, `A1ᵀ A1 = R1ᵀ R1` and `B2 B2ᵀ = R2ᵀ R2` (R1 is the R of `A1 = Q1 R1`).
Then with `Y = R1 B1` `[r1, d_model]` and `Z = A2 R2ᵀ` `[d_model, r2]`: `‖L‖_F = ‖Y‖_F`, `‖R‖_F = ‖Z‖_F` and
`‖L R‖_F = ‖Y Z‖_F` (an r1 × r2 matrix). `composition_score` works in float64 throughout; `composition_scores`
runs its contractions over d_model (Gram matrices, `Y`, `Z`, `Y Z`) in the model's dtype when that is float32
(relative error ~1e-6; float64 would cost several times more there on a CPU) and everything d_head-sized (square
roots, norms, sums) in float64; a float64 model is float64 throughout.
"""

from __future__ import annotations

import functools

import torch

from models.arch.tl_compat import FactoredMatrix

from .checks import check_finite, check_int, check_model_finite, check_weight_properties
from .interface import f64, serial_ops, warn_if_unfolded

KINDS = ("q", "k", "v")


def _check_kind(kind: str) -> str:
    k = str(kind).lower()
    if k not in KINDS:
        raise ValueError(f"kind={kind!r} is not a composition kind; allowed: 'q', 'k', 'v'")
    return k


def _r(W: torch.Tensor) -> torch.Tensor:
    """A square root R of the Gram matrix, `Wᵀ W = Rᵀ R` (`[..., n, r]` → `[..., r, r]`), so `‖W M‖_F = ‖R M‖_F`.

    The Cholesky factor of `Wᵀ W` (R of `W = QR`); where a Gram matrix is singular (rank < r), the
    eigendecomposition `Wᵀ W = U Λ Uᵀ` gives `R = Λ^½ Uᵀ` instead."""
    G = (W.transpose(-2, -1) @ W).to(torch.float64)
    L, info = torch.linalg.cholesky_ex(G)
    if bool((info == 0).all()):
        return L.transpose(-2, -1)
    lam, U = torch.linalg.eigh(G)
    return lam.clamp_min(0).sqrt()[..., :, None] * U.transpose(-2, -1)


def _left(A1: torch.Tensor, B1: torch.Tensor) -> torch.Tensor:
    """`Y = R1 B1` for the writing circuit `A1 B1` (in B1's dtype)."""
    return _r(A1).to(B1.dtype) @ B1


def _right(A2: torch.Tensor, B2: torch.Tensor) -> torch.Tensor:
    """`Z = A2 R2ᵀ` for the reading circuit `A2 B2` (in A2's dtype)."""
    return A2 @ _r(B2.transpose(-2, -1)).transpose(-2, -1).to(A2.dtype)


def _sq_norm(X: torch.Tensor, dims=(-2, -1)) -> torch.Tensor:
    """Σ X² over `dims` in float64, squared in float64 too: float32 squares of weights scaled by 1e-6 underflow."""
    return torch.sum(X.to(torch.float64).square(), dims)


def _ratio(num_sq: torch.Tensor, left_sq: torch.Tensor, right_sq: torch.Tensor) -> torch.Tensor:
    """`sqrt(num_sq / (left_sq · right_sq))`, 0 where a factor is zero."""
    den = (left_sq * right_sq).sqrt()
    return torch.where(den > 0, num_sq.sqrt() / den.clamp_min(1e-300), torch.zeros_like(den))


def composition_score(left: FactoredMatrix, right: FactoredMatrix) -> torch.Tensor:
    """Composition score `‖L R‖_F / (‖L‖_F ‖R‖_F)` of a writing circuit L = `W_OV^{h1}` (earlier head) with a
    reading circuit R of a later head (Elhage et al. 2021, "Framework", §"Virtual Attention Heads /
    Composition"), row form:

    - Q-composition: `R = W_QK^{h2}`  (h1's output read by h2's queries),
    - K-composition: `R = (W_QK^{h2})ᵀ` (read by h2's keys),
    - V-composition: `R = W_OV^{h2}`  (read by h2's values).

    In [0, 1] (sub-multiplicativity of the Frobenius norm). This is exactly TransformerLens'
    `utilities.composition_scores(left, right)` and `TransformerBridge.all_composition_scores(mode)` (same left
    and right factors), computed from d_head-sized factors in float64 (see the module docstring). Leading dims
    broadcast elementwise; 0 where a factor is zero. `TypeError` unless both are `FactoredMatrix`es, `ValueError`
    when R cannot read L's output (L's columns ≠ R's rows), `NonFiniteError` for NaN/inf factors."""
    for name, fm in (("left", left), ("right", right)):
        if not isinstance(fm, FactoredMatrix):
            raise TypeError(f"composition_score: {name} must be a FactoredMatrix, got {type(fm).__name__}")
    if left.rdim != right.ldim:
        raise ValueError(f"composition_score: left {tuple(left.shape)} writes {left.rdim} dims but right "
                         f"{tuple(right.shape)} reads {right.ldim}")
    check_finite({"left.A": left.A, "left.B": left.B, "right.A": right.A, "right.B": right.B}, "composition_score")
    with serial_ops():
        Y = _left(f64(left.A), f64(left.B))
        Z = _right(f64(right.A), f64(right.B))
        return _ratio(_sq_norm(Y @ Z), _sq_norm(Y), _sq_norm(Z))


def composition_scores(model, kind: str, subtract_baseline: bool = False, baseline_samples: int = 64,
                       seed: int = 0) -> torch.Tensor:
    """`composition_score` for every (earlier head, later head) pair: `[n_layers, n_heads, n_layers, n_heads]`
    float64, indexed `[l1, h1, l2, h2]`; zero unless `l1 < l2` (TransformerLens' layout and mask).

    `kind` is "q", "k" or "v" (see `composition_score` for the three right-hand circuits). Only the `l1 < l2`
    blocks are computed: the factors `Y = R_V^{h1} W_O^{h1}` and `Z` of every head (from d_head × d_head Gram
    matrices), then per earlier layer one `[n_heads·d_head, d_model] @ [d_model, n_later·d_head]` product whose
    d_head × d_head blocks' norms are the numerators. With `subtract_baseline=True` the random-matrix
    expectation `composition_baseline(d_model, d_head, kind, baseline_samples, seed)` is subtracted on the
    `l1 < l2` entries (the Framework's presentation); the result may then be negative. A 0-layer model gives an
    empty `[0, n_heads, 0, n_heads]`; NaN/inf weights raise `NonFiniteError` (a `ValueError`)."""
    kind = _check_kind(kind)
    check_weight_properties(model, "composition_scores")
    if model.cfg.n_layers == 0:
        H = model.cfg.n_heads
        return torch.zeros(0, H, 0, H, dtype=torch.float64, device=model.W_E.device)
    check_model_finite(model, "composition_scores", ("W_Q", "W_K", "W_V", "W_O"))
    warn_if_unfolded(model)
    with serial_ops():  # a few dozen medium ops: see serial_ops
        return _composition_scores(model, kind, subtract_baseline, baseline_samples, seed)


def _composition_scores(model, kind, subtract_baseline, baseline_samples, seed) -> torch.Tensor:
    L, Hn, dm, dh = model.W_V.shape
    out = torch.zeros(L, Hn, L, Hn, dtype=torch.float64, device=model.W_E.device)
    if L < 2:
        return out
    wd = torch.float64 if model.W_V.dtype == torch.float64 else torch.float32  # see the module docstring
    W_V, W_O = model.W_V.detach().to(wd), model.W_O.detach().to(wd)
    Y = _left(W_V[:-1], W_O[:-1])  # [L-1, H, dh, d_model]
    if kind == "v":
        Z = _right(W_V[1:], W_O[1:])  # [L-1, H, d_model, dh]
    else:
        W_Q, W_K = model.W_Q[1:].detach().to(wd), model.W_K[1:].detach().to(wd)
        A2, B2 = (W_Q, W_K) if kind == "q" else (W_K, W_Q)
        Z = _right(A2, B2.transpose(-2, -1))
    y_sq, z_sq = _sq_norm(Y), _sq_norm(Z)  # [L-1, H]
    r1, r2 = Y.shape[-2], Z.shape[-1]
    for l1 in range(L - 1):
        n2 = L - l1 - 1
        later = Z[l1:].permute(2, 0, 1, 3).reshape(dm, n2 * Hn * r2)  # [d_model, (l2, h2, e)]
        P = (Y[l1].reshape(Hn * r1, dm) @ later).view(Hn, r1, n2, Hn, r2)
        num_sq = _sq_norm(P, (1, 4))  # [h1, l2, h2]
        out[l1, :, l1 + 1:] = _ratio(num_sq, y_sq[l1][:, None, None], z_sq[l1:][None])
        if subtract_baseline:
            out[l1, :, l1 + 1:] -= composition_baseline(dm, dh, kind, baseline_samples, seed)
    return out


@functools.lru_cache(maxsize=64)
def composition_baseline(d_model: int, d_head: int, kind: str = "k", n_samples: int = 64, seed: int = 0) -> float:
    """Expected `composition_score` of random heads with these shapes: the mean over `n_samples` pairs of
    heads whose W_Q, W_K, W_V `[d_model, d_head]` and W_O `[d_head, d_model]` have i.i.d. standard normal
    entries (seeded; float64; the per-pair spread is ≈ 0.0004 at d_model 768, so 64 samples pin the mean to
    ≈ 5e-5). ≈ 1/√d_model (0.036 for d_model 768): the Framework subtracts this expectation
    before comparing composition scores (Elhage et al. 2021, "Two-Layer Models", composition-score figure)."""
    kind = _check_kind(kind)
    d_model, d_head = check_int(d_model, "d_model"), check_int(d_head, "d_head")
    n_samples = check_int(n_samples, "n_samples")
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

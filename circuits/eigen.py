"""Eigenvalues of factored circuits and the copying scores built on them.

The non-zero eigenvalues of `AB` equal those of `BA` (if `ABv = λv` with λ ≠ 0 then `BA(Bv) = λ(Bv)` and
`Bv ≠ 0`), so a `d_vocab × d_vocab` circuit factored through `d_head` has its spectrum in a `d_head × d_head`
matrix. Computed in float64 (complex128 results), returned on the input's device.
"""

from __future__ import annotations

import torch

from models.arch.products import matmul
from models.arch.tl_compat import FactoredMatrix

from .checks import analysis_dtype, check_finite, check_matrix, check_model_finite, check_weight_properties
from .interface import serial_ops, warn_if_unfolded

Matrix = FactoredMatrix | torch.Tensor


def _to_f64(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    if t.device.type == "mps":  # no float64 on MPS
        t = t.cpu()
    return t.to(torch.float64)


def eigenvalues(fm: Matrix) -> torch.Tensor:
    """Eigenvalues of a square (stack of) matrices `[..., n, n]`, via the BA trick for a `FactoredMatrix`.

    For `fm = A B` with inner dimension m < n, returns the m eigenvalues of `BA` (the non-zero eigenvalues of
    `AB`, padded with zeros where `BA` is singular); otherwise those of `AB`. A dense tensor is decomposed as is.
    Result: complex128 `[..., min(m, n)]`, sorted by decreasing |λ|, on the input's device. This is
    TransformerLens' `FactoredMatrix.eigenvalues` (which always uses `BA`), in float64 and sorted.
    Raises `TypeError` for anything but a matrix, `ValueError` for a non-square one and `NonFiniteError` (a
    `ValueError`) when an entry or factor holds NaN/inf (LAPACK would return garbage for it).
    """
    check_matrix(fm, "eigenvalues")
    shape = fm.shape
    if shape[-1] != shape[-2]:
        raise ValueError(f"eigenvalues need a square matrix, got shape {tuple(shape)}")
    with serial_ops():  # a batch of small products and eigenproblems: see serial_ops
        if isinstance(fm, FactoredMatrix):
            device = fm.A.device
            A, B = _to_f64(fm.A), _to_f64(fm.B)
            check_finite({"factor A": A, "factor B": B}, "eigenvalues")
            small = B @ A if fm.mdim <= fm.ldim else A @ B
        else:
            device, small = fm.device, _to_f64(fm)
        check_finite({"the matrix": small}, "eigenvalues")
        lam = torch.linalg.eigvals(small.cpu() if small.device.type != "cpu" else small)
        order = lam.abs().argsort(dim=-1, descending=True, stable=True)
        return lam.gather(-1, order).to(device)


def copying_score(fm: Matrix) -> torch.Tensor:
    """Copying score `Σ_i λ_i / Σ_i |λ_i|` over the eigenvalues of a (full OV) circuit, in [−1, 1].

    Framework (Elhage et al. 2021), "Copying / Primarily Positive Eigenvalues": +1 for a matrix with only
    non-negative eigenvalues (a copying head's `W_E W_OV W_U`), −1 for only non-positive ones, ≈ 0 for random
    matrices. The numerator is real (the sum of a real matrix's eigenvalues, i.e. its trace). 0 for a zero
    matrix. Vectorised over leading dims; float64, on the input's device."""
    lam = eigenvalues(fm)
    total = lam.abs().sum(-1)
    return torch.where(total > 0, lam.sum(-1).real / total.clamp_min(torch.finfo(torch.float64).tiny),
                       torch.zeros_like(total))


def positive_eigenvalue_fraction(fm: Matrix, weighted: bool = False, rtol: float = 1e-9) -> torch.Tensor:
    """Fraction of the non-negligible eigenvalues (|λ| > rtol·max|λ|) whose real part is positive.

    With `weighted=True`: `Σ_{Re λ>0} |λ| / Σ |λ|` instead, the share of the spectrum's magnitude that is
    positive (Framework, "Copying / Primarily Positive Eigenvalues", which plots the eigenvalues and reports the
    share that are positive). Float64, vectorised over leading dims, 0 for a zero matrix."""
    lam = eigenvalues(fm)
    mag = lam.abs()
    keep = mag > rtol * mag.amax(-1, keepdim=True)
    pos = keep & (lam.real > 0)
    if weighted:
        num, den = (mag * pos).sum(-1), (mag * keep).sum(-1)
    else:
        num, den = pos.sum(-1).to(torch.float64), keep.sum(-1).to(torch.float64)
    return torch.where(den > 0, num / den.clamp_min(1e-300), torch.zeros_like(num))


def copying_scores(model) -> torch.Tensor:
    """`copying_score` of every head's full OV circuit `W_E W_V^h W_O^h W_U`, as `[n_layers, n_heads]` float64.

    The vocabulary is touched once per model: `M = W_U W_E` `[d_model, d_model]` (computed in the model's dtype,
    a single pass over d_vocab), then per head the d_head × d_head matrix `W_O^h M W_V^h`, whose eigenvalues
    are the non-zero eigenvalues of the full OV circuit (`AB` vs `BA` with `A = W_E W_V`, `B = W_O W_U`),
    batched over all heads. The two products over d_vocab and d_model run in the model's dtype (for float32,
    relative error ~1e-6; float16/bfloat16 models are read in float32, `models.arch.products.matmul`);
    `W_O M` times `W_V` and the eigenproblems run in float64.
    A 0-layer model gives an empty `[0, n_heads]`; NaN/inf weights raise `NonFiniteError`."""
    check_weight_properties(model, "copying_scores")
    if model.cfg.n_layers == 0:
        return torch.zeros(0, model.cfg.n_heads, dtype=torch.float64, device=model.W_E.device)
    check_model_finite(model, "copying_scores", ("W_E", "W_V", "W_O", "W_U"))
    warn_if_unfolded(model)
    wd = analysis_dtype(model.W_E)
    M = matmul(model.W_U.detach().to(wd), model.W_E.detach().to(wd))  # [d_model, d_model]: one pass over d_vocab
    W_O = model.W_O.detach().to(wd)
    L, H, dh, dm = W_O.shape
    W_OM = (W_O.reshape(L * H * dh, dm) @ M.to(W_O.dtype)).view(L, H, dh, dm)  # one GEMM for all heads
    return copying_score(FactoredMatrix(W_OM, model.W_V.detach().to(wd))).to(model.W_E.device)

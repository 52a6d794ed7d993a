"""`TensorProduct`: the Framework's `A ⊗ W` notation for maps on a residual stream `x [pos, d]`.

Elhage et al. (2021), §"Notation / Tensor products": `A` mixes positions (an attention pattern), `W` mixes
features (a weight matrix), and the two commute. The paper writes column vectors: `(A ⊗ W_col)·x = A x W_colᵀ`
for `x [pos, d]`. We keep `W` in row form (`W = W_colᵀ`, `[d_in, d_out]`, the layout of `W_OV = W_V W_O`):

    TensorProduct(A, W).apply(x) = A @ x @ W        # [..., pos, d_in] -> [..., pos, d_out]

Composition is operator composition, `(T1 @ T2).apply(x) == T1.apply(T2.apply(x))` (T2 acts first), so the
mixed-product rule `(A1 ⊗ W1)(A2 ⊗ W2) = A1A2 ⊗ W1W2` of the paper's column form reads, with row-form feature
matrices, `TensorProduct(A1 @ A2, W2 @ W1)`: the feature factors multiply in the order the stream meets them.
"""

from __future__ import annotations

import torch


class TensorProduct:
    """`A ⊗ W` with `A [..., pos_out, pos_in]` acting across positions and `W [..., d_in, d_out]` (row form)
    across features. Leading dims of A and W broadcast (e.g. a batch of attention patterns)."""

    __slots__ = ("A", "W")

    def __init__(self, A: torch.Tensor, W: torch.Tensor):
        if A.ndim < 2 or W.ndim < 2:
            raise ValueError(f"A and W must be (stacks of) matrices, got shapes {tuple(A.shape)}, {tuple(W.shape)}")
        self.A, self.W = A, W

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """`(pos_out, d_out, pos_in, d_in)`: the map sends `[pos_in, d_in]` to `[pos_out, d_out]`."""
        return (self.A.shape[-2], self.W.shape[-1], self.A.shape[-1], self.W.shape[-2])

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """`(A ⊗ W)·x = A x W` for `x [..., pos_in, d_in]` → `[..., pos_out, d_out]` (the paper's `A x W_colᵀ`).

        Evaluated in the cheaper association order (the two factors commute)."""
        P_out, d_out, P_in, d_in = self.shape
        if x.shape[-2:] != (P_in, d_in):
            raise ValueError(f"x must end in [pos={P_in}, d={d_in}], got {tuple(x.shape)}")
        if P_out * P_in * d_in + P_out * d_in * d_out <= P_in * d_in * d_out + P_out * P_in * d_out:
            return (self.A @ x) @ self.W  # fewer multiply-adds this way round
        return self.A @ (x @ self.W)

    def __matmul__(self, other: TensorProduct) -> TensorProduct:
        """Mixed-product rule: `(A1 ⊗ W1) ∘ (A2 ⊗ W2) = (A1 A2) ⊗ (W2 W1)` in row form (other acts first)."""
        if not isinstance(other, TensorProduct):
            return NotImplemented
        return TensorProduct(self.A @ other.A, other.W @ self.W)

    def __mul__(self, c) -> TensorProduct:
        return TensorProduct(self.A, self.W * c)

    __rmul__ = __mul__

    def materialize(self) -> torch.Tensor:
        """The `[pos_out·d_out, pos_in·d_in]` matrix acting on row-major flattened `x` (`x.reshape(-1)`):
        `torch.kron(A, Wᵀ)`, the Kronecker product of the paper's column-form factors. Small sizes only."""
        A, Wt = torch.broadcast_tensors(self.A[..., None, None], self.W.transpose(-2, -1)[..., None, None, :, :])
        out = A * Wt  # [..., po, pi, do, di]
        *lead, po, pi, do, di = out.shape
        return out.permute(*range(len(lead)), -4, -2, -3, -1).reshape(*lead, po * do, pi * di)

    def __repr__(self) -> str:
        return f"TensorProduct(A={tuple(self.A.shape)}, W={tuple(self.W.shape)})"

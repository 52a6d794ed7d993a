"""`TensorProduct` (A ⊗ W): application, Kronecker materialisation, mixed-product rule."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from circuits import TensorProduct

dims = st.integers(1, 4)



def _kron(a, b):
    """torch.kron, with standard strides forced: torch 2.13's kron fails on a "contiguous" tensor whose size-1
    dims carry non-standard strides (e.g. `randn(1, 2).T.contiguous()`)."""
    std = lambda t: t.reshape(-1).view(t.shape)
    return torch.kron(std(a), std(b))


def _rand(g, *shape):
    return torch.randn(*shape, generator=g, dtype=torch.float64)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), p0=dims, p1=dims, p2=dims, d0=dims, d1=dims, d2=dims)
def test_mixed_product_rule(seed, p0, p1, p2, d0, d1, d2):
    g = torch.Generator().manual_seed(seed)
    A1, A2 = _rand(g, p2, p1), _rand(g, p1, p0)  # T2 maps [p0, d0] -> [p1, d1]; T1 maps [p1, d1] -> [p2, d2]
    W1, W2 = _rand(g, d1, d2), _rand(g, d0, d1)
    T1, T2 = TensorProduct(A1, W1), TensorProduct(A2, W2)
    T = T1 @ T2
    x = _rand(g, p0, d0)
    assert torch.allclose(T.apply(x), T1.apply(T2.apply(x)))
    assert torch.allclose(T.A, A1 @ A2) and torch.allclose(T.W, W2 @ W1)  # row form: W2 then W1
    assert torch.allclose(T.materialize(), T1.materialize() @ T2.materialize())
    # the paper's column-form statement: (A1 ⊗ W1c)(A2 ⊗ W2c) = A1A2 ⊗ W1c W2c, with Wc = Wᵀ
    W1c, W2c = W1.T, W2.T
    assert torch.allclose(_kron(A1, W1c) @ _kron(A2, W2c), _kron(A1 @ A2, W1c @ W2c))
    assert torch.allclose(T.materialize(), _kron(A1 @ A2, W1c @ W2c))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), p_in=dims, p_out=dims, d_in=dims, d_out=dims)
def test_apply_and_materialize_agree_with_kron(seed, p_in, p_out, d_in, d_out):
    g = torch.Generator().manual_seed(seed)
    A, W, x = _rand(g, p_out, p_in), _rand(g, d_in, d_out), _rand(g, p_in, d_in)
    T = TensorProduct(A, W)
    assert T.shape == (p_out, d_out, p_in, d_in)
    M = T.materialize()
    assert torch.allclose(M, _kron(A, W.T))
    assert torch.allclose(T.apply(x), A @ x @ W)
    assert torch.allclose(M @ x.reshape(-1), T.apply(x).reshape(-1))


def test_batched_patterns_broadcast():
    g = torch.Generator().manual_seed(0)
    A, W, x = _rand(g, 5, 3, 3), _rand(g, 4, 2), _rand(g, 5, 3, 4)
    T = TensorProduct(A, W)
    assert torch.allclose(T.apply(x), A @ x @ W)
    M = T.materialize()
    assert M.shape == (5, 6, 12)
    assert torch.allclose(M[2], _kron(A[2], W.T))
    assert torch.allclose((2.0 * T).apply(x), 2 * T.apply(x))


def test_identity_tensor_product_is_identity():
    T = TensorProduct(torch.eye(3, dtype=torch.float64), torch.eye(4, dtype=torch.float64))
    assert torch.equal(T.materialize(), torch.eye(12, dtype=torch.float64))

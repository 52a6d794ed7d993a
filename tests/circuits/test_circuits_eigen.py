"""Eigenvalues via the BA trick, copying scores and diagonal statistics against dense computations."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import circuits
from circuits.testing import random_model
from models.arch.tl_compat import FactoredMatrix

SETTINGS = settings(max_examples=40, deadline=None)



def _rand(seed, *shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _match(a: torch.Tensor, b: torch.Tensor, tol: float) -> None:
    """Every eigenvalue in `a` has a distinct partner in `b` within `tol` (greedy; sizes equal)."""
    remaining = list(b)
    for x in a:
        d = torch.stack([(x - y).abs() for y in remaining])
        i = int(d.argmin())
        assert float(d[i]) < tol, (x, remaining[i])
        remaining.pop(i)


@SETTINGS
@given(seed=st.integers(0, 10**6), n=st.integers(2, 12), m=st.integers(1, 12), lead=st.sampled_from([(), (3,)]))
def test_factored_eigenvalues_equal_dense_nonzero_part(seed, n, m, lead):
    A, B = _rand(seed, *lead, n, m), _rand(seed + 1, *lead, m, n)
    fm = FactoredMatrix(A, B)
    ours = circuits.eigenvalues(fm)
    k = min(n, m)
    assert ours.shape == (*lead, k) and ours.dtype == torch.complex128
    dense = torch.linalg.eigvals(A @ B)
    dense = dense.gather(-1, dense.abs().argsort(-1, descending=True))[..., :k]
    scale = float((A @ B).norm()) + 1.0
    for o, d in zip(ours.reshape(-1, k), dense.reshape(-1, k)):
        assert torch.allclose(o.abs(), d.abs(), atol=1e-9 * scale)  # sorted magnitudes agree
        _match(o, d, 1e-7 * scale)


@SETTINGS
@given(seed=st.integers(0, 10**6), n=st.integers(2, 10), m=st.integers(1, 10))
def test_copying_score_bounds_and_extremes(seed, n, m):
    A, B = _rand(seed, n, m), _rand(seed + 1, m, n)
    s = float(circuits.copying_score(FactoredMatrix(A, B)))
    assert -1 - 1e-12 <= s <= 1 + 1e-12
    W = _rand(seed + 2, n, m)
    assert float(circuits.copying_score(FactoredMatrix(W, W.T))) == pytest.approx(1.0, abs=1e-12)
    assert float(circuits.copying_score(FactoredMatrix(-W, W.T))) == pytest.approx(-1.0, abs=1e-12)
    assert float(circuits.copying_score(W @ W.T)) == pytest.approx(1.0, abs=1e-12)  # dense input too


def test_copying_score_of_zero_matrix_is_zero():
    assert float(circuits.copying_score(FactoredMatrix(torch.zeros(4, 2), torch.zeros(2, 4)))) == 0.0


def test_eigenvalues_agree_with_transformer_lens():
    fm = FactoredMatrix(_rand(0, 2, 3, 20, 4), _rand(1, 2, 3, 4, 20))
    ours, tl = circuits.eigenvalues(fm), fm.eigenvalues
    assert tl.shape == ours.shape
    for o, t in zip(ours.reshape(-1, 4), tl.reshape(-1, 4)):
        _match(o, t.to(torch.complex128), 1e-10)


def test_copying_scores_match_per_head_and_dense():
    m = random_model(n_layers=2, n_heads=3, d_vocab=23, seed=1)
    scores = circuits.copying_scores(m)
    assert scores.shape == (2, 3) and scores.dtype == torch.float64
    for l in range(2):
        for h in range(3):
            dense = (m.W_E @ m.W_V[l, h] @ m.W_O[l, h] @ m.W_U).detach()
            lam = torch.linalg.eigvals(dense)
            expected = float(lam.sum().real / lam.abs().sum())
            assert float(scores[l, h]) == pytest.approx(expected, abs=1e-10)
            per_head = circuits.copying_score(circuits.full_ov_circuit(m, l, h))
            assert float(per_head) == pytest.approx(expected, abs=1e-10)
    stacked = circuits.copying_score(circuits.full_ov_circuit(m))
    assert torch.allclose(stacked, scores, atol=1e-10)


def test_copying_scores_float32_model_close_to_float64():
    m64 = random_model(n_layers=1, n_heads=2, seed=4)
    m32 = random_model(n_layers=1, n_heads=2, seed=4, dtype="float32")
    assert torch.allclose(circuits.copying_scores(m32), circuits.copying_scores(m64), atol=1e-5)


def test_positive_eigenvalue_fraction():
    W = _rand(0, 8, 3)
    assert float(circuits.positive_eigenvalue_fraction(FactoredMatrix(W, W.T))) == 1.0
    assert float(circuits.positive_eigenvalue_fraction(FactoredMatrix(-W, W.T))) == 0.0
    D = torch.diag(torch.tensor([3.0, 1.0, -1.0, 0.0], dtype=torch.float64))
    assert float(circuits.positive_eigenvalue_fraction(D)) == pytest.approx(2 / 3)
    assert float(circuits.positive_eigenvalue_fraction(D, weighted=True)) == pytest.approx(4 / 5)


def _dense_diag_stats(M: torch.Tensor, ks):
    diag = M.diagonal(dim1=-2, dim2=-1)
    rank = (M > diag[..., None]).sum(-1)
    return {k: (rank < k).double().mean(-1) for k in ks}


@SETTINGS
@given(seed=st.integers(0, 10**6), n=st.integers(1, 40), m=st.integers(1, 6), block=st.sampled_from([8, 200, 10**6]))
def test_diagonal_rank_stats_match_dense(seed, n, m, block):
    A, B = _rand(seed, 2, n, m), _rand(seed + 1, 2, m, n)
    A[0] += B[0].T  # make one head copy-ish so accuracies are not all ~1/n
    fm = FactoredMatrix(A, B)
    got = circuits.diagonal_rank_stats(fm, k=(1, 3, 5), block_bytes=block)
    want = _dense_diag_stats(A @ B, (1, 3, 5))
    for k in (1, 3, 5):
        assert got[k].shape == (2,)
        assert torch.allclose(got[k], want[k])


def test_diagonal_rank_stats_identity_and_ties():
    eye = torch.eye(6, dtype=torch.float64)
    assert float(circuits.diagonal_rank_stats(eye, k=1)[1]) == 1.0
    ones = torch.ones(6, 6)  # all tied: ties count for the diagonal
    assert float(circuits.diagonal_rank_stats(ones)[1]) == 1.0
    with pytest.raises(ValueError):
        circuits.diagonal_rank_stats(eye, k=0)


def test_diagonal_rank_stats_on_full_ov_circuit_of_a_copying_head():
    from circuits.testing import build_induction_model

    m, info = build_induction_model()
    (l, h), = info.copying_heads
    stats = circuits.diagonal_rank_stats(circuits.full_ov_circuit(m, l, h), k=(1, 5))
    assert float(stats[1]) == 1.0 and float(stats[5]) == 1.0
    (l, h), = info.anti_copying_heads
    assert float(circuits.diagonal_rank_stats(circuits.full_ov_circuit(m, l, h))[1]) == 0.0


@pytest.mark.parametrize("chunk", [1, 3, 7, 64])
def test_diagonal_rank_stats_chunked_filter_is_exact(chunk, monkeypatch):
    import circuits.diagonal as diagonal

    monkeypatch.setattr(diagonal, "CHUNK", chunk)
    for seed, n in ((0, 97), (1, 150), (2, 64)):
        A, B = _rand(seed, 3, n, 5), _rand(seed + 1, 3, 5, n)
        A[0] += 0.8 * B[0].T  # near-copying: many rows of small rank, the ones the filter must count exactly
        A[1] += 3.0 * B[1].T
        ks = (1, 2, 5, 12)
        got = circuits.diagonal_rank_stats(FactoredMatrix(A, B), k=ks, block_bytes=8 * n * 13)
        want = _dense_diag_stats(A @ B, ks)
        for k in ks:
            assert torch.allclose(got[k], want[k]), (k, got[k], want[k])


def test_diagonal_rank_stats_of_two_heads_together():
    """ARENA's "heads 1.4 and 1.10 together": the sum of two full OV circuits, factored by concatenation."""
    m = random_model(n_layers=2, n_heads=2, seed=6)
    f1, f2 = circuits.full_ov_circuit(m, 1, 0), circuits.full_ov_circuit(m, 1, 1)
    both = FactoredMatrix(torch.cat([f1.A, f2.A], -1), torch.cat([f1.B, f2.B], -2))
    got = circuits.diagonal_rank_stats(both, k=(1, 5))
    want = _dense_diag_stats((f1.AB + f2.AB).detach(), (1, 5))
    assert all(torch.allclose(got[k], want[k]) for k in (1, 5))

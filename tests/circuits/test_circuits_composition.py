"""Composition scores: dense Frobenius formula, TransformerLens' utility and bridge, random baseline."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import circuits
from circuits.testing import random_model
from models.arch.tl_compat import FactoredMatrix, utilities

tl_composition_scores = utilities().composition_scores


def _dense_scores(model, kind):
    """The Framework's row-form formulas with dense d_model × d_model matrices."""
    W_Q, W_K, W_V, W_O = (getattr(model, n).detach() for n in ("W_Q", "W_K", "W_V", "W_O"))
    OV, QK = W_V @ W_O, W_Q @ W_K.transpose(-2, -1)
    right = {"q": QK, "k": QK.transpose(-2, -1), "v": OV}[kind]
    L, H = W_Q.shape[:2]
    out = torch.zeros(L, H, L, H, dtype=torch.float64)
    for l1 in range(L):
        for h1 in range(H):
            for l2 in range(l1 + 1, L):
                for h2 in range(H):
                    num = (OV[l1, h1] @ right[l2, h2]).norm()
                    out[l1, h1, l2, h2] = num / (OV[l1, h1].norm() * right[l2, h2].norm())
    return out


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10**6), n_layers=st.integers(1, 3), n_heads=st.integers(1, 3),
       d_head=st.sampled_from([2, 4, 20]), kind=st.sampled_from(["q", "k", "v"]))
def test_composition_scores_equal_dense_formula(seed, n_layers, n_heads, d_head, kind):
    m = random_model(n_layers=n_layers, n_heads=n_heads, d_model=12, d_head=d_head, seed=seed)
    got = circuits.composition_scores(m, kind)
    assert got.shape == (n_layers, n_heads, n_layers, n_heads) and got.dtype == torch.float64
    assert torch.all(got >= 0) and torch.all(got <= 1 + 1e-12)
    assert torch.allclose(got, _dense_scores(m, kind), atol=1e-12)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10**6), r1=st.integers(1, 6), r2=st.integers(1, 6), d=st.integers(2, 9))
def test_composition_score_of_factored_matrices(seed, r1, r2, d):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)
    left, right = FactoredMatrix(r(d, r1), r(r1, d)), FactoredMatrix(r(d, r2), r(r2, d))
    got = float(circuits.composition_score(left, right))
    want = float((left.AB @ right.AB).norm() / (left.AB.norm() * right.AB.norm()))
    assert 0 <= got <= 1 + 1e-12 and got == pytest.approx(want, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("kind", ["q", "k", "v"])
def test_float32_model_scores_close_to_float64(kind):
    m64 = random_model(n_layers=3, n_heads=4, d_model=48, d_head=8, seed=3)
    m32 = random_model(n_layers=3, n_heads=4, d_model=48, d_head=8, seed=3, dtype="float32")
    s32, s64 = circuits.composition_scores(m32, kind), circuits.composition_scores(m64, kind)
    assert s32.dtype == torch.float64 and torch.allclose(s32, s64, rtol=1e-5, atol=1e-7)


def test_kind_is_validated_and_case_insensitive():
    m = random_model(n_layers=2)
    assert torch.equal(circuits.composition_scores(m, "K"), circuits.composition_scores(m, "k"))
    with pytest.raises(ValueError, match="composition kind"):
        circuits.composition_scores(m, "x")


@pytest.mark.parametrize("kind", ["q", "k", "v"])
def test_agrees_with_transformer_lens_utility(kind):
    """TL's convention: left = OV of the earlier head; right = QK, QKᵀ or OV of the later head (Q, K, V);
    scores [l1, h1, l2, h2], masked to l1 < l2 by TransformerBridge.all_composition_scores."""
    m = random_model(n_layers=3, n_heads=2, seed=7)
    right = {"q": m.QK, "k": m.QK.T, "v": m.OV}[kind]
    tl = tl_composition_scores(m.OV, right).detach()
    L = 3
    mask = torch.arange(L)[:, None, None, None] < torch.arange(L)[None, None, :, None]
    assert torch.allclose(circuits.composition_scores(m, kind), torch.where(mask, tl, 0.0), atol=1e-10)


@pytest.mark.tl4
def test_agrees_with_bridge_all_composition_scores():
    from models import to_transformer_lens

    m = random_model(n_layers=2, n_heads=3, seed=8)
    bridge = to_transformer_lens(m)
    for kind in "qkv":
        ours = circuits.composition_scores(m, kind)
        assert torch.allclose(circuits.composition_scores(bridge, kind), ours, atol=1e-12)
        tl = bridge.all_composition_scores(kind.upper()).scores.detach()
        assert torch.allclose(tl.to(torch.float64), ours, atol=1e-10)


def test_random_baseline_is_about_one_over_sqrt_d_model():
    b = circuits.composition_baseline(768, 64, kind="k", n_samples=64, seed=0)
    assert b == pytest.approx(768**-0.5, rel=0.03)  # 0.036
    assert circuits.composition_baseline(512, 64, kind="v", n_samples=64, seed=1) == pytest.approx(512**-0.5, rel=0.03)
    assert circuits.composition_baseline(768, 64, "k", 64, 0) == b  # seeded (and cached)


def test_subtract_baseline():
    m = random_model(n_layers=2, n_heads=2, seed=9)
    raw = circuits.composition_scores(m, "q")
    sub = circuits.composition_scores(m, "q", subtract_baseline=True, baseline_samples=16)
    base = circuits.composition_baseline(16, 6, "q", 16, 0)
    assert torch.allclose(sub[0, :, 1], raw[0, :, 1] - base)
    assert torch.all(sub[1] == 0) and torch.all(sub[:, :, 0] == 0)

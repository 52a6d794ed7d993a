"""Numerics of the weight-space analyses: half-precision models are analysed in float32/float64 (same answer as
their float32 copy within bf16/fp16 rounding), and extreme-but-valid weights (scaled by 1e4 or 1e-6) give finite,
scale-invariant answers."""

from __future__ import annotations

import copy

import pytest
import torch

import circuits
from models import HookedTransformer, HookedTransformerConfig

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def f32():
    cfg = HookedTransformerConfig(n_layers=2, d_model=32, n_ctx=16, d_vocab=200, n_heads=4, d_mlp=None,
                                  normalization_type=None, positional_embedding_type="shortformer", seed=3,
                                  init_range=0.2)
    return HookedTransformer(cfg)


def cast(model, dtype: str):
    m = copy.deepcopy(model).to(getattr(torch, dtype))
    m.cfg.dtype = dtype
    return m


def analyses_of(m):
    ov = circuits.full_ov_circuit(m, 1)
    return {
        "copying_scores": circuits.copying_scores(m),
        "composition_k": circuits.composition_scores(m, "k"),
        "composition_v": circuits.composition_scores(m, "v"),
        "eigen_copying": circuits.copying_score(ov),
        "positive_fraction": circuits.positive_eigenvalue_fraction(ov),
        "top5": circuits.diagonal_rank_stats(ov, k=5)[5],
    }


@pytest.mark.parametrize("dtype,tol", [("bfloat16", 2e-2), ("float16", 4e-3)])
def test_half_precision_models_match_their_float32_copy(f32, dtype, tol):
    half = cast(f32, dtype)
    twin = cast(half, "float32")  # the same (rounded) weights, in float32
    got, ref = analyses_of(half), analyses_of(twin)
    for name in ref:
        assert got[name].dtype in (torch.float64, torch.float32), name
        assert torch.isfinite(got[name]).all(), name
        torch.testing.assert_close(got[name].double(), ref[name].double(), atol=tol, rtol=0, msg=name)
    # eigenvalues themselves: within half-precision rounding of the products, relative to the spectrum's scale
    lam_h = circuits.eigenvalues(circuits.full_ov_circuit(half, 0, 1))
    lam_f = circuits.eigenvalues(circuits.full_ov_circuit(twin, 0, 1))
    assert lam_h.dtype == torch.complex128
    assert float((lam_h - lam_f).abs().max() / lam_f.abs().max()) < 5 * tol


def test_copying_and_composition_scores_of_half_models_are_computed_wide(f32):
    """Beyond the factors' own rounding, no half-precision arithmetic: copying/composition scores of a bf16 model
    equal those of its float32 twin to float32 accuracy."""
    half = cast(f32, "bfloat16")
    twin = cast(half, "float32")
    torch.testing.assert_close(circuits.copying_scores(half), circuits.copying_scores(twin), atol=1e-5, rtol=0)
    torch.testing.assert_close(circuits.composition_scores(half, "q"), circuits.composition_scores(twin, "q"),
                               atol=1e-5, rtol=0)


@pytest.mark.parametrize("scale", [1e4, 1e-6])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_extreme_weight_scales_stay_finite_and_scale_invariant(f32, scale, dtype):
    base = cast(f32, dtype)
    big = copy.deepcopy(base)
    with torch.no_grad():
        for p in big.parameters():
            p.mul_(scale)
    ref = analyses_of(cast(base, "float32"))
    got = analyses_of(big)
    for name in ref:
        assert torch.isfinite(got[name]).all(), (name, scale)
        torch.testing.assert_close(got[name].double(), ref[name].double(), atol=2e-2 if dtype == "bfloat16" else 1e-4,
                                   rtol=0, msg=f"{name} at scale {scale}")
    lam = circuits.eigenvalues(circuits.full_ov_circuit(big, 1, 0))
    assert torch.isfinite(lam).all() and lam.abs().max() > 0


def test_composition_scores_do_not_underflow(f32):
    """float32 squares of 1e-6-scaled products underflowed to 0 before the norms were squared in float64."""
    tiny = copy.deepcopy(f32)
    with torch.no_grad():
        for p in tiny.parameters():
            p.mul_(1e-6)
    s = circuits.composition_scores(tiny, "k")
    assert s[0, :, 1].min() > 0
    torch.testing.assert_close(s, circuits.composition_scores(f32, "k"), atol=1e-4, rtol=0)

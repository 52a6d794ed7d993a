"""bfloat16 / float16 CPU products computed in float32 and rounded once (`models.arch.products`): each product within
one rounding of float64, as torch's own kernel; gradients; a whole model's forward, cache and backward against the
same with torch's kernels; and the rule that decides (dtypes, device and autocast only)."""

from __future__ import annotations

import pytest
import torch
from helpers import in_dtype

from models import HookedTransformer, HookedTransformerConfig
from models.arch import products

REDUCED = [torch.bfloat16, torch.float16]
HALF_ULP = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}  # relative rounding error bound of one rounding


@pytest.fixture
def upcast(monkeypatch):
    """Returns a setter: `upcast(True)` keeps the rule (reduced-precision CPU products in float32), `upcast(False)`
    sends them to torch's own kernels."""
    real = products.in_float32

    def set_to(on: bool) -> None:
        monkeypatch.setattr(products, "in_float32", real if on else (lambda *tensors: False))
    return set_to


def _data(dtype, m=40, k=96, n=24, grad=False):
    g = torch.Generator().manual_seed(0)
    x, W, b = (torch.randn(*s, generator=g).to(dtype) for s in ((m, k), (k, n), (n,)))
    return [t.requires_grad_(grad) for t in (x, W, b)]


def _within_one_rounding(got: torch.Tensor, want: torch.Tensor, terms: torch.Tensor, dtype) -> None:
    """Each entry of `got` within one rounding to `dtype` of the float64 `want`, plus float32 summation slack over
    `terms` (the sum of the absolute products)."""
    bound = HALF_ULP[dtype] * want.abs() + 1e-6 * terms + 1e-30
    excess = float(((got.double() - want).abs() - bound).max())
    assert excess <= 0, excess


@pytest.mark.parametrize("dtype", REDUCED)
@pytest.mark.parametrize("on", [True, False], ids=["float32", "torch's kernel"])
def test_affine_and_matmul_round_once(upcast, dtype, on):
    upcast(on)
    x, W, b = _data(dtype)
    xd, Wd, bd = x.double(), W.double(), b.double()
    terms = xd.abs() @ Wd.abs()
    got = products.affine(b, x, W)
    assert got.dtype == dtype
    _within_one_rounding(got, xd @ Wd + bd, terms + bd.abs(), dtype)
    got = products.matmul(x, W)
    assert got.dtype == dtype
    _within_one_rounding(got, xd @ Wd, terms, dtype)


@pytest.mark.parametrize("dtype", REDUCED)
def test_float32_path_gradients(upcast, dtype):
    upcast(True)
    x, W, b = _data(dtype, grad=True)
    g = torch.randn(40, 24, generator=torch.Generator().manual_seed(1)).to(dtype)
    products.affine(b, x, W).backward(g)
    gd = g.double()
    assert x.grad.dtype == W.grad.dtype == b.grad.dtype == dtype
    _within_one_rounding(x.grad, gd @ W.double().t(), gd.abs() @ W.double().abs().t(), dtype)
    _within_one_rounding(W.grad, x.double().t() @ gd, x.double().abs().t() @ gd.abs(), dtype)
    _within_one_rounding(b.grad, gd.sum(0), gd.abs().sum(0), dtype)


@pytest.mark.parametrize("per_head", [False, True], ids=["fused", "per-head inputs and results"])
@pytest.mark.parametrize("dtype", REDUCED)
def test_model_forward_cache_and_gradients_match_torchs_kernels(upcast, dtype, per_head):
    """The layers and the explicit attention path (`run_with_cache`: scores, pattern, pattern·v with and without
    the causal skip; per-head inputs and results) in float32 against the same model on torch's reduced-precision
    kernels and float64: the same activations in the same dtype, each no further from float64 than 2× torch's."""
    cfg = HookedTransformerConfig(n_layers=2, d_model=64, n_heads=4, d_mlp=128, n_ctx=24, d_vocab=61,
                                  normalization_type="LN", seed=0, dtype="float64", use_attn_result=per_head,
                                  use_split_qkv_input=per_head)
    ref = HookedTransformer(cfg)
    model = in_dtype(ref, str(dtype).removeprefix("torch."))
    tokens = torch.randint(0, 61, (3, 24), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want_logits, want = ref.run_with_cache(tokens)
        runs = {}
        for on in (True, False):
            upcast(on)
            seen = []  # a hook that edits the pattern (here: leaves it) keeps pattern·v off the causal skip
            edit = [("blocks.1.attn.hook_pattern", lambda t, hook: t.clone()),
                    ("blocks.1.attn.hook_z", lambda t, hook, seen=seen: seen.append(t))]
            model.run_with_hooks(tokens, fwd_hooks=edit)
            runs[on] = model.run_with_cache(tokens), seen[0]
    for (logits, cache), z in runs.values():
        assert logits.dtype == dtype and all(cache[name].dtype == dtype for name in cache.keys())
        assert set(cache.keys()) == set(want.keys()) and z.dtype == dtype
    err = lambda got, w: float((got.double() - w).nan_to_num(posinf=0, neginf=0).abs().max() / w.nan_to_num(
        posinf=0, neginf=0).abs().max())
    (fast_logits, fast), fast_z = runs[True]
    (slow_logits, slow), slow_z = runs[False]
    assert err(fast_logits, want_logits) <= 2 * err(slow_logits, want_logits) + 1e-3
    for name in want.keys():
        assert err(fast[name], want[name]) <= 2 * err(slow[name], want[name]) + 1e-3, name
    z = want["blocks.1.attn.hook_z"]
    assert err(fast_z, z) <= 2 * err(slow_z, z) + 1e-3

    grads = {}
    for on in (True, False):
        upcast(on)
        model.zero_grad(set_to_none=True)
        model(tokens, return_type="loss").backward()
        grads[on] = {n: p.grad.double() for n, p in model.named_parameters()}
    ref(tokens, return_type="loss").backward()
    scale = max(float(p.grad.abs().max()) for p in ref.parameters())
    for n, p in ref.named_parameters():
        e_fast = float((grads[True][n] - p.grad).abs().max())
        e_slow = float((grads[False][n] - p.grad).abs().max())
        assert e_fast <= 2 * e_slow + 0.02 * scale, (n, e_fast, e_slow)


class _ReducedProducts(torch.overrides.TorchFunctionMode):
    """Records the products called on bfloat16 / float16 tensors."""

    PRODUCTS = {torch.matmul, torch.mm, torch.bmm, torch.addmm, torch.baddbmm, torch.einsum, torch.Tensor.__matmul__,
                torch.nn.functional.linear}

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if func in self.PRODUCTS and any(t.dtype in REDUCED for t in tensors):
            self.calls.append(func.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("hooks", ["none", "cache", "pattern edited", "generate", "per-head inputs and results"])
def test_no_reduced_precision_product_runs_where_float32_is_chosen(upcast, hooks):
    per_head = hooks == "per-head inputs and results"
    model = HookedTransformer(HookedTransformerConfig(n_layers=2, d_model=32, n_heads=4, d_mlp=64, n_ctx=16,
                                                      d_vocab=50, normalization_type="LN", seed=0, dtype="bfloat16",
                                                      use_attn_result=per_head, use_split_qkv_input=per_head))
    tokens = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(0))
    run = {"none": lambda: model(tokens), "cache": lambda: model.run_with_cache(tokens),
           "pattern edited": lambda: model.run_with_hooks(
               tokens, fwd_hooks=[("blocks.0.attn.hook_pattern", lambda t, hook: t.clone())]),
           "generate": lambda: model.generate(tokens[:, :4], max_new_tokens=8, temperature=0.0),
           "per-head inputs and results": lambda: model.run_with_cache(tokens)}[hooks]
    seen = {}
    for on in (False, True):
        upcast(on)
        with torch.no_grad(), _ReducedProducts() as spy:
            run()
        seen[on] = spy.calls
    assert seen[False] and not seen[True], seen  # torch's kernels were called before, none now


def test_when_the_float32_path_is_taken():
    """By dtype, device and autocast alone: the same call takes the same path in every process."""
    x = torch.ones(4, 4, dtype=torch.float16)
    assert products.in_float32(x) and products.in_float32(x.bfloat16()) and not products.in_float32(x.float())
    assert not products.in_float32(x.double())
    assert products.in_float32(x, x, None)  # absent operands skipped
    assert not products.in_float32(x, x.float())  # one reduced dtype
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not products.in_float32(x)  # autocast chooses its own precision

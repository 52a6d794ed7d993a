"""`models.accel.train_attention`: the training attention on oneDNN's batched matmul agrees with a float64 loop reference
and with `F.scaled_dot_product_attention` (values, gradients, double backward), leaves torch's matmul setting as it
found it, carries a model's training step to the plain path's gradients, and is not taken where it must not be.
Comparisons use tolerances: the kernels round differently."""

import threading

import pytest
import torch
import torch.nn.functional as F
from helpers import attention_loop64

from models import HookedTransformer, HookedTransformerConfig, gemm
from models.accel import train_attention as ta


@pytest.fixture
def exact():
    """oneDNN's batched float32 products are exact here (elsewhere the path is never taken: the probe fails)."""
    if not gemm._matmuls_exact():
        pytest.skip("oneDNN's batched float32 matmul is absent or not float32-exact on this CPU")


@pytest.fixture
def fast_path(exact, monkeypatch):
    """The model takes the oneDNN attention (as on a CPU where both measurements favour oneDNN), not the fused one
    (tests/models/test_fused_attention.py)."""
    monkeypatch.setattr(ta, "_fused", lambda q, bias: False)
    monkeypatch.setattr(gemm, "_decided", {"onednn": "onednn"})
    monkeypatch.setattr(ta, "_decided", {"onednn": True})
    with gemm.use("onednn"):
        yield


def _qkv(B=3, H=4, T=24, dh=8, seed=0, dtype=torch.float32):
    """q, k, v `[batch, pos, head, d_head]` as strided views into one projection output, as the model passes them."""
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(B, T, 3, H, dh, generator=g).to(dtype).requires_grad_()  # the same numbers in float64
    return qkv, [qkv[:, :, i] for i in range(3)]


def _bias(kind, H, T, seed=1):
    g = torch.Generator().manual_seed(seed)
    if kind == "2d":  # additive, with some keys masked (never a whole row: the diagonal stays)
        b = torch.randn(T, T, generator=g)
        return b.masked_fill((torch.rand(T, T, generator=g) < 0.3).fill_diagonal_(False), float("-inf"))
    if kind == "per_head":  # ALiBi-like: −slope·|i − j| per head
        pos = torch.arange(T, dtype=torch.float32)
        return -torch.rand(H, 1, 1, generator=g) * (pos[:, None] - pos[None, :]).abs()
    return None


def _heads_first(fn):
    """`fn` on `[batch, head, pos, d_head]` inputs, called with and returning `[batch, pos, head, d_head]` ones."""
    return lambda q, k, v, *args: fn(*(t.transpose(1, 2) for t in (q, k, v)), *args).transpose(1, 2)


@pytest.mark.parametrize("kind", ["none", "causal", "2d", "per_head"])
def test_values_and_gradients_match_float64_and_sdpa(exact, kind):
    B, H, T, dh = 3, 4, 24, 8
    bias, causal, scale = _bias(kind, H, T), kind == "causal", dh ** -0.5
    dz = torch.randn(B, T, H, dh, generator=torch.Generator().manual_seed(2))
    results = {}
    for name, fn in (("fast", ta.attention), ("sdpa", ta._sdpa), ("float64", attention_loop64)):
        qkv, (q, k, v) = _qkv(B, H, T, dh, dtype=torch.float64 if name == "float64" else torch.float32)
        z = fn(q, k, v, bias, causal, scale)
        (g,) = torch.autograd.grad(z, qkv, dz.to(z.dtype))
        results[name] = z.double(), g.double()
    for other in ("float64", "sdpa"):
        for got, want in zip(results["fast"], results[other]):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("T", [ta.SPLIT_MIN - 2, ta.SPLIT_MIN, ta.SPLIT_MIN + 1, 2 * ta.SPLIT_MIN])
@pytest.mark.parametrize("grads", ["qkv", "q", "kv"])
def test_causal_query_halves_match_float64_and_sdpa(exact, monkeypatch, T, grads):
    """Causal squares of an even length from `SPLIT_MIN` on run in two query halves (`_split_forward`); values and
    the gradients asked for match the float64 loop and torch's attention on both sides of the threshold."""
    calls = []
    split = ta._split_forward
    monkeypatch.setattr(ta, "_split_forward", lambda *a: calls.append(1) or split(*a))
    B, H, dh, scale = 2, 3, 8, 0.3
    dz = torch.randn(B, T, H, dh, generator=torch.Generator().manual_seed(3))
    results = {}
    for name, fn in (("fast", ta.attention), ("sdpa", ta._sdpa), ("float64", attention_loop64)):
        g = torch.Generator().manual_seed(4)
        dtype = torch.float64 if name == "float64" else torch.float32
        qkv = [torch.randn(B, T, H, dh, generator=g).to(dtype).requires_grad_(n in grads) for n in "qkv"]
        z = fn(*qkv, None, True, scale)
        wrt = [t for t in qkv if t.requires_grad]
        results[name] = [z.double(), *(d.double() for d in torch.autograd.grad(z, wrt, dz.to(z.dtype)))]
    assert len(calls) == (T % 2 == 0 and T >= ta.SPLIT_MIN)
    for other in ("float64", "sdpa"):
        for got, want in zip(results["fast"], results[other], strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-5)


def test_grouped_query_heads_match_sdpa(exact):
    """Two key/value heads for four query heads (query head h reads key/value head h // 2), as `enable_gqa`."""
    out = {}
    for name in ("fast", "sdpa"):
        qkv, (q, k, v) = _qkv()
        k, v = k[:, :, :2], v[:, :, :2]
        z = ta.attention(q, k, v, None, True, 0.35) if name == "fast" else F.scaled_dot_product_attention(
            *(t.transpose(1, 2) for t in (q, k, v)), is_causal=True, scale=0.35, enable_gqa=True).transpose(1, 2)
        out[name] = z, *torch.autograd.grad(z.sin().sum(), qkv)
    for got, want in zip(out["fast"], out["sdpa"]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-5)


@_heads_first
def _math_sdpa(q, k, v, bias, causal, scale):
    """torch's math-backend attention (it has a double backward): a reference independent of `ta._explicit`, which
    the double backward differentiates."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, is_causal=causal, scale=scale)


@pytest.mark.parametrize("causal", [True, False])
def test_double_backward_matches_torch_math_attention(exact, causal):
    """`create_graph=True` (which torch's flash kernel does not support) gives the gradients and second derivatives
    of torch's math-backend attention, in float64 (causal, and with a per-head bias)."""
    grads = {}
    for name, fn in (("fast", ta.attention), ("math", _math_sdpa)):
        qkv, (q, k, v) = _qkv(dtype=torch.float64 if name == "math" else torch.float32)
        bias = None if causal else _bias("per_head", 4, 24).to(q.dtype)
        (g,) = torch.autograd.grad(fn(q, k, v, bias, causal, 0.35).sin().sum(), qkv, create_graph=True)
        (gg,) = torch.autograd.grad(g.pow(2).sum(), qkv)
        grads[name] = g, gg
    for got, want in zip(grads["fast"], grads["math"]):
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)


def test_matmul_setting_is_restored(exact):
    setting = torch.backends.mkldnn.matmul
    before = setting.fp32_precision
    qkv, (q, k, v) = _qkv()
    torch.autograd.grad(ta.attention(q, k, v, None, True, 0.35).sum(), qkv)
    assert setting.fp32_precision == before
    with pytest.raises(RuntimeError):  # an error inside the block restores it too
        ta.attention(q, k[:, :5], v, None, False, 0.35)
    assert setting.fp32_precision == before


def test_overlapping_threads_restore_the_setting_once_all_left():
    """Thread A enters, B enters, A leaves (B still computing: oneDNN stays allowed), B leaves: restored."""
    setting = torch.backends.mkldnn.matmul
    before = setting.fp32_precision
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def a():
        with gemm.onednn_matmuls():
            a_in.set()
            b_in.wait(5)
        a_out.set()

    def b():
        a_in.wait(5)
        with gemm.onednn_matmuls():
            b_in.set()
            a_out.wait(5)
            seen["after A left"] = setting.fp32_precision

    threads = [threading.Thread(target=f) for f in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert seen["after A left"] == "bf16"
    assert setting.fp32_precision == before


def _model():
    return HookedTransformerConfig(n_layers=2, d_model=32, n_ctx=48, d_vocab=61, n_heads=4, d_mlp=None,
                                   normalization_type=None, positional_embedding_type="shortformer", seed=0)


def _step_grads(cfg):
    model = HookedTransformer(cfg).train()
    tokens = torch.randint(0, cfg.d_vocab, (4, cfg.n_ctx), generator=torch.Generator().manual_seed(0))
    model(tokens, return_type="loss").backward()
    return {name: p.grad for name, p in model.named_parameters()}


def test_training_step_matches_plain_path(fast_path, monkeypatch):
    calls = []
    real = ta.attention
    monkeypatch.setattr(ta, "attention", lambda *a: calls.append(1) or real(*a))
    fast = _step_grads(_model())
    assert len(calls) == 2, "the oneDNN attention was not taken in training"
    with gemm.use("plain"):  # TOY_CIRCUITS_GEMM=plain: flash attention and MKL products
        plain = _step_grads(_model())
    assert len(calls) == 2, "the plain setting still took the oneDNN attention"
    for name in plain:
        torch.testing.assert_close(fast[name], plain[name], rtol=1e-4, atol=1e-5, msg=name)


def test_not_taken_where_it_must_not_be(fast_path, monkeypatch):
    qkv, (q, k, v) = _qkv()
    assert ta.usable(q, k, v, None, False)
    with torch.no_grad():  # inference keeps the flash kernel
        assert not ta.usable(q, k, v, None, False)
    q64, k64, v64 = (t.double() for t in (q, k, v))
    assert not ta.usable(q64, k64, v64, None, False)
    assert ta.usable(q, k[:, :, :2], v[:, :, :2], None, False)  # grouped-query heads: repeated
    assert not ta.usable(q, k[:, :, :3], v[:, :, :3], None, False)  # 3 key/value heads for 4 query heads
    assert not ta.usable(q, k, v, torch.zeros(3, 1, 24, 24), False)  # a per-sequence mask
    assert not ta.usable(q, k, v, None, True)  # rows that may be masked throughout (padding)
    assert not ta.usable(q, k, v, torch.zeros(24, 24, requires_grad=True), False)  # a learned bias
    long_qkv, (lq, lk, lv) = _qkv(B=1, H=1, T=ta.MAX_LEN + 1, dh=4)
    assert not ta.usable(lq, lk, lv, None, False)
    monkeypatch.setenv("TOY_CIRCUITS_GEMM", "plain")
    # leave `gemm.use("onednn")` for this check, so the environment decides; restored here, not by monkeypatch
    # (whose undo would run after the fixture's `use` block has ended and leave "onednn" forced for later tests)
    forced, gemm._forced = gemm._forced, None
    try:
        assert not ta.usable(q, k, v, None, False)
    finally:
        gemm._forced = forced


def test_hooked_and_explicit_paths_are_untouched(fast_path, monkeypatch):
    """With a pattern hook (run_with_cache, attribution), the explicit path runs, not this one."""
    monkeypatch.setattr(ta, "attention", lambda *a: pytest.fail("oneDNN attention under a pattern hook"))
    names = ["blocks.0.attn.hook_pattern", "blocks.1.attn.hook_pattern"]
    model = HookedTransformer(_model()).train()
    tokens = torch.randint(0, 61, (2, 48), generator=torch.Generator().manual_seed(0))
    seen = []
    hooks = [(name, lambda t, hook: seen.append(t.shape) or t) for name in names]
    model.run_with_hooks(tokens, return_type="loss", fwd_hooks=hooks).backward()
    assert seen == [(2, 4, 48, 48)] * 2


@pytest.mark.parametrize("broken", ["missing", "no grad_input", "wrong values"])
def test_private_softmax_backward_is_checked_before_use(monkeypatch, broken):
    """`torch._softmax_backward_data` (private) is used only where it exists, takes `grad_input=` and writes the
    softmax's backward over its input; otherwise the path is not taken (torch's flash kernel runs, as with
    `TOY_CIRCUITS_GEMM=plain`)."""
    real = torch._softmax_backward_data
    if broken == "missing":
        monkeypatch.delattr(torch, "_softmax_backward_data")
    elif broken == "no grad_input":
        monkeypatch.setattr(torch, "_softmax_backward_data", lambda g, out, dim, dtype: real(g, out, dim, dtype))
    else:
        monkeypatch.setattr(torch, "_softmax_backward_data", lambda g, out, dim, dtype, grad_input: grad_input.zero_())
    monkeypatch.setattr(ta, "_decided", {})
    monkeypatch.setattr(gemm, "_decided", {"onednn": "onednn"})  # the kernel allows the path: only the check refuses
    assert not ta._softmax_backward_in_place()
    with gemm.use("onednn"):
        assert not ta._decide()
        qkv, (q, k, v) = _qkv()
        assert not ta.usable(q, k, v, None, False)


def test_private_softmax_backward_check_passes_on_torch_as_installed():
    assert ta._softmax_backward_in_place()

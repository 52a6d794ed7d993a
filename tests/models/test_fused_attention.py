"""`models.accel.fused_attention`: the compiled training attention agrees with a float64 loop (values and every gradient,
causal and unmasked, lengths on and off its 16-wide vectors, every `d_head` it takes, strided inputs), gives the same
bits at any thread count, carries a model's training step to the plain path's gradients, writes the gradients of a
split projection into one buffer, and is refused as its module says (building and loading: test_kernels.py). Skipped
where no C++ compiler can build it (the batched products run there instead)."""

import pytest
import torch
from helpers import attention_loop64, kernels_built_for

from models import HookedTransformer, HookedTransformerConfig, attention, gemm
from models.accel import fused_attention as fa
from models.accel import train_attention as ta
from models.errors import ConfigError


@pytest.fixture
def kernel():
    if fa.library() is None:
        pytest.skip(f"the fused attention is not built here: {fa.why_not()}")


def _inputs(B, T, H, D, seed=0):
    """q, k, v as strided views of one projection output `[B, T, 3, H, D]` (as the model passes them) and dz."""
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(B, T, 3, H, D, generator=g)
    return qkv.unbind(2), torch.randn(B, T, H, D, generator=g)


def _loop64(q, k, v, dz, causal, scale):
    """z and dq, dk, dv in float64 by autograd over one (sequence, head) at a time: the independent reference."""
    x = [t.double().requires_grad_() for t in (q, k, v)]
    z = attention_loop64(*x, None, causal, scale)
    return [z.detach(), *torch.autograd.grad(z, x, dz.double())]


def _close(got, want, rtol=3e-6, atol=1e-7):
    """Within `rtol` of the reference's largest entry (float32 products of ≤ 200 terms), or `atol` where that is 0
    (one position: its query's gradient)."""
    for a, b in zip(got, want, strict=True):
        assert a.dtype == torch.float32
        assert float((a.double() - b).abs().max()) <= rtol * float(b.abs().max()) + atol


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("T,D", [(1, 32), (2, 16), (3, 48), (5, 16), (7, 64), (16, 64), (37, 48), (66, 32),
                                 (128, 32), (200, 16)])
def test_values_and_gradients_match_float64(kernel, causal, T, D):
    (q, k, v), dz = _inputs(2, T, 3, D)
    z, lse = fa.forward(q, k, v, causal, 0.7 / D ** 0.5)
    got = [z, *fa.backward(q, k, v, dz, lse, causal, 0.7 / D ** 0.5, (True, True, True))]
    _close(got, _loop64(q, k, v, dz, causal, 0.7 / D ** 0.5))
    # the rows' log-sum-exp, as the backward reads it
    s = torch.einsum("bthd,bshd->bhts", q.double(), k.double()) * 0.7 / D ** 0.5
    if causal:
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    torch.testing.assert_close(lse.double(), s.logsumexp(-1).flatten(0, 1), rtol=0, atol=1e-5)


def test_only_the_gradients_asked_for_and_strided_dz(kernel):
    (q, k, v), dz = _inputs(2, 39, 2, 32, seed=1)
    z, lse = fa.forward(q, k, v, True, 0.2)
    want = _loop64(q, k, v, dz, True, 0.2)
    dz_spread = torch.full((2, 39, 2, 64), float("nan"))[..., :32].copy_(dz)  # rows and heads apart: read in place
    dq, dk, dv = fa.backward(q, k, v, dz_spread, lse, True, 0.2, (False, True, True))
    assert dq is None
    _close([dk, dv], want[2:])
    dz_strided = torch.empty(2, 39, 2, 64)[..., ::2].copy_(dz)  # d_head not contiguous: copied first
    dq, dk, dv = fa.backward(q, k, v, dz_strided, lse, True, 0.2, (True, False, False))
    assert dk is None and dv is None
    _close([dq], [want[1]])


def test_wrong_inputs_are_refused_before_the_kernel_reads_them(kernel):
    (q, k, v), dz = _inputs(1, 8, 2, 32)
    z, lse = fa.forward(q, k, v, True, 0.2)
    with pytest.raises(ValueError, match="float32 CPU"):
        fa.forward(q.double(), k, v, True, 0.2)
    with pytest.raises(ValueError, match="of one shape"):
        fa.forward(q, k[:, :, :1], v, True, 0.2)  # one key head for two query heads: would read past k
    with pytest.raises(ValueError, match="lse must be"):
        fa.backward(q, k, v, dz, lse[:1], True, 0.2, (True, True, True))


def test_the_same_bits_at_any_thread_count(kernel):
    """Each (sequence, head) pair is one thread's work, so the thread count cannot change a result."""
    (q, k, v), dz = _inputs(3, 70, 4, 32, seed=2)
    threads = torch.get_num_threads()
    out = []
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            z, lse = fa.forward(q, k, v, True, 0.3)
            out.append([z, lse, *fa.backward(q, k, v, dz, lse, True, 0.3, (True, True, True))])
    finally:
        torch.set_num_threads(threads)
    for other in out[1:]:
        assert all(torch.equal(a, b) for a, b in zip(out[0], other))


def test_nan_spreads_to_its_rows_only(kernel):
    """A NaN query gives NaN in its own rows of z (as torch's softmax), none elsewhere."""
    (q, k, v), _ = _inputs(1, 20, 1, 16, seed=3)
    q = q.clone()
    q[0, 7, 0, 3] = float("nan")
    z, _ = fa.forward(q, k, v, True, 0.25)
    assert z[0, 7].isnan().all() and not z[0, :7].isnan().any() and not z[0, 8:].isnan().any()


@pytest.mark.parametrize("causal", [True, False])
def test_the_training_attention_takes_it_and_its_double_backward(kernel, monkeypatch, causal):
    """`models.accel.train_attention.attention` runs `_FusedAttention` for a `d_head` of 16 (values and the kernel's
    gradients as the float64 loop), and a double backward differentiates the explicit attention (the kernel has
    none)."""
    monkeypatch.setattr(ta, "_fused_decided", {})
    monkeypatch.setattr(ta, "_fused_faster", lambda: True)  # the measurement is the CPU's; the path is the test's
    (q, k, v), dz = _inputs(2, 33, 2, 16, seed=4)
    x = [t.clone().requires_grad_() for t in (q, k, v)]
    assert ta.usable(*x, None, False) and ta._fused(x[0], None)
    z = ta.attention(*x, None, causal, 0.3)
    assert z.grad_fn.name() == "_FusedAttentionBackward"
    _close([z.detach(), *torch.autograd.grad(z, x, dz, retain_graph=True)], _loop64(q, k, v, dz, causal, 0.3))
    g = torch.autograd.grad(z, x, dz, create_graph=True)
    gg = torch.autograd.grad(sum(t.pow(2).sum() for t in g), x)
    x64 = [t.double().requires_grad_() for t in (q, k, v)]
    g64 = torch.autograd.grad(ta._explicit(*x64, None, causal, 0.3), x64, dz.double(), create_graph=True)
    want = torch.autograd.grad(sum(t.pow(2).sum() for t in g64), x64)
    for a, b in zip([*g, *gg], [*g64, *want]):
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("positions", ["shortformer", "standard"])
def test_a_training_step_matches_the_plain_path(kernel, monkeypatch, positions):
    """The step's gradients against torch's kernels; q, k, v's gradients reach the projection as one buffer (its
    split's backward concatenates nothing): q and k's with Shortformer positions (v reads the residual stream
    alone), all three's otherwise."""
    monkeypatch.setattr(ta, "_fused_decided", {})
    monkeypatch.setattr(ta, "_fused_faster", lambda: True)
    assert ta._fused(torch.zeros(1, 8, 2, 32), None)  # decided (the probe's own calls are not counted below)
    calls = []
    real = fa.forward
    monkeypatch.setattr(fa, "forward", lambda *a: calls.append(1) or real(*a))
    cfg = HookedTransformerConfig(n_layers=2, d_model=64, n_ctx=40, d_vocab=61, n_heads=2, d_mlp=None,
                                  normalization_type=None, positional_embedding_type=positions, seed=0)
    tokens = torch.randint(0, 61, (3, 40), generator=torch.Generator().manual_seed(0))
    taken_whole = []  # per split of a projection's output: its gradient is the incoming gradients' own storage
    split_backward = attention._Columns.backward

    def watched(ctx, *g):
        out = split_backward(ctx, *g)
        taken_whole.append(out[0].untyped_storage().data_ptr() == g[0].untyped_storage().data_ptr())
        return out

    monkeypatch.setattr(attention._Columns, "backward", staticmethod(watched))

    def grads():
        model = HookedTransformer(cfg).train()
        model(tokens, return_type="loss").backward()
        return {name: p.grad for name, p in model.named_parameters()}

    fused = grads()
    assert len(calls) == 2, "the fused attention was not taken in training"
    assert taken_whole == [True, True], "the gradients of q, k, v were concatenated"
    monkeypatch.setenv(fa.ENV, "off")
    with gemm.use("plain"):  # torch's flash attention and MKL products
        plain = grads()
    assert len(calls) == 2, f"{fa.ENV}=off still took the fused attention"
    for name in plain:
        torch.testing.assert_close(fused[name], plain[name], rtol=1e-4, atol=1e-5, msg=name)


def _split_views(B, T, H, D, widths, seed=0):
    """q, k, v `[B, T, H, D]` as a projection gives them: column blocks of 2-D buffers `[B·T, width]`, `widths` the
    number of them per buffer (3: one buffer; 2, 1: Shortformer's q and k, then v)."""
    g = torch.Generator().manual_seed(seed)
    views = []
    for n in widths:
        views += [t.view(B, T, H, D) for t in torch.randn(B * T, n * H * D, generator=g).split(H * D, -1)]
    return views


@pytest.mark.parametrize("widths,need,shared", [((3,), (True, True, True), [[0, 1, 2]]),
                                                ((2, 1), (True, True, True), [[0, 1], [2]]),
                                                ((3,), (True, False, True), []),
                                                ((2, 1), (False, True, True), [[2]])])
def test_gradients_of_a_split_projection_share_its_layout(kernel, widths, need, shared):
    """Inputs that tile one projection buffer get their gradients at the same places in one new buffer (no
    concatenation later); others (a buffer not tiled by the gradients asked for) get contiguous ones. The same
    bits either way."""
    q, k, v = _split_views(2, 37, 2, 32, widths)
    dz = torch.randn(2, 37, 2, 32)
    z, lse = fa.forward(q, k, v, True, 0.2)
    got = fa.backward(q, k, v, dz, lse, True, 0.2, need)
    plain = fa.backward(q.contiguous(), k.contiguous(), v.contiguous(), dz, lse, True, 0.2, need)
    for a, b in zip(got, plain):
        assert (a is None) == (b is None) and (a is None or torch.equal(a, b))
    grouped = [i for group in shared for i in group]
    for group in shared:
        base = got[group[0]]._base
        assert base is not None and base.is_contiguous() and all(got[i]._base is base for i in group)
        inputs = (q, k, v)
        for i in group:
            assert got[i].stride() == inputs[i].stride()
            assert got[i].storage_offset() - base.storage_offset() == inputs[i].storage_offset()
    for i, g in enumerate(got):
        if g is not None and i not in grouped:
            assert g.is_contiguous() and g._base is None


def test_the_split_takes_packed_gradients_whole():
    """`models.arch.attention._Columns`: gradients that are its column blocks in place come back as their buffer (no
    copy); separate ones, and a missing one (zeros), are concatenated; its double backward is torch's."""
    from models.arch.attention import _Columns, _columns

    y = torch.randn(6, 7, dtype=torch.float64, requires_grad=True)
    seen = []
    mid = y * 1
    mid.register_hook(lambda g: seen.append(g))
    outs = _columns(mid, [3, 4])
    buffer = torch.randn(6, 7, dtype=torch.float64)
    torch.autograd.backward(outs, [buffer[:, :3], buffer[:, 3:]])
    assert seen[0].data_ptr() == buffer.data_ptr() and torch.equal(seen[0], buffer)
    y.grad = None
    a, b = torch.randn(6, 3, dtype=torch.float64), torch.randn(6, 4, dtype=torch.float64)
    torch.autograd.backward(_columns(y * 1, [3, 4]), [a, b])
    assert torch.equal(y.grad, torch.cat([a, b], -1))
    y.grad = None
    _columns(y * 1, [3, 4])[1].backward(b)
    assert torch.equal(y.grad, torch.cat([torch.zeros(6, 3, dtype=torch.float64), b], -1))
    assert torch.autograd.gradcheck(lambda t: _Columns.apply(t, 2, 5), y)
    assert torch.autograd.gradgradcheck(lambda t: _Columns.apply(t, 2, 5), y)
    assert _columns(y, [7])[0] is y  # one block: the tensor itself


def test_not_taken_for_shapes_it_does_not_cover(kernel):
    (q, k, v), _ = _inputs(1, 8, 2, 32)
    assert fa.takes(q, None)
    assert not fa.takes(q, torch.zeros(8, 8))  # a bias keeps the batched products
    assert not fa.takes(torch.zeros(1, 8, 2, 24), None)  # d_head not a multiple of 16
    assert not fa.takes(torch.zeros(1, 8, 2, 80), None)  # wider than its register blocks
    with pytest.raises(ValueError, match="d_head"):
        fa.forward(*(torch.zeros(1, 8, 2, 24) for _ in range(3)), True, 0.1)


def test_off_and_bad_settings(fresh_kernels, monkeypatch):
    monkeypatch.setenv(fa.ENV, "off")
    assert fa.library() is None and fa.why_not() == f"{fa.ENV}=off"
    assert not ta._fused(torch.zeros(1, 8, 2, 32), None)
    monkeypatch.setenv(fa.ENV, "fast")
    with pytest.raises(ConfigError, match="allowed: auto, off"):
        fa.library()


@pytest.mark.parametrize("wrong_for", [32, 64])
@pytest.mark.parametrize("where", ["values", "gradients"])
def test_probe_refuses_a_wrong_kernel(kernel, monkeypatch, wrong_for, where):
    """A kernel whose values or gradients are off for one `d_head` (a miscompile of one register block) is not used:
    the probe compares every head size with the float64 reference first."""
    assert ta._fused_exact()
    name = "forward" if where == "values" else "backward"
    real = getattr(fa, name)

    def off(q, *args):
        out = real(q, *args)
        if q.shape[-1] != wrong_for:
            return out
        return (out[0] * (1 + 1e-4), out[1]) if where == "values" else [g * (1 + 1e-4) for g in out]

    monkeypatch.setattr(fa, name, off)
    assert not ta._fused_exact()
    monkeypatch.setattr(ta, "_fused_decided", {})
    assert not ta._fused(torch.zeros(1, 8, 2, 16), None)


def test_gemm_plain_turns_it_off(kernel, monkeypatch):
    """`TOY_CIRCUITS_GEMM=plain` asks for torch's own kernels: neither the fused nor the batched attention runs."""
    monkeypatch.setattr(ta, "_fused_decided", {})
    monkeypatch.setattr(ta, "_fused_faster", lambda: True)
    x = [t.clone().requires_grad_() for t in _inputs(1, 16, 2, 32)[0]]
    assert ta._fused(x[0], None)
    with gemm.use("plain"):
        assert not ta._fused(x[0], None) and not ta.usable(*x, None, False)


@pytest.mark.slow
@pytest.mark.parametrize("target", ["x86-64", "x86-64-v3"])
def test_other_vector_widths_give_the_same_results(fresh_kernels, monkeypatch, target):
    """The kernel's 16-float vectors lowered to SSE2 (x86-64) and AVX2 (x86-64-v3) instead of this CPU's widest:
    built through the same loader and compared with the float64 loop (aarch64 was checked the same way under qemu,
    benchmarks/README.md)."""
    kernels_built_for(target, monkeypatch)
    for causal in (True, False):
        (q, k, v), dz = _inputs(2, 45, 2, 48, seed=5)
        z, lse = fa.forward(q, k, v, causal, 0.15)
        got = [z, *fa.backward(q, k, v, dz, lse, causal, 0.15, (True, True, True))]
        _close(got, _loop64(q, k, v, dz, causal, 0.15))

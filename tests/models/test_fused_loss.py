"""`models.accel.fused_loss`: the compiled cross-entropy agrees with float64 `F.cross_entropy` (losses and gradients, ignored
rows, vocabularies on and off its 16-wide vectors, strided rows, extreme logits), gives the same bits at any thread
count, carries a model's loss and its gradients to the plain path's, has a double backward, raises on bad targets
as torch does, and steps aside where it does not apply. Skipped where no C++ compiler can build it."""

import pytest
import torch
import torch.nn.functional as F
from helpers import kernels_built_for

from models import HookedTransformer, HookedTransformerConfig, fused_loss, gemm
from models.errors import ConfigError

FL = fused_loss._FusedCrossEntropy
FASTER = fused_loss._faster  # the real probe (the `kernel` fixture replaces it)


@pytest.fixture
def kernel(monkeypatch):
    if fused_loss.kernels.library() is None:
        pytest.skip(f"the compiled kernels are not built here: {fused_loss.why_not()}")
    # chosen at the default settings without the probes (tested on their own below): the path is the test's
    monkeypatch.setattr(fused_loss, "_decided", {("auto", "auto"): True})
    monkeypatch.setattr(fused_loss, "_faster", lambda: True)  # the measurement is the CPU's
    monkeypatch.delenv(gemm.ENV, raising=False)
    monkeypatch.delenv(fused_loss.ENV, raising=False)


@pytest.fixture
def kernel_calls(kernel, monkeypatch):
    """The shapes of the logits each call of the kernel's function saw."""
    seen = []
    real = FL.apply
    monkeypatch.setattr(FL, "apply", lambda x, t: seen.append(tuple(x.shape)) or real(x, t))
    return seen


def _case(N, V, spread=3.0, seed=0, ignore_every=3):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, V, generator=g) * spread
    t = torch.randint(0, V, (N,), generator=g)
    t[::ignore_every] = -100
    return x, t, torch.randn(N, generator=g)


def _reference(x, t, dl):
    """Per-row losses and the logits' gradient for the row weights `dl`, float64 `F.cross_entropy`."""
    x64 = x.detach().double().requires_grad_()
    losses = F.cross_entropy(x64, t, reduction="none")
    (grad,) = torch.autograd.grad(losses, x64, dl.double())
    return losses.detach(), grad


def _close(got, want, dl, rtol=1e-6):
    """Losses within `rtol` of the largest (1e-7 absolute: a loss near 0 is `m − x_t + log(1 + tiny)`), gradients within
    `rtol` of the largest row weight (|g · (p − 1)| near the target keeps g's rounding; float32 torch: ≤ 1.3e-7 on
    these cases)."""
    (losses, grad), (losses64, grad64) = got, want
    assert losses.dtype == grad.dtype == torch.float32
    assert float((losses.double() - losses64).abs().max()) <= rtol * float(losses64.abs().max()) + 1e-7
    assert float((grad.double() - grad64).abs().max()) <= rtol * float(dl.abs().max())


@pytest.mark.parametrize("N,V", [(1, 1), (3, 2), (7, 16), (37, 45), (64, 512), (5, 1000), (19, 33)])
@pytest.mark.parametrize("spread", [0.1, 3.0, 40.0])
@pytest.mark.parametrize("seed", [0, 1])
def test_losses_and_gradients_match_float64(kernel, N, V, spread, seed):
    x, t, dl = _case(N, V, spread, seed)
    x.requires_grad_()
    losses = FL.apply(x, t)
    (grad,) = torch.autograd.grad(losses, x, dl)
    _close([losses.detach(), grad], _reference(x, t, dl), dl)
    assert torch.all(losses[t == -100] == 0) and torch.all(grad[t == -100] == 0)


@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.parametrize("rows", ["contiguous", "every other row"])
def test_cross_entropy_is_f_cross_entropy(kernel_calls, reduction, rows):
    """The public function (its reduction and ignored rows) against torch's, on contiguous rows and on every other
    row of a buffer (a row stride of 2 V, read in place)."""
    logits = torch.randn(36, 40, generator=torch.Generator().manual_seed(1)) * 4
    x = logits if rows == "contiguous" else logits[::2]
    t = torch.randint(0, 40, (x.shape[0],), generator=torch.Generator().manual_seed(2))
    t[3] = -100
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    got, want = fused_loss.cross_entropy(a, t, reduction), F.cross_entropy(b, t, reduction=reduction)
    dl = torch.randn(want.shape)
    got.backward(dl)
    want.backward(dl)
    torch.testing.assert_close(got, want, rtol=2e-6, atol=2e-6)
    torch.testing.assert_close(a.grad, b.grad, rtol=2e-6, atol=1e-7)
    assert kernel_calls == [tuple(x.shape)]


def test_rows_read_in_place(kernel, monkeypatch):
    """Rows with a stride (every other row of a buffer) are read where they are, not copied first."""
    base = torch.randn(20, 33)
    rows = base[::2]
    t = torch.randint(0, 33, (10,))
    seen = []
    real = FL.apply
    monkeypatch.setattr(FL, "apply", lambda x, tt: seen.append(x.data_ptr() == base.data_ptr() and x.stride(0) == 66)
                        or real(x, tt))
    fused_loss.cross_entropy(rows, t)
    assert seen == [True]


def test_all_rows_ignored_and_nonfinite_logits_as_torch(kernel_calls):
    x, _, _ = _case(4, 20)
    t = torch.full((4,), -100)
    assert torch.isnan(fused_loss.cross_entropy(x, t)) and torch.isnan(F.cross_entropy(x, t))  # 0 / 0
    x[1, 3] = float("nan")
    x[2, 5] = float("inf")
    t = torch.tensor([1, 2, 3, 4])
    got, want = fused_loss.cross_entropy(x, t, "none"), F.cross_entropy(x, t, reduction="none")
    assert torch.equal(torch.isnan(got), torch.isnan(want)) and torch.isnan(got[1:3]).all()
    torch.testing.assert_close(got[[0, 3]], want[[0, 3]])
    assert kernel_calls == [(4, 20), (4, 20)]
    x = torch.full((2, 40), -float("inf"))  # −inf logits: gradient exactly 0 there, as torch (vector and tail)
    x[:, 5] = 1.0
    x[1, 37] = 0.5
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    fused_loss.cross_entropy(a, torch.tensor([5, 37])).backward()
    F.cross_entropy(b, torch.tensor([5, 37])).backward()
    assert torch.equal(a.grad == 0, b.grad == 0) and int((a.grad == 0).sum()) == 78  # all but row 1's two
    torch.testing.assert_close(a.grad, b.grad)
    ignored = torch.randn(3, 20)
    ignored[1, 4] = float("nan")
    c = ignored.clone().requires_grad_()
    fused_loss.cross_entropy(c, torch.tensor([1, -100, 2]), "none").sum().backward()
    assert torch.equal(c.grad[1], torch.zeros(20)) and torch.isfinite(c.grad).all()  # an ignored row: exactly 0


def test_the_function_checks_what_it_reads(kernel):
    """Called directly, the kernel's function refuses inputs it would read wrongly (int32 targets, a strided
    vocabulary axis, a length mismatch, float64, strided targets) instead of reading past them."""
    x, t, _ = _case(4, 8)
    strided_t = torch.stack([t, t], 1)[:, 0]
    for args in ((x, t.int()), (x.t().contiguous().t(), t), (x, t[:3]), (x.double(), t), (x, strided_t)):
        with pytest.raises(ValueError, match="fused loss takes"):
            FL.apply(*args)


@pytest.mark.parametrize("bad", [7, 100, -1, -101])
def test_a_target_out_of_range_raises_as_torch(kernel_calls, bad):
    x, _, _ = _case(4, 7)
    t = torch.tensor([0, 1, bad, 2])
    with pytest.raises(IndexError, match="out of bounds"):
        fused_loss.cross_entropy(x, t)
    assert kernel_calls == [(4, 7)]  # the kernel found it (and torch's own error names it)


def test_the_same_bits_at_any_thread_count(kernel):
    x, t, dl = _case(333, 515)
    results = []
    for threads in (1, 2, 3):
        torch.set_num_threads(threads)
        a = x.clone().requires_grad_()
        losses = FL.apply(a, t)
        losses.backward(dl)
        results.append((losses.detach(), a.grad))
    for other in results[1:]:
        assert all(torch.equal(u, w) for u, w in zip(results[0], other))


def test_double_backward_matches_float64(kernel):
    """Under `create_graph=True` the gradient is differentiable: its Hessian-vector product and its derivative in
    the row weights against float64 torch."""
    x, t, dl = _case(6, 13)
    v = torch.randn(6, 13)
    a, b = x.clone().requires_grad_(), x.double().requires_grad_()
    w32, w64 = dl.clone().requires_grad_(), dl.double().requires_grad_()
    out = []
    for inp, w, fn in ((a, w32, FL.apply), (b, w64, lambda u, tt: F.cross_entropy(u, tt, reduction="none"))):
        (g,) = torch.autograd.grad(fn(inp, t), inp, w, create_graph=True)
        out.append(torch.autograd.grad((g * v.to(g.dtype)).sum(), (inp, w)))
    for a, b in zip(out[0], out[1]):
        assert float((a.double() - b).abs().max()) <= 1e-5 * float(b.abs().max())


def test_falls_back_where_it_does_not_apply(kernel, monkeypatch):
    """Other dtypes, label smoothing, a strided vocabulary axis, other reductions, forward-mode AD and functorch
    transforms run `F.cross_entropy` (with its results)."""
    from torch.autograd import forward_ad

    calls = []
    real = FL.apply
    monkeypatch.setattr(FL, "apply", lambda *a: calls.append(1) or real(*a))
    x, t, _ = _case(8, 10)
    fused_loss.cross_entropy(x, t)
    assert calls == [1]
    for args, kw in (((x.double(), t), {}), ((x, t), {"label_smoothing": 0.1}), ((x.t().contiguous().t(), t), {}),
                     ((x, t), {"reduction": "sum"})):
        kw_torch = {"reduction": kw.get("reduction", "mean"), "label_smoothing": kw.get("label_smoothing", 0.0)}
        torch.testing.assert_close(fused_loss.cross_entropy(*args, **kw), F.cross_entropy(*args, **kw_torch))
    with pytest.raises(RuntimeError, match="Long"):  # torch's own error for int32 targets
        fused_loss.cross_entropy(x, t.int())
    tangent = torch.randn(8, 10)
    with forward_ad.dual_level():
        got = forward_ad.unpack_dual(fused_loss.cross_entropy(forward_ad.make_dual(x, tangent), t)).tangent
        want = forward_ad.unpack_dual(F.cross_entropy(forward_ad.make_dual(x, tangent), t)).tangent
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(torch.func.grad(lambda u: fused_loss.cross_entropy(u, t))(x),
                               torch.func.grad(lambda u: F.cross_entropy(u, t))(x))
    assert calls == [1]


def test_a_models_loss_and_gradients_match_the_plain_path(kernel, monkeypatch):
    """`model(tokens, return_type="loss")` (per token too, and with padding) on the kernel against
    `TOY_CIRCUITS_FUSED_LOSS=off`."""
    cfg = HookedTransformerConfig(n_layers=1, d_model=32, n_ctx=12, d_vocab=37, n_heads=2, d_mlp=None,
                                  normalization_type=None, seed=0)
    model = HookedTransformer(cfg)
    tokens = torch.randint(0, 37, (3, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[1, :4] = 0

    def run(**kw):
        model.zero_grad()
        loss = model(tokens, return_type="loss", **kw)
        (loss.sum() if loss.dim() else loss).backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    calls = []
    real = FL.apply
    monkeypatch.setattr(FL, "apply", lambda *a: calls.append(1) or real(*a))
    for kw in ({}, {"loss_per_token": True}, {"attention_mask": mask}):
        fused = run(**kw)
        monkeypatch.setenv(fused_loss.ENV, "off")
        plain = run(**kw)
        monkeypatch.delenv(fused_loss.ENV)
        torch.testing.assert_close(fused[0], plain[0], rtol=1e-6, atol=1e-6)
        for name in plain[1]:
            torch.testing.assert_close(fused[1][name], plain[1][name], rtol=1e-5, atol=1e-7, msg=name)
    assert len(calls) == 3


@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_first_decided_in_an_evaluation(kernel_calls, monkeypatch, mode):
    """The probes differentiate: a first call under `no_grad` or `inference_mode` still decides (both probes run
    their autograd; the timing verdict is the CPU's, so each contender runs once here), and uses the kernel."""
    ran = []

    def once_each(plain, fast, repeats, gain):
        plain(), fast()
        ran.append((repeats, gain))
        return True

    monkeypatch.setattr(fused_loss, "_decided", {})
    monkeypatch.setattr(fused_loss, "_faster", FASTER)
    monkeypatch.setattr(gemm, "beats_per_core", once_each)
    x, t, _ = _case(5, 9)
    with mode():
        got = fused_loss.cross_entropy(x, t, "none")
    assert fused_loss._decided == {("auto", "auto"): True} and ran == [(7, 1.0)]  # not slower than torch's
    assert kernel_calls[-1] == (5, 9)
    torch.testing.assert_close(got, F.cross_entropy(x, t, reduction="none"))


def test_settings(kernel, monkeypatch):
    monkeypatch.setenv(fused_loss.ENV, "off")
    assert not fused_loss._chosen() and fused_loss.why_not() == f"{fused_loss.ENV}=off"
    monkeypatch.setenv(fused_loss.ENV, "fast")
    with pytest.raises(ConfigError, match="allowed: auto, off"):
        fused_loss.cross_entropy(*_case(3, 4)[:2])
    monkeypatch.delenv(fused_loss.ENV)
    assert fused_loss._chosen() and fused_loss.why_not() == ""
    with gemm.use("plain"):  # torch's own kernels only
        assert not fused_loss._chosen() and "plain" in fused_loss.why_not()


@pytest.mark.parametrize("where", ["losses", "gradients"])
def test_probe_refuses_a_wrong_kernel(kernel, monkeypatch, where):
    """A kernel whose losses or gradients are off by 1e-4 (a miscompile) is not used."""
    assert fused_loss._exact()
    off = (1 + 1e-4, 1.0) if where == "losses" else (1.0, 1 + 1e-4)

    class Off(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, t):
            ctx.save_for_backward(x, t)
            return F.cross_entropy(x, t, reduction="none") * off[0]

        @staticmethod
        def backward(ctx, g):
            x, t = ctx.saved_tensors
            onehot = F.one_hot(t.clamp(min=0), x.shape[1])
            return (torch.softmax(x, -1) - onehot) * (g * (t != -100))[:, None] * off[1], None

    monkeypatch.setattr(fused_loss, "_decided", {})
    assert fused_loss._chosen()
    monkeypatch.setattr(fused_loss, "_FusedCrossEntropy", Off)
    monkeypatch.setattr(fused_loss, "_decided", {})
    assert not fused_loss._exact() and not fused_loss._chosen()


@pytest.mark.slow
@pytest.mark.parametrize("target", ["x86-64", "x86-64-v3"])
def test_other_vector_widths_give_the_same_results(fresh_kernels, monkeypatch, target):
    """The kernel's 16-float vectors lowered to SSE2 (x86-64) and AVX2 (x86-64-v3) instead of this CPU's widest,
    built through the loader and compared with float64 (aarch64 was checked the same way under qemu,
    benchmarks/README.md)."""
    kernels_built_for(target, monkeypatch)
    for N, V, spread in ((37, 45, 3.0), (19, 512, 40.0), (4, 15, 0.1)):
        x, t, dl = _case(N, V, spread, seed=7)
        x.requires_grad_()
        losses = FL.apply(x, t)
        (grad,) = torch.autograd.grad(losses, x, dl)
        _close([losses.detach(), grad], _reference(x, t, dl), dl)

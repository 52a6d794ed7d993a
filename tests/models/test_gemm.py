"""`models.accel.gemm`: the oneDNN fast path agrees with the plain `x @ W + b` (values and every kind of gradient), and the
calls it must not take (strided weights, few rows, float64, functorch, the `plain` switch) run the plain kernel.
Comparisons use tolerances: the kernels round differently."""

import pytest
import torch

from models import ConfigError, HookedTransformer, HookedTransformerConfig, gemm


@pytest.fixture
def onednn(monkeypatch):
    """The oneDNN path, wherever torch has the operator (on CPUs without AVX-512 too: the capability gate and the
    measurement only decide whether it is worth it, not whether it is right)."""
    try:
        x, W, b = _data()
        gemm._onednn(x, W.t(), b)
    except (AttributeError, RuntimeError, NotImplementedError):
        pytest.skip("torch has no working oneDNN linear here")
    monkeypatch.setattr(gemm, "_decided", {"onednn": "onednn"})
    with gemm.use("onednn"):
        yield


@pytest.fixture
def no_onednn(monkeypatch):
    """Calls that must take the plain kernel fail loudly if they reach oneDNN."""
    def refuse(*args):
        raise AssertionError("oneDNN was called")
    monkeypatch.setattr(gemm, "_onednn", refuse)


def _data(m=64, k=48, n=40, grad=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    x, W, b = torch.randn(m, k, generator=g), torch.randn(k, n, generator=g), torch.randn(n, generator=g)
    return [t.requires_grad_(grad) for t in (x, W, b)]


def _plain_and_fast(fn):
    with gemm.use("plain"):
        ref = fn()
    return ref, fn()


@pytest.mark.parametrize("zero_bias", [False, True])
def test_forward_matches_plain(onednn, zero_bias):
    x, W, b = _data()
    if zero_bias:
        b = torch.zeros_like(b)
    ref, got = _plain_and_fast(lambda: gemm.affine(b, x, W))
    torch.testing.assert_close(got, x @ W + b, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("matmuls", [False, True], ids=["dW-linear", "dW-matmul"])
def test_backward_matches_plain(onednn, monkeypatch, matmuls):
    """Both routes of dW = xᵀ g: `_onednn` on a copied xᵀ, and `onednn_matmuls` reading xᵀ in place."""
    if matmuls and not gemm._matmuls_exact():
        pytest.skip("torch's float32 matmul on oneDNN is absent or not float32-exact here")
    monkeypatch.setattr(gemm, "_matmuls_decided", {"onednn": matmuls})

    def grads():
        x, W, b = _data(grad=True)
        (gemm.affine(b, x, W).sin().sum()).backward()
        return x.grad, W.grad, b.grad
    for r, g in zip(*_plain_and_fast(grads)):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")  # torch's forward_ad import
def test_double_backward_and_forward_ad_match_plain(onednn):
    def second():
        x, W, b = _data(grad=True)
        gx, = torch.autograd.grad(gemm.affine(b, x, W).pow(2).sum(), x, create_graph=True)
        return torch.autograd.grad(gx.sum(), (W, b))

    def tangent():
        import torch.autograd.forward_ad as fwad
        x, W, b = _data()
        tx, tW, _ = _data(seed=1)
        with fwad.dual_level():
            out = gemm.affine(b, fwad.make_dual(x, tx), fwad.make_dual(W, tW))
            return (fwad.unpack_dual(out).tangent,)
    for fn in (second, tangent):
        for r, g in zip(*_plain_and_fast(fn)):
            torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-4)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_vmap_and_jacobian_take_the_plain_kernel(onednn, no_onednn):
    x, W, b = _data()
    out = torch.func.vmap(lambda row: gemm.affine(b, row, W))(x[:, None].expand(-1, 40, -1).contiguous())
    torch.testing.assert_close(out[:, 0], x @ W + b)
    jac = torch.func.jacrev(lambda W_: gemm.affine(b, x, W_))(W)
    assert jac.shape == (64, 40, 48, 40)


@pytest.mark.parametrize("case", ["few rows", "float64", "plain switch", "autocast"])
def test_calls_that_must_not_use_onednn(onednn, no_onednn, case):
    x, W, b = _data(k=48, n=80)
    if case == "few rows":
        x = x[: gemm.MIN_ROWS - 1]
    elif case == "float64":
        x, W, b = x.double(), W.double(), b.double()
    ctx = {"plain switch": gemm.use("plain"), "autocast": torch.autocast("cpu", dtype=torch.bfloat16)}
    with ctx.get(case, torch.no_grad()):
        torch.testing.assert_close(gemm.affine(b, x, W), torch.addmm(b, x, W))  # bfloat16 under autocast


@pytest.mark.parametrize("grad", [False, True])
def test_column_sliced_weight_reaches_onednn_contiguous(onednn, monkeypatch, grad):
    """oneDNN runs a slow reference kernel on strided weights: a column slice is copied first (its gradient still
    lands in the slice's columns of the full weight)."""
    seen, real = [], gemm._onednn

    def spy(x, Wt, b):
        seen.append(Wt.is_contiguous() or Wt.t().is_contiguous())
        return real(x, Wt, b)
    monkeypatch.setattr(gemm, "_onednn", spy)
    monkeypatch.setattr(gemm, "_matmuls_decided", {"onednn": False})  # dW through `_onednn` too
    x, W, b = _data(k=48, n=80, grad=grad)
    out = gemm.affine(b[10:50], x, W[:, 10:50])
    torch.testing.assert_close(out, x[:, :] @ W[:, 10:50] + b[10:50], rtol=1e-5, atol=1e-5)
    if grad:
        out.sum().backward()
        torch.testing.assert_close(W.grad[:, 10:50], x.sum(0)[:, None].expand(-1, 40), rtol=1e-5, atol=1e-5)
        assert not W.grad[:, :10].any() and not W.grad[:, 50:].any()
    assert len(seen) == (3 if grad else 1) and all(seen)


def test_kernel_choice(monkeypatch):
    """"auto" takes oneDNN only when capable and measured faster; "onednn" skips the measurement; "plain" never."""
    monkeypatch.delenv(gemm.ENV, raising=False)
    for capable, faster, want in ((False, True, "plain"), (True, False, "plain"), (True, True, "onednn")):
        monkeypatch.setattr(gemm, "_decided", {})
        monkeypatch.setattr(gemm, "_capable", lambda c=capable: c)
        monkeypatch.setattr(gemm, "_faster", lambda f=faster: f)
        assert gemm.kernel() == want
        with gemm.use("onednn"):
            assert gemm.kernel() == ("onednn" if capable else "plain")
        with gemm.use("plain"):
            assert gemm.kernel() == "plain"


def test_bad_setting_is_a_config_error(monkeypatch):
    with pytest.raises(ConfigError, match="allowed: auto, plain, onednn"):
        with gemm.use("mkl"):
            pass
    monkeypatch.setenv(gemm.ENV, "fastest")
    with pytest.raises(ConfigError, match=gemm.ENV):
        gemm.kernel()


def test_model_loss_and_gradients_match_plain(onednn):
    """A model with an MLP, LayerNorm and biases, over 2 × 24 tokens (≥ MIN_ROWS rows in every product)."""
    cfg = HookedTransformerConfig(n_layers=2, d_model=32, n_ctx=24, d_vocab=50, n_heads=4, d_mlp=64, seed=0,
                                  normalization_type="LN", positional_embedding_type="standard")
    model = HookedTransformer(cfg)
    tokens = torch.randint(0, 50, (2, 24), generator=torch.Generator().manual_seed(0))

    def run():
        model.zero_grad()
        loss = model(tokens, return_type="loss")
        loss.backward()
        return [loss.detach()] + [p.grad.clone() for p in model.parameters()]
    ref, got = _plain_and_fast(run)
    for r, g in zip(ref, got):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)


def test_a_probe_remeasures_before_refusing_and_restores_the_thread_count(monkeypatch):
    """`beats_per_core`: one losing round is measured again (a noisy round must not decide a process), two refuse;
    concurrent probes leave the thread count as they found it."""
    import threading

    rounds = []
    monkeypatch.setattr(gemm, "_beats", lambda plain, fast, repeats, gain: rounds.append(1) or len(rounds) > 1)
    assert gemm.beats_per_core(None, None, 3) and len(rounds) == 2
    monkeypatch.setattr(gemm, "_beats", lambda plain, fast, repeats, gain: rounds.append(1) or False)
    rounds.clear()
    assert not gemm.beats_per_core(None, None, 3) and len(rounds) == 2
    torch.set_num_threads(3)
    monkeypatch.setattr(gemm, "_beats", lambda plain, fast, repeats, gain: torch.get_num_threads() == 1)
    threads = [threading.Thread(target=gemm.beats_per_core, args=(None, None, 3)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert torch.get_num_threads() == 3

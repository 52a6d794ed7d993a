"""The layers' dense products `x @ W + b`, and the one place that chooses the GEMM kernel running them.

torch sends float32 CPU matmuls to MKL. On CPUs with AVX-512 where MKL runs its AVX2 kernels (AMD Zen 4/5), the
oneDNN library inside torch runs the same products about twice as fast (benchmarks/README.md). torch offers
oneDNN for dense float32 tensors only through a private operator, `torch.ops.mkldnn._linear_pointwise` (the
kernel of its compiler's CPU linear), so it is used only where all of these hold, and `x @ W + b` otherwise:

- capability: torch was built with oneDNN, has the operator, reports AVX-512 (`torch.backends.cpu`), and a
  probe product through the operator matches the plain one (`kernel()` decides once, at first use);
- measured: on that probe oneDNN beat the plain kernel by at least `MIN_GAIN` (so MKL keeps the CPUs where it is
  fastest, such as Intel's with AVX-512);
- the call fits: a float32 CPU tensor (float64 keeps torch's kernel; so do CUDA and MPS), at least `MIN_ROWS`
  rows (oneDNN's fixed cost loses below), a contiguous `x`, no functorch transform, no `torch.compile` tracing and
  no CPU autocast (which runs `x @ W` in its lower precision).
  A strided weight (a column slice: oneDNN would run its slow reference kernel on it) is copied to a contiguous
  one first, a copy of `d_in · d_out` numbers beside a product of `rows` times as many multiply-adds.

Forward and backward both run on oneDNN (`_OneDNNAffine`; its double backward uses plain differentiable ops, and
forward-mode AD has a `jvp`). torch's own `mm` / `bmm` reach oneDNN only through a public precision setting
(`onednn_matmuls`, used where `onednn_matmuls_ok` found it float32-exact and faster): the weight gradient `xᵀ g`
takes it (oneDNN reads `xᵀ` in place; `_linear_pointwise` copies it), and so does `models.accel.train_attention`.
bfloat16 and float16 CPU products (the layers', the attention's explicit path, per-head products and decoding
projection) run in float32 and are rounded once to their dtype where `upcast_reduced` measured that faster (CPUs
without native reduced-precision kernels; benchmarks/README.md); torch's own kernel rounds a float32 sum once too.
Switch: the environment variable `TOY_CIRCUITS_GEMM` = `auto` (the default), `plain` (never oneDNN, never the float32
way for reduced precision) or `onednn` (skip the oneDNN measurement, keep the capability check); `use(kernel)` sets it
in code. Results agree with the plain kernel to rounding, not bitwise.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time

import torch

from ..errors import ConfigError

KERNELS = ("auto", "plain", "onednn")
ENV = "TOY_CIRCUITS_GEMM"
MIN_ROWS = 32
MIN_GAIN = 1.25
PROBE_RTOL = 1e-5  # largest error over largest entry allowed on the probes (float32: ~1e-7; bfloat16: ~1e-3)

_decided: dict[str, str] = {}  # requested setting -> "plain" or "onednn", filled at first use
_forced: str | None = None  # set by `use`


def _requested() -> str:
    req = _forced or os.environ.get(ENV, "auto").strip().lower() or "auto"
    if req not in KERNELS:
        raise ConfigError(f"{ENV}={req!r} is not a GEMM kernel setting; allowed: {', '.join(KERNELS)}")
    return req


def _onednn(x: torch.Tensor, Wt: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """`x @ Wtᵀ + b` through oneDNN (`Wt` is `[d_out, d_in]`, as `F.linear`'s weight)."""
    return torch.ops.mkldnn._linear_pointwise(x, Wt, b, "none", [], "")


def _capable() -> bool:
    """oneDNN can run float32 products here and agrees with the plain kernel on a probe."""
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return False
    if torch.backends.cpu.get_cpu_capability() not in ("AVX512",):
        return False
    try:
        x, W, b = _probe(64, 48, 40)
        got = _onednn(x, W.t(), b)
    except (RuntimeError, NotImplementedError):
        return False
    return bool(torch.allclose(got, torch.addmm(b, x, W), rtol=1e-4, atol=1e-4))


def _probe(m: int, k: int, n: int):
    g = torch.Generator().manual_seed(0)
    r = lambda *shape: torch.randn(*shape, generator=g, device="cpu")
    return r(m, k), r(k, n), r(n)


def _faster(repeats: int = 7) -> bool:
    """oneDNN beats `x @ W` by `MIN_GAIN` on a 256 × 256 @ 256 × 512 product (best of `repeats`, alternated)."""
    x, W, _ = _probe(256, 256, 512)
    return _beats(lambda: x @ W, lambda: _onednn(x, W.t(), None), repeats)


def _beats(plain, fast, repeats: int, gain: float = MIN_GAIN) -> bool:
    """`fast()` takes at most 1 / `gain` of `plain()`'s time: best of `repeats` each, alternated, after one warm-up
    round (where oneDNN builds its primitive)."""
    best = [float("inf"), float("inf")]
    for i in range(repeats + 1):
        for j, f in enumerate((plain, fast)):
            t0 = time.perf_counter()
            f()
            if i:
                best[j] = min(best[j], time.perf_counter() - t0)
    return best[0] >= gain * best[1]


def kernel() -> str:
    """The kernel float32 CPU products use in this process: "onednn" or "plain" (decided once, at first use)."""
    req = _requested()
    if req not in _decided:
        if req == "plain" or not _capable():
            _decided[req] = "plain"
        else:
            _decided[req] = "onednn" if req == "onednn" or _faster() else "plain"
    return _decided[req]


@contextlib.contextmanager
def use(setting: str):
    """Within the block, products use `setting` ("auto", "plain" or "onednn"), as `TOY_CIRCUITS_GEMM` would."""
    global _forced
    if setting not in KERNELS:
        raise ConfigError(f"GEMM kernel {setting!r} is unknown; allowed: {', '.join(KERNELS)}")
    before, _forced = _forced, setting
    try:
        yield
    finally:
        _forced = before


_switch = threading.Lock()
_inside = 0  # threads within `onednn_matmuls`: the first switches the setting on, the last restores it
_saved: list[str] = []


@contextlib.contextmanager
def onednn_matmuls():
    """Within the block, torch may send float32 `mm` / `bmm` / `baddbmm` to oneDNN (its `brg_matmul`), which it does
    only when `torch.backends.mkldnn.matmul.fp32_precision` (a public setting) allows reduced precision (`"bf16"`).
    oneDNN down-converts float32 matmuls only where it has a kernel for that (AMX); elsewhere it runs its float32
    kernel, as `onednn_matmuls_ok` checks before anything uses this. The setting is process-wide while on: another
    thread's float32 matmul in that window also runs on oneDNN (threads share the switch: the first in turns it on,
    the last out restores it)."""
    global _inside
    setting = torch.backends.mkldnn.matmul
    with _switch:
        if _inside == 0:
            _saved[:] = [setting.fp32_precision]
            setting.fp32_precision = "bf16"
        _inside += 1
    try:
        yield
    finally:
        with _switch:
            _inside -= 1
            if _inside == 0:
                setting.fp32_precision = _saved.pop()


_matmuls_decided: dict[str, bool] = {}  # requested setting -> whether `onednn_matmuls` is used


def onednn_matmuls_ok() -> bool:
    """Once per setting: `kernel()` is oneDNN, and inside `onednn_matmuls` float32 `bmm` and `mm` (plain and with a
    transposed operand) match a float64 reference to float32 accuracy (a bfloat16 product would be ~1000× further
    off) and `bmm` beats the plain kernel by `MIN_GAIN` on `[32, 128, 64] @ [32, 64, 128]` (best of 9, alternated: a
    wide margin, so that processes decide alike; on one thread, as a per-core property: ~20 ms once)."""
    req = _requested()
    if req not in _matmuls_decided:
        _matmuls_decided[req] = kernel() == "onednn" and _matmuls_exact() and _matmuls_faster()
    return _matmuls_decided[req]


def _matmuls_exact() -> bool:
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.backends.mkldnn, "matmul")):
        return False
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(8, 128, 32, generator=g), torch.randn(8, 32, 128, generator=g)
    pairs = ((a, b), (b.transpose(1, 2), a.transpose(1, 2)), (b, a), (a[0].t(), a[1]))
    try:
        with onednn_matmuls():
            got = [x @ y for x, y in pairs]
    except (RuntimeError, AttributeError, ValueError):
        return False
    return agrees(got, [x.double() @ y.double() for x, y in pairs])


def agrees(got, want) -> bool:
    """Every probe result is within `PROBE_RTOL` of its reference's largest entry (the probes' exactness test)."""
    return all(float((x - y).abs().max()) <= PROBE_RTOL * float(y.abs().max()) for x, y in zip(got, want, strict=True))


_probe_lock = threading.RLock()  # one probe at a time: each sets the process's thread count and restores it


def beats_per_core(plain, fast, repeats: int, gain: float = MIN_GAIN) -> bool:
    """`_beats` on one thread, the thread count restored after: the probes measure a per-core property (with two
    threads on a loaded machine the timings flip from run to run). A first round that finds `fast` not faster is
    measured once more before refusing it, so that a process's verdict does not hinge on one noisy round (a fresh
    process refused the fused loss in 1 of 14 single rounds at load 0.5; a kernel that is truly slower fails both)."""
    with _probe_lock:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return _beats(plain, fast, repeats, gain) or _beats(plain, fast, repeats, gain)
        finally:
            torch.set_num_threads(threads)


def _matmuls_faster(repeats: int = 9) -> bool:
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(32, 128, 64, generator=g), torch.randn(32, 64, 128, generator=g)

    def fast():
        with onednn_matmuls():
            torch.bmm(a, b)

    return beats_per_core(lambda: torch.bmm(a, b), fast, repeats)


def _fits(x: torch.Tensor, W: torch.Tensor) -> bool:
    return (x.device.type == "cpu" and x.dtype == torch.float32 and W.dtype == torch.float32
            and x.dim() == 2 and x.shape[0] >= MIN_ROWS and x.is_contiguous() and W.dim() == 2
            and not traced() and not torch.is_autocast_enabled("cpu") and kernel() == "onednn")


REDUCED = (torch.bfloat16, torch.float16)
_upcast_decided: dict[tuple[str, torch.dtype], bool] = {}  # (requested setting, dtype) -> whether to upcast


def upcast_reduced(dtype: torch.dtype) -> bool:
    """Once per setting and dtype: bfloat16 / float16 CPU products run in float32 and are rounded once to `dtype`.

    torch's own reduced-precision CPU products accumulate in float32 and round once as well, but where the CPU has no
    native kernel for them they run many times slower than the float32 product (benchmarks/README.md, "bfloat16");
    the products of two bfloat16 / float16 numbers are exact in float32, so both ways differ only in the order of
    the float32 sum. Decided where a probe finds the float32 way no further from a float64 reference than torch's
    (within 2×) and faster per core by `MIN_GAIN`; never with `TOY_CIRCUITS_GEMM=plain`."""
    key = (_requested(), dtype)
    if key not in _upcast_decided:
        _upcast_decided[key] = key[0] != "plain" and _upcast_probe(dtype)
    return _upcast_decided[key]


def _upcast_probe(dtype: torch.dtype, repeats: int = 5) -> bool:
    x, W, _ = (t.to(dtype) for t in _probe(64, 128, 256))
    plain, up = x @ W, (x.float() @ W.float()).to(dtype)
    ref = x.double() @ W.double()
    err = lambda t: float((t.double() - ref).abs().max())
    return err(up) <= 2 * err(plain) and beats_per_core(lambda: x @ W, lambda: (x.float() @ W.float()).to(dtype),
                                                         repeats)


def in_float32(*tensors: torch.Tensor | None) -> bool:
    """The tensors (None: absent) are bfloat16 / float16 CPU tensors of one dtype whose products run in float32 here
    (`upcast_reduced`; not under CPU autocast, which chooses its own precision). Other dtypes return at the first
    test, so float32 calls pay one comparison."""
    first = tensors[0]
    return (first.dtype in REDUCED and first.device.type == "cpu"
            and all(t is None or t.dtype == first.dtype for t in tensors)
            and not torch.is_autocast_enabled("cpu") and upcast_reduced(first.dtype))


def rounded_product(fn, *tensors: torch.Tensor | None) -> torch.Tensor:
    """`fn(*tensors)` for a product of reduced-precision CPU tensors: computed on float32 copies and rounded once to
    their dtype where `in_float32` holds (as torch's own kernel rounds its float32 sum), else as it is."""
    if not in_float32(*tensors):
        return fn(*tensors)
    return fn(*(None if t is None else t.float() for t in tensors)).to(tensors[0].dtype)


def affine(b: torch.Tensor, x: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """`x @ W + b` for a 2-D `x [rows, d_in]`, `W [d_in, d_out]`, `b [d_out]`, as one fused product (no separate
    bias pass), on the kernel `kernel()` chose where the call fits (module docstring). A bias that is zero and
    needs no gradient (the buffers of `use_bias=False`) is skipped on the CPU; the zero test reads the values, so a
    bias written later (`circuits.fold_layer_norm`) still counts. On a GPU the test would synchronise, so the add
    stays; below `MIN_ROWS` rows (a decoding step) the test costs more than the add, so the add stays too."""
    if in_float32(x, W, b):  # as `rounded_product`, on float32 copies
        return affine(b.float(), x.float(), W.float()).to(x.dtype)
    skip_b = x.shape[0] >= MIN_ROWS and not b.requires_grad and b.device.type == "cpu" and not b.any()
    if not _fits(x, W):
        return x @ W if skip_b else torch.addmm(b, x, W)
    W, bias = W.contiguous(), None if skip_b else b.contiguous()
    if (torch.is_grad_enabled() and (x.requires_grad or W.requires_grad or b.requires_grad)) or dual_level():
        return _OneDNNAffine.apply(x, W, bias)
    return _onednn(x, W.t(), bias)


def matmul(x: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """`x @ W` for 2-D `x` and `W`, on the kernel `kernel()` chose where the call fits (see `affine`)."""
    if in_float32(x, W):
        return matmul(x.float(), W.float()).to(x.dtype)
    if not _fits(x, W):
        return x @ W
    W = W.contiguous()
    if (torch.is_grad_enabled() and (x.requires_grad or W.requires_grad)) or dual_level():
        return _OneDNNAffine.apply(x, W, None)
    return _onednn(x, W.t(), None)


def inference_only(*tensors: torch.Tensor) -> bool:
    """No autograd of any kind reaches `tensors`: no gradient is recorded for them, no forward-mode tangent, no
    functorch transform (`vmap`, `grad`, `jacrev`) and no `torch.compile` tracing. Fast paths that write in place or
    into `out=` views (attention's explicit path) take only such calls."""
    return (not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors)) and not dual_level()
            and not traced())


def traced() -> bool:
    """`torch.compile` is tracing or a functorch transform (`vmap`, `grad`, `jacrev`) is active: the custom
    autograd functions and the in-place writes of the fast paths are not for such calls."""
    return torch.compiler.is_compiling() or getattr(torch._C, "_are_functorch_transforms_active", lambda: True)()


def dual_level() -> bool:
    """Inside `torch.autograd.forward_ad.dual_level` (tangents must flow through `_OneDNNAffine.jvp`)."""
    return getattr(torch.autograd.forward_ad, "_current_level", 0) >= 0


class _OneDNNAffine(torch.autograd.Function):
    """`x @ W + b` with oneDNN forward and backward: dx = g Wᵀ, dW = xᵀ g, db = Σ_rows g."""

    @staticmethod
    def forward(ctx, x, W, b):  # ctx in forward, not `setup_context`: torch's `apply` then skips binding the
        ctx.save_for_backward(x, W)  # arguments through `inspect.signature` on every call (~20 µs)
        ctx.save_for_forward(x, W)
        ctx.has_bias = b is not None
        return _onednn(x, W.t(), b)

    @staticmethod
    def backward(ctx, g):
        x, W = ctx.saved_tensors
        need_x, need_W, need_b = ctx.needs_input_grad
        fast = not torch.is_grad_enabled() and g.dtype == torch.float32  # else: double backward, plain ops
        g = g.contiguous() if fast else g  # an expanded gradient (of a sum) is copied: m·n beside m·n·k
        dx = dW = db = None
        if need_x:
            dx = _onednn(g, W, None) if fast else g @ W.t()
        if need_W and fast and W.shape[0] >= MIN_ROWS and onednn_matmuls_ok():
            with onednn_matmuls():  # oneDNN's matmul reads the transposed x in place; `_onednn` would copy it
                dW = x.t() @ g
        elif need_W:
            dW = _onednn(x.t(), g.t(), None) if fast and W.shape[0] >= MIN_ROWS else x.t() @ g
        if need_b and ctx.has_bias:
            db = g.sum(0)
        return dx, dW, db

    @staticmethod
    def jvp(ctx, dx, dW, db):
        x, W = ctx.saved_tensors
        out = None
        for term in (dx @ W if dx is not None else None, x @ dW if dW is not None else None, db):
            if term is not None:
                out = term if out is None else out + term
        return out

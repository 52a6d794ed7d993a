"""Cross-entropy on the compiled kernel of `fused_loss.cpp` (built at first use by `models.accel.kernels`), float32 CPU.

`F.cross_entropy` on the CPU is `log_softmax` (an `[N, V]` output saved for the backward) then `nll_loss`, whose
backward fills an `[N, V]` gradient with zeros before `log_softmax`'s backward reads it and the saved output and
writes the logits' gradient: at the `attn-only-2l` training preset (`[4096, 512]` logits) that is ~7 % of a step.
The kernel reads the logits once in the forward (each row's maximum and log-sum-exp, kept: `2 N` floats) and once
in the backward, writing the gradient `g · (softmax(x) − onehot(target))` in the same pass (the softmax's and the
negative log-likelihood's gradients, e.g. Goodfellow et al. 2016, §6.2.2.3). Our own code: torch has no fused CPU
cross-entropy.

`cross_entropy` is `F.cross_entropy` (class targets, `ignore_index` −100, reduction mean or none) and runs the
kernel where all of these hold, else `F.cross_entropy` itself:
- `TOY_CIRCUITS_FUSED_LOSS` is `auto` (the default; `off` turns it off) and `TOY_CIRCUITS_GEMM` is not `plain`
  (torch's own kernels only; `models.accel.gemm`);
- `models.accel.kernels` built and loaded the library here, and once per process and setting its probes passed: values
  and gradients against float64 (`_exact`) and not slower than `F.cross_entropy` (`_faster`);
- the call fits: float32 CPU logits `[N, V]` with contiguous rows, int64 targets `[N]`, no label smoothing, no
  `torch.compile` tracing, functorch transform or forward-mode AD.
A double backward (`create_graph=True`) differentiates `softmax(x) − onehot` as plain ops. An out-of-range target
raises as `F.cross_entropy` does. Where torch's results are artefacts of its passes, the kernel's are exact: an
ignored row's gradient is 0 even where its logits hold NaN (torch: NaN, from 0 · NaN), and −inf logits get 0.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import gemm, kernels

ENV = "TOY_CIRCUITS_FUSED_LOSS"
IGNORE = -100  # F.cross_entropy's default ignore_index

_decided: dict[tuple[str, str], bool] = {}  # (this setting, GEMM setting) -> the verdict (`kernels.decided`)


def _setting() -> str:
    return kernels.setting(ENV, "fused-loss")


def why_not() -> str:
    """Empty where the kernel is in use for calls that fit, else why it is not."""
    key = (_setting(), gemm._requested())
    if key[0] == "off":
        return f"{ENV}=off"
    if key[1] == "plain":
        return f"{gemm.ENV}=plain"
    if kernels.library() is None:
        return kernels.why_not()
    return "" if _chosen() else "its first-use probe found it inexact or not faster than F.cross_entropy here"


def _chosen() -> bool:
    return kernels.decided(_decided, _setting(), _exact, _faster)


def _readable(x: torch.Tensor, t: torch.Tensor) -> bool:
    """The kernel can read these: float32 CPU logits `[N, V]` (N, V > 0) with contiguous rows, int64 CPU targets
    `[N]`."""
    return (x.dtype == torch.float32 and x.device.type == "cpu" and x.dim() == 2 and x.shape[0] > 0
            and x.shape[1] > 0 and x.stride(1) == 1 and t.dtype == torch.int64 and t.device.type == "cpu"
            and t.shape == x.shape[:1])


def _fits(logits: torch.Tensor, target: torch.Tensor, label_smoothing: float) -> bool:
    return (_readable(logits, target) and label_smoothing == 0 and not gemm.traced() and not gemm.dual_level())


def cross_entropy(logits: torch.Tensor, target: torch.Tensor, reduction: str = "mean",
                  label_smoothing: float = 0.0) -> torch.Tensor:
    """`F.cross_entropy(logits, target, reduction=reduction, label_smoothing=label_smoothing)` for logits `[N, V]`
    and class targets `[N]` (−100: ignored), on the kernel where it applies (module docstring)."""
    if reduction not in ("mean", "none") or not _fits(logits, target, label_smoothing) or not _chosen():
        return F.cross_entropy(logits, target, reduction=reduction, label_smoothing=label_smoothing)
    losses = _FusedCrossEntropy.apply(logits, target.contiguous())
    return losses if reduction == "none" else losses.sum() / (target != IGNORE).sum()


class _FusedCrossEntropy(torch.autograd.Function):
    """Per-row losses `[N]` of logits `[N, V]` and targets `[N]` (0 where ignored); saves each row's maximum and log
    of its sum of exponentials (`[2, N]`), not a softmax."""

    @staticmethod
    def forward(ctx, x, t):
        if not (_readable(x, t) and t.is_contiguous()):  # raw memory: a mismatch would read past the storage
            raise ValueError(f"the fused loss takes float32 CPU logits [N, V] with contiguous rows and int64 CPU "
                             f"targets [N]; got {x.dtype} {tuple(x.shape)} and {t.dtype} {tuple(t.shape)}")
        N, V = x.shape
        stats, losses = x.new_empty(2, N), x.new_empty(N)
        bad = kernels.library().fl_forward(x.data_ptr(), N, V, x.stride(0), t.data_ptr(), IGNORE, stats[0].data_ptr(),
                                           stats[1].data_ptr(), losses.data_ptr(), torch.get_num_threads())
        if bad:  # F.cross_entropy names the target that is out of range
            F.cross_entropy(x.detach(), t)
            raise IndexError(f"a target is outside [0, {V}) and is not the ignore index {IGNORE}")
        ctx.save_for_backward(x, t, stats)
        return losses

    @staticmethod
    def backward(ctx, g):
        x, t, stats = ctx.saved_tensors
        if torch.is_grad_enabled():  # double backward: the gradient as differentiable ops
            kept = t != IGNORE
            onehot = F.one_hot(t.clamp(min=0), x.shape[1]).to(x.dtype)
            return (torch.softmax(x, -1) - onehot) * (g * kept)[:, None], None
        N, V = x.shape
        dx = torch.empty_like(x, memory_format=torch.contiguous_format)
        g = g.float()
        kernels.library().fl_backward(x.data_ptr(), N, V, x.stride(0), t.data_ptr(), IGNORE, stats[0].data_ptr(),
                                      stats[1].data_ptr(), g.data_ptr(), g.stride(0), dx.data_ptr(), dx.stride(0),
                                      torch.get_num_threads())
        return dx, None


def _exact() -> bool:
    """The kernel's per-row losses and gradients match float64 `F.cross_entropy` to `gemm.PROBE_RTOL` of their
    largest entry: vocabularies off and on 16 (its vector tails), ignored rows, large and small logits."""
    g = torch.Generator().manual_seed(0)
    for N, V, spread in ((37, 45, 3.0), (9, 512, 30.0), (5, 7, 1.0)):
        x = torch.randn(N, V, generator=g) * spread
        t = torch.randint(0, V, (N,), generator=g)
        t[::4] = IGNORE
        dl = torch.randn(N, generator=g)
        x32 = x.clone().requires_grad_()
        got = _FusedCrossEntropy.apply(x32, t)
        got.backward(dl)
        x64 = x.double().requires_grad_()
        want = F.cross_entropy(x64, t, reduction="none")
        want.backward(dl.double())
        if not gemm.agrees([got.detach(), x32.grad], [want.detach(), x64.grad]):
            return False
    return True


def _faster(repeats: int = 7) -> bool:
    """Forward and backward on `[2048, 512]` logits are not slower than `F.cross_entropy`'s, one thread (as
    `models.accel.gemm` measures: a per-core property). Not slower, rather than `gemm.MIN_GAIN` faster: the gain is in
    the passes over memory a step saves (a 1.2–5× difference alone on one thread here, its low end when torch's
    buffers are already mapped), and a 1.25× bar made one fresh process in twelve refuse it."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2048, 512, generator=g).requires_grad_()
    t = torch.randint(0, 512, (2048,), generator=g)

    def run(fn):
        torch.autograd.grad(fn(x, t), x)

    return gemm.beats_per_core(lambda: run(F.cross_entropy),
                               lambda: run(lambda a, b: _FusedCrossEntropy.apply(a, b).mean()), repeats, gain=1.0)

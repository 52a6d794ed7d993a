"""Attention for training (autograd, no hooks) with its six batched products on oneDNN's float32 matmul.

`softmax(q kᵀ · scale + bias) v` for every (sequence, head) pair is a batch of small products (at the `attn-only-2l`
preset: 128 pairs of `[128, 32] @ [32, 128]`). torch's CPU flash attention runs them, `32 × 128` blocks at a time,
on MKL, and `torch.bmm` runs them on MKL too; on CPUs where MKL takes its AVX2 kernels (AMD Zen 4/5) both reach
50–70 GFLOP/s on one thread, while oneDNN's AVX-512 batched matmul (`brg_matmul:avx512_core`) runs the same
products 2–3× faster (benchmarks/README.md).

The products run inside `models.accel.gemm.onednn_matmuls()`, which lets torch send float32 `bmm` to oneDNN, and only where
`models.accel.gemm.onednn_matmuls_ok()` found them float32-exact and faster than MKL's on this CPU (see there).

The products (Vaswani et al. 2017, §3.2.1; the backward as Dao et al. 2022, §B.2, without the tiling):
forward `S = scale · q kᵀ + bias` (one `baddbmm`), `P = softmax(S)` (in place), `z = P v`; backward `dP = dz vᵀ`,
`dS = P ⊙ (dP − rowsum(dP ⊙ P))` (`torch._softmax_backward_data`, the softmax's own backward, written over dP),
`dq = scale · dS k`, `dk = scale · dSᵀ q` and `dv = Pᵀ dz` (oneDNN reads the transposed squares in place). q, k, v
come in and z and the gradients go out in the projections' layout `[batch, pos, head, d_head]`, each copied once to
and from the products' `[batch·head, pos, d_head]`. The pattern is saved for the backward (`B · H · T²` floats, as
the explicit path keeps), so `usable` caps the length at `MAX_LEN`; longer sequences keep the flash kernel's O(T)
memory. A double backward (`create_graph=True`) differentiates the explicit softmax attention instead (`_explicit`;
torch's flash kernel has no double backward). A causal square of even length ≥ `SPLIT_MIN` runs in two query halves
(`_split_forward`): the first half's queries see only the first half's keys, so the upper-right quarter (masked: its
pattern is exactly 0, its products add exact zeros) is never formed and the softmax and its backward pass over 3/4
of the square; the mask is added on the two diagonal quarters only.
Where `models.accel.fused_attention`'s compiled kernel loads and passes its probes, calls without a bias other than the
causal mask take it instead (`_FusedAttention`: the same function with each pair's square kept in cache; `_fused`).
Our own code: TransformerLens has no training-specific attention kernel.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F

from ..arch.score_bias import Causal
from . import fused_attention, gemm, kernels

MAX_LEN = 512  # longest sequence on this path (the saved pattern grows as T²)
SPLIT_MIN = 64  # causal squares from this length on are computed in two query halves (`_split_forward`)
_NOTHING = torch.zeros(())  # baddbmm's added term where there is none (beta=0 ignores it)


def _heads(t: torch.Tensor) -> torch.Tensor:
    """`[batch, pos, head, d] -> [batch·head, pos, d]`, contiguous (one copy of the strided view)."""
    B, T, H, d = t.shape
    return t.transpose(1, 2).reshape(B * H, T, d)


def _tokens(t: torch.Tensor, B: int) -> torch.Tensor:
    """`[batch·head, pos, d] -> [batch, pos, head, d]`, contiguous (one copy): the layout the projections use."""
    BH, T, d = t.shape
    return t.view(B, BH // B, T, d).transpose(1, 2).contiguous()


class _BmmAttention(torch.autograd.Function):
    """softmax(q kᵀ · scale + bias) v for `q, k, v [batch, pos, head, d_head]`; z in the same shape."""

    @staticmethod
    def forward(ctx, q, k, v, bias, is_causal, scale):
        B, T, H, dh = q.shape
        ctx.bias, ctx.is_causal, ctx.scale = bias if not is_causal else None, is_causal, scale
        ctx.split = is_causal and T % 2 == 0 and T >= SPLIT_MIN
        with gemm.onednn_matmuls():
            if ctx.split:
                z, saved = _split_forward(q, k, v, scale)
                ctx.save_for_backward(q, k, v, *saved)  # q, k, v: for a double backward
                return _tokens(z, B)
            qb, kb, vb = _heads(q), _heads(k), _heads(v)
            if is_causal:
                bias = _causal(T, q.dtype)
            added = _NOTHING if bias is None else bias if bias.dim() == 2 else bias.expand(B, H, T, T).flatten(0, 1)
            P = torch.baddbmm(added, qb, kb.transpose(1, 2), beta=0 if bias is None else 1, alpha=scale)
            torch.softmax(P, -1, out=P)
            z = torch.bmm(P, vb)
        ctx.save_for_backward(q, k, v, qb, kb, vb, P)
        return _tokens(z, B)

    @staticmethod
    def backward(ctx, dz):
        q, k, v, *saved = ctx.saved_tensors
        need_q, need_k, need_v = ctx.needs_input_grad[:3]
        if torch.is_grad_enabled():  # double backward: differentiate the plain ops
            return _double_backward(ctx, q, k, v, dz)
        B = q.shape[0]
        with gemm.onednn_matmuls():
            if ctx.split:
                grads = _split_backward(dz, *saved, ctx.scale, need_q, need_k, need_v)
            else:
                grads = _backward(_heads(dz), *saved, ctx.scale, need_q, need_k, need_v)
            grads = [None if g is None else _tokens(g, B) for g in grads]
        return *grads, None, None, None


class _FusedAttention(torch.autograd.Function):
    """The same function on `models.accel.fused_attention`'s kernel (no bias: causal or unmasked), z `[batch, pos, head,
    d_head]`; it saves the rows' log-sum-exp, not the pattern."""

    @staticmethod
    def forward(ctx, q, k, v, bias, is_causal, scale):
        z, lse = fused_attention.forward(q, k, v, is_causal, scale)
        ctx.bias, ctx.is_causal, ctx.scale = None, is_causal, scale
        ctx.save_for_backward(q, k, v, lse)
        return z

    @staticmethod
    def backward(ctx, dz):
        q, k, v, lse = ctx.saved_tensors
        if torch.is_grad_enabled():  # double backward: differentiate the plain ops
            return _double_backward(ctx, q, k, v, dz)
        grads = fused_attention.backward(q, k, v, dz, lse, ctx.is_causal, ctx.scale, ctx.needs_input_grad[:3])
        return *grads, None, None, None


def _backward(dZ, qb, kb, vb, P, scale, need_q, need_k, need_v):
    """`dq, dk, dv [batch·head, pos, d]` (None where not needed) of softmax(qb kbᵀ · scale + bias) vb, from
    `dZ = ∂L/∂z` and the pattern `P`, the inputs `[batch·head, pos, d]`."""
    dS = _scores_grad(dZ, vb, P)
    dq = torch.baddbmm(_NOTHING, dS, kb, beta=0, alpha=scale) if need_q else None
    dk = torch.baddbmm(_NOTHING, dS.transpose(1, 2), qb, beta=0, alpha=scale) if need_k else None
    dv = torch.bmm(P.transpose(1, 2), dZ) if need_v else None
    return dq, dk, dv


def _halves(t: torch.Tensor) -> torch.Tensor:
    """`[batch, pos, head, d] -> [2, batch·head, pos/2, d]`, contiguous (a copy): the first and second half of the
    positions as two contiguous batches (oneDNN would copy a strided slice of `_heads(t)` on each use)."""
    B, T, H, d = t.shape
    return t.view(B, 2, T // 2, H, d).permute(1, 0, 3, 2, 4).reshape(2, B * H, T // 2, d)


def _split_forward(q, k, v, scale):
    """The causal forward in two halves of the queries: the first half sees only the first half of the keys, so
    the upper-right quarter of the `[T, T]` square (all masked, its pattern exactly 0) is never formed; the mask
    is added where it has −inf, on the two diagonal quarters. Returns z `[BH, T, dh]` and what the backward
    needs: the query halves, keys and values (whole and first half) and the two halves' patterns `[BH, T/2, T/2]`
    and `[BH, T/2, T]`."""
    qh, kb, vb = _halves(q), _heads(k), _heads(v)
    h = qh.shape[2]
    kt, vt = kb[:, :h].contiguous(), vb[:, :h].contiguous()
    mask = _causal(h, q.dtype)
    Pt, Pb = _pattern(qh[0], kt, scale, mask, 0), _pattern(qh[1], kb, scale, mask, h)
    z = torch.empty_like(kb)
    torch.bmm(Pt, vt, out=z[:, :h])  # each half written in place: no concatenation
    torch.bmm(Pb, vb, out=z[:, h:])
    return z, (qh, kb, vb, kt, vt, Pt, Pb)


def _split_backward(dz, qh, kb, vb, kt, vt, Pt, Pb, scale, need_q, need_k, need_v):
    """The backward of `_split_forward`: `dq, dk, dv [BH, T, dh]` (None where not needed); the first half of the
    keys gets both halves' terms (the first half's added onto its rows)."""
    h = Pt.shape[1]
    dZt, dZb = _halves(dz).unbind(0)
    dq = dk = dv = None
    dSt, dSb = _scores_grad(dZt, vt, Pt), _scores_grad(dZb, vb, Pb)
    if need_q:
        dq = torch.empty_like(kb)
        torch.baddbmm(_NOTHING, dSt, kt, beta=0, alpha=scale, out=dq[:, :h])
        torch.baddbmm(_NOTHING, dSb, kb, beta=0, alpha=scale, out=dq[:, h:])
    if need_k:  # dk = scale · dSᵀ q
        dk = torch.baddbmm(_NOTHING, dSb.transpose(1, 2), qh[1], beta=0, alpha=scale)
        dk[:, :h].baddbmm_(dSt.transpose(1, 2), qh[0], alpha=scale)
    if need_v:  # dv = Pᵀ dz
        dv = torch.bmm(Pb.transpose(1, 2), dZb)
        dv[:, :h].baddbmm_(Pt.transpose(1, 2), dZt)
    return dq, dk, dv


def _pattern(q, k, scale, mask, start):
    """`softmax(scale · q kᵀ + mask)` for `q [BH, rows, d]`, `k [BH, keys, d]`, with the `[rows, rows]` causal
    `mask` added on the keys from `start` on (the diagonal block; the keys before it are all visible), the softmax
    written over the scores."""
    P = torch.baddbmm(_NOTHING, q, k.transpose(1, 2), beta=0, alpha=scale)
    P[:, :, start:] += mask
    return torch.softmax(P, -1, out=P)


def _scores_grad(dZ, v, P):
    """`dS = P ⊙ (dP − rowsum(dP ⊙ P))` for `dP = dZ vᵀ` (the softmax's backward, module docstring), written over
    dP by the private `torch._softmax_backward_data` (checked by `_softmax_backward_in_place`)."""
    dS = torch.bmm(dZ, v.transpose(1, 2))
    return torch._softmax_backward_data(dS, P, -1, P.dtype, grad_input=dS)


def _explicit(q, k, v, bias, is_causal, scale):
    """The same function as differentiable ops that have a double backward (torch's CPU flash kernel has none),
    `q, k, v [batch, pos, head, d_head]`."""
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    s = (q @ k.transpose(-1, -2)) * scale
    if is_causal:
        s = s + _causal(q.shape[-2], q.dtype)
    elif bias is not None:
        s = s + bias
    return (s.softmax(-1) @ v).transpose(1, 2)


def _double_backward(ctx, q, k, v, dz):
    """The gradients as differentiable functions of `q, k, v` and `dz` (for `create_graph=True`)."""
    wrt = [t for t, need in zip((q, k, v), ctx.needs_input_grad[:3]) if need]
    z = _explicit(q, k, v, ctx.bias, ctx.is_causal, ctx.scale)
    got = iter(torch.autograd.grad(z, wrt, dz, create_graph=True))
    return (*(next(got) if need else None for need in ctx.needs_input_grad[:3]), None, None, None)


_CAUSAL = Causal()  # its `dense` memoises each size's mask on this object


def _causal(T: int, dtype: torch.dtype) -> torch.Tensor:
    """`[T, T]`: −inf above the diagonal (the keys a causal query must not see), 0 elsewhere; `models.arch.score_bias`'s
    causal mask, built once per size and dtype."""
    return _CAUSAL.dense(T, T, dtype)


def attention(q, k, v, bias: torch.Tensor | None, is_causal: bool, scale: float) -> torch.Tensor:
    """softmax(q kᵀ · scale + bias) v on the oneDNN path for `q, k, v [batch, pos, head, d_head]` (the projections'
    layout; check `usable` first), z `[batch, pos, head, d_head]` contiguous; `bias` and `is_causal` as
    `F.scaled_dot_product_attention`'s `attn_mask` and `is_causal`."""
    if k.shape[2] != q.shape[2]:  # grouped-query: query head h reads key/value head h // (H / H_kv)
        k, v = (t.repeat_interleave(q.shape[2] // k.shape[2], 2) for t in (k, v))
    return (_FusedAttention if _fused(q, bias) else _BmmAttention).apply(q, k, v, bias, is_causal, scale)


def usable(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, empty_rows: bool) -> bool:
    """This module's attention applies to this call (`q, k, v [batch, pos, head, d_head]`): training (a gradient is
    needed), float32 CPU tensors, key/value heads dividing the query heads (grouped-query heads are repeated, as
    `enable_gqa`), a square of at most `MAX_LEN` positions, a bias (needing no gradient) without a batch axis or
    fully masked rows; no functorch transform, `torch.compile` tracing, autocast or forward-mode AD; and either
    the fused kernel takes it (`_fused`) or `models.accel.gemm.kernel()` is oneDNN and the probe passed (`_decide`)
    (`TOY_CIRCUITS_GEMM=plain` turns both off)."""
    B, T, H, dh = q.shape
    return (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
            and q.device.type == "cpu" and q.dtype == k.dtype == v.dtype == torch.float32
            and k.shape == v.shape and k.shape[0] == B and k.shape[1] == T and k.shape[3] == dh
            and H % k.shape[2] == 0 and 1 < T <= MAX_LEN and not empty_rows
            and (bias is None or (bias.dtype == q.dtype and not bias.requires_grad and bias.dim() in (2, 3)
                                  and bias.shape[-2:] == (T, T) and (bias.dim() == 2 or bias.shape[0] == H)))
            and not gemm.traced() and not torch.is_autocast_enabled("cpu") and not gemm.dual_level()
            and (_fused(q, bias) or (gemm.kernel() == "onednn" and _decide())))


_decided: dict[str, bool] = {}  # GEMM setting -> whether this path applies (`models.accel.gemm.onednn_matmuls_ok`)
_fused_decided: dict[tuple[str, str], bool] = {}  # (fused-attention setting, GEMM setting) -> `kernels.decided`


def _fused(q: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """The call goes to `models.accel.fused_attention`'s kernel: it covers the shape, `TOY_CIRCUITS_GEMM` is not `plain`
    (torch's kernels only), and once per setting the kernel loaded and its probes passed (`_fused_exact`,
    `_fused_faster`)."""
    return fused_attention.takes(q, bias) and kernels.decided(_fused_decided, fused_attention._setting(),
                                                               _fused_exact, _fused_faster)


PROBES = ((37, 32), (70, 16), (70, 48), (21, 64))  # (length, d_head): every register block, lengths off 16, > 64


def _fused_exact() -> bool:
    """The kernel's values and gradients match the float64 explicit attention to `gemm.PROBE_RTOL` of their
    largest entry, causal and unmasked, for every `d_head` it takes (`PROBES`)."""
    g = torch.Generator().manual_seed(0)
    for (T, dh), causal in itertools.product(PROBES, (True, False)):
        q, k, v, dz = (torch.randn(2, T, 2, dh, generator=g) for _ in range(4))
        z, lse = fused_attention.forward(q, k, v, causal, 0.2)
        got = [z, *fused_attention.backward(q, k, v, dz, lse, causal, 0.2, (True, True, True))]
        x = [t.double().requires_grad_() for t in (q, k, v)]
        ref = _explicit(*x, None, causal, 0.2)
        if not gemm.agrees(got, [ref.detach(), *torch.autograd.grad(ref, x, dz.double())]):
            return False
    return True


def _fused_faster(repeats: int = 7) -> bool:
    """The kernel's forward + backward beats what would run instead (the batched oneDNN products where they are
    chosen, else torch's flash kernel) by `gemm.MIN_GAIN` on 32 causal pairs of 128 × 32, one thread (as
    `models.accel.gemm` measures: a per-core property)."""
    g = torch.Generator().manual_seed(0)
    q, k, v, dz = (torch.randn(8, 128, 4, 32, generator=g) for _ in range(4))
    x = [t.requires_grad_() for t in (q, k, v)]
    other = _BmmAttention.apply if gemm.kernel() == "onednn" and _decide() else _sdpa

    def run(fn):
        z = fn(*x, None, True, 32 ** -0.5)
        torch.autograd.grad(z, x, dz)

    return gemm.beats_per_core(lambda: run(other), lambda: run(_FusedAttention.apply), repeats)


def _sdpa(q, k, v, bias, is_causal, scale):
    """torch's attention (its flash kernel on the CPU) on `[batch, pos, head, d_head]` inputs."""
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    return F.scaled_dot_product_attention(q, k, v, bias, is_causal=is_causal, scale=scale).transpose(1, 2)


def _decide() -> bool:
    key = gemm._requested()
    if key not in _decided:
        _decided[key] = _softmax_backward_in_place() and gemm.onednn_matmuls_ok()
    return _decided[key]


def _softmax_backward_in_place() -> bool:
    """The private `torch._softmax_backward_data` exists, takes `grad_input=` and, written over its own input,
    gives the softmax's backward `dS` of the module docstring (checked once per setting, on a small case)."""
    g = torch.Generator().manual_seed(0)
    P, dP = torch.randn(2, 3, 40, generator=g).softmax(-1), torch.randn(2, 3, 40, generator=g)
    want = P * (dP - (dP * P).sum(-1, keepdim=True))
    try:
        torch._softmax_backward_data(dP, P, -1, P.dtype, grad_input=dP)
    except (AttributeError, TypeError, RuntimeError):
        return False
    return torch.allclose(dP, want, rtol=1e-5, atol=1e-7)

"""Attention for training (autograd, no hooks) with its six batched products on oneDNN's float32 matmul.

`softmax(q kᵀ · scale + bias) v` for every (sequence, head) pair is a batch of small products (at the `attn-only-2l`
preset: 128 pairs of `[128, 32] @ [32, 128]`). torch's CPU flash attention runs them, `32 × 128` blocks at a time,
on MKL, and `torch.bmm` runs them on MKL too; on CPUs where MKL takes its AVX2 kernels (AMD Zen 4/5) both reach
50–70 GFLOP/s on one thread, while oneDNN's AVX-512 batched matmul (`brg_matmul:avx512_core`) runs the same
products 2–3× faster (benchmarks/README.md).

The products run inside `models.gemm.onednn_matmuls()`, which lets torch send float32 `bmm` to oneDNN, and only where
`models.gemm.onednn_matmuls_ok()` found them float32-exact and faster than MKL's on this CPU (see there).

The products (Vaswani et al. 2017, §3.2.1; the backward as Dao et al. 2022, §B.2, without the tiling):
forward `S = scale · q kᵀ + bias` (one `baddbmm`), `P = softmax(S)`, `z = P v`; backward `dP = dz vᵀ`,
`dS = P ⊙ (dP − rowsum(dP ⊙ P))` (`torch._softmax_backward_data`, the softmax's own backward), `dq = scale · dS k`,
`dkᵀ = scale · qᵀ dS` and `dvᵀ = dzᵀ P` (the small operand transposed: oneDNN reads a transposed view in place, a
transposed pattern it would not). The pattern is saved for the backward (`B · H · T²` floats, as the explicit path
keeps), so `usable` caps the length at `MAX_LEN`; longer sequences keep the flash kernel's O(T) memory. A double
backward (`create_graph=True`) differentiates the explicit softmax attention instead (`_explicit`; torch's flash kernel
has no double backward). A causal square of even length ≥ `SPLIT_MIN` runs in two query halves (`_split_forward`):
the first half's queries see only the first half's keys, so the upper-right quarter (masked: its pattern is exactly
0, its products add exact zeros) is never formed and the softmax and its backward pass over 3/4 of the square.
Our own code: TransformerLens has no training-specific attention kernel.
"""

from __future__ import annotations

import functools

import torch

from . import gemm

MAX_LEN = 512  # longest sequence on this path (the saved pattern grows as T²)
SPLIT_MIN = 64  # causal squares from this length on are computed in two query halves (`_split_forward`)
_NOTHING = torch.zeros(())  # baddbmm's added term where there is none (beta=0 ignores it)


def _batched(t: torch.Tensor) -> torch.Tensor:
    """`[batch, head, pos, d] -> [batch·head, pos, d]`, contiguous (a copy of a strided view)."""
    return t.reshape(-1, *t.shape[-2:])


class _BmmAttention(torch.autograd.Function):
    """softmax(q kᵀ · scale + bias) v for `q, k, v [batch, head, pos, d_head]`; z in the same shape."""

    @staticmethod
    def forward(ctx, q, k, v, bias, is_causal, scale):
        B, H, T, dh = q.shape
        ctx.bias, ctx.is_causal, ctx.scale = bias if not is_causal else None, is_causal, scale
        ctx.split = is_causal and T % 2 == 0 and T >= SPLIT_MIN
        with gemm.onednn_matmuls():
            if ctx.split:
                z, saved = _split_forward(q, k, v, scale)
                ctx.save_for_backward(q, k, v, *saved)  # q, k, v: for a double backward
                return z.view(B, H, T, dh)
            qb, kb, vb = _batched(q), _batched(k), _batched(v)
            bias = _causal(T, q.dtype) if is_causal else bias
            added = _NOTHING if bias is None else bias if bias.dim() == 2 else bias.expand(B, H, T, T).flatten(0, 1)
            S = torch.baddbmm(added, qb, kb.transpose(1, 2), beta=0 if bias is None else 1, alpha=scale)
            P = S.softmax(-1)
            del S
            z = torch.bmm(P, vb)
        ctx.save_for_backward(q, k, v, qb, kb, vb, P)
        return z.view(B, H, T, dh)

    @staticmethod
    def backward(ctx, dz):
        q, k, v, *saved = ctx.saved_tensors
        need_q, need_k, need_v = ctx.needs_input_grad[:3]
        if torch.is_grad_enabled():  # double backward: differentiate the plain ops
            return _double_backward(ctx, q, k, v, dz)
        B, H, T, dh = q.shape
        if ctx.split:
            with gemm.onednn_matmuls():
                dq, dk, dv = _split_backward(dz, *saved, ctx.scale, need_q, need_k, need_v)
            return (None if dq is None else dq.view(B, H, T, dh),
                    None if dk is None else dk.view(B, H, dh, T).transpose(-1, -2),
                    None if dv is None else dv.view(B, H, dh, T).transpose(-1, -2), None, None, None)
        qb, kb, vb, P = saved
        dZ = _batched(dz)
        dq = dk = dv = None
        with gemm.onednn_matmuls():
            dS = torch._softmax_backward_data(torch.bmm(dZ, vb.transpose(1, 2)), P, -1, P.dtype)
            if need_q:
                dq = torch.baddbmm(_NOTHING, dS, kb, beta=0, alpha=ctx.scale)
                dq = dq.view(B, H, T, dh)
            if need_k:  # dkᵀ = scale · qᵀ dS
                dk = torch.baddbmm(_NOTHING, qb.transpose(1, 2), dS, beta=0,
                                   alpha=ctx.scale)
                dk = dk.view(B, H, dh, T).transpose(-1, -2)
            if need_v:  # dvᵀ = dzᵀ P
                dv = torch.bmm(dZ.transpose(1, 2), P).view(B, H, dh, T).transpose(-1, -2)
        return dq, dk, dv, None, None, None


def _halves(t: torch.Tensor) -> torch.Tensor:
    """`[batch, head, pos, d] -> [2, batch·head, pos/2, d]`, contiguous (a copy): the first and second half of the
    positions as two contiguous batches (oneDNN would copy a strided slice of `_batched(t)` on each use)."""
    B, H, T, d = t.shape
    return t.reshape(B, H, 2, T // 2, d).permute(2, 0, 1, 3, 4).reshape(2, B * H, T // 2, d)


def _split_forward(q, k, v, scale):
    """The causal forward in two halves of the queries: the first half sees only the first half of the keys, so
    the upper-right quarter of the `[T, T]` square (all masked, its pattern exactly 0) is never formed. Returns z
    `[BH, T, dh]` and what the backward needs: the query halves, keys and values (whole and first half) and the two
    halves' patterns `[BH, T/2, T/2]` and `[BH, T/2, T]`."""
    qh, kb, vb = _halves(q), _batched(k), _batched(v)
    h = qh.shape[2]
    kt, vt = kb[:, :h].contiguous(), vb[:, :h].contiguous()
    mask = _causal(2 * h, q.dtype)
    Pt = torch.baddbmm(mask[:h, :h], qh[0], kt.transpose(1, 2), alpha=scale).softmax(-1)
    Pb = torch.baddbmm(mask[h:], qh[1], kb.transpose(1, 2), alpha=scale).softmax(-1)
    z = torch.empty_like(kb)
    torch.bmm(Pt, vt, out=z[:, :h])  # each half written in place: no concatenation
    torch.bmm(Pb, vb, out=z[:, h:])
    return z, (qh, kb, vb, kt, vt, Pt, Pb)


def _split_backward(dz, qh, kb, vb, kt, vt, Pt, Pb, scale, need_q, need_k, need_v):
    """The backward of `_split_forward`: `dq [BH, T, dh]`, `dkᵀ` and `dvᵀ [BH, dh, T]` (None where not needed); the
    first half of the keys gets both halves' terms (the first half's added onto its columns)."""
    h = Pt.shape[1]
    dZt, dZb = _halves(dz).unbind(0)
    dSt = torch._softmax_backward_data(torch.bmm(dZt, vt.transpose(1, 2)), Pt, -1, Pt.dtype)
    dSb = torch._softmax_backward_data(torch.bmm(dZb, vb.transpose(1, 2)), Pb, -1, Pb.dtype)
    dq = dkT = dvT = None
    if need_q:
        dq = torch.empty_like(kb)
        torch.baddbmm(_NOTHING, dSt, kt, beta=0, alpha=scale, out=dq[:, :h])
        torch.baddbmm(_NOTHING, dSb, kb, beta=0, alpha=scale, out=dq[:, h:])
    if need_k:  # dkᵀ = scale · qᵀ dS
        dkT = torch.baddbmm(_NOTHING, qh[1].transpose(1, 2), dSb, beta=0, alpha=scale)
        dkT[:, :, :h] += torch.baddbmm(_NOTHING, qh[0].transpose(1, 2), dSt, beta=0, alpha=scale)
    if need_v:  # dvᵀ = dzᵀ P
        dvT = torch.bmm(dZb.transpose(1, 2), Pb)
        dvT[:, :, :h] += torch.bmm(dZt.transpose(1, 2), Pt)
    return dq, dkT, dvT


def _explicit(q, k, v, bias, is_causal, scale):
    """The same function as differentiable ops that have a double backward (torch's CPU flash kernel has none)."""
    s = (q @ k.transpose(-1, -2)) * scale
    if is_causal:
        s = s + _causal(q.shape[-2], q.dtype)
    elif bias is not None:
        s = s + bias
    return s.softmax(-1) @ v


def _double_backward(ctx, q, k, v, dz):
    """The gradients as differentiable functions of `q, k, v` and `dz` (for `create_graph=True`)."""
    wrt = [t for t, need in zip((q, k, v), ctx.needs_input_grad[:3]) if need]
    z = _explicit(q, k, v, ctx.bias, ctx.is_causal, ctx.scale)
    got = iter(torch.autograd.grad(z, wrt, dz, create_graph=True))
    return (*(next(got) if need else None for need in ctx.needs_input_grad[:3]), None, None, None)


@functools.lru_cache(maxsize=8)
def _causal(T: int, dtype: torch.dtype) -> torch.Tensor:
    """`[T, T]`: −inf above the diagonal (the keys a causal query must not see), 0 elsewhere."""
    return torch.full((T, T), float("-inf"), dtype=dtype).triu(1)


def attention(q, k, v, bias: torch.Tensor | None, is_causal: bool, scale: float) -> torch.Tensor:
    """softmax(q kᵀ · scale + bias) v on the oneDNN path, `q, k, v [batch, head, pos, d_head]` (check `usable`
    first); `bias` and `is_causal` as `F.scaled_dot_product_attention`'s `attn_mask` and `is_causal`."""
    if k.shape[1] != q.shape[1]:  # grouped-query: query head h reads key/value head h // (H / H_kv)
        k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], 1) for t in (k, v))
    return _BmmAttention.apply(q, k, v, bias, is_causal, scale)


def usable(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, empty_rows: bool) -> bool:
    """The oneDNN attention applies to this call: training (a gradient is needed), float32 CPU tensors, key/value
    heads dividing the query heads (grouped-query heads are repeated, as `enable_gqa`), a square of at most
    `MAX_LEN` positions, a bias (needing no gradient) without a batch axis or fully masked rows; no functorch
    transform, `torch.compile` tracing, autocast or forward-mode AD; `models.gemm.kernel()` is oneDNN (so
    `TOY_CIRCUITS_GEMM=plain` turns this path off too) and the probe passed (`_decide`)."""
    T = q.shape[2]
    return (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
            and q.device.type == "cpu" and q.dtype == k.dtype == v.dtype == torch.float32
            and k.shape == v.shape and q.shape[0] == k.shape[0] and q.shape[2:] == k.shape[2:]
            and q.shape[1] % k.shape[1] == 0 and 1 < T <= MAX_LEN and not empty_rows
            and (bias is None or (bias.dtype == q.dtype and not bias.requires_grad and bias.dim() in (2, 3)
                                  and bias.shape[-2:] == (T, T)
                                  and (bias.dim() == 2 or bias.shape[0] == q.shape[1])))
            and not gemm.traced() and not torch.is_autocast_enabled("cpu") and not gemm.dual_level()
            and gemm.kernel() == "onednn" and _decide())


_decided: dict[str, bool] = {}  # GEMM setting -> whether this path applies (`models.gemm.onednn_matmuls_ok`)


def _decide() -> bool:
    key = gemm._requested()
    if key not in _decided:
        _decided[key] = hasattr(torch, "_softmax_backward_data") and gemm.onednn_matmuls_ok()
    return _decided[key]

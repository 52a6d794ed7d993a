"""The fused training attention of `fused_attention.cpp` (compiled on this machine at first use by `models.accel.kernels`).

A training step's attention, done as batched products (`models.accel.train_attention`'s `_BmmAttention`, torch's flash
kernel alike), sends each (sequence, head) pair's `[T, T]` square through memory between its products, softmax and
backward: on a CPU whose L3 is shared (a VM) that traffic, not the arithmetic, sets its speed. The kernel in
`fused_attention.cpp` keeps each pair's square in cache from the first product to the last (FlashAttention's
forward and backward, Dao et al. 2022, Algorithms 1 and 2, one block of keys per pair) and reads q, k, v and dz
in the projections' `[batch, pos, head, d_head]` layout (no layout copies around it). torch 2.13 has no such kernel
for float32 training on the CPU (its flash kernel runs MKL's `32 × 128` products; FlexAttention has no CPU
backward), so it is ours, ~280 lines of C++ (and the vector helpers of `simd.h`) with no dependency but OpenMP.

It is used only where all of these hold, checked once per process and setting (`models.accel.train_attention._fused`):
- `TOY_CIRCUITS_FUSED_ATTENTION` is `auto` (the default; `off` turns it off) and `TOY_CIRCUITS_GEMM` is not `plain`
  (torch's own kernels only; `models.accel.gemm`);
- `models.accel.kernels` built and loaded the library here (Linux, a C++ compiler, torch's OpenMP runtime shared);
- on a probe it matches a float64 reference (values and gradients) and beats what would run instead (the batched
  oneDNN products, else torch's flash kernel) by `gemm.MIN_GAIN`.
`why_not()` says why it is not in use. Shapes it takes: float32, `d_head` a multiple of 16 up to 64, a causal
mask or none (other biases keep the batched products).
"""

from __future__ import annotations

import ctypes

import torch

from . import kernels

ENV = "TOY_CIRCUITS_FUSED_ATTENTION"
HEAD_SIZES = (16, 32, 48, 64)  # d_head the kernel's register blocks cover


def _setting() -> str:
    return kernels.setting(ENV, "fused-attention")


def _strides(t: torch.Tensor):
    return (ctypes.c_int64 * 3)(t.stride(0), t.stride(1), t.stride(2))


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _kernel() -> ctypes.CDLL:
    lib = library()
    if lib is None:
        raise RuntimeError(f"the fused attention is not available: {why_not()}")
    return lib


def _check(code: int) -> None:
    if code == 2:
        raise MemoryError("the fused attention could not allocate its per-thread buffers")
    if code:
        raise ValueError(f"the fused attention takes d_head in {HEAD_SIZES}")


def _rows(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """`t` with its last axis contiguous, checked to be a float32 CPU tensor of `like`'s shape (the kernel reads
    raw memory: a mismatch would read past the storage)."""
    if t.dtype != torch.float32 or t.device.type != "cpu" or t.shape != like.shape or t.dim() != 4:
        raise ValueError(f"the fused attention takes float32 CPU tensors [batch, pos, head, d_head] of one shape; "
                         f"got {t.dtype} {t.device.type} {tuple(t.shape)} beside {tuple(like.shape)}")
    return t if t.stride(3) == 1 else t.contiguous()


def forward(q, k, v, is_causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """z `[batch, pos, head, d_head]` (contiguous) and the rows' log-sum-exp `[batch·head, pos]` of
    `softmax(scale · q kᵀ (+ causal mask)) v` for float32 CPU `q, k, v [batch, pos, head, d_head]`."""
    q, k, v = _rows(q, q), _rows(k, q), _rows(v, q)
    B, T, H, D = q.shape
    z, lse, sums = q.new_empty(B, T, H, D), q.new_empty(B * H, T), q.new_empty(B * H, T)
    _check(_kernel().fa_forward(q.data_ptr(), k.data_ptr(), v.data_ptr(), _strides(q), _strides(k), _strides(v),
                               B, T, H, D, int(is_causal), scale, z.data_ptr(), lse.data_ptr(), sums.data_ptr(),
                               torch.get_num_threads()))
    return z, lse.add_(sums.log_())  # the rows' maxima plus the logs of their sums


def backward(q, k, v, dz, lse, is_causal: bool, scale: float, need: tuple[bool, bool, bool]):
    """`dq, dk, dv` (None where `need` says not) of `forward`'s z, given `dz = ∂L/∂z` and `forward`'s `lse`."""
    q0, k0, v0 = q, k, v
    q, k, v, dz = _rows(q, q), _rows(k, q), _rows(v, q), _rows(dz, q)
    B, T, H, D = q.shape
    if lse.shape != (B * H, T) or not lse.is_contiguous() or lse.dtype != torch.float32:
        raise ValueError(f"lse must be forward's [batch·head, pos] = {(B * H, T)} float32; got {tuple(lse.shape)}")
    grads = _gradients((q0, k0, v0), need)
    strides = (ctypes.c_int64 * 9)(*(s for g in grads for s in (g.stride()[:3] if g is not None else (0, 0, 0))))
    _check(_kernel().fa_backward(q.data_ptr(), k.data_ptr(), v.data_ptr(), _strides(q), _strides(k), _strides(v),
                                dz.data_ptr(), _strides(dz), B, T, H, D, int(is_causal), scale, lse.data_ptr(),
                                *(_ptr(g) for g in grads), strides, torch.get_num_threads()))
    return grads


def contiguous_gradients(inputs, need) -> list:
    """Empty contiguous gradients of `inputs`' shapes (None where not `need`ed)."""
    return [t.new_empty(t.shape) if n else None for t, n in zip(inputs, need)]


def _gradients(inputs, need) -> list:
    """Empty `[batch, pos, head, d_head]` gradients for `inputs` (None where not `need`ed). Inputs that are the column
    blocks of one buffer `[batch·pos, width]` (the fused q/k/v projection's output, split) tiling it, get theirs at
    the same places in one new buffer of that shape, which the split's backward takes whole instead of concatenating
    (`models.arch.attention._Columns`); the others get contiguous ones."""
    grads = contiguous_gradients(inputs, need)
    for base in {id(t._base): t._base for t, n in zip(inputs, need) if n and t._base is not None}.values():
        group = [i for i, (t, n) in enumerate(zip(inputs, need)) if n and t._base is base]
        B, T, H, D = inputs[group[0]].shape
        width = base.shape[-1] if base.dim() == 2 else 0
        cols = sorted(inputs[i].storage_offset() - base.storage_offset() for i in group)
        if (base.is_contiguous() and base.shape == (B * T, width) and len(group) * H * D == width
                and cols == list(range(0, width, H * D))
                and all(inputs[i].shape == (B, T, H, D) and inputs[i].stride() == (T * width, width, D, 1)
                        for i in group)):
            buffer = base.new_empty(base.shape)
            for i in group:
                grads[i] = buffer.as_strided(inputs[i].shape, inputs[i].stride(),
                                             inputs[i].storage_offset() - base.storage_offset())
    return grads


def library() -> ctypes.CDLL | None:
    """The compiled kernels (`models.accel.kernels.library()`), or None where the setting, platform or compiler rules them
    out (`why_not` says which)."""
    return None if _setting() == "off" else kernels.library()


def why_not() -> str:
    """Empty where `library()` is loaded, else why it is not."""
    return f"{ENV}=off" if _setting() == "off" else kernels.why_not()


def takes(q: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """The kernel covers this call's shape and mask (the caller checks the rest: `models.accel.train_attention.usable`)."""
    return bias is None and q.shape[-1] in HEAD_SIZES

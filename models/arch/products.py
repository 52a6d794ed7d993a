"""The layers' dense products, in plain torch: `affine` (`x @ W + b`), `matmul`, and `rounded_product` for
bfloat16 / float16 CPU tensors.

Every rule here reads only dtypes, devices and shapes, never a clock, so the same inputs take the same kernels and
give bitwise the same numbers in every process.

bfloat16 and float16 CPU products run on float32 copies and are rounded once to their dtype: torch's own
reduced-precision CPU kernels accumulate in float32 and round once as well, so both ways differ only in the order of
the float32 sum, but where the CPU has no native kernel for them torch's run many times slower (benchmarks/README.md,
"bfloat16 on the CPU"). CUDA, float32 / float64 and CPU autocast (which chooses its own precision) keep torch's kernels.
"""

from __future__ import annotations

import torch

REDUCED = (torch.bfloat16, torch.float16)
#: Fewer rows than this are a decoding step: there per-call overheads outweigh the arithmetic (`affine`, and the
#: attention's per-head projection).
DECODE_ROWS = 32


def in_float32(*tensors: torch.Tensor | None) -> bool:
    """The tensors (None: absent) are bfloat16 / float16 CPU tensors of one dtype, outside CPU autocast: their
    products run in float32 (module docstring). Other dtypes return at the first test."""
    first = tensors[0]
    return (first.dtype in REDUCED and first.device.type == "cpu"
            and all(t is None or t.dtype == first.dtype for t in tensors)
            and not torch.is_autocast_enabled("cpu"))


def rounded_product(fn, *tensors: torch.Tensor | None) -> torch.Tensor:
    """`fn(*tensors)`; for reduced-precision CPU tensors (`in_float32`) computed on float32 copies and rounded once to
    their dtype."""
    if not in_float32(*tensors):
        return fn(*tensors)
    return fn(*(None if t is None else t.float() for t in tensors)).to(tensors[0].dtype)


def affine(b: torch.Tensor, x: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """`x @ W + b` for a 2-D `x [rows, d_in]`, `W [d_in, d_out]`, `b [d_out]`, as one `addmm`. A CPU bias that is
    zero and needs no gradient (the buffers of `use_bias=False`) is skipped (the test reads the values, so a bias
    written later, e.g. by `circuits.fold_layer_norm`, still counts); on a GPU the test would synchronise, inside
    `torch.compile` break the graph, and below `DECODE_ROWS` rows (a decoding step) cost more than the add, so
    the add stays there. Adding a zero changes no bit of the product."""
    if in_float32(x, W, b):
        return affine(b.float(), x.float(), W.float()).to(x.dtype)
    if (x.shape[0] >= DECODE_ROWS and not b.requires_grad and b.device.type == "cpu"
            and not torch.compiler.is_compiling() and not b.any()):
        return x @ W
    return torch.addmm(b, x, W)


def matmul(x: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """`x @ W` for 2-D `x` and `W` (reduced-precision CPU tensors in float32, as `rounded_product`)."""
    return rounded_product(torch.matmul, x, W)


def linear(x: torch.Tensor, W: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """`x @ W + b` for `x [..., d_in]`, `W [d_in, d_out]` (see `affine`)."""
    return affine(b, x.reshape(-1, x.shape[-1]), W).view(*x.shape[:-1], W.shape[-1])

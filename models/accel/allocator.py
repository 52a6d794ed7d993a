"""The `malloc` piece of `models.accel`: a process-wide malloc setting that keeps freed memory.

glibc's malloc serves large blocks from fresh `mmap` pages and returns them on `free`, and trims the top of its heap,
so every forward pass faults its activations in again page by page (about 10k minor faults per `run_with_cache` of
model a in benchmarks/forward.py, a fifth of its CPU time on the benchmark machine; benchmarks/README.md).
`keep_freed_memory()` sets glibc's `M_MMAP_THRESHOLD` to `MMAP_THRESHOLD` (its own dynamic maximum, so blocks below
it come from the heap) and `M_TRIM_THRESHOLD` to `TRIM_THRESHOLD`, so freed blocks are reused instead of re-faulted.
The cost: the process keeps up to `TRIM_THRESHOLD` of freed heap. So it is never applied unless asked for
(`models.accel.enable("malloc")`, `circuits train|report --accel`, `TOY_CIRCUITS_ACCEL=malloc`).
"""

from __future__ import annotations

import ctypes
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc <malloc.h>
MMAP_THRESHOLD = 32 * 2**20
TRIM_THRESHOLD = 2**30


def keep_freed_memory() -> bool:
    """Apply the setting (module docstring) to this process; True when glibc accepted it, False where it does not
    apply (another C library or OS)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # glibc only (musl's mallopt ignores these settings)  # noqa: B018
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))

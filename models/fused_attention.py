"""The fused training attention of `fused_attention.cpp`, compiled on this machine at first use and called by ctypes.

A training step's attention, done as batched products (`models.train_attention`'s `_BmmAttention`, torch's flash
kernel alike), sends each (sequence, head) pair's `[T, T]` square through memory between its products, softmax and
backward: on a CPU whose L3 is shared (a VM) that traffic, not the arithmetic, sets its speed. The kernel in
`fused_attention.cpp` keeps each pair's square in cache from the first product to the last (FlashAttention's
forward and backward, Dao et al. 2022, Algorithms 1 and 2, one block of keys per pair) and reads q, k, v and dz
in the projections' `[batch, pos, head, d_head]` layout (no layout copies around it). torch 2.13 has no such kernel
for float32 training on the CPU (its flash kernel runs MKL's `32 × 128` products; FlexAttention has no CPU
backward), so it is ours, ~330 lines of C++ with no dependency but OpenMP.

It is compiled with the system's C++ compiler (`$CXX`, else `g++`, else `c++`; `-O3 -fopenmp` and the first of
`-march=native` (x86), `-mcpu=native` (ARM) or neither that the compiler accepts) into
the toolkit's cache (`models.cache_dir.default_cache_dir() / "kernels"`, one file per source, compiler and CPU, written
atomically under a file lock) and used only where all of these hold, checked once per process and setting
(`models.train_attention._fused`):
- `TOY_CIRCUITS_FUSED_ATTENTION` is `auto` (the default; `off` turns it off) and `TOY_CIRCUITS_GEMM` is not `plain`
  (torch's own kernels only; `models.gemm`);
- Linux, a compiler that builds the source, and a library that shares torch's OpenMP runtime (`libgomp.so.1`, the
  one torch loaded: the pairs run on torch's own threads; a second runtime would fight them for the cores);
- on a probe it matches a float64 reference (values and gradients) and beats what would run instead (the batched
  oneDNN products, else torch's flash kernel) by `gemm.MIN_GAIN`.
`why_not()` says why it is not in use. Shapes it takes: float32, `d_head` a multiple of 16 up to 64, a causal
mask or none (other biases keep the batched products).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import torch

from .cache_dir import default_cache_dir
from .errors import ConfigError

ENV = "TOY_CIRCUITS_FUSED_ATTENTION"
SETTINGS = ("auto", "off")
SOURCE = Path(__file__).with_name("fused_attention.cpp")
FLAGS = ("-O3", "-std=c++17", "-fopenmp", "-shared", "-fPIC", "-Wno-psabi")
TARGETS = (("-march=native",), ("-mcpu=native",), ())  # tried in turn: the first the compiler takes
HEAD_SIZES = (16, 32, 48, 64)  # d_head the kernel's register blocks cover
_OPENMP = re.compile(r"\S*/lib(?:gomp|iomp5|omp)[-.\w]*\.so[.\d]*")

_lock = threading.Lock()
_state: dict[str, object] = {}  # "lib": the loaded library (or None), "why": why not


def _setting() -> str:
    value = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if value not in SETTINGS:
        raise ConfigError(f"{ENV}={value!r} is not a fused-attention setting; allowed: {', '.join(SETTINGS)}")
    return value


def _compiler() -> list[str] | None:
    """The compiler's command: `$CXX` (split as a shell would: "ccache g++"), else `g++`, else `c++` on PATH."""
    if os.environ.get("CXX", "").strip():
        return shlex.split(os.environ["CXX"])
    found = shutil.which("g++") or shutil.which("c++")
    return [found] if found else None


def _cpu_identity() -> str:
    """What `-march=native` / `-mcpu=native` compile for: the machine, and the CPU's model and feature lines."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    keep = [ln for ln in lines if ln.split(":")[0].strip() in ("model name", "flags", "Features", "CPU part")]
    return platform.machine() + "\n" + "\n".join(dict.fromkeys(keep))


def library_path(cxx: list[str]) -> Path:
    """Where the library built by `cxx` from this source for this CPU lives."""
    version = subprocess.run([*cxx, "--version"], capture_output=True, text=True, timeout=60).stdout
    key = hashlib.sha256("\0".join([SOURCE.read_text(), version, repr((FLAGS, TARGETS)), _cpu_identity()]).encode())
    return default_cache_dir() / "kernels" / f"fused_attention-{key.hexdigest()[:16]}.so"


def _build(cxx: list[str], target: Path) -> str | None:
    """Compile the source to `target` (atomically, under a lock shared with other processes); None, or why not."""
    from filelock import FileLock

    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if target.exists():
            return None
        logging.getLogger(__name__).info("compiling %s with %s (once per machine) into %s", SOURCE.name,
                                         shlex.join(cxx), target)
        fd, tmp = tempfile.mkstemp(prefix=target.stem + ".", suffix=".tmp.so", dir=target.parent)
        os.close(fd)
        try:
            for arch in TARGETS:
                run = subprocess.run([*cxx, *FLAGS, *arch, str(SOURCE), "-o", tmp], capture_output=True,
                                     text=True, timeout=300)
                if run.returncode == 0:
                    os.replace(tmp, target)
                    return None
            return f"{shlex.join(cxx)} failed to compile {SOURCE.name}: {run.stderr.strip()[-300:]}"
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)


def _openmp_runtimes() -> set[str]:
    return set(_OPENMP.findall(Path("/proc/self/maps").read_text()))


def _load() -> tuple[ctypes.CDLL | None, str]:
    if not sys.platform.startswith("linux"):
        return None, f"not Linux ({sys.platform}): the OpenMP runtime shared with torch cannot be checked"
    try:
        cxx = _compiler()
    except ValueError as e:  # shlex: unbalanced quotes
        return None, f"$CXX is not a command line: {e}"
    if cxx is None:
        return None, "no C++ compiler ($CXX, g++ or c++) on PATH"
    try:  # RuntimeError: no home directory for the cache
        path = library_path(cxx)
        why = None if path.exists() else _build(cxx, path)  # a read-only cache that holds it is enough
    except (OSError, subprocess.SubprocessError, RuntimeError) as e:
        return None, f"could not build the kernel: {e}"
    if why:
        return None, why
    torch.get_num_threads()  # torch's OpenMP runtime is loaded with torch; ours must resolve to it
    before = _openmp_runtimes()
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:  # a truncated file, a cache on a noexec mount
        return None, f"could not load the kernel: {e}"
    if _openmp_runtimes() != before:
        return None, "the kernel loaded a second OpenMP runtime beside torch's"
    i64p, f32p = ctypes.POINTER(ctypes.c_int64), ctypes.c_void_p
    common = [f32p, f32p, f32p, i64p, i64p, i64p]
    sizes = [ctypes.c_int64] * 4 + [ctypes.c_int, ctypes.c_float]
    lib.fa_forward.argtypes = common + sizes + [f32p, f32p, f32p, ctypes.c_int]
    lib.fa_backward.argtypes = common + [f32p, i64p] + sizes + [f32p, f32p, f32p, f32p, ctypes.c_int]
    lib.fa_forward.restype = lib.fa_backward.restype = ctypes.c_int
    return lib, ""


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
    q, k, v, dz = _rows(q, q), _rows(k, q), _rows(v, q), _rows(dz, q)
    B, T, H, D = q.shape
    if lse.shape != (B * H, T) or not lse.is_contiguous() or lse.dtype != torch.float32:
        raise ValueError(f"lse must be forward's [batch·head, pos] = {(B * H, T)} float32; got {tuple(lse.shape)}")
    grads = [q.new_empty(B, T, H, D) if n else None for n in need]
    _check(_kernel().fa_backward(q.data_ptr(), k.data_ptr(), v.data_ptr(), _strides(q), _strides(k), _strides(v),
                                dz.data_ptr(), _strides(dz), B, T, H, D, int(is_causal), scale, lse.data_ptr(),
                                *(_ptr(g) for g in grads), torch.get_num_threads()))
    return grads


def library() -> ctypes.CDLL | None:
    """The kernel, built and loaded on first call, or None where the setting, platform or compiler rules it out
    (`why_not` says which)."""
    if _setting() == "off":
        return None
    with _lock:
        if "lib" not in _state:
            _state["lib"], _state["why"] = _load()
    return _state["lib"]


def why_not() -> str:
    """Empty where `library()` is loaded, else why it is not."""
    if _setting() == "off":
        return f"{ENV}=off"
    return "" if library() is not None else str(_state["why"])


def takes(q: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """The kernel covers this call's shape and mask (the caller checks the rest: `models.train_attention.usable`)."""
    return bias is None and q.shape[-1] in HEAD_SIZES

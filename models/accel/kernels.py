"""The toolkit's compiled CPU kernels: `fused_attention.cpp` and `fused_loss.cpp` (with `simd.h`), built into one
library on this machine at first use and called by ctypes (`models.accel.fused_attention`, `models.accel.fused_loss`).

torch 2.13 has no fused float32 attention with a backward on the CPU, and its cross-entropy writes and reads back
three `[tokens, vocab]` tensors besides the logits; both are memory-bound in a training step of a small model
(benchmarks/README.md), so these two are ours, C++ with no dependency but OpenMP.

The library is compiled with the system's C++ compiler (`$CXX`, else `g++`, else `c++`; `-O3 -fopenmp` and the first
of `-march=native` (x86), `-mcpu=native` (ARM) or neither that the compiler accepts) into the toolkit's cache
(`models.io.cache_dir.default_cache_dir() / "kernels"`, one file per source text, compiler command line and version,
and CPU, written atomically under a file lock; a cache that already holds it needs no lock), and loaded only on Linux
and only where it shares torch's OpenMP runtime (`libgomp.so.1`, the one torch loaded: the kernels run on torch's own
threads; a second runtime would fight them for the cores). `library()` is the loaded library or None, `why_not()` the
reason. Each kernel's module adds its own switch (`setting`) and first-use probe (exactness against float64, speed
against torch).
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

from ..errors import ConfigError
from ..io.cache_dir import default_cache_dir
from . import gemm

SOURCES = tuple(Path(__file__).with_name(name) for name in ("fused_attention.cpp", "fused_loss.cpp"))
HEADERS = (Path(__file__).with_name("simd.h"),)
FLAGS = ("-O3", "-std=c++17", "-fopenmp", "-shared", "-fPIC", "-Wno-psabi")
TARGETS = (("-march=native",), ("-mcpu=native",), ())  # tried in turn: the first the compiler takes
SETTINGS = ("auto", "off")  # each kernel's switch (`setting`)
_OPENMP = re.compile(r"\S*/lib(?:gomp|iomp5|omp)[-.\w]*\.so[.\d]*")

_P, _I64, _INT, _F32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
_I64P = ctypes.POINTER(ctypes.c_int64)
_ATTENTION = [_P, _P, _P, _I64P, _I64P, _I64P]  # q, k, v and their strides
_SIZES = [_I64] * 4 + [_INT, _F32]  # B, T, H, D, causal, scale
SIGNATURES = {  # each exported function's arguments (all return int: 0, or an error code)
    "fa_forward": _ATTENTION + _SIZES + [_P, _P, _P, _INT],
    "fa_backward": _ATTENTION + [_P, _I64P] + _SIZES + [_P, _P, _P, _P, _I64P, _INT],
    "fl_forward": [_P, _I64, _I64, _I64, _P, _I64, _P, _P, _P, _INT],
    "fl_backward": [_P, _I64, _I64, _I64, _P, _I64, _P, _P, _P, _I64, _P, _I64, _INT],
}

_lock = threading.Lock()
_state: dict[str, object] = {}  # "lib": the loaded library (or None), "why": why not


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
    """Where the library built by `cxx` (its whole command line: `$CXX` may carry flags) from these sources for this
    CPU lives."""
    version = subprocess.run([*cxx, "--version"], capture_output=True, text=True, timeout=60).stdout
    texts = [p.read_text() for p in (*SOURCES, *HEADERS)]
    command = shlex.join([shutil.which(cxx[0]) or cxx[0], *cxx[1:]])
    key = hashlib.sha256("\0".join([*texts, command, version, repr((FLAGS, TARGETS)), _cpu_identity()]).encode())
    return default_cache_dir() / "kernels" / f"toy_circuits_kernels-{key.hexdigest()[:16]}.so"


def _build(cxx: list[str], target: Path) -> str | None:
    """Compile the sources to `target` (atomically, under a lock shared with other processes); None, or why not."""
    from filelock import FileLock

    target.parent.mkdir(parents=True, exist_ok=True)
    names = ", ".join(p.name for p in SOURCES)
    with FileLock(str(target) + ".lock"):
        if target.exists():
            return None
        logging.getLogger(__name__).info("compiling %s with %s (once per machine) into %s", names, shlex.join(cxx),
                                         target)
        fd, tmp = tempfile.mkstemp(prefix=target.stem + ".", suffix=".tmp.so", dir=target.parent)
        os.close(fd)
        try:
            run = None
            for arch in TARGETS:
                run = subprocess.run([*cxx, *FLAGS, *arch, *map(str, SOURCES), "-o", tmp], capture_output=True,
                                     text=True, timeout=300)
                if run.returncode == 0:
                    os.replace(tmp, target)
                    return None
            why = run.stderr.strip()[-300:] if run else "no target to compile for"
            return f"{shlex.join(cxx)} failed to compile {names}: {why}"
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
        return None, f"could not build the kernels: {e}"
    if why:
        return None, why
    torch.get_num_threads()  # torch's OpenMP runtime is loaded with torch; ours must resolve to it
    before = _openmp_runtimes()
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:  # a truncated file, a cache on a noexec mount
        return None, f"could not load the kernels: {e}"
    if _openmp_runtimes() != before:
        return None, "the kernels loaded a second OpenMP runtime beside torch's"
    for name, args in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, ctypes.c_int
    return lib, ""


def setting(env: str, what: str) -> str:
    """A kernel's switch: the environment variable `env`, `auto` (the default) or `off`."""
    value = os.environ.get(env, "auto").strip().lower() or "auto"
    if value not in SETTINGS:
        raise ConfigError(f"{env}={value!r} is not a {what} setting; allowed: {', '.join(SETTINGS)}")
    return value


_deciding = threading.RLock()  # one first decision at a time (a second caller waits for it, not probing again)


def decided(verdicts: dict, setting: str, *probes) -> bool:
    """Whether a kernel whose switch reads `setting` runs in this process: decided once per (`setting`,
    `TOY_CIRCUITS_GEMM`) pair and kept in `verdicts`; yes where the switch is not `off`, the GEMM setting not `plain`
    (torch's own kernels only), the library loaded and every probe (exactness, then speed) passes. The probes
    differentiate: they run with autograd on and outside inference mode, as the first call may come from an
    evaluation."""
    key = (setting, gemm._requested())
    if key not in verdicts:
        with _deciding, torch.inference_mode(False), torch.enable_grad():
            if key not in verdicts:
                verdicts[key] = (setting != "off" and key[1] != "plain" and library() is not None
                                 and all(probe() for probe in probes))
    return verdicts[key]


def library() -> ctypes.CDLL | None:
    """The kernels, built and loaded on first call, or None where the platform or compiler rules them out
    (`why_not` says which)."""
    with _lock:
        if "lib" not in _state:
            _state["lib"], _state["why"] = _load()
    return _state["lib"]


def why_not() -> str:
    """Empty where `library()` is loaded, else why it is not."""
    return "" if library() is not None else str(_state["why"])

"""`models.accel.kernels`: the compiled kernels are built once into the cache, atomically, loaded without a lock where
they exist, and refused with a reason (no compiler, a failing one, an unusable library or cache), in which case the
fused attention and the fused loss fall back to torch's kernels."""

import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from models.accel import fused_attention, fused_loss, kernels
from models.accel import train_attention as ta


def _falls_back() -> bool:
    """Neither compiled kernel is chosen, and the loss is still `F.cross_entropy`'s."""
    x, t = torch.randn(6, 11), torch.tensor([1, 2, 3, -100, 4, 5])
    same = torch.equal(fused_loss.cross_entropy(x, t, "none"), F.cross_entropy(x, t, reduction="none"))
    return not ta._fused(torch.zeros(1, 8, 2, 32), None) and not fused_loss._chosen() and same


@pytest.fixture
def compiler():
    if kernels._compiler() is None:
        pytest.skip("no C++ compiler")
    return kernels._compiler()


def test_built_once_into_the_cache_atomically(fresh_kernels, compiler):
    assert kernels.library() is not None, kernels.why_not()
    built = list((fresh_kernels / "kernels").glob("*.so"))
    assert [p.name for p in built] == [kernels.library_path(compiler).name]  # no temporary file left
    mtime = built[0].stat().st_mtime_ns
    kernels._state.clear()
    assert kernels.library() is not None and built[0].stat().st_mtime_ns == mtime  # loaded, not rebuilt


def test_the_declared_signatures_are_the_c_prototypes():
    """`kernels.SIGNATURES` (what ctypes passes) against each function's prototype in the C++ sources, argument by
    argument: an address for a pointer, int64 for `i64`, int for `int`, float for `float` (a mismatch would pass
    arguments in the wrong registers)."""
    import ctypes
    import re

    ctype = {"i64": ctypes.c_int64, "int": ctypes.c_int, "float": ctypes.c_float}
    found = {}
    for source in kernels.SOURCES:
        for name, params in re.findall(r"^int (\w+)\(([^)]*)\)", source.read_text(), re.M):
            found[name] = [p.replace("const", "").split()[0] for p in params.split(",")]
    assert set(found) == set(kernels.SIGNATURES)
    for name, params in found.items():
        declared = kernels.SIGNATURES[name]
        assert len(declared) == len(params), name
        for i, (c, t) in enumerate(zip(params, declared)):
            if c.endswith("*"):  # an address (a tensor's data_ptr), or an i64 array built by ctypes
                want = (ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64)) if c == "i64*" else (ctypes.c_void_p,)
            else:
                want = (ctype[c],)
            assert t in want, f"{name} argument {i}: {c} declared as {t}"


def test_the_compiler_command_line_is_in_the_cache_key(fresh_kernels, compiler, monkeypatch):
    """`$CXX` with flags (a sanitizer, fast-math) builds its own library, not the plain one's."""
    assert kernels.library_path(compiler) != kernels.library_path([*compiler, "-ffast-math"])
    assert kernels.library_path(compiler) == kernels.library_path(list(compiler))


def test_a_changed_source_builds_a_new_library(fresh_kernels, compiler, monkeypatch, tmp_path):
    """The cache key covers every source and header: an edited header is a new file, not the stale one."""
    first = kernels.library_path(compiler)
    header = tmp_path / "simd.h"
    header.write_text(kernels.HEADERS[0].read_text() + "\n// edited\n")
    monkeypatch.setattr(kernels, "HEADERS", (header,))
    assert kernels.library_path(compiler) != first


@pytest.mark.parametrize("cxx,why", [("/nonexistent/c++", "could not build"), ("false", "failed to compile"),
                                     ("env /nonexistent/c++", "failed to compile"),
                                     ('g++ "-O2', "not a command line")])
def test_no_compiler_falls_back_with_a_reason(fresh_kernels, monkeypatch, cxx, why):
    monkeypatch.setenv("CXX", cxx)
    assert kernels.library() is None and why in kernels.why_not()
    assert why in fused_attention.why_not() and why in fused_loss.why_not()
    assert _falls_back()
    assert not list(Path(fresh_kernels).rglob("*.so"))  # nothing half-written left behind


def test_a_compiler_without_march_native_builds_with_the_next_target(fresh_kernels, compiler, monkeypatch, tmp_path):
    """ARM's GCC takes `-mcpu=native`, not `-march=native`: the build tries the targets in turn."""
    seen = tmp_path / "seen"
    wrapper = tmp_path / "arm-like-c++"
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> {seen}\ncase "$*" in *-march=native*) exit 1;; esac\n'
                       f'exec {compiler[0]} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("CXX", str(wrapper))
    assert kernels.library() is not None, kernels.why_not()
    calls = [line for line in seen.read_text().splitlines() if "fused_attention.cpp" in line]
    assert ["-march=native" in c for c in calls] == [True, False] and "-mcpu=native" in calls[1]
    assert all("fused_loss.cpp" in c for c in calls)  # one library from every source


def test_no_compiler_on_path(fresh_kernels, monkeypatch):
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setenv("PATH", os.devnull)
    assert kernels.library() is None and kernels.why_not() == "no C++ compiler ($CXX, g++ or c++) on PATH"
    assert _falls_back()


def test_a_library_that_does_not_load_falls_back(fresh_kernels, compiler):
    """A truncated file in the cache (or one on a noexec mount) is refused with the loader's reason."""
    path = kernels.library_path(compiler)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\x7fELF truncated")
    assert kernels.library() is None and "could not load" in kernels.why_not()
    assert _falls_back()


def test_no_home_directory_falls_back(fresh_kernels, monkeypatch):
    monkeypatch.delenv("CIRCUITS_CACHE")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)

    def no_home():
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(Path, "home", no_home)
    assert kernels.library() is None and "home directory" in kernels.why_not()
    assert _falls_back()


def test_a_built_library_is_loaded_without_the_lock(fresh_kernels, compiler, monkeypatch):
    """A cache that already holds the library (a shared, read-only one) needs no lock and no build."""
    assert kernels.library() is not None, kernels.why_not()
    kernels._state.clear()
    monkeypatch.setattr(kernels, "_build", lambda *a: pytest.fail("rebuilt or locked a library that exists"))
    assert kernels.library() is not None


def test_a_kernel_is_decided_once_per_setting(monkeypatch):
    """`kernels.decided`: `off` and `TOY_CIRCUITS_GEMM=plain` say no without probing; otherwise the probes run once
    (in order, stopping at the first no, with autograd on even when called under `no_grad`), threads arriving at
    once wait for that one decision, and the verdict is kept per setting."""
    import threading
    import time

    from models.accel import gemm

    monkeypatch.setattr(kernels, "library", lambda: object())
    ran = []

    def exact():
        ran.append(("exact", torch.is_grad_enabled()))
        time.sleep(0.05)
        return True

    verdicts = {}
    assert not kernels.decided(verdicts, "off", exact) and ran == []
    with gemm.use("plain"):
        assert not kernels.decided(verdicts, "auto", exact) and ran == []
    with torch.no_grad():
        answers = []
        threads = [threading.Thread(target=lambda: answers.append(kernels.decided(verdicts, "auto", exact)))
                   for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert answers == [True] * 4 and ran == [("exact", True)]
    assert not kernels.decided({}, "auto", lambda: False, lambda: pytest.fail("probed after a no"))

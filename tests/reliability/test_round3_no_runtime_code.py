"""Round three (issue 32), rows 10-12: the compiled-kernel cache is gone (issue 29 removed run-time compilation and
`models/accel`), so nothing can be planted there. These tests hold that: no module of ours loads a shared library
(but libc's `renameat2`, `models/files/atomic.py`), builds a C++ extension or starts a compiler, and a training step,
report sections and generation, run with a cache folder holding a planted library and a FIFO (world-writable, as on
shared storage), open nothing in it but the token and tokenizer caches they write themselves."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("models", "circuits", "analyses")
LOADERS = {"ctypes", "cffi", "torch.utils.cpp_extension", "distutils", "setuptools", "subprocess"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return out


def test_no_module_of_ours_can_load_or_build_native_code():
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            hits = {m for m in _imports(path) if m in LOADERS or m.split(".")[0] in ("ctypes", "cffi")}
            text = path.read_text()
            hits |= {w for w in ("load_library", "load_inline", "dlopen", "CDLL(") if w in text}
            if hits:
                found[str(path.relative_to(ROOT))] = sorted(hits)
    # the one exception: libc's renameat2 for atomic folder swaps, looked up in the running process (CDLL(None))
    assert found == {"models/files/atomic.py": ["CDLL(", "ctypes"]}, found
    assert "ctypes.CDLL(None, use_errno=True)" in (ROOT / "models/files/atomic.py").read_text()
    assert not (ROOT / "models" / "accel").exists()


PROBE = r"""
import builtins, ctypes, json, os, subprocess, sys
from pathlib import Path

cache = Path(sys.argv[1])
opened, loaded, started = [], [], []
real_open, real_os_open = builtins.open, os.open
def spy_open(file, *a, **k):
    opened.append(str(file)); return real_open(file, *a, **k)
def spy_os_open(path, *a, **k):
    opened.append(str(path)); return real_os_open(path, *a, **k)
builtins.open, os.open = spy_open, spy_os_open
cdll_init = ctypes.CDLL.__init__
def spy_cdll(self, name, *a, **k):
    loaded.append(name); return cdll_init(self, name, *a, **k)
ctypes.CDLL.__init__ = spy_cdll
popen_init = subprocess.Popen.__init__
def spy_popen(self, args, *a, **k):
    started.append(str(args)); return popen_init(self, args, *a, **k)
subprocess.Popen.__init__ = spy_popen

import torch
import torch.utils.cpp_extension as ext
def refuse(*a, **k):
    raise AssertionError("a C++ extension was built or loaded at run time")
ext.load = ext.load_inline = torch.ops.load_library = torch.compile = refuse

import models
from analyses import build_report
from models import HookedTransformerConfig
from models.training.config import TrainConfig
from models.training.loop import train

out = Path(sys.argv[2])
cfg = HookedTransformerConfig(n_layers=2, d_model=16, n_ctx=16, d_vocab=259, n_heads=2, attn_only=True,
                              normalization_type=None)
model, _ = train(cfg, TrainConfig(steps=2, batch_size=2, data="synthetic:repeat", tokenizer="bytes",
                                  progress=False, out_dir=str(out / "run"), checkpoint_every=2, log_checkpoints=0,
                                  eval_every=2, val_sequences=2))
build_report(models.load(out / "run"), out / "report", folder=out / "run", sections=["overview", "attention",
             "copying"], progress=False, parallel=False)
model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=3, verbose=False)
planted = [p for p in opened if str(cache / "kernels") in p]
print(json.dumps({"planted_opened": planted, "loaded": [None if n is None else str(n) for n in loaded],
                  "started": started}))
"""


@pytest.mark.e2e  # a fresh interpreter: a training run, a report and generation under the spies
def test_a_training_step_and_a_report_load_nothing_from_a_planted_cache(tmp_path):
    cache = tmp_path / "shared-cache"
    kernels = cache / "kernels"
    kernels.mkdir(parents=True)
    (kernels / "fused_attention.so").write_bytes(b"\x7fELF planted")
    os.mkfifo(kernels / "fa_forward.so")
    for p in (cache, kernels, kernels / "fused_attention.so"):
        os.chmod(p, 0o777)  # another user's or world-writable, as on shared storage
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", CIRCUITS_CACHE=str(cache),
               XDG_CACHE_HOME=str(cache))
    r = subprocess.run([sys.executable, "-c", PROBE, str(cache), str(tmp_path / "out")], capture_output=True,
                       text=True, timeout=600, env=env, cwd=ROOT)  # timeout: the hang guard (a FIFO dlopen blocks)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["planted_opened"] == []
    import torch

    torch_lib = str(Path(torch.__file__).parent)  # torch's own import loads libtorch_global_deps.so with ctypes
    assert all(n is None or n.startswith(torch_lib) for n in got["loaded"]), got["loaded"]
    assert not [s for s in got["started"] if any(c in s for c in ("g++", "gcc", "c++", "cc ", "ninja", "clang"))]
    assert (tmp_path / "out" / "report" / "report.md").is_file()

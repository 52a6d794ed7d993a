"""Sizes that would exhaust memory are refused up front naming the option and its limit (`seq_len`, `--batch-size`,
`--windows`), and `--text-file` reads only what the windows need, so memory does not grow with the file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from models import HookedTransformer, HookedTransformerConfig, save
from models.data.tokenizer import ByteTokenizer

pytestmark = pytest.mark.e2e  # memory bounds of commands in subprocesses

ROOT = Path(__file__).resolve().parents[2]
MODEL = dict(n_layers=1, d_model=16, n_ctx=16, d_vocab=259, n_heads=2, d_mlp=None, normalization_type=None,
             positional_embedding_type="rotary", use_bias=False)
TRAIN = dict(steps=2, batch_size=4, data="synthetic:repeat", tokenizer="bytes", progress=False)


def circuits(*argv, timeout=120):
    env = dict(os.environ, PYTHONPATH=os.environ.get("PYTHONPATH") or str(ROOT))
    return subprocess.run([sys.executable, "-m", "analyses.cli", *argv], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=ROOT)


@pytest.mark.parametrize("train,args,option", [
    ({"seq_len": 10**9}, [], "seq_len"),
    ({}, ["--batch-size", str(10**9)], "--batch-size"),
])
def test_train_sizes_beyond_memory_exit_2_naming_the_option(tmp_path, train, args, option):
    spec = json.dumps({"model": MODEL, "train": dict(TRAIN, **train)})
    r = circuits("train", "--config", spec, "--out", str(tmp_path / "run"), "--no-scores", *args)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("circuits") or option in r.stderr
    assert option in r.stderr and "allowed" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("bounds")
    cfg = HookedTransformerConfig(**dict(MODEL, positional_embedding_type="shortformer", n_ctx=32), seed=0)
    save(HookedTransformer(cfg, tokenizer=ByteTokenizer()), d / "m")
    return d


def test_windows_beyond_memory_exit_2(folder):
    r = circuits("paths", str(folder / "m"), "--windows", str(10**8))
    assert r.returncode == 2, r.stderr
    assert "--windows" in r.stderr and "<=" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_text_file_memory_does_not_grow_with_the_file(folder):
    big = folder / "big.txt"
    line = b"def f(x):\n    return x + 1  # a line of python\n"
    big.write_bytes(line * (25_000_000 // len(line)))  # 25 MB
    # the child's own peak: VmHWM (its address space since exec); ru_maxrss would include the peak of this pytest
    # process, which the child inherits through fork and exec
    code = ("import resource, sys\nfrom analyses.cli import main\n"
            "rc = main(['paths', sys.argv[1], '--text-file', sys.argv[2], '--windows', '8', '--json'])\n"
            "try:\n    peak = next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM:'))\n"
            "except (OSError, StopIteration):\n    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
            "print(peak // 1024, rc)")
    env = dict(os.environ, PYTHONPATH=os.environ.get("PYTHONPATH") or str(ROOT))
    r = subprocess.run([sys.executable, "-c", code, str(folder / "m"), str(big)], capture_output=True, text=True,
                       env=env, timeout=120)
    peak_mb, rc = (int(x) for x in r.stdout.strip().splitlines()[-1].split())
    assert rc == 0, r.stderr
    assert peak_mb < 1200, peak_mb  # before: the whole file was tokenized (25 MB -> 4.7 GB, 73 s)

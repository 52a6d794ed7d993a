"""`circuits patch` and `circuits lens`: JSON that matches the library, figures written, fast help, and bad input
answered with exit code 2 and one line on stderr."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.e2e  # `circuits patch` end to end

ROOT = Path(__file__).resolve().parents[2]
CLEAN, CORRUPT = "x = foo(a, b)\ny = foo(a,", "x = foo(a, c)\ny = foo(a,"  # attn-only-2l: same token count


def run_json(*args) -> dict:
    from analyses import cli

    buf = io.StringIO()
    n = torch.get_num_threads()
    try:
        with contextlib.redirect_stdout(buf):
            rc = cli.main([str(a) for a in args] + ["--json", "--no-progress"])
    finally:
        torch.set_num_threads(n)
    assert rc == 0
    return json.loads(buf.getvalue())


def run_subprocess(*args) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, "-m", "analyses.cli", *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def test_patch_heads_json_matches_the_library(tmp_path):
    import models
    from analyses import patching as P

    out = tmp_path / "heads.png"
    obj = run_json("patch", "attn-only-2l", "--clean", CLEAN, "--corrupt", CORRUPT, "--answer", " b", "--wrong", " c",
                   "--figure", out)
    assert obj["metric"] == "logit_diff" and obj["direction"] == "denoising" and obj["clean"] > obj["corrupt"]
    assert set(obj["results"]) == {"z", "q", "k", "v", "pattern"}
    assert out.stat().st_size > 10_000 and not list(tmp_path.glob(".heads-*"))  # written, no temp file left
    m = models.load("attn-only-2l")
    met = P.metric("logit_diff", P.answers(m, 1, " b", " c"))
    ref = P.activation_patching(m, m.to_tokens(CLEAN), m.to_tokens(CORRUPT), met, kind="z", progress=False)
    torch.testing.assert_close(torch.tensor(obj["results"]["z"]["values"], dtype=torch.float64), ref.values,
                               atol=1e-5, rtol=0)


@pytest.mark.parametrize("what", ["resid", "paths"])
def test_patch_resid_and_paths(what):
    obj = run_json("patch", "attn-only-2l", "--clean", CLEAN, "--corrupt", CORRUPT, "--answer", " b", "--what", what)
    assert obj["metric"] == "loss"
    r = next(iter(obj["results"].values()))
    assert r["direction"] == ("noising" if what == "paths" else "denoising")
    assert r["axes"] == (["component", "sender", "receiver"] if what == "paths" else ["layer", "pos"])


def test_lens(tmp_path):
    out = tmp_path / "lens.png"
    obj = run_json("lens", "attn-only-2l", "--text", "def f(x):\n    return x\n", "--top", "2", "--figure", out)
    assert obj["labels"] == ["0_pre", "1_pre", "final_post"] and out.is_file()
    assert len(obj["next_token_prob"][0]) == len(obj["tokens"]) - 1 and len(obj["top_ids"][0][0]) == 2


@pytest.mark.parametrize("command", ["patch", "lens"])
def test_help(command):
    r = run_subprocess(command, "--help")
    assert r.returncode == 0 and f"usage: circuits {command}" in r.stdout
    for opt in ("--json", "--device", "--seed", "--figure", "--csv"):
        assert opt in r.stdout


BAD = [
    (["patch", "attn-only-2l", "--clean", "x = 1", "--corrupt", "x = 12", "--answer", "1"], "same number of tokens"),
    (["patch", "attn-only-2l", "--clean", CLEAN, "--corrupt", CORRUPT, "--answer", "hello world"], "not one"),
    (["patch", "attn-only-2l", "--clean", CLEAN, "--corrupt", CORRUPT, "--answer", " b", "--metric", "logit-diff"],
     "needs a wrong answer"),
    (["patch", "attn-only-2l", "--clean", CLEAN, "--corrupt", CORRUPT, "--answer", " b", "--pos", "99"], "--pos 99"),
    (["patch", "attn-only-2l", "--clean", CLEAN, "--corrupt", CORRUPT, "--answer", " b", "--figure", "f.jpg"], ".png"),
    (["patch", "attn-only-1l", "--clean", CLEAN, "--corrupt", CORRUPT, "--answer", " b", "--what", "paths"],
     "at least 2 attention layer"),
    (["patch", "attn-only-2l", "--clean", CLEAN, "--corrupt", CORRUPT, "--answer", "9999"], "out of range"),
    (["lens", "attn-only-2l", "--text", ""], "--text is empty"),
    (["lens", "attn-only-2l", "--text", "x", "--top", "0"], "--top must be >= 1"),
    (["lens", "no-such-model", "--text", "x"], "attn-only-2l"),
]


@pytest.mark.parametrize("argv,match", BAD, ids=[m for _, m in BAD])
def test_bad_input_exit_2_one_line(argv, match, capsys):
    from analyses import cli

    n = torch.get_num_threads()
    try:
        rc = cli.main(argv)
    finally:
        torch.set_num_threads(n)
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert rc == 2 and len(err) == 1 and match in err[0], err


def test_bad_input_in_a_subprocess_and_argparse_choices():
    for argv, match in ((BAD[0][0], "same number of tokens"),
                        (["patch", "attn-only-2l", "--clean", "a", "--corrupt", "b", "--answer", "1", "--what", "mlp"],
                         "invalid choice: 'mlp'")):
        r = run_subprocess(*argv)
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode == 2 and len(lines) == 1 and match in lines[0] and "Traceback" not in r.stderr, r.stderr

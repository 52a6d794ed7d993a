"""Every `circuits` subcommand given bad input: exit code 2, exactly one line on stderr, no traceback.

Run in process (cheap) for the whole matrix; a few cases also through a real subprocess, where a stray traceback or
a warning would show."""

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

from models import HookedTransformer, HookedTransformerConfig, save
from models.data.tokenizer import ByteTokenizer

ROOT = Path(__file__).resolve().parents[2]
ANALYSIS = ["info", "report", "heads", "eigen", "compose", "paths", "trigrams", "attention", "generate"]
REQUIRED = {"report": ["--out", "{d}/r"], "trigrams": ["--head", "0.0"], "attention": ["--text", "ab", "--figure",
            "{d}/x.png"], "generate": ["--prompt", "ab", "--max-new-tokens", "2"]}


@pytest.fixture(scope="module")
def d(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli-bad")
    cfg = HookedTransformerConfig(n_layers=2, d_model=16, n_ctx=32, d_vocab=259, n_heads=2, d_mlp=None,
                                  normalization_type=None, positional_embedding_type="shortformer", seed=0)
    save(HookedTransformer(cfg, tokenizer=ByteTokenizer()), d / "tiny")
    small = cfg.replace(d_vocab=50)
    torch.save(HookedTransformer(small).state_dict(), d / "small.pth")
    (d / "small.json").write_text(small.to_json())
    ByteTokenizer().save(d / "bytes.json")
    (d / "file.txt").write_text("hello")
    (d / "binary.txt").write_bytes(b"\x00\x01\x02" * 50)
    os.symlink(d / "nowhere", d / "dangling")
    nan = HookedTransformer(cfg, tokenizer=ByteTokenizer())
    with torch.no_grad():
        nan.blocks[1].attn.W_V[0, 0, 0] = float("nan")
    save(nan, d / "nan")
    return d


def run_cli(argv) -> tuple[int, list[str], str]:
    from analyses import cli

    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            rc = cli.main([str(a) for a in argv])
        except SystemExit as e:  # argparse
            rc = e.code
    text = err.getvalue()
    return rc, [ln for ln in text.splitlines() if ln.strip()], text


def assert_usage_error(argv, match):
    rc, lines, text = run_cli(argv)
    assert rc == 2, (rc, text)
    assert "Traceback" not in text
    assert len(lines) == 1, text
    assert match in lines[0], lines[0]


def fill(args, d):
    return [str(a).format(d=d) for a in args]


BAD_MODELS = [
    ("no-such-model", [], "unknown model 'no-such-model'"),
    ("{d}/missing.pth", [], "no such file"),
    ("{d}/small.pth", [], "pass --config"),
    ("{d}/file.txt", [], "pass --config"),  # a file where a folder or state dict is expected
    ("{d}/dangling", [], "unknown model"),
    ("{d}/small.pth", ["--config", "{d}/file.txt"], "is not valid JSON"),
    ("{d}/small.pth", ["--config", "{d}/nope.json"], "cannot read config"),
    ("{d}/tiny", ["--config", "{d}/small.json"], "only for a state-dict"),
    ("{d}/small.pth", ["--config", "{d}/small.json", "--tokenizer", "{d}/bytes.json"],
     "has 259 ids but the model's d_vocab is 50"),
    ("{d}/tiny", ["--device", "tpu"], "device"),
]


# every bad model through two commands, every command at least twice: one loader serves all of them
@pytest.mark.parametrize("command,model,extra,match", [
    (ANALYSIS[(i + k) % len(ANALYSIS)], *case) for i, case in enumerate(BAD_MODELS) for k in (0, len(ANALYSIS) // 2)])
def test_bad_models(d, command, model, extra, match):
    argv = [command, model, *extra, *REQUIRED.get(command, [])]
    assert_usage_error(fill(argv, d), match)


@pytest.mark.parametrize("command", ["trigrams", "attention"])
@pytest.mark.parametrize("head,match", [("9.9", "out of range: layers 0..1, heads 0..1"), ("x", "expected LAYER.HEAD"),
                                        ("1.5.2", "expected LAYER.HEAD"), ("-1.0", "out of range"),
                                        ("L9H0", "out of range"), ("", "expected LAYER.HEAD")])
def test_bad_heads(d, command, head, match):
    argv = [command, "{d}/tiny", "--head", head] + (["--text", "ab", "--figure", "{d}/x.png"] if command == "attention"
                                                   else [])
    assert_usage_error(fill(argv, d), match)


@pytest.mark.parametrize("argv,match", [
    (["compose", "{d}/tiny", "--kind", "x"], "invalid choice: 'x'"),
    (["compose", "{d}/tiny", "--kind", ""], "invalid choice"),
    (["compose", "{d}/tiny", "--top", "0"], "expected a positive integer, got 0"),
    (["compose", "{d}/tiny", "--top", "-1"], "expected a positive integer, got -1"),
    (["paths", "{d}/tiny", "--top", "0"], "expected a positive integer"),
    (["paths", "{d}/tiny", "--windows", "-2"], "expected a positive integer"),
    (["trigrams", "{d}/tiny", "--head", "0.0", "--top", "-1"], "expected a positive integer"),
    (["trigrams", "{d}/tiny", "--head", "0.0", "--top", "1.5"], "expected a positive integer, got '1.5'"),
    (["report", "{d}/tiny", "--out", "{d}/r", "--windows", "0"], "expected a positive integer"),
    (["eigen", "{d}/tiny", "--eigenvalues", "-3"], "--eigenvalues must be >= 0"),
    (["heads", "{d}/tiny", "--threshold", "nan"], "--threshold must be a finite number"),
    (["heads", "{d}/tiny", "--threshold", "x"], "--threshold"),
    (["attention", "{d}/tiny", "--text", "", "--figure", "{d}/x.png"], "--text is empty"),
    (["attention", "{d}/tiny", "--text", "ab", "--figure", "{d}/x.jpg"], "expected a .png"),
    (["attention", "{d}/tiny", "--text", "ab", "--figure", "{d}/no/x.png"], "does not exist"),
    (["generate", "{d}/tiny", "--prompt", ""], "--prompt is empty"),
    (["generate", "{d}/tiny", "--prompt", "a", "--temperature", "nan"], "--temperature must be a number >= 0"),
    (["generate", "{d}/tiny", "--prompt", "a", "--temperature", "-1"], "--temperature must be a number >= 0"),
    (["generate", "{d}/tiny", "--prompt", "a", "--top-p", "0"], "--top-p must be in (0, 1]"),
    (["generate", "{d}/tiny", "--prompt", "a", "--max-new-tokens", "-1"], "--max-new-tokens must be >= 0"),
    (["report", "{d}/tiny", "--out", "{d}/file.txt"], "exists and is not a folder"),
    (["report", "{d}/tiny", "--out", "{d}/file.txt/sub"], "Not a directory"),
    (["report", "{d}/tiny", "--out", "{d}/r", "--sections", "bogus"], "unknown section(s) bogus"),
    (["heads", "{d}/tiny", "--text-file", "{d}/binary.txt"], "looks binary"),
    (["heads", "{d}/tiny", "--text-file", "{d}"], "cannot read --text-file"),  # a folder where a file is expected
    (["heads", "{d}/tiny", "--text-file", "{d}/dangling"], "cannot read --text-file"),
    (["eigen", "{d}/tiny", "--threads", "0"], "--threads must be >= 1"),
    (["eigen", "{d}/nan"], "W_V holds non-finite values"),
    (["compose", "{d}/nan"], "W_V holds non-finite values"),
    (["trigrams", "{d}/nan", "--head", "1.0"], "W_V holds non-finite values"),
    (["train", "--preset", "nope", "--out", "{d}/t"], "unknown preset 'nope'"),
    (["train", "--config", "{d}/file.txt", "--out", "{d}/t"], "is not valid JSON"),
    (["train", "--config", "{d}/small.json", "--out", "{d}/t", "--data", "{d}/dangling"], "does not exist"),
    (["train", "--config", "{d}/small.json", "--out", "{d}/t", "--steps", "0"], "steps must be an int >= 1"),
    (["train", "--config", "{d}/small.json", "--out", "{d}/t", "--tokenizer", "bpe-x", "--data", "{d}/file.txt"],
     "expected 'bpe-<vocab size>'"),
    (["bogus"], "invalid choice: 'bogus'"),
])
def test_bad_options(d, argv, match):
    assert_usage_error(fill(argv, d), match)


def test_nothing_written_by_failed_commands(d):
    before = sorted(p.name for p in d.iterdir())
    run_cli(fill(["report", "no-such-model", "--out", "{d}/never"], d))
    run_cli(fill(["attention", "{d}/tiny", "--text", "", "--figure", "{d}/never.png"], d))
    assert sorted(p.name for p in d.iterdir()) == before


@pytest.mark.e2e
@pytest.mark.parametrize("argv,match", [
    (["eigen", "{d}/nan", "--json"], "non-finite"),
    (["trigrams", "{d}/tiny", "--head", "x"], "expected LAYER.HEAD"),
    (["info", "{d}/small.pth", "--config", "{d}/small.json", "--tokenizer", "{d}/bytes.json"], "d_vocab is 50"),
])
def test_subprocess_one_line_no_traceback(d, argv, match):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-m", "analyses.cli", *fill(argv, d)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and match in lines[0] and "Traceback" not in r.stderr, r.stderr
    assert r.stdout == "" or json.loads(r.stdout) is not None

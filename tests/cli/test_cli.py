"""End to end: the real `circuits` command in a subprocess, for every subcommand.

Success output, `--json` that parses, exit code 2 with a one-line message on bad input, exit code 1 on internal
failure, and `--help` answering in under 0.5 s. Tiny saved models (made here, in a temporary folder) keep the fast
suite fast; the zoo models are exercised in the slow job when they exist.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from models import HookedTransformer, HookedTransformerConfig, save
from models.data.tokenizer import ByteTokenizer

pytestmark = pytest.mark.e2e  # the command line end to end, mostly in subprocesses

ROOT = Path(__file__).resolve().parents[2]
ZOO = ROOT / "models" / "zoo"
TEXT = ROOT / "analyses" / "scores.py"  # natural-ish text for the scores that need it (bytes tokenizer)
SUBCOMMANDS = ["zoo", "info", "train", "report", "heads", "eigen", "compose", "paths", "trigrams", "attention",
               "generate"]


def circuits(*args, timeout: int = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, "-m", "analyses.cli", *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def ok(*args) -> str:
    r = circuits(*args)
    assert r.returncode == 0, f"exit {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    assert "Traceback" not in r.stderr
    return r.stdout


def ok_json(*args) -> dict:
    return json.loads(ok(*args, "--json", "--no-progress") if args[0] not in ("zoo", "info") else ok(*args, "--json"))



def in_process_json(*args) -> dict:
    """Run `circuits ... --json` in this process (cheaper than a subprocess) and parse its stdout."""
    import contextlib
    import io

    from analyses import cli

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = cli.main([str(a) for a in args] + ["--json", "--no-progress"])
    assert rc == 0
    return json.loads(buf.getvalue())


def usage_error(*args, match: str) -> str:
    r = circuits(*args)
    assert r.returncode == 2, f"exit {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    assert "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert match in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    """tiny/ (2-layer attention-only, bytes tokenizer), tiny.pth + tiny_config.json (a legacy state dict),
    mlp/ (1 layer with an MLP and LayerNorm)."""
    d = tmp_path_factory.mktemp("cli-models")
    cfg = HookedTransformerConfig(n_layers=2, d_model=32, n_ctx=64, d_vocab=259, n_heads=2, d_mlp=None,
                                  attn_only=True, normalization_type=None, positional_embedding_type="shortformer",
                                  use_bias=False, seed=0, model_name="tiny")
    m = HookedTransformer(cfg, tokenizer=ByteTokenizer())
    save(m, d / "tiny")
    torch.save(m.state_dict(), d / "tiny.pth")
    (d / "tiny_config.json").write_text(cfg.to_json())
    tl = {"n_layers": 2, "d_model": 32, "n_ctx": 64, "d_head": 16, "n_heads": 2, "d_vocab": 259, "d_mlp": None,
          "act_fn": None, "attn_only": True, "normalization_type": None, "positional_embedding_type": "standard",
          "shortformer_pos": True, "tokenizer_name": None, "d_vocab_out": 259}  # TransformerLens' own config dict
    (d / "tiny_tl_config.json").write_text(json.dumps(tl))
    mlp = HookedTransformerConfig(n_layers=1, d_model=32, n_ctx=64, d_vocab=259, n_heads=2, d_mlp=64,
                                  normalization_type="LN", positional_embedding_type="standard", seed=0)
    save(HookedTransformer(mlp, tokenizer=ByteTokenizer()), d / "mlp")
    return d


# --- help ---------------------------------------------------------------------------------------------
def test_help_lists_every_subcommand():
    out = circuits("--help").stdout
    for c in SUBCOMMANDS:
        assert f"    {c}" in out, c


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_subcommand_help(command, capsys):
    from analyses.cli import build_parser

    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args([command, "--help"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0 and f"usage: circuits {command}" in out
    for opt in ("--json", "--device", "--seed"):
        assert opt in out, (command, opt)


def test_every_help_page_imports_no_torch():
    """What keeps `--help` fast: the parser and every command's help are built without importing torch."""
    code = ("import sys; from analyses.cli import build_parser, COMMAND_MODULES; p = build_parser(); p.format_help(); "
            "[a.choices[c].format_help() for a in p._subparsers._group_actions for c in a.choices]; "
            "print('torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.stdout.strip() == "False", r.stderr


def test_cli_module_does_not_import_torch():
    code = "import sys, analyses.cli; print('torch' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "False", r.stderr


# --- every subcommand: JSON in the fast suite, text output in the slow job ----------------------------------
def test_zoo_lists_json():
    out = ok_json("zoo")
    assert isinstance(out["models"], list)
    names = {m["name"] for m in out["models"]}
    assert names == {p.parent.name for p in ZOO.glob("*/config.json")}


def test_info(models_dir):
    out = ok_json("info", models_dir / "tiny")
    assert out["config"]["n_layers"] == 2 and out["tokenizer"].startswith("bytes")
    assert out["parameters"]["total"] == sum(v for k, v in out["parameters"].items() if k != "total")
    assert "blocks.0.attn.hook_z" in out["hooks"]
    # only hook points that fire: TransformerLens' opt-in points are listed while switched on
    assert not any(h.endswith(("hook_attn_in", "hook_q_input", "hook_mlp_in")) for h in out["hooks"])
    assert ("blocks.0.attn.hook_result" in out["hooks"]) == out["config"]["use_attn_result"]


def test_legacy_state_dict_with_config(models_dir):
    """A TransformerLens-layout .pth with --config gives the same numbers as the saved folder."""
    from analyses import cli

    a = ok_json("eigen", models_dir / "tiny.pth", "--config", models_dir / "tiny_tl_config.json")
    b = in_process_json("eigen", models_dir / "tiny")
    assert [h["ov_copying"] for h in a["heads"]] == pytest.approx([h["ov_copying"] for h in b["heads"]])
    assert cli.main(["info", str(models_dir / "tiny.pth"), "--config", str(models_dir / "tiny_config.json")]) == 0


def test_heads(models_dir):
    out = ok_json("heads", models_dir / "tiny", "--text-file", TEXT)
    assert [h["head"] for h in out["heads"]] == ["L0H0", "L0H1", "L1H0", "L1H1"]
    for h in out["heads"]:
        assert {"induction", "prefix_matching", "previous_token", "copying_behavioural", "ov_copying",
                "verdict"} <= set(h)
        assert 0 <= h["induction"] <= 1 and isinstance(h["verdict"], list)


def test_eigen(models_dir):
    out = ok_json("eigen", models_dir / "tiny", "--eigenvalues", 2)
    for h in out["heads"]:
        assert -1 <= h["ov_copying"] <= 1 and -1 <= h["qk_copying"] <= 1 and len(h["ov_eigenvalues"]) == 2
    assert out["heads"][2]["k_partner"] in ("L0H0", "L0H1") and out["heads"][0]["k_partner"] is None


def test_compose(models_dir):
    out = ok_json("compose", models_dir / "tiny", "--kind", "k", "--top", 3)
    assert out["kind"] == "k" and 0 < out["baseline"] < 1 and len(out["top"]) == 3
    assert out["earlier_heads"] == ["L0H0", "L0H1"] and out["later_heads"] == ["L1H0", "L1H1"]
    assert all(0 <= v <= 1 for row in out["scores"] for v in row)
    for kind in ("q", "v"):
        assert in_process_json("compose", models_dir / "tiny", "--kind", kind)["kind"] == kind


def test_paths(models_dir):
    out = ok_json("paths", models_dir / "tiny", "--windows", 2, "--text-file", TEXT)
    assert out["n_terms"] == [1, 4, 4] and len(out["losses_by_order"]) == 3
    assert out["losses_by_order"][-1] == pytest.approx(out["model_loss"], abs=1e-3)
    assert {t["term"] for t in out["top_terms"]} <= set(out["per_term"])


def test_trigrams(models_dir):
    out = ok_json("trigrams", models_dir / "tiny", "--head", "0.1", "--top", 5, "--bugs")
    assert out["head"] == "L0H1" and 0 < len(out["skip_trigrams"]) <= 5 and isinstance(out["bugs"], list)
    assert {"source", "destination", "out", "qk", "ov"} <= set(out["skip_trigrams"][0])


def test_attention(models_dir, tmp_path):
    png = tmp_path / "all.png"
    out = ok_json("attention", models_dir / "tiny", "--text", "abcabc", "--figure", png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out["tokens"][0] == "<|bos|>" and len(out["tokens"]) == 7
    assert set(out["heads"]) == {"L0H0", "L0H1", "L1H0", "L1H1"}
    row = out["heads"]["L1H0"]["pattern"][3]
    assert sum(row) == pytest.approx(1, abs=1e-4) and all(v == 0 for v in row[4:])


def test_generate_is_seeded(models_dir):
    a = ok_json("generate", models_dir / "tiny", "--prompt", "x", "--max-new-tokens", 5, "--seed", 3, "--samples", 2)
    b = in_process_json("generate", models_dir / "tiny", "--prompt", "x", "--max-new-tokens", 5, "--seed", 3,
                        "--samples", 2)
    assert a["samples"] == b["samples"] and len(a["samples"]) == 2
    assert all(len(s["tokens"]) == 1 + 1 + 5 for s in a["samples"])  # BOS + prompt + new tokens


def test_report_sections(models_dir, tmp_path):
    out_dir = tmp_path / "rep"
    out = ok_json("report", models_dir / "tiny", "--out", out_dir, "--sections", "overview,composition",
                  "--text-file", TEXT, "--windows", 4)
    assert out["sections"] == ["overview", "composition"] and out["failed"] == {}
    md = (out_dir / "report.md").read_text()
    assert "## Overview" in md and "## Two layers" in md
    assert all(Path(f).is_file() for f in out["figures"])


TEXT_RUNS = {
    "zoo": ([], None),
    "info": (["{tiny}"], "blocks.1.attn.hook_pattern"),
    "heads": (["{tiny}", "--text-file", str(TEXT)], "induction heads:"),
    "eigen": (["{tiny}", "--eigenvalues", "2"], "OV copying"),
    "compose": (["{tiny}", "--kind", "v"], "V-composition"),
    "paths": (["{tiny}", "--windows", "2", "--text-file", str(TEXT)], "L1H1∘L0H0"),
    "trigrams": (["{tiny}", "--head", "L0H1", "--top", "5", "--bugs"], "skip-trigram bugs"),
    "attention": (["{tiny}", "--text", "abcabc", "--head", "1.0", "--figure", "{tmp}/p.png"], "most-attended"),
    "generate": (["{tiny}", "--prompt", "def ", "--max-new-tokens", "4", "--temperature", "0"], "def "),
    "report": (["{tiny}", "--out", "{tmp}/r", "--sections", "overview", "--text-file", str(TEXT)], "wrote "),
}


@pytest.mark.slow
@pytest.mark.parametrize("command", sorted(TEXT_RUNS))
def test_text_output(models_dir, tmp_path, command):
    args, expect = TEXT_RUNS[command]
    args = [a.format(tiny=models_dir / "tiny", tmp=tmp_path) for a in args]
    text = ok(command, *args)
    assert text.strip() and (expect is None or expect in text)


# --- bad usage and bad input: exit 2, one line ------------------------------------------------------------
def test_unknown_model_lists_the_zoo():
    line = usage_error("info", "no-such-model", match="unknown model 'no-such-model'")
    assert "zoo models:" in line
    for name in (p.parent.name for p in ZOO.glob("*/config.json")):
        assert name in line


def test_head_out_of_range(models_dir):
    usage_error("trigrams", models_dir / "tiny", "--head", "9.9", match="out of range: layers 0..1, heads 0..1")


def test_missing_file(models_dir, tmp_path):
    usage_error("info", tmp_path / "missing.pth", "--config", models_dir / "tiny_config.json", match="no such file")


def test_argparse_errors_are_one_line():
    usage_error("compose", "attn-only-2l", "--kind", "x", match="invalid choice: 'x'")
    usage_error("trigrams", "attn-only-2l", match="required: --head")
    usage_error("bogus", match="invalid choice: 'bogus'")
    usage_error("heads", "x", "--seed", "abc", match="--seed")


@pytest.mark.parametrize("args,match", [
    (["info", "{tiny}.pth"], "pass --config"),
    (["info", "{tiny}.pth", "--config", "{tmp}/nope.json"], "cannot read config"),
    (["info", "{tmp}/bad.pth", "--config", "{tiny}_config.json"], "refused or unreadable"),
    (["info", "{tiny}", "--config", "{tiny}_config.json"], "only for a state-dict"),
    (["paths", "{dir}/mlp"], "attention-only"),
    (["compose", "{dir}/mlp"], "at least 2 attention layer"),
    (["heads", "{tiny}", "--text-file", "{tmp}/none.txt"], "cannot read --text-file"),
    (["attention", "{tiny}", "--text", "ab", "--head", "one", "--figure", "{tmp}/x.png"], "expected LAYER.HEAD"),
    (["attention", "{tiny}", "--text", "ab", "--figure", "{tmp}/no/x.png"], "does not exist"),
    (["attention", "{tiny}.pth", "--config", "{tiny}_config.json", "--text", "ab", "--figure", "{tmp}/x.png"],
     "no tokenizer"),
    (["report", "{tiny}", "--out", "{tmp}/r", "--sections", "bogus"], "unknown section(s) bogus"),
    (["generate", "{tiny}", "--prompt", "x", "--top-p", "2"], "--top-p must be in (0, 1]"),
    (["eigen", "{tiny}", "--device", "tpu"], "device"),
])
def test_bad_input_in_process(models_dir, tmp_path, capsys, args, match):
    """The same checks without a subprocess each (the subprocess path is covered above)."""
    from analyses import cli

    (tmp_path / "bad.pth").write_bytes(b"not a checkpoint")
    argv = [a.format(tiny=models_dir / "tiny", tmp=tmp_path, dir=models_dir) for a in args]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and match in err[0], err


def test_unavailable_device(models_dir, capsys):
    from analyses import cli

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert cli.main(["eigen", str(models_dir / "tiny"), "--device", "cuda"]) == 2
    assert "not available" in capsys.readouterr().err


def test_internal_failure_exit_1(monkeypatch, capsys):
    from analyses import cli

    def boom(args):
        raise RuntimeError("kaboom")

    monkeypatch.setattr(cli, "COMMANDS", [cli.Command("boom", "fails", lambda p: None, boom)])
    assert cli.main(["boom"]) == 1
    assert "internal error: RuntimeError: kaboom" in capsys.readouterr().err


# --- the zoo models (slow job; an unknown or missing model makes `ok` fail with the CLI's message) ---------
@pytest.mark.slow
def test_zoo_two_layer_heads_and_composition():
    heads = ok_json("heads", "attn-only-2l")
    induction = heads["induction_heads"]
    assert induction and all(h.startswith("L1") for h in induction), induction
    assert heads["previous_token_heads"] and all(h.startswith("L0") for h in heads["previous_token_heads"])
    comp = ok_json("compose", "attn-only-2l", "--kind", "k", "--top", 3)
    assert comp["top"][0]["earlier"] in heads["previous_token_heads"]
    assert comp["top"][0]["later"] in induction


@pytest.mark.slow
def test_zoo_report_and_paths(tmp_path):
    out = ok_json("report", "attn-only-2l", "--out", tmp_path / "r", "--windows", 16)
    assert out["failed"] == {} and "composition" in out["sections"] and out["figures"]
    paths = ok_json("paths", "attn-only-2l", "--windows", 4)
    assert paths["gains"][0] > paths["gains"][1] > -0.05  # single heads matter more than virtual heads


@pytest.mark.slow
@pytest.mark.parametrize("name", ["attn-only-0l", "attn-only-1l", "gelu-2l"])
def test_zoo_models_load_and_run(name):
    info = ok_json("info", name)
    assert info["final_val_loss"] is None or info["final_val_loss"] < math.log(info["config"]["d_vocab"])  # < uniform
    ok("generate", name, "--prompt", "import os\n", "--max-new-tokens", 8, "--no-progress")
    if info["config"]["n_layers"] >= 1:
        assert ok_json("eigen", name)["heads"]

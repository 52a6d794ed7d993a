"""Model kinds on the command line: every command that reads MODEL declares the kinds it serves (one run function per
kind), the dispatcher loads the model once and refuses any other kind in one line (exit 2) naming the command, the
model's kind and the kinds served, and nothing in `analyses/` tests a model's kind but `models.model_kind`.

Runs `analyses.cli.main` in this process on tiny saved models of each kind (no zoo model, no subprocess)."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest

from models.arch.kind import DECODER, ENCODER, ENCODER_DECODER, KIND_NAMES, KINDS

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """One tiny saved model folder per kind."""
    from models import save
    from models.arch.config import HookedTransformerConfig
    from models.arch.encoder import EncoderConfig, HookedEncoder
    from models.arch.encoder_decoder import HookedEncoderDecoder
    from models.arch.encoder_decoder_config import EncoderDecoderConfig
    from models.arch.model import HookedTransformer

    base = tmp_path_factory.mktemp("kinds")
    built = {
        DECODER: HookedTransformer(HookedTransformerConfig(n_layers=2, d_model=16, n_ctx=8, d_vocab=20, n_heads=2,
                                                           attn_only=True, seed=0)),
        ENCODER: HookedEncoder(EncoderConfig(n_layers=1, d_model=16, n_ctx=8, d_vocab=20, n_heads=2, seed=0)),
        ENCODER_DECODER: HookedEncoderDecoder(EncoderDecoderConfig(d_model=16, n_heads=2, d_vocab_src=11,
                                                                   d_vocab_tgt=13, n_ctx_src=8, n_ctx_tgt=9, seed=0)),
    }
    for kind, model in built.items():
        save(model, base / kind)
    return {kind: base / kind for kind in built}


def _main(capsys, *argv) -> subprocess.CompletedProcess:
    from analyses import cli

    capsys.readouterr()
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(argv, code, out, err)


def _model_commands():
    from analyses.cli import COMMANDS

    return [c for c in COMMANDS if isinstance(c.run, dict)]


#: the arguments each command needs besides MODEL to get past argparse (its refusal must come before their use)
EXTRA = {"trigrams": ["--head", "0.0"], "patch": ["--clean", "a", "--corrupt", "b", "--answer", "a"],
         "lens": ["--text", "ab"], "generate": ["--prompt", "ab"], "report": ["--out", "{tmp}/r"],
         "attention": ["--text", "ab", "--figure", "{tmp}/a.png"], "sae": None}


def test_every_command_declares_the_kinds_it_serves():
    from analyses.cli import COMMANDS

    for c in COMMANDS:
        assert callable(c.run) or isinstance(c.run, dict), c.name
        if isinstance(c.run, dict):
            assert c.run and set(c.run) <= set(KINDS), (c.name, c.run)
            assert all(callable(f) for f in c.run.values()), c.name
            assert set(c.why) <= set(KINDS) - set(c.run), (c.name, c.why)  # reasons only for kinds refused
    names = {c.name for c in _model_commands()}
    assert {"info", "report", "attention", "generate", "heads", "eigen", "compose", "paths", "trigrams", "patch",
            "lens", "sae"} <= names


def test_a_kind_a_command_does_not_serve_is_refused_in_one_line(folders, tmp_path, capsys):
    refused = 0
    for c in _model_commands():
        for kind in set(KINDS) - set(c.run):
            argv = ([c.name, "train", folders[kind], "--hook", "blocks.0.hook_resid_post", "--out", tmp_path / "s"]
                    if c.name == "sae" else
                    [c.name, folders[kind], *(a.format(tmp=tmp_path) for a in EXTRA.get(c.name) or [])])
            r = _main(capsys, *argv, "--device", "cpu")
            line = r.stderr.strip()
            assert r.returncode == 2 and "\n" not in line, (argv, r.returncode, r.stderr)
            assert line.startswith(f"circuits {c.name}: error: "), line
            for word in [KIND_NAMES[kind]] + [KIND_NAMES[k] for k in c.run]:
                assert word in line, (word, line)
            refused += 1
    assert refused >= 8  # compose, trigrams, patch, lens (encoder-decoder); generate, paths (encoder); sae (both)
    assert not (tmp_path / "s").exists()  # refused before anything was written


def test_the_served_kinds_answer(folders, tmp_path, capsys):
    """Each kind reaches its own run function through the one dispatcher: `info` on all three."""
    import json

    for kind in KINDS:
        r = _main(capsys, "info", folders[kind], "--json", "--device", "cpu")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["name"] == str(folders[kind])


#: spellings of a kind test other than `models.model_kind`
KIND_TESTS = ("cross_W_Q", "W_E_src", "d_vocab_src", "is_encoder_decoder", "HookedEncoderDecoder", "HookedEncoder",
              "model_type")


def _kind_tests(path: Path) -> list[str]:
    """`hasattr(x, NAME)` / `getattr(x, NAME, ...)` with a kind-revealing NAME, `isinstance(x, <model class>)`, a
    comparison with `model_type`, and calls of functions named `is_encoder_decoder`, in `path`'s code."""
    found = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            args = [a.value for a in node.args if isinstance(a, ast.Constant)]
            if node.func.id in ("hasattr", "getattr") and any(a in KIND_TESTS for a in args):
                found.setdefault(node.lineno, ast.unparse(node))
            if node.func.id == "isinstance" and any(n in ast.unparse(node) for n in KIND_TESTS):
                found.setdefault(node.lineno, ast.unparse(node))
        if isinstance(node, (ast.Call, ast.FunctionDef)):
            name = node.name if isinstance(node, ast.FunctionDef) else ast.unparse(node.func).split(".")[-1]
            if name == "is_encoder_decoder":
                found.setdefault(node.lineno, "is_encoder_decoder")
        if isinstance(node, ast.Compare) and "model_type" in ast.unparse(node):
            found.setdefault(node.lineno, ast.unparse(node))
    return [f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{n} {what}"
            for n, what in sorted(found.items())]


def test_nothing_in_analyses_tests_a_models_kind_but_model_kind():
    found = [f for p in sorted((ROOT / "analyses").rglob("*.py")) for f in _kind_tests(p)]
    assert found == []


def test_the_kind_test_finder_finds_the_spellings(tmp_path):
    """The finder above is not vacuous: each spelling it must catch, caught."""
    src = tmp_path / "x.py"
    src.write_text("a = hasattr(m, 'cross_W_Q')\nb = getattr(m.cfg, 'model_type', None) == 'encoder'\n"
                   "c = is_encoder_decoder(m)\nd = hasattr(cfg, 'd_vocab_src')\ne = isinstance(m, HookedEncoder)\n")
    assert len(_kind_tests(src)) == 5

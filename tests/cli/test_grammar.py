"""The command-line grammar (docs/cli.md) held against every registered command: the test walks the command
registry (`analyses.cli.COMMANDS` and every sub-command parser under them) and checks each against the table in
docs/cli.md and the rules above it, so that a new command, or an option added to one, that breaks the grammar fails
here. The behaviour behind the options (a PNG written by `--figure`, CSV that parses, the deprecated `--out FIG.png`)
runs in the e2e tier on a tiny model."""

from __future__ import annotations

import argparse
import csv
import io
import json
import re
from pathlib import Path

import pytest

from analyses import cli

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "cli.md"
EVERYWHERE = ("--json", "--device", "--seed", "--no-progress")


def command_parsers() -> dict[str, argparse.ArgumentParser]:
    """Every command a user can run, by its words ("heads", "sae train"), with its parser: the registry's commands,
    and the leaves of those that have sub-commands."""
    out: dict[str, argparse.ArgumentParser] = {}

    def walk(words: str, p: argparse.ArgumentParser) -> None:
        subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            out[words] = p
        for a in subs:
            for name, child in a.choices.items():
                walk(f"{words} {name}", child)

    top = cli.build_parser()
    (action,) = [a for a in top._actions if isinstance(a, argparse._SubParsersAction)]
    assert sorted(action.choices) == sorted(c.name for c in cli.COMMANDS)
    for name, p in action.choices.items():
        walk(name, p)
    return out


def grammar_table() -> dict[str, dict[str, str]]:
    """docs/cli.md's command table: {command: {column: cell}}."""
    text = DOC.read_text()
    block = text.split("<!-- cli-grammar-table", 1)[1].split("\n\n", 1)[0]
    rows = [[c.strip().strip("`") for c in ln.strip().strip("|").split("|")] for ln in block.splitlines()[1:]]
    head, body = rows[0], [r for r in rows[2:] if r and r[0]]
    return {r[0]: dict(zip(head[1:], r[1:])) for r in body}


PARSERS = command_parsers()
TABLE = grammar_table()


def options(p: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """The options the user sees (`--help`), by option string; hidden ones (a deprecated spelling) left out."""
    return {s: a for a in p._actions if a.help != argparse.SUPPRESS for s in a.option_strings}


def test_the_table_lists_every_command_and_no_other():
    assert set(TABLE) == set(PARSERS)


@pytest.mark.parametrize("words", sorted(PARSERS))
def test_every_command_keeps_the_grammar(words):
    p, row = PARSERS[words], TABLE[words]
    opts = options(p)
    for o in EVERYWHERE:
        assert o in opts, f"circuits {words} lacks {o}"
    positionals = [a for a in p._actions if not a.option_strings and a.dest != "help"]
    assert ("model" in [a.dest for a in positionals]) == (row["MODEL"] == "yes"), words
    out = opts.get("--out")
    assert {"no": None, "optional": False, "required": True}[row["--out DIR"]] == (out and out.required), words
    if out is not None:  # a folder, always
        assert out.metavar == "DIR" and "folder" in out.help, (words, out.metavar, out.help)
    assert ("--figure" in opts) == (row["--figure"] == "yes"), words
    if "--figure" in opts:
        assert opts["--figure"].metavar == "PATH.png" and not opts["--figure"].required
    assert ("--csv" in opts) == (row["--csv"] == "yes"), words


def _required_argv(p: argparse.ArgumentParser) -> list[str]:
    """The least argv this parser accepts: a value for each positional and each required option (or required group)."""
    argv: list[str] = []
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction) or a.dest == "help":
            continue
        value = str(a.choices[0]) if a.choices else "x"
        if not a.option_strings:
            argv.append(value)
        elif a.required:
            argv += [a.option_strings[0], value]
    for g in p._mutually_exclusive_groups:
        if g.required:
            a = g._group_actions[0]
            argv += [a.option_strings[0]] + ([] if a.nargs == 0 else ["x"])
    return argv


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        code = cli.main(argv)
    except SystemExit as e:
        code = e.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("words", sorted(PARSERS))
def test_an_unknown_option_is_one_line_naming_the_command(words, capsys):
    argv = words.split() + _required_argv(PARSERS[words]) + ["--no-such-option"]
    code, out, err = _run(argv, capsys)
    assert code == 2 and out == "", (argv, code, out)
    assert len(err.strip().splitlines()) == 1 and err.startswith(f"circuits {words}: error: "), err
    assert "--no-such-option" in err


@pytest.mark.parametrize("words", sorted(w for w in PARSERS if TABLE[w]["--csv"] == "yes"))
def test_json_and_csv_together_are_refused_in_one_line(words, capsys):
    argv = words.split() + _required_argv(PARSERS[words]) + ["--json", "--csv"]
    code, out, err = _run(argv, capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and err.startswith(f"circuits {words}: error: "), err


@pytest.mark.parametrize("words", ["attention", "patch", "lens"])
def test_out_that_is_not_a_png_is_refused_where_it_once_named_the_figure(words, tmp_path, capsys):
    argv = words.split() + _required_argv(PARSERS[words]) + ["--out", str(tmp_path / "folder")]
    argv[1] = "attn-only-2l"  # MODEL
    code, out, err = _run(argv, capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "--figure" in err and "folder" in err and not (tmp_path / "folder").exists()


def test_the_help_pages_and_the_readme_name_the_grammar():
    epilog = cli.build_parser().epilog
    for code in ("0 ok", "2 bad usage", "1 a full disk"):
        assert code in epilog
    readme = (ROOT / "README.md").read_text()
    assert "docs/cli.md" in readme


# --- behaviour: the e2e tier, in this process, on a tiny model --------------------------------------------------
#: what each command with a figure needs besides MODEL (a tiny 2-layer attention-only model with a byte tokenizer)
EXTRA = {"heads": [], "eigen": [], "compose": ["--kind", "k"], "paths": ["--windows", "2"],
         "trigrams": ["--head", "1.0", "--top", "5"], "attention": ["--text", "abcabc"],
         "patch": ["--clean", "abab", "--corrupt", "abcd", "--answer", "a", "--what", "resid"],
         "lens": ["--text", "abcab"], "sweep": None,
         "discover": ["--task", "induction", "--n-prompts", "4", "--seq-len", "6", "--method", "eap"]}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    import torch

    from models import HookedTransformer, HookedTransformerConfig, save
    from models.data.tokenizer import ByteTokenizer

    d = tmp_path_factory.mktemp("grammar")
    cfg = HookedTransformerConfig(n_layers=2, d_model=32, n_ctx=32, d_vocab=259, n_heads=2, d_mlp=None,
                                  attn_only=True, normalization_type=None, positional_embedding_type="shortformer",
                                  use_bias=False, seed=0, model_name="tiny")
    torch.manual_seed(0)
    save(HookedTransformer(cfg, tokenizer=ByteTokenizer()), d / "tiny")
    (d / "text.txt").write_text("def f(x):\n    return x + 1\n" * 40)
    return d


def _argv(words, tiny, tmp_path):
    if words == "sweep":
        from test_sweep_cli import _sweep  # the hand-built sweep folder of the sweep tests

        return ["sweep", str(_sweep(tmp_path, [(0, "finished", 300, 2, 1), (1, "finished", 500, 1, 2)])),
                "--no-copying"]
    extra = EXTRA[words] + (["--text-file", str(tiny / "text.txt")] if words in ("heads", "paths") else [])
    return words.split() + [str(tiny / "tiny")] + extra


FIGURES = sorted(w for w in PARSERS if TABLE[w]["--figure"] == "yes")


def test_every_figure_command_has_an_example_here():
    assert set(FIGURES) == set(EXTRA)


@pytest.mark.e2e
@pytest.mark.parametrize("words", FIGURES)
def test_figure_writes_a_png_and_names_it(words, tiny, tmp_path, capsys, monkeypatch):
    """The PNG is written, named in the JSON, and passes `analyses.figure_checks` (nothing cut off or overprinted,
    text ≥ 7 pt, a colour bar on every heatmap)."""
    from analyses.cli import common
    from analyses.figure_checks import figure_problems

    problems, save = [], common.save_figure
    monkeypatch.setattr(common, "save_figure", lambda fig, path: (problems.extend(figure_problems(fig)),
                                                                   save(fig, path)))
    png = tmp_path / "f.png"
    code, out, err = _run(_argv(words, tiny, tmp_path) + ["--figure", str(png), "--json", "--no-progress"], capsys)
    assert code == 0, err
    assert problems == []
    assert json.loads(out)["figure"] == str(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from PIL import Image

    w, h = Image.open(png).size
    assert w >= 300 and h >= 150


@pytest.mark.e2e
@pytest.mark.parametrize("words", sorted(w for w in PARSERS if TABLE[w]["--csv"] == "yes"))
def test_csv_is_the_json_table(words, tiny, tmp_path, capsys):
    """--csv parses, has a header and one row per record of the command's JSON (checked where the JSON lists them)."""
    argv = (["zoo"] if words == "zoo" else ["info", str(tiny / "tiny")] if words == "info"
            else _argv(words, tiny, tmp_path)) + ["--no-progress"]
    code, out, err = _run(argv + ["--csv"], capsys)
    assert code == 0, err
    rows = list(csv.reader(io.StringIO(out)))
    assert len(rows) >= 2 and all(len(r) == len(rows[0]) for r in rows), out
    code, js, err = _run(argv + ["--json"], capsys)
    obj = json.loads(js)
    records = {"zoo": "models", "heads": "heads", "eigen": "heads", "trigrams": "skip_trigrams", "sweep": "seeds",
               "paths": "per_term"}.get(words)
    if records:
        assert len(rows) - 1 == len(obj[records]), (len(rows), len(obj[records]))


@pytest.mark.e2e
def test_out_png_still_names_the_figure_for_one_release_with_a_deprecation_line(tiny, tmp_path, capsys):
    png = tmp_path / "a.png"
    code, out, err = _run(["attention", str(tiny / "tiny"), "--text", "abcabc", "--out", str(png), "--json"], capsys)
    assert code == 0 and png.is_file() and json.loads(out)["figure"] == str(png)
    assert re.fullmatch(r"circuits attention: --out FIG\.png is deprecated .* use --figure \S+a\.png\n", err), err


def test_zoo_is_an_aligned_table_and_shows_small_losses(capsys):
    """Every column starts where its header does, and a loss of 8e-6 is not printed as 0."""
    from models.io.checkpoint import zoo_cards

    code, out, _ = _run(["zoo"], capsys)
    lines = out.rstrip("\n").splitlines()
    spans = [m.span() for m in re.finditer(r"-+", lines[1])]  # the dashes under each header
    for ln in lines[2:]:
        for start, end in spans[1:]:
            assert ln[start - 2: start] == "  " and ln[start:end].strip(), (ln, start)  # each cell in its column
    for c in zoo_cards():
        row = next(ln for ln in lines if ln.startswith(c["name"] + " "))
        shown = float(row[slice(*spans[6])])
        assert shown == pytest.approx(c["val_loss"], rel=1e-3), (row, c["val_loss"])


def test_paths_of_a_one_layer_model_names_no_virtual_head(capsys):
    code, out, err = _run(["paths", "attn-only-1l", "--windows", "1", "--no-progress"], capsys)
    assert code == 0, err
    assert "∘" not in out and "virtual head" not in out
    code, out, err = _run(["paths", "attn-only-2l", "--windows", "1", "--no-progress", "--json"], capsys)
    terms = json.loads(out)["per_term"]
    assert any("∘" in t for t in terms)  # a two-layer model has them; the text names one of its own


def test_a_missing_saelens_says_how_to_install_it_from_a_source_checkout(monkeypatch):
    import builtins

    from models.errors import MissingDependencyError
    from models.io import sae

    real = builtins.__import__

    def no_sae_lens(name, *a, **k):
        if name.split(".")[0] == "sae_lens":
            raise ImportError("No module named 'sae_lens'", name="sae_lens")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_sae_lens)
    monkeypatch.delitem(__import__("sys").modules, "sae_lens", raising=False)
    with pytest.raises(MissingDependencyError) as e:
        sae.sae_lens()
    msg = str(e.value)
    assert "toy-circuits[sae]" not in msg  # the package is not on an index: that form fails from a checkout
    assert "pip install -e '.[sae]'" in msg and "sae-lens==" in msg

"""The fourth reliability round's cases on files read (issue 38): tokenizer.json settings and regular expressions,
ids a tokenizer lacks, SAE folders (non-finite weights, absurd widths, a hook name that is no string, truncated
weights, a huge cfg.json), an SAE written to a full disk, a legacy state dict that is a FIFO, and corrupt seed-sweep
records. Each goes through the file kind's reader (`models.io.readers`) and, on the command line, ends in one line and
exit 2 (exit 1 for the full disk) with nothing changed."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analyses.cli import main
from models.errors import SAEError, TokenizerError

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=str(ROOT), RUST_BACKTRACE="0")


def run_cli(*argv, timeout=120):
    return subprocess.run([sys.executable, "-m", "analyses.cli", *map(str, argv)], capture_output=True, text=True,
                          env=ENV, timeout=timeout, stdin=subprocess.DEVNULL)


def one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def tree_hash(folder: Path) -> dict:
    """Each entry under `folder`: a hash of a regular file's bytes (a sparse file of 64 MiB or more: its size)."""
    def digest(p: Path):
        if p.is_symlink() or not p.is_file():
            return p.is_dir()
        size = p.stat().st_size
        return size if size >= 1 << 26 else hashlib.sha256(p.read_bytes()).hexdigest()

    return {str(p.relative_to(folder)): digest(p) for p in sorted(folder.rglob("*"))}


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    """A model folder with a BPE tokenizer (`root/model`), an SAE on it (`root/sae`) and a seed sweep (`root/sweep`)."""
    from models.io import examples

    root = tmp_path_factory.mktemp("ex")
    examples.model_example(root)
    examples.sweep_example(root)
    return root


@pytest.fixture
def case(example, tmp_path):
    root = tmp_path / "case"
    shutil.copytree(example, root)
    return root


def _tokenizer_json(case) -> dict:
    return json.loads((case / "model" / "tokenizer.json").read_text())


# --- tokenizer.json ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("key,value", [
    ("truncation", {"direction": "Right", "max_length": 2, "strategy": "LongestFirst", "stride": 0}),
    ("padding", {"strategy": {"Fixed": 40}, "direction": "Right", "pad_to_multiple_of": None, "pad_id": 1,
                 "pad_type_id": 0, "pad_token": "<|pad|>"}),
])
def test_tokenizer_json_that_truncates_or_pads_is_refused(case, capsys, key, value):
    """The `tokenizers` library applies a file's truncation / padding to every encode: every text cut to 2 tokens,
    or padded to 40. Refused, naming the setting and the fix; `circuits info` is one line, exit 2."""
    from models.data.tokenizer import load_tokenizer

    path = case / "model" / "tokenizer.json"
    path.write_text(json.dumps(dict(_tokenizer_json(case), **{key: value})))
    with pytest.raises(TokenizerError, match=f"{key}.*null"):
        load_tokenizer(path)
    assert main(["info", str(case / "model")]) == 2
    assert "tokenizer.json" in one_line(capsys.readouterr().err)


def test_tokenizer_json_padding_to_2_31_is_refused_not_an_abort(case):
    """Padding to 2³¹ tokens aborted the process (a Rust allocation failure) at the first encode."""
    path = case / "model" / "tokenizer.json"
    pad = {"strategy": {"Fixed": 2**31}, "direction": "Right", "pad_to_multiple_of": None, "pad_id": 1,
           "pad_type_id": 0, "pad_token": "<|pad|>"}
    path.write_text(json.dumps(dict(_tokenizer_json(case), padding=pad)))
    r = run_cli("generate", case / "model", "--prompt", "hello", "--max-new-tokens", "1")
    assert r.returncode == 2 and "padding" in one_line(r.stderr)


def _with_regex(data: dict, pattern: str) -> dict:
    split = {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False}
    return dict(data, pre_tokenizer={"type": "Sequence", "pretokenizers": [split, data["pre_tokenizer"]]})


def test_catastrophic_pre_tokenizer_regex_is_refused_not_a_rust_panic(case, capsys):
    """`(a+)+$` made the library's regex engine give up and Rust panic (a `PanicException`, a BaseException no
    `except Exception` catches: a traceback) on text with a long run of a's."""
    path = case / "model" / "tokenizer.json"
    path.write_text(json.dumps(_with_regex(_tokenizer_json(case), "(a+)+$")))
    assert main(["generate", str(case / "model"), "--prompt", "a" * 40 + "!", "--max-new-tokens", "1"]) == 2
    assert "nested repetition" in one_line(capsys.readouterr().err)


#: regular expressions over a small alphabet: atoms, classes, groups, alternation and every quantifier
_atoms = st.sampled_from(["a", "b", "[ab]", r"\s", ".", "a?"])


def _quantified(inner):
    return st.tuples(inner, st.sampled_from(["", "", "*", "+", "?", "{1,3}", "{2}", "*?"])).map("".join)


_regexes = st.recursive(
    _quantified(_atoms),
    lambda inner: st.one_of(
        st.lists(_quantified(inner), min_size=1, max_size=3).map("".join),
        st.tuples(inner, inner).map(lambda t: f"{t[0]}|{t[1]}"),
        _quantified(inner.map(lambda s: f"({s})")),
        _quantified(inner.map(lambda s: f"(?:{s})")),
    ),
    max_leaves=6,
)
_ADVERSARIAL = ["a" * 60 + "!", "ab" * 30 + "!", " " * 60 + "x", "aab" * 20]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pattern=_regexes)
def test_every_regex_the_rule_admits_runs_on_adversarial_text(pattern):
    """The rule (`regex_problem`) refuses nested repetition, backreferences and more than two repeated atoms in a
    branch. Whatever it admits must run on text built to make backtracking explode, without the Rust panic that a
    catastrophic pattern causes (the library gives up past its backtracking limit); and what it refuses includes
    every `(X)+` whose X repeats."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    from models.data.tokenizer import regex_problem

    problem = regex_problem(pattern)
    if problem is None:
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), "isolated")
        for text in _ADVERSARIAL:
            try:
                tok.encode(text)
            except BaseException as e:  # a PanicException is a BaseException
                pytest.fail(f"{pattern!r} was admitted but the library failed on {text[:12]!r}…: "
                            f"{type(e).__name__}: {str(e)[:100]}")
    nested = f"({pattern})+"
    if any(q in pattern for q in ("*", "+", "{1,3}", "{2}", "|")):
        assert regex_problem(nested) is not None, nested


def test_ids_a_smaller_tokenizer_lacks_are_shown_visibly(example):
    """A model whose vocabulary is larger than its tokenizer's: those ids decoded to '' (nothing shown). Now
    `<id N>` everywhere token text is rendered: `to_str_tokens`, `to_string`, the analyses' labels."""
    import models
    from analyses.labels import token_labels
    from models.data.tokenizer import ByteTokenizer, load_tokenizer

    model = models.load(example / "model")
    tok = model.tokenizer
    extra = tok.vocab_size + 5
    model2 = models.HookedTransformer(model.cfg.replace(d_vocab=tok.vocab_size + 10), tokenizer=tok)
    assert model2.to_str_tokens(torch.tensor([extra])) == [f"<id {extra}>"]
    known = tok.encode("hello")
    assert model2.to_string(torch.tensor([*known, extra, *known])) == f"hello<id {extra}>hello"
    assert token_labels(model2, [extra]) == [f"<id {extra}>"]
    # a Hugging Face table (no BOS of ours), the byte tokenizer and the seq2seq vocabularies say the same
    data = json.loads((example / "model" / "tokenizer.json").read_text())
    data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] != "<|bos|>"]
    data["model"]["vocab"].pop("<|bos|>")
    hf_path = example / "hf.json"
    hf_path.write_text(json.dumps(data))
    hf = load_tokenizer(hf_path)
    assert hf.decode([len(hf) + 3]) == f"<id {len(hf) + 3}>"
    assert ByteTokenizer().decode([400]) == "<id 400>"


# --- SAE folders -----------------------------------------------------------------------------------------------------
def _sae_cfg(case) -> dict:
    return json.loads((case / "sae" / "cfg.json").read_text())


def _weights(case) -> dict:
    from safetensors.torch import load_file

    return load_file(str(case / "sae" / "sae_weights.safetensors"))


def _save_weights(case, tensors) -> None:
    from safetensors.torch import save_file

    save_file(tensors, str(case / "sae" / "sae_weights.safetensors"))


def _nan(case):
    w = _weights(case)
    w["W_enc"][0, 0] = float("nan")
    _save_weights(case, w)
    return "non-finite"


def _huge_d_sae(case):
    (case / "sae" / "cfg.json").write_text(json.dumps(dict(_sae_cfg(case), d_sae=10**9)))
    return "d_sae"


def _hook_not_a_string(case):
    cfg = _sae_cfg(case)
    cfg["metadata"]["hook_name"] = 17
    (case / "sae" / "cfg.json").write_text(json.dumps(cfg))
    return "hook name"


def _truncated_weights(case):
    path = case / "sae" / "sae_weights.safetensors"
    path.write_bytes(path.read_bytes()[:-100])
    return "truncated"


def _huge_cfg(case):
    with open(case / "sae" / "cfg.json", "r+b") as f:  # 2 GiB, sparse: refused on its size, never read
        f.truncate(2 << 30)
    return "bytes, more than"


@pytest.mark.parametrize("damage", [_nan, _huge_d_sae, _hook_not_a_string, _truncated_weights, _huge_cfg],
                         ids=["NaN weights", "d_sae 1e9", "hook name 17", "truncated weights", "2 GiB cfg.json"])
def test_bad_sae_folders_are_one_line_exit_2(case, capsys, damage):
    """Each was a traceback, or (NaN weights) a report of "dead 256/256, L0 0, FVU nan" with exit 0; the folder is
    read through its readers before SAELens is needed, so the answer is the same with or without it."""
    from models.io.readers import read_sae_folder

    why = damage(case)
    with pytest.raises(SAEError, match=why):
        read_sae_folder(case / "sae")
    before = tree_hash(case)
    assert main(["sae", "report", str(case / "model"), str(case / "sae"), "--out", str(case / "rep")]) == 2
    line = one_line(capsys.readouterr().err)
    assert why in line and str(case / "sae") in line
    assert tree_hash(case) == before


class _FullDiskSAE:
    """An SAE whose `save_model` meets a full disk the way SAELens' does: safetensors' `save_file` raising its own
    error type with the operating system's error in its text."""

    def save_model(self, path):
        from safetensors import SafetensorError

        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "sae_weights.safetensors").write_bytes(b"")
        raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space '
                              'left on device" })')


def test_sae_train_on_a_full_disk_is_one_line_exit_1(example, tmp_path, capsys, monkeypatch):
    """`circuits sae train` on a full disk: safetensors' own error type came out as a traceback. Now
    `DiskFullError` (an environment error: exit 1), one line, and nothing left behind."""
    import models.training.sae as training
    from models.errors import DiskFullError
    from models.io.sae import save_sae
    from models.training.sae import Trained

    trained = Trained(_FullDiskSAE(), {"hook_name": "blocks.0.hook_resid_post", "steps": 1, "d_sae": 32}, 0.0)
    with pytest.raises(DiskFullError) as info:
        save_sae(trained, tmp_path / "direct")
    assert info.value.errno == errno.ENOSPC and not (tmp_path / "direct").exists()
    monkeypatch.setattr(training, "train_sae", lambda *a, **k: trained)
    before = sorted(os.listdir(tmp_path))
    code = main(["sae", "train", str(example / "model"), "--hook", "blocks.0.hook_resid_post", "--steps", "1",
                 "--out", str(tmp_path / "sae"), "--text-file", str(ROOT / "README.md")])
    assert code == 1 and "disk is full" in one_line(capsys.readouterr().err)
    assert sorted(os.listdir(tmp_path)) == before


# --- a legacy state dict that is a FIFO ------------------------------------------------------------------------------
def test_info_of_a_fifo_pth_does_not_hang(example, tmp_path):
    """`circuits info old.pth --config cfg.json` where old.pth is a FIFO waited forever for a writer."""
    from models.io.examples import legacy_example

    legacy_example(tmp_path)
    (tmp_path / "old.pth").unlink()
    os.mkfifo(tmp_path / "old.pth")
    r = run_cli("info", tmp_path / "old.pth", "--config", tmp_path / "cfg.json", timeout=60)
    assert r.returncode == 2 and "old.pth" in one_line(r.stderr) and "FIFO" in r.stderr


# --- seed sweeps -----------------------------------------------------------------------------------------------------
def _sweep_record(case) -> dict:
    return json.loads((case / "sweep" / "sweep.json").read_text())


SWEEP_DAMAGE = {
    "truncated": lambda t: t[: len(t) // 2],
    "garbage": lambda t: "\x00\x01 not json at all \xff",
    "wrong types": lambda t: json.dumps(dict(json.loads(t), members=[{"seed": "x", "folder": 3, "status": 1}])),
    "NaN": lambda t: json.dumps(dict(json.loads(t), steps=float("nan"))),
    "missing keys": lambda t: json.dumps({"members": [{}]}),
}
METRICS_DAMAGE = {
    "torn line": lambda t: t[: 30] + "\n" + t,
    "garbage": lambda t: "\x00\xff garbage\n" + t,
    "wrong types": lambda t: '{"step": "a", "tokens": [], "val_loss": "x"}\n',
    "NaN": lambda t: t.replace('"val_loss": 4.0', '"val_loss": NaN', 1),
    "missing keys": lambda t: '{"x": 1}\n' + t,
}


@pytest.mark.parametrize("file,how", [("sweep.json", k) for k in SWEEP_DAMAGE] +
                         [("seed-0/metrics.jsonl", k) for k in METRICS_DAMAGE])
def test_corrupt_sweep_records_are_one_line_exit_2(case, capsys, file, how):
    """`circuits sweep` over a corrupt sweep.json or member metrics.jsonl: tracebacks (wrong types, missing keys) or
    silently wrong numbers (NaN losses, garbage lines skipped). One line naming the file, exit 2, nothing written."""
    path = case / "sweep" / file
    damage = (SWEEP_DAMAGE if file == "sweep.json" else METRICS_DAMAGE)[how]
    path.write_bytes(damage(path.read_text()).encode("utf-8", "surrogateescape"))
    before = tree_hash(case)
    assert main(["sweep", str(case / "sweep"), "--out", str(case / "doc")]) == 2
    assert Path(file).name in one_line(capsys.readouterr().err)
    assert tree_hash(case) == before


@pytest.mark.parametrize("how", ["garbage", pytest.param("wrong types", marks=pytest.mark.e2e),
                                 pytest.param("missing keys", marks=pytest.mark.e2e)])
def test_resume_over_a_corrupt_sweep_json_changes_nothing(case, capsys, how):
    """`circuits train --seeds --resume` over a corrupt sweep.json: one line, exit 2, the folder as it was."""
    path = case / "sweep" / "sweep.json"
    path.write_bytes(SWEEP_DAMAGE[how](path.read_text()).encode("utf-8", "surrogateescape"))
    before = tree_hash(case)
    code = main(["train", "--preset", "attn-only-2l", "--seeds", "0-1", "--resume", "--steps", "2", "--no-progress",
                 "--out", str(case / "sweep")])
    assert code == 2 and "sweep.json" in one_line(capsys.readouterr().err)
    assert tree_hash(case) == before

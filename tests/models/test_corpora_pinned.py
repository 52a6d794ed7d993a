"""The pinned corpus (issue 40): the shipped snapshot's archive matches its manifest's sha256 and a corrupted or
replaced one is refused by name; snapshots are deterministic archives whose extraction keeps `stdlib_source`'s
order and split; `"stdlib"` means the snapshot and `"python-stdlib"` the running Python's library; a card number is
recomputed from the snapshot; (slow) the manifest's token counts are the snapshot's."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import models
from models.data import corpora
from models.data.corpora import (
    PINNED,
    SNAPSHOT_DIR,
    _tree_split,
    pinned_source,
    resolve_source,
    snapshot_manifest,
    stdlib_source,
    text_digest,
    write_snapshot,
)
from models.errors import CorpusChecksumError, CorpusError
from models.io.checkpoint import ZOO_DIR


def test_shipped_archive_matches_its_manifest():
    """The archive's sha256, computed here with hashlib over the file's bytes, is the manifest's; the archive is
    package data (pyproject's package-data names it)."""
    man = snapshot_manifest(PINNED)
    archive = SNAPSHOT_DIR / man["archive"]
    assert hashlib.sha256(archive.read_bytes()).hexdigest() == man["sha256"]
    assert man["name"] == PINNED and man["files"] == man["train_files"] + man["val_files"] > 1000
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert '"data/corpus/*.tar.xz", "data/corpus/*.json"' in pyproject


def _tree(root: Path) -> Path:
    """A small library-like tree: packages, a `test` package and a `tests` folder (validation), names whose
    `Path` order differs from their string order (`a/`, `a-b/`)."""
    files = {"a/x.py": "import os\n", "a-b/y.py": "def f():\n    return 1\n", "z.py": "print('z')\n",
             "test/test_z.py": "assert True\n", "pkg/tests/t.py": "x = 1\n", "pkg/mod.py": "y = 2\n",
             "notes.txt": "not python\n"}
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


@pytest.fixture
def tiny_snapshot(tmp_path, monkeypatch):
    """A snapshot of `_tree` written by `write_snapshot` into a temporary SNAPSHOT_DIR."""
    src = _tree(tmp_path / "lib")
    train, val = _tree_split(src)
    ship = tmp_path / "ship"
    ship.mkdir()
    man = write_snapshot(corpora.TextSource("tiny", train, val), src, ship, "tiny-v1", 1, "a test tree")
    monkeypatch.setattr(corpora, "SNAPSHOT_DIR", ship)
    return SimpleNamespace(src=src, train=train, val=val, ship=ship, man=man, cache=tmp_path / "cache")


def test_snapshot_round_trip_keeps_order_split_and_text(tiny_snapshot):
    t = tiny_snapshot
    s = pinned_source("tiny-v1", t.cache)
    rel = lambda files, root: [p.relative_to(root).as_posix() for p in files]
    assert rel(s.train_files, s.train_files[0].parents[1]) == rel(t.train, t.src)
    assert rel(s.train_files, s.train_files[0].parents[1])[:2] == ["a/x.py", "a-b/y.py"]  # Path order, not str
    assert sorted(rel(s.val_files, s.val_files[0].parents[2])) == ["pkg/tests/t.py", "test/test_z.py"]
    assert [p.read_bytes() for p in s.train_files + s.val_files] == [p.read_bytes() for p in t.train + t.val]
    assert s.sha256 == t.man["sha256"] and s.name == "tiny-v1"


def test_snapshot_archive_is_deterministic(tiny_snapshot, tmp_path):
    """Written twice (the files' mtimes changed in between): the same bytes; members are relative, mtime 0, uid 0."""
    import os
    import tarfile

    t = tiny_snapshot
    for p in t.train + t.val:
        os.utime(p, (12345, 12345))
    again = tmp_path / "again"
    again.mkdir()
    man2 = write_snapshot(corpora.TextSource("tiny", t.train, t.val), t.src, again, "tiny-v1", 1, "a test tree")
    assert man2["sha256"] == t.man["sha256"]
    assert (again / "tiny-v1.tar.xz").read_bytes() == (t.ship / "tiny-v1.tar.xz").read_bytes()
    with tarfile.open(t.ship / "tiny-v1.tar.xz") as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == [p.relative_to(t.src).as_posix() for p in t.train + t.val]
    assert all(m.mtime == 0 and m.uid == m.gid == 0 and m.mode == 0o644 and not m.uname for m in members)


def test_corrupted_or_replaced_archive_is_refused(tiny_snapshot, tmp_path):
    t = tiny_snapshot
    archive = t.ship / "tiny-v1.tar.xz"
    data = bytearray(archive.read_bytes())
    data[len(data) // 2] ^= 0xFF
    archive.write_bytes(bytes(data))
    with pytest.raises(CorpusChecksumError, match="corrupted or replaced"):
        pinned_source("tiny-v1", t.cache)
    # replaced by another valid snapshot of other text
    other = _tree(tmp_path / "other")
    (other / "z.py").write_text("print('other')\n")
    tr, va = _tree_split(other)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    write_snapshot(corpora.TextSource("o", tr, va), other, elsewhere, "tiny-v1", 1, "other")
    shutil.copy(elsewhere / "tiny-v1.tar.xz", archive)
    with pytest.raises(CorpusChecksumError):
        pinned_source("tiny-v1", t.cache)
    assert not (t.cache / "snapshots").exists() or not any((t.cache / "snapshots").iterdir())


def test_manifest_whose_text_does_not_match_is_refused_and_nothing_published(tiny_snapshot):
    t = tiny_snapshot
    man = dict(t.man, text_sha256="0" * 64)
    (t.ship / "tiny-v1.json").write_text(json.dumps(man))
    with pytest.raises(CorpusChecksumError, match="text_sha256"):
        pinned_source("tiny-v1", t.cache)
    assert not [p for p in (t.cache / "snapshots").iterdir() if not p.name.startswith(".")]


def test_changed_extracted_text_is_extracted_again(tiny_snapshot, monkeypatch):
    t = tiny_snapshot
    s = pinned_source("tiny-v1", t.cache)
    s.train_files[0].write_text("tampered\n")
    monkeypatch.setattr(corpora, "_VERIFIED", set())  # a new process
    s2 = pinned_source("tiny-v1", t.cache)
    assert s2.train_files[0].read_text() == "import os\n"
    folder = s2.train_files[0].parents[1]
    assert text_digest(folder, s2.train_files + s2.val_files) == t.man["text_sha256"]


def test_missing_or_malformed_manifest_is_a_corpus_error(tiny_snapshot):
    with pytest.raises(CorpusError, match="no corpus snapshot 'nope'"):
        pinned_source("nope", tiny_snapshot.cache)
    (tiny_snapshot.ship / "bad.json").write_text(json.dumps({"name": "bad"}))
    with pytest.raises(CorpusError, match="not a corpus snapshot manifest"):
        pinned_source("bad", tiny_snapshot.cache)


def test_stdlib_means_the_snapshot_and_python_stdlib_the_running_library():
    pinned = resolve_source("stdlib")
    assert pinned.name == PINNED and pinned.sha256 == snapshot_manifest(PINNED)["sha256"]
    assert resolve_source(None).name == PINNED
    running = resolve_source("python-stdlib")
    assert running.sha256 is None and [p.name for p in running.train_files] == \
        [p.name for p in stdlib_source().train_files]
    man = snapshot_manifest(PINNED)
    assert (len(pinned.train_files), len(pinned.val_files)) == (man["train_files"], man["val_files"])


def test_recorded_data_accepts_both_built_in_names(tmp_path):
    from models.data.corpora import recorded_data

    assert recorded_data(tmp_path, "python-stdlib") == "python-stdlib"
    assert recorded_data(tmp_path, "stdlib") == "stdlib"


def test_a_card_number_recomputed_from_the_pinned_corpus():
    """attn-only-2l's validation loss, computed here from the snapshot's validation windows (the ones training
    evaluates on: `val_sequences` evenly spaced windows) and the shipped weights, is the card's."""
    import torch

    from models.training.loop import TrainConfig, build_data, evaluate_loss

    folder = ZOO_DIR / "attn-only-2l"
    cfg = TrainConfig.from_json((folder / "train_config.json").read_text())
    cfg.cache_dir = None
    model = models.load(folder)
    batches, _, corpus = build_data(cfg, model.cfg, tokenizer=model.tokenizer)
    assert corpus.sha256 == snapshot_manifest(PINNED)["sha256"]
    with torch.no_grad():
        loss = evaluate_loss(model, torch.as_tensor(batches.val_batch(cfg.val_sequences)))
    measured = json.loads((folder / "measured.json").read_text())
    assert loss == pytest.approx(measured["final_val_loss"], abs=1e-6)
    card = (folder / "card.md").read_text()
    assert f"final validation loss: **{loss:.4f}**" in card


def test_report_header_says_when_the_card_names_another_corpus(tmp_path):
    from analyses.report import corpus_note

    corpus = SimpleNamespace(name="python3.11-stdlib-v1", sha256="a" * 64)
    assert corpus_note(corpus, None) == f"Text: the validation split of corpus {corpus.name} (sha256 {'a' * 64})."
    (tmp_path / "summary.json").write_text(json.dumps({"steps": 1, "corpus": {"name": "mine", "sha256": "b" * 64}}))
    note = corpus_note(corpus, tmp_path)
    assert "Not the corpus the model's card names (mine, sha256 " + "b" * 64 in note
    (tmp_path / "summary.json").write_text(json.dumps({"steps": 1}))
    assert "names no corpus checksum" in corpus_note(corpus, tmp_path)
    (tmp_path / "summary.json").write_text(json.dumps({"steps": 1, "corpus": {"name": "x", "sha256": "a" * 64}}))
    assert corpus_note(corpus, tmp_path) == corpus_note(corpus, None)


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["bpe-512", "bpe-2048", "bytes"])
def test_manifest_token_counts_are_the_snapshots(spec, tmp_path):
    """Tokenized afresh (an empty cache) with the zoo model's tokenizer: the manifest's train / validation counts."""
    from models.data.corpora import build_token_corpus

    man = snapshot_manifest(PINNED)["tokens"][spec]
    corpus = build_token_corpus(pinned_source(PINNED), models.load(man["zoo model"]).tokenizer, tmp_path)
    assert (corpus.train.size, corpus.val.size) == (man["train"], man["val"])
    assert corpus.train.dtype == np.uint16 and corpus.folder.is_relative_to(tmp_path)


@pytest.mark.e2e
def test_heads_says_when_the_text_is_not_the_cards_corpus(tmp_path):
    """`circuits heads` on a copy of attn-only-2l whose summary.json names another corpus prints one line saying so;
    on the zoo model itself (its card names the pinned corpus) it prints none."""
    import contextlib
    import io

    from analyses import cli

    folder = tmp_path / "m"
    shutil.copytree(ZOO_DIR / "attn-only-2l", folder, ignore=shutil.ignore_patterns("checkpoints"))
    summary = json.loads((folder / "summary.json").read_text())
    summary["corpus"] = {"name": "elsewhere", "sha256": "c" * 64}
    (folder / "summary.json").write_text(json.dumps(summary))
    outs = []
    for target in (str(folder), "attn-only-2l"):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            assert cli.main(["heads", target, "--no-progress"]) == 0
        outs.append(buf.getvalue())
    assert outs[0].rstrip().splitlines()[-1].startswith("Not the corpus the model's card names (elsewhere, sha256 c")
    assert "Not the corpus" not in outs[1] and "no corpus checksum" not in outs[1]


def test_runs_and_sweeps_record_the_corpus_checksum(tmp_path):
    """summary.json of a run, sweep.json and each member's summary name the corpus by name and sha256: for a folder
    of text, `source_fingerprint` (sha256 over the files' names and contents), computed here independently."""
    from models.data.corpora import folder_source, source_fingerprint
    from models.training.loop import train
    from models.training.sweep import train_sweep
    from tests.models.test_train import TEXT, tiny_model, tiny_train

    text = tmp_path / "texts"
    text.mkdir()
    (text / "code.py").write_text(TEXT)
    want = {"name": "texts", "sha256": source_fingerprint(folder_source(text))}
    assert want["sha256"] == hashlib.sha256(b"code.py\0" + TEXT.encode() + b"\1--val--" + b"0.05").hexdigest()
    short = dict(steps=4, checkpoint_every=2, log_checkpoints=0, eval_every=2)
    train(tiny_model(), tiny_train(text, tmp_path / "run", **short))
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["corpus"] == want
    train_sweep(tiny_model(), tiny_train(text, tmp_path / "sweep", **short), [0, 1])
    assert json.loads((tmp_path / "sweep" / "sweep.json").read_text())["corpus"] == want
    assert json.loads((tmp_path / "sweep" / "seed-1" / "summary.json").read_text())["corpus"] == want

"""`build_report` on a full disk: the previous report.md and figures stay byte for byte, no 0-byte PNG or torn
report.md appears, nothing is left behind (the report is staged in a hidden folder and published by renames)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import matplotlib.figure
import pytest
import torch
from helpers import fail_fsync_of

from analyses import build_report
from models import HookedTransformer, HookedTransformerConfig
from models.data.tokenizer import ByteTokenizer
from models.io.run_folder import MARK_FILE

pytestmark = pytest.mark.e2e  # whole reports written to a full disk

TEXT = torch.tensor(list((Path(__file__).resolve().parents[2] / "analyses" / "scores.py").read_bytes()[:3000]))
SECTIONS = ["overview", "copying", "attention"]


def tiny():
    cfg = HookedTransformerConfig(n_layers=1, d_model=16, n_ctx=32, d_vocab=259, n_heads=2, d_mlp=None,
                                  normalization_type=None, positional_embedding_type="shortformer", seed=0)
    return HookedTransformer(cfg, tokenizer=ByteTokenizer())


def snapshot(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


@pytest.mark.parametrize("where", ["second figure", "report.md fsync"])
def test_full_disk_keeps_the_previous_report(tmp_path, monkeypatch, where):
    out = tmp_path / "r"
    first = build_report(tiny(), out, tokens=TEXT, progress=False, sections=SECTIONS)
    assert first.failed == {} and len([p for p in first.files if p.suffix == ".png"]) >= 2
    before = snapshot(out)
    calls = {"n": 0}
    if where == "second figure":
        real = matplotlib.figure.Figure.savefig

        def savefig(self, fname, *a, **k):
            calls["n"] += 1
            if calls["n"] == 2:
                Path(fname).write_bytes(b"")  # what a full disk leaves: a 0-byte file
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(self, fname, *a, **k)

        monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    else:
        fail_fsync_of(monkeypatch, "report.md")
    with pytest.raises(OSError) as e:
        build_report(tiny(), out, tokens=TEXT, progress=False, sections=SECTIONS)
    assert e.value.errno == errno.ENOSPC
    assert snapshot(out) == before  # same names, same bytes: no torn report.md, no 0-byte PNG, no staging folder


def test_report_files_follow_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        r = build_report(tiny(), tmp_path / "r", tokens=TEXT, progress=False, sections=SECTIONS)
    finally:
        os.umask(old)
    assert {p.stat().st_mode & 0o777 for p in r.files} == {0o644}
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == sorted([MARK_FILE] + [p.name for p in r.files])
    assert (tmp_path / "r").stat().st_mode & 0o777 == 0o755

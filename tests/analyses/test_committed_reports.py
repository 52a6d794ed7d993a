"""(e2e) The committed reports `docs/report-NAME/report.md` (the README's examples: attn-only-1l, attn-only-2l,
enc-dec-reverse, enc-dec-sort) are what `circuits report NAME --out DIR` writes today, on the pinned corpus: a fresh
run's report.md equals the committed one line for line (issue 40: the committed 2L report had gone stale, and on
another Python build the running library's text gave other numbers). Regenerate with
`python -m analyses.cli report NAME --out docs/report-NAME --no-progress`."""

from __future__ import annotations

import contextlib
import difflib
import io
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.e2e
@pytest.mark.parametrize("name", ["attn-only-2l", "attn-only-1l", "enc-dec-reverse", "enc-dec-sort"])
def test_committed_report_is_a_fresh_run(name, tmp_path):
    from analyses import cli

    out = tmp_path / "report"
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli.main(["report", name, "--out", str(out), "--no-progress"]) == 0
    fresh = (out / "report.md").read_text().splitlines()
    committed = (ROOT / "docs" / f"report-{name}" / "report.md").read_text().splitlines()
    diff = list(difflib.unified_diff(committed, fresh, "committed", "fresh", n=0, lineterm=""))
    assert not diff, "\n".join(line[:300] for line in diff[:20])
    if not name.startswith("enc-dec"):  # the encoder–decoders read held-out task pairs, not a corpus
        assert "Text: the validation split of corpus python3.11-stdlib-v1 (sha256 " in "\n".join(fresh)


@pytest.mark.e2e
def test_committed_reproduction_is_a_fresh_run(tmp_path):
    """analyses/REPRODUCTION.md is what `python -m analyses.reproduction` writes today, but for its run time."""
    from analyses.reproduction import write

    write(tmp_path / "REPRODUCTION.md")
    drop = lambda text: [ln for ln in text.splitlines() if not ln.startswith("*Computed in ")]
    fresh = drop((tmp_path / "REPRODUCTION.md").read_text())
    committed = drop((ROOT / "analyses" / "REPRODUCTION.md").read_text())
    diff = list(difflib.unified_diff(committed, fresh, "committed", "fresh", n=0, lineterm=""))
    assert not diff, "\n".join(line[:300] for line in diff[:20])

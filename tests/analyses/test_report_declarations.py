"""The report's sections declare the `ctx.cache` keys they read and write (`analyses.report.run.Section`), and
`run.check_split` decides from those declarations which sections may run in the second process. Here: every
declaration is honest (each section run with a cache that records what it touched), and `check_split` refuses a
split that would hand a section a value written in the other process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from analyses.report import SECOND_PROCESS, SECTIONS, build_report
from analyses.report import run as report_run
from analyses.report.context import Context
from analyses.report.encdec_sections import ENCDEC_SECTIONS
from analyses.report.run import Section, check_split

TEXT = torch.tensor(list((Path(__file__).resolve().parents[2] / "analyses" / "scores.py").read_bytes()[:6000]))


class Recorder(dict):
    """A dict that records the keys read (`reads`) and written (`writes`) through it."""

    def __init__(self, *a):
        super().__init__(*a)
        self.reads, self.writes = set(), set()

    def __getitem__(self, k):
        self.reads.add(k)
        return super().__getitem__(k)

    def get(self, k, default=None):
        self.reads.add(k)
        return super().get(k, default)

    def __contains__(self, k):
        self.reads.add(k)
        return super().__contains__(k)

    def __setitem__(self, k, v):
        self.writes.add(k)
        super().__setitem__(k, v)


def _record(monkeypatch) -> dict[str, Recorder]:
    """Run each section of the next report with its own `Recorder` as `ctx.cache` (holding what came before)."""
    seen: dict[str, Recorder] = {}
    real = report_run._run_ticked

    def ticked(ctx, key, fn, disk_errors, tick):
        ctx.cache = seen[key] = Recorder(ctx.cache)
        try:
            return real(ctx, key, fn, disk_errors, tick)
        finally:
            ctx.cache = dict(ctx.cache)

    monkeypatch.setattr(report_run, "_run_ticked", ticked)
    return seen


def _check(seen: dict[str, Recorder], table) -> None:
    declared = {s.key: Section(*s) for s in table}
    assert seen, "no section ran"
    for key, rec in seen.items():
        s = declared[key]
        assert rec.reads - Context.memos - s.writes <= s.reads, (key, rec.reads)
        assert rec.writes - Context.memos == s.writes, (key, rec.writes)


@pytest.mark.e2e  # a whole report of a small model, sequentially
def test_decoder_sections_declare_what_they_read_and_write(tmp_path, monkeypatch):
    from models import HookedTransformer, HookedTransformerConfig, save
    from models.data.tokenizer import ByteTokenizer

    cfg = HookedTransformerConfig(n_layers=2, d_model=32, n_ctx=64, d_vocab=259, n_heads=2, d_mlp=None,
                                  normalization_type=None, positional_embedding_type="shortformer", seed=0)
    model = HookedTransformer(cfg, tokenizer=ByteTokenizer())
    save(model, tmp_path / "m")
    recs = [{"step": i, "tokens": 512 * i, "val_loss": 5.0 - 0.1 * i, "train_loss": 5.1 - 0.1 * i,
             "icl_score": -0.01 * i, "induction_scores_20": [[0.01 * i, 0.02]] * 2} for i in range(6)]
    (tmp_path / "m" / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in recs))
    seen = _record(monkeypatch)
    r = build_report(model, tmp_path / "r", folder=tmp_path / "m", tokens=TEXT, progress=False, parallel=False)
    assert r.failed == {}, r.failed
    assert set(seen) == set(r.sections) and "skip_trigrams" in seen and "direct_path" in seen
    assert "bigrams" in seen["skip_trigrams"].reads  # the one value passed between sections today
    _check(seen, SECTIONS)


@pytest.mark.e2e
def test_encoder_decoder_sections_declare_what_they_read_and_write(tmp_path, monkeypatch):
    from models import load
    from models.io.checkpoint import ZOO_DIR

    folder = Path(ZOO_DIR) / "enc-dec-reverse"
    if not (folder / "model.safetensors").is_file():
        pytest.skip("zoo model enc-dec-reverse not present")
    seen = _record(monkeypatch)
    r = build_report(load(folder), tmp_path / "r", folder=folder, progress=False, parallel=False)
    assert r.failed == {}, r.failed
    _check(seen, ENCDEC_SECTIONS)


def test_the_split_in_use_keeps_to_the_declarations():
    check_split(SECTIONS, SECOND_PROCESS)
    check_split(ENCDEC_SECTIONS, set())


def test_a_split_that_would_lose_a_value_is_refused():
    with pytest.raises(ValueError, match="skip_trigrams reads ctx.cache\\['bigrams'\\]"):
        check_split(SECTIONS, SECOND_PROCESS - {"direct_path"})  # bigrams written here, read in the child
    with pytest.raises(ValueError, match="skip_trigrams reads"):
        check_split(SECTIONS, {"direct_path"})  # bigrams written in the child, read here
    order = [s for s in SECTIONS if s[0] != "direct_path"] + [s for s in SECTIONS if s[0] == "direct_path"]
    with pytest.raises(ValueError, match="writes after it"):
        check_split(order, set())

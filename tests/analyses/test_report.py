"""Reports: sections chosen by the model, every named figure written, failures contained; zoo reports (slow)."""

import json
import re
from pathlib import Path

import pytest
import torch

import models
from analyses import build_report
from analyses.report import SECTIONS
from circuits.testing import build_induction_model
from models import HookedTransformer, HookedTransformerConfig
from models.data.tokenizer import ByteTokenizer
from models.io.checkpoint import resolve

pytestmark = pytest.mark.e2e  # whole reports

TEXT = torch.tensor(list((Path(__file__).resolve().parents[2] / "analyses" / "scores.py").read_bytes()[:6000]))



def byte_model(n_layers=1, d_mlp=None, norm=None, pos="shortformer", seed=0):
    cfg = HookedTransformerConfig(n_layers=n_layers, d_model=32, n_ctx=64, d_vocab=259, n_heads=2, d_mlp=d_mlp,
                                  normalization_type=norm, positional_embedding_type=pos, seed=seed)
    return HookedTransformer(cfg, tokenizer=ByteTokenizer())


def check_files(report):
    md = report.path.read_text()
    named = re.findall(r"\]\(([^)]+\.png)\)", md)
    for name in named:
        assert (report.path.parent / name).is_file(), name
    assert {p.name for p in report.files if p.suffix == ".png"} == set(named)
    assert all(p.is_file() for p in report.files)
    return md


def test_hand_built_model_report(tmp_path):
    model, info = build_induction_model(d_vocab=40, n_ctx=64)
    r = build_report(model, tmp_path, progress=False)
    assert r.failed == {}
    md = check_files(r)
    assert "composition" in r.sections and "dynamics" not in r.sections
    assert "**Induction heads: L1H0.**" in md and "**Previous-token heads: L0H0.**" in md
    assert "Skipped: needs validation text" in md  # no tokenizer: text sections say so
    assert "Report(" in str(r)


@pytest.mark.parametrize("n_layers,d_mlp,norm", [(0, None, None), (1, None, None), (2, 64, "LN")])
def test_sections_fit_the_model(tmp_path, n_layers, d_mlp, norm):
    m = byte_model(n_layers, d_mlp, norm, pos="standard" if d_mlp else "shortformer")
    r = build_report(m, tmp_path, tokens=TEXT, progress=False)
    assert r.failed == {}, r.failed
    md = check_files(r)
    expect = {k for k, *_ in SECTIONS}
    assert set(r.sections) <= expect
    assert ("composition" in r.sections) == (n_layers >= 2)
    assert ("term_importance" in r.sections) == (n_layers >= 1 and d_mlp is None)
    assert ("mlp_note" in r.sections) == (d_mlp is not None)
    assert "In-context learning score" in md and "bigram entropy" in md


def test_failing_section_is_contained(tmp_path, monkeypatch):
    from analyses.report import build as R

    def boom(ctx):
        raise RuntimeError("kaput")

    sections = [s if s[0] != "copying" else (s[0], s[1], s[2], boom) for s in R.SECTIONS]
    monkeypatch.setattr(R, "SECTIONS", sections)
    r = R.build_report(byte_model(1), tmp_path, tokens=TEXT, progress=False, sections=["overview", "copying"])
    assert r.sections == ["overview", "copying"] and "kaput" in r.failed["copying"]
    assert "This section failed: RuntimeError: kaput" in r.path.read_text()


def test_saved_run_folder_gets_dynamics(tmp_path):
    m = byte_model(1)
    folder = tmp_path / "run"
    m.save(folder)
    recs = [{"step": i, "tokens": 512 * i, "val_loss": 5.0 - 0.1 * i, "train_loss": 5.1 - 0.1 * i,
             "icl_score": -0.01 * i, "induction_scores_20": [[0.01 * i, 0.02]]} for i in range(6)]
    (folder / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in recs))
    r = build_report(models.load(folder), tmp_path / "out", folder=folder, tokens=TEXT, progress=False)
    assert "dynamics" in r.sections and r.failed == {}
    check_files(r)
    assert (tmp_path / "out" / "training_dynamics.png").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["attn-only-0l", "attn-only-1l", "attn-only-2l", "gelu-2l"])
def test_zoo_report(tmp_path, name):
    r = build_report(models.load(name), tmp_path, folder=resolve(name), progress=False)
    assert r.failed == {}, r.failed
    check_files(r)
    assert sum(r.seconds.values()) < 240, r.seconds


def test_every_export_resolves_and_import_is_lazy():
    import subprocess
    import sys

    import analyses

    for name in analyses.__all__:
        assert getattr(analyses, name) is not None, name
    code = "import sys, analyses, analyses.cli; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


def test_chunked_position_losses_give_the_icl_score():
    from helpers import make_model

    from analyses.scores import in_context_learning_score, position_losses

    model = make_model(2)
    tokens = torch.randint(0, model.cfg.d_vocab, (130, 24), generator=torch.Generator().manual_seed(0))
    per = position_losses(model, tokens, chunk=7)
    whole = model(tokens, return_type="loss", loss_per_token=True).double()
    assert per.shape == (130, 23) and torch.allclose(per, whole, atol=1e-5)
    diff = float((per[:, 19] - per[:, 2]).mean())
    assert diff == pytest.approx(in_context_learning_score(model, tokens, 3, 20, chunk=11), abs=1e-5)
    assert diff == pytest.approx(in_context_learning_score(model, tokens, 3, 20, chunk=1000), abs=1e-5)

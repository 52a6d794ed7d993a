"""`circuits report --tokenizer T FOLDER` reports the model the command line loaded, T attached, on every device:
the report no longer loads the folder a second time (which dropped T on the CPU). Checked against `build_report` of
the same model with T attached, and against the report without T (so the test can tell the two apart)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = ["overview", "skip_trigrams"]  # skip-trigrams print tokens as the tokenizer spells them


@pytest.fixture
def folder(tmp_path) -> Path:
    """A saved 1-layer model without a tokenizer, a byte tokenizer file and a text file."""
    from models import HookedTransformer, HookedTransformerConfig, save
    from models.data.tokenizer import ByteTokenizer

    cfg = HookedTransformerConfig(n_layers=1, d_model=16, n_ctx=32, d_vocab=259, n_heads=2, attn_only=True, seed=0)
    save(HookedTransformer(cfg), tmp_path / "m")
    ByteTokenizer().save(tmp_path / "bytes.json")
    (tmp_path / "t.txt").write_text((ROOT / "analyses" / "scores.py").read_text()[:4000])
    return tmp_path


def test_report_uses_the_tokenizer_option_on_cpu(folder, capsys):
    import models
    from analyses import build_report
    from analyses.cli import main
    from analyses.cli.common import read_text_tokens
    from models.data.tokenizer import load_tokenizer

    m = folder / "m"
    code = main(["report", str(m), "--tokenizer", str(folder / "bytes.json"), "--text-file", str(folder / "t.txt"),
                 "--sections", ",".join(SECTIONS), "--out", str(folder / "cli"), "--device", "cpu", "--no-progress"])
    assert code == 0, capsys.readouterr().err
    got = (folder / "cli" / "report.md").read_text()

    model = models.load(m)
    model.tokenizer = load_tokenizer(folder / "bytes.json")
    tokens = read_text_tokens(model, str(folder / "t.txt"))
    want = build_report(model, folder / "api", folder=m, name=str(m), tokens=tokens, sections=SECTIONS,
                        progress=False, parallel=False).path.read_text()
    bare = build_report(models.load(m), folder / "bare", folder=m, name=str(m), tokens=tokens, sections=SECTIONS,
                        progress=False, parallel=False).path.read_text()
    assert got == want
    assert got != bare  # without the tokenizer the tokens are spelled otherwise

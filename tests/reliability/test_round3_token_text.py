"""Round three (issue 32), rows 6-9: token text from a model folder reaching Markdown, HTML, the terminal and figure
labels. A hostile tokenizer (tokens `<!--`, `<script>`, `</script>`, `![](http:e)`, `<b>PWN</b>`,
`<img src=x onerror=alert(1)>`, ESC and other control bytes, `$a^{$`) in a model folder, reported on: every section
runs, report.md and report.html carry the text escaped, the page makes no request and renders every section and
view (headless Chromium, e2e), and the terminal gets no control byte. Each test failed on the code before the
change (docs/RELIABILITY.md, round three)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

HOSTILE = ["<!--", "<script>", "</script>", "![](http:e)", "<b>PWN</b>", "<img src=x onerror=alert(1)>",
           "\x1b[31mRED", "\x07bell", "\x9bcsi", "\u202eevil", "$a^{$", "line\u2028sep"]
PLAIN = ["a", "b", "c", "d", "e", "f", "g", "h"]
SEP = "¦"
CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u2028\u2029]")


def _hostile_tokenizer():
    """A word-level tokenizer (words split on `SEP`) whose vocabulary holds the hostile tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from models.data.tokenizer import SPECIALS, BPETokenizer

    vocab = {t: i for i, t in enumerate(list(SPECIALS) + ["[UNK]"] + PLAIN + HOSTILE)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(SEP, behavior="removed")
    return BPETokenizer(tok)


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> Path:
    """A 2-layer attention-only model whose tokenizer and validation text (a file inside the folder, named by its
    train_config.json) are full of hostile tokens."""
    import random

    from models import HookedTransformer, HookedTransformerConfig, save

    tok = _hostile_tokenizer()
    cfg = HookedTransformerConfig(n_layers=2, d_model=32, n_ctx=24, d_vocab=tok.vocab_size, n_heads=2,
                                  attn_only=True, normalization_type=None, seed=0)
    folder = tmp_path_factory.mktemp("hostile") / "model"
    save(HookedTransformer(cfg, tokenizer=tok), folder)
    rng = random.Random(0)
    words = [rng.choice(PLAIN + HOSTILE) for _ in range(6000)]
    (folder / "text.txt").write_text(SEP.join(words))
    (folder / "train_config.json").write_text(json.dumps({"data": "text.txt", "tokenizer": "<b>word</b>"}))
    assert all(tok.decode([tok.encode(t)[0]]) == t for t in HOSTILE)  # each hostile string is one token
    return folder


def _run(*argv, timeout=900) -> subprocess.CompletedProcess:
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "analyses.cli", *map(str, argv)], capture_output=True, timeout=timeout,
                          cwd=root, env=env)


@pytest.fixture(scope="module")
def report(hostile, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("hostile-report")
    r = _run("report", hostile, "--out", out, "--html", "--json", "--no-progress", "--windows", "8")
    assert r.returncode == 0, r.stderr.decode(errors="replace")[-3000:]
    summary = json.loads(r.stdout)
    assert summary["failed"] == {}, summary["failed"]  # row 9: `$a^{$` broke a figure's labels (mathtext)
    return out


@pytest.mark.e2e  # a whole report in a subprocess
def test_every_section_runs_and_report_md_carries_token_text_escaped(report):
    md = (report / "report.md").read_text(encoding="utf-8")
    assert "failed" not in md.lower() or "section" not in md.lower()
    for raw in ("<b>", "<img", "<script", "</script", "<!--", "![](", "$a^{$"):
        assert not re.search(r"(?<!\\)" + re.escape(raw), md), raw  # row 7: raw HTML, an image link, math
    assert not CONTROL.search(md), CONTROL.search(md)  # row 8: ESC and other control bytes
    assert "\\<b\\>PWN\\</b\\>" in md or "\\<script\\>" in md  # the tokens are there, escaped


class _Tags(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.in_script, self.scripts = [], False, []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag == "script":
            self.scripts.append("")
            self.in_script = True

    def handle_endtag(self, tag):
        if tag == "script":
            self.in_script = False

    def handle_data(self, data):
        if self.in_script:
            self.scripts[-1] += data


@pytest.mark.e2e
def test_report_html_has_only_its_own_tags_and_escaped_script_data(report):
    page = (report / "report.html").read_text(encoding="utf-8")
    assert not CONTROL.search(page.replace("\n", "")), CONTROL.search(page)
    parser = _Tags()
    parser.feed(page)
    imgs = [a for t, a in parser.tags if t == "img"]
    assert imgs and all(a.get("src", "").startswith("data:image/png;base64,") for a in imgs), imgs[:3]
    assert not [t for t, _ in parser.tags if t in ("b", "iframe", "object", "embed", "link")]
    views = page.count("CircuitsVis.render(")
    assert views == 3 and len(parser.scripts) == 1 + views  # the bundle, then one script per view
    for script in parser.scripts[1:]:
        assert "<" not in script and "\u2028" not in script, script[:200]  # row 6: JSON escapes < > & U+2028
    sections = re.findall(r"^## ", (report / "report.md").read_text(), flags=re.M)
    assert page.count("<h2>") == len(sections) >= 4


@pytest.mark.parametrize("argv", [
    ["trigrams", "--head", "0.0", "--bugs"],
    pytest.param(["lens", "--text", SEP.join(HOSTILE)], marks=pytest.mark.tl4),  # TransformerLens' lens: 4.x
    ["attention", "--text", SEP.join(HOSTILE), "--head", "0.0", "--figure", "{tmp}/a.png"],
], ids=["trigrams", "lens", "attention"])
def test_the_terminal_gets_no_control_bytes(hostile, tmp_path, argv, capsys):
    from analyses import cli

    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    capsys.readouterr()
    code = cli.main([argv[0], str(hostile), *argv[1:], "--no-progress"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert not CONTROL.search(out + err), repr(CONTROL.search(out + err))
    assert "\\x1b" in out or "\\u202e" in out or "\\x07" in out  # the tokens are shown, escaped


def test_figure_labels_are_plain_text():
    import matplotlib

    matplotlib.use("Agg")
    import torch

    from analyses.interactive import plot_token_values
    from analyses.labels import figure_text
    from analyses.plots import plot_token_patterns

    labels = [figure_text(t) for t in ("$a^{$", "$x$", "plain")]
    for fig in (plot_token_patterns([torch.eye(3).numpy()], ["$a^{$", "$x$", "plain"], ["L0H0"]),
                plot_token_values(["$a^{$", "$x$", "plain"], torch.ones(3, 1), ["L0H0"], "t", "logit (nats)")):
        fig.canvas.draw()  # mathtext would raise ValueError on `$a^{$`
        shown = [t.get_text() for ax in fig.axes for t in ax.get_xticklabels()]
        assert [s for s in shown if s] == labels or [s for s in shown if s][:3] == labels, shown


CHROMIUM = os.environ.get("TOY_CIRCUITS_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.mark.e2e
@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (Debian: apt-get install chromium)")
def test_hostile_page_in_headless_chromium_makes_no_request_and_renders_everything(report):
    pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    n_sections = len(re.findall(r"^## ", (report / "report.md").read_text(), flags=re.M))
    from helpers import offline_page

    with offline_page(CHROMIUM, FLAGS, (report / "report.html").as_uri()) as (page, requests, errors, dialogs):
        page.get_by_text("Head Selector (hover to view, click to lock)").first.wait_for(timeout=30_000)
        page.wait_for_timeout(500)
        h2 = page.locator("body > h2").count()  # CircuitsVis draws headings of its own inside views
        views = page.eval_on_selector_all(".circuitsvis-view", "els => els.map(e => e.childElementCount)")
        bold = page.locator("b", has_text="PWN").count() + page.locator("img[src=x]").count()
    assert requests == [] and dialogs == [] and errors == [], (requests, dialogs, errors)
    assert h2 == n_sections  # every section, none swallowed into a script or comment
    assert len(views) == 3 and all(n > 0 for n in views), views  # every interactive view rendered
    assert bold == 0  # <b>PWN</b> and <img src=x ...> stayed text

"""The SAE feature pages of `circuits sae report --html` (`analyses.sae_page`) and the activation histogram they draw
(`analyses.sae_metrics.activation_histogram`): the histogram against numpy's, the page's numbers against the report
they draw, and token text (data from a model folder) escaped once, whatever it holds. No SAELens needed: the report
is built by hand; tests/models/test_zoo_saes.py checks the pages of a real SAE against a direct computation."""

from __future__ import annotations

import html
from html.parser import HTMLParser

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from analyses.labels import visible_controls
from analyses.sae_metrics import activation_histogram
from analyses.sae_page import features_html, histogram_svg
from analyses.sae_report import Feature, FeatureContext, SAEReport, markdown

HOSTILE = ["<!--", "<script>alert(1)</script>", "</section>", "<b>PWN</b>", "<img src=x onerror=alert(1)>",
           "&amp;", '"quote\'', "\x1b[31mRED", "\u202eevil", "$a^{$", "line\u2028sep", "]]>"]


@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.one_of(st.just(0.0), st.floats(0, 50, allow_nan=False)), min_size=1, max_size=200),
       bins=st.integers(1, 40))
def test_activation_histogram_is_numpys_over_the_positive_values(values, bins):
    a = torch.tensor(values, dtype=torch.float32)
    h = activation_histogram(a, bins)
    pos = a.double().numpy()[a.numpy() > 0]
    assert h.zeros == int((a <= 0).sum())
    if pos.size == 0:
        assert h.counts == [] and h.edges == []
        return
    counts, edges = np.histogram(pos, bins=bins, range=(0.0, pos.max()))
    assert h.counts == counts.tolist() and sum(h.counts) == pos.size
    np.testing.assert_allclose(h.edges, edges, rtol=1e-12, atol=0)


class _Page(HTMLParser):
    """The tags, comments, text and attributes of a page fragment."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags, self.comments, self.text, self.attrs = [], [], [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs.append((tag, dict(attrs)))

    def handle_comment(self, data):
        self.comments.append(data)

    def handle_data(self, data):
        self.text.append(data)


def _parse(fragment: str) -> _Page:
    p = _Page()
    p.feed(fragment)
    p.close()
    return p


def _report(labels: list[str]) -> SAEReport:
    acts = [0.0, 0.5, 2.0, 1.0, 0.25][: len(labels)] + [0.0] * max(0, len(labels) - 5)
    ctx = FeatureContext(list(labels), acts, 2)
    hist = activation_histogram(torch.tensor([0.0, 0.5, 2.0, 1.0, 0.25, 2.0]), 4)
    feat = Feature(7, 0.25, 2.0, [("".join(labels[:2]), labels[2], "".join(labels[3:]), 2.0)],
                   [(t, 1.0 - 0.1 * i) for i, t in enumerate(labels[:4])],
                   [(t, -1.0 + 0.1 * i) for i, t in enumerate(labels[4:8])], hist, [ctx])
    stats = {"hook_name": "blocks.0.hook_mlp_out", "tokens": 40, "fvu": 0.1, "l0": 2.0, "dead": 0, "d_sae": 8}
    losses = {"clean": 1.0, "spliced": 1.1, "zero_ablated": 2.0, "recovered": 0.9}
    return SAEReport(stats, losses, torch.zeros(8), [feat])


def test_hostile_token_text_is_text_on_the_page():
    """Every token (context, promoted, suppressed) shows as itself, control characters made visible; nothing in it
    becomes a tag, a comment, an entity or an attribute."""
    report = _report(HOSTILE)
    page = _parse(features_html(report))
    assert set(page.tags) <= {"style", "p", "a", "section", "h3", "h4", "div", "svg", "rect", "title", "line", "text",
                              "table", "thead", "tbody", "tr", "th", "td", "code", "span"}, set(page.tags)
    assert page.comments == []
    assert page.tags.count("section") == 1 and "script" not in page.tags and "img" not in page.tags
    text = "".join(page.text)
    f = report.features[0]
    for label in f.windows[0].labels + [t for t, _ in f.promoted + f.demoted]:
        assert visible_controls(label) in text, label
    assert "\x1b" not in text and "\u202e" not in text and "\u2028" not in text
    tokens = [a.get("title") for tag, a in page.attrs if tag == "span" and "sae-tok" in a.get("class", "")]
    assert tokens == [f"activation {v:.3f}" for v in f.windows[0].acts]


def test_page_numbers_are_the_reports():
    """The histogram's bars carry the report's counts and bin edges, their heights in proportion; the logit table the
    promoted and suppressed tokens in order with their weights; each context token its activation, the one the
    context was picked for outlined; the density line the feature's frequency."""
    report = _report(["a", "b", "c", "d", "e", "f", "g", "h"])
    f = report.features[0]
    page = _parse(features_html(report))
    rects = [a for tag, a in page.attrs if tag == "rect"]
    assert [int(r["data-count"]) for r in rects] == f.histogram.counts == [1, 1, 1, 2]
    assert [float(r["data-lo"]) for r in rects] == f.histogram.edges[:-1]
    heights = np.array([float(r["height"]) for r in rects])
    np.testing.assert_allclose(heights / heights.max(), np.array(f.histogram.counts) / max(f.histogram.counts),
                               atol=1e-3)
    frag = features_html(report)
    rows = frag.split("<tbody>", 1)[1].split("</tbody>", 1)[0].split("</tr>")[:-1]
    for i, row in enumerate(rows):
        cells = _parse(row)
        words = [t for t in cells.text if t.strip()]
        (pt, pv), (dt, dv) = f.promoted[i], f.demoted[i]
        assert words == [pt, f"{pv:+.2f}", dt, f"{dv:+.2f}"], words
    tops = [a for tag, a in page.attrs if tag == "span" and "sae-top" in a.get("class", "")]
    assert len(tops) == 1 and tops[0]["title"] == f"activation {f.windows[0].acts[f.windows[0].at]:.3f}"
    assert "active on 25.00% of tokens (10 of 40)" in html.unescape(frag)


def test_a_feature_that_never_fires_and_a_hook_without_logit_weights():
    hist = activation_histogram(torch.zeros(5), 8)
    assert "never active" in histogram_svg(hist)
    report = _report(["a", "b", "c"])
    report.features[0].promoted = report.features[0].demoted = None
    assert "no logit weights" in features_html(report)


def test_markdown_for_the_page_ends_at_the_pages_heading():
    report = _report(["a", "b", "c", "d", "e", "f", "g", "h"])
    md = markdown(report, "m", None, "text", features=False)
    assert md.rstrip().endswith("## Feature pages") and "### Feature" not in md
    full = markdown(report, "m", None, "text")
    assert "### Feature 7" in full and "Suppresses: e (-1.00), f (-0.90)" in full


@pytest.mark.parametrize("bad", ["", "a,b", "-1", "3,-2"])
def test_features_option_refuses_bad_lists(bad, capsys):
    from analyses.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["sae", "report", "gelu-2l", "x", "--out", "y", "--features", bad])
    assert exit_.value.code == 2 and "feature numbers" in capsys.readouterr().err

"""`report.html`: one self-contained page (figures embedded, CircuitsVis inlined), checked as text and then in a
real headless Chromium with the network off: no console errors, no request leaves the page, picking a head shows
its title and a pattern whose pixels match the hand-built model's known circuit."""

import base64
import io
import os
import re
import shutil

import numpy as np
import pytest
import torch

from analyses import build_report
from circuits.testing import build_induction_model

pytestmark = pytest.mark.e2e  # the HTML report, in a browser

CHROMIUM = os.environ.get("TOY_CIRCUITS_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
#: Flags for a root, headless, offline run (see the machine notes): no sandbox, no GPU, no background traffic.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """The hand-built induction model's report with `html=True`: L0H0 attends to the previous token, L1H0 is the
    induction head, L1H1 attends to the first token (circuits.testing)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model, _ = build_induction_model(d_vocab=24, n_ctx=48, dtype="float32")
        out = tmp_path_factory.mktemp("html")
        r = build_report(model, out, sections=["overview", "attention", "copying"], progress=False, html=True)
    finally:
        torch.set_num_threads(n)
    assert r.failed == {}
    return r


def test_page_is_self_contained(report):
    page = report.path.parent / "report.html"
    assert page in report.files
    text = page.read_text()
    pngs = [f for f in report.files if f.suffix == ".png"]
    assert len(pngs) >= 3 and text.count('src="data:image/png;base64,') == len(pngs)
    # nothing to fetch: no external script, stylesheet, image or font, no CDN
    assert not re.search(r"""<(script|link|img|iframe)[^>]+(src|href)=["']?(https?:|//)""", text)
    assert "unpkg" not in text and "@import" not in text
    assert text.count("CircuitsVis.render(") == 1  # no validation text: the probe's attention view only
    assert "var CircuitsVis" in text  # the bundle inlined once
    # the embedded figures are the files, byte for byte
    first = re.search(r'src="data:image/png;base64,([^"]+)"', text).group(1)
    assert base64.b64decode(first) in {f.read_bytes() for f in pngs}


def test_html_flag_on_the_command_line(tmp_path):
    from analyses.cli import main

    model, _ = build_induction_model(d_vocab=12, n_ctx=24, dtype="float32")
    model.save(tmp_path / "m")
    assert main(["report", str(tmp_path / "m"), "--out", str(tmp_path / "r"), "--sections", "overview,attention",
                 "--html", "--no-progress", "--json"]) == 0
    assert (tmp_path / "r" / "report.html").is_file() and (tmp_path / "r" / "report.md").is_file()


def _ink(png: bytes) -> np.ndarray:
    """(x, y) of the 'attention' pixels of a CircuitsVis pattern: its cells are shades of its positive colour
    (blue); text is grey, the masked upper triangle light grey, zero cells white."""
    from PIL import Image

    a = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)
    r, g, b = a[..., 0], a[..., 1], a[..., 2]
    ys, xs = np.nonzero((b - r > 60) & (b - g > 60))
    return np.stack([xs, ys], 1)


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (Debian: apt-get install chromium)")
def test_page_in_headless_chromium(report, tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    page_path = report.path.parent / "report.html"
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            ctx = browser.new_context(offline=True, viewport={"width": 1280, "height": 1000})
            page = ctx.new_page()
            errors, requests = [], []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("request", lambda q: None if q.url.startswith(("file:", "data:", "blob:")) else
                    requests.append(q.url))
            page.goto(page_path.as_uri())
            page.get_by_text("Head Selector (hover to view, click to lock)").first.wait_for(timeout=30_000)
            assert page.locator("img").count() >= 3
            assert all(page.eval_on_selector_all("img", "els => els.map(e => e.naturalWidth > 0)"))
            patterns = {}
            for head in ("L0H0", "L1H1", "L1H0"):
                page.locator("h4", has_text=head).first.click()
                title = page.locator("h3", has_text=f"{head} Zoomed").first
                title.wait_for(timeout=5_000)  # the selected head's title is shown
                canvas = title.locator("xpath=following-sibling::div[1]//canvas").first
                canvas.scroll_into_view_if_needed()
                page.wait_for_timeout(300)  # chart.js animates the first draw
                data = canvas.evaluate("c => c.toDataURL('image/png')")
                patterns[head] = base64.b64decode(data.split(",", 1)[1])
                canvas.screenshot(path=str(tmp_path / f"{head}.png"))
            page.screenshot(path=str(tmp_path / "page.png"))
        finally:
            browser.close()
    assert errors == [] and requests == []
    ink = {h: _ink(png) for h, png in patterns.items()}
    assert all(len(v) > 200 for v in ink.values()), {h: len(v) for h, v in ink.items()}  # non-empty patterns
    prev, first = ink["L0H0"], ink["L1H1"]
    # previous-token head: ink along the sub-diagonal (x and y rise together)
    assert np.corrcoef(prev[:, 0], prev[:, 1])[0, 1] > 0.95
    # first-token head: one column at the left, spread down the rows
    assert first[:, 0].std() < 0.1 * first[:, 1].std()
    assert patterns["L1H0"] != patterns["L0H0"]

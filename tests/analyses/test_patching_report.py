"""The report section on path patching and the figures of `analyses.patching`."""

from __future__ import annotations

import re

import matplotlib
import pytest
import torch

matplotlib.use("Agg")

from analyses import patching as P  # noqa: E402
from analyses.report import SECTIONS, build_report  # noqa: E402
from circuits.testing import build_induction_model, random_model  # noqa: E402


def test_report_section_on_the_hand_built_induction_model(tmp_path):
    model, _ = build_induction_model()
    r = build_report(model, tmp_path, sections=["path_patching"], progress=False)
    assert r.sections == ["path_patching"] and not r.failed
    md = r.path.read_text()
    assert (tmp_path / "path_patching.png").stat().st_size > 10_000
    rows = re.findall(r"^\| (k|q|v): (L\dH\d) → (L\dH\d) \| [\d.]+ \| (-?[\d.]+) \|$", md, re.M)
    assert rows[0][:3] == ("k", "L0H0", "L1H0") and float(rows[0][3]) > 0.9
    assert len(rows) == 1  # no other single path carries 0.005 of the effect
    joint = dict(re.findall(r"^\| every layer-0 head → every later head \| ([QKV]) \| (-?[\d.]+) \|$", md, re.M))
    assert float(joint["Q"]) == 0 and float(joint["V"]) == 0 and float(joint["K"]) > 0.9


def test_section_is_for_two_layers_and_more():
    pred = next(s.fits for s in SECTIONS if s.key == "path_patching")

    class Ctx:
        def __init__(self, n):
            self.cfg = type("C", (), {"n_layers": n})()

    assert [pred(Ctx(n)) for n in (0, 1, 2, 3)] == [False, False, True, True]


def test_plot_patching_panels_share_one_scale():
    m = random_model(n_layers=3, n_heads=2, positional="standard").eval()
    g = torch.Generator().manual_seed(0)
    clean = torch.randint(0, m.cfg.d_vocab, (2, 6), generator=g)
    corrupt = torch.randint(0, m.cfg.d_vocab, (2, 6), generator=g)
    met = P.metric("loss", P.answers(m, 2, correct=1))
    r = P.path_patching_matrix(m, clean, corrupt, met, progress=False)
    fig = P.plot_patching(r)
    images = [ax.images[0] for ax in fig.axes if ax.images]
    assert len(images) == 3  # one panel per component
    lims = {im.get_clim() for im in images}
    assert len(lims) == 1 and pytest.approx(-lims.pop()[0]) == float(r.share().nan_to_num().abs().max())
    by_pos = P.activation_patching(m, clean, corrupt, met, kind="z", by_pos=True, progress=False)
    fig = P.plot_patching(by_pos)
    assert [ax.get_xlabel() for ax in fig.axes if ax.images] == ["pos"] * 3  # positions run along x
    a = P.attribution_patching(m, clean, corrupt, met, kind="z", progress=False)
    assert "r = " in P.plot_attribution(a).axes[0].get_title()
    P.plot_dla(P.direct_logit_attribution(m, clean, answer=1))


@pytest.mark.tl4
def test_plot_logit_lens_scale_is_probability():
    m = random_model(n_layers=3, n_heads=2, positional="standard").eval()
    clean = torch.randint(0, m.cfg.d_vocab, (1, 6), generator=torch.Generator().manual_seed(0))
    lens = P.logit_lens(m, clean)
    assert P.plot_logit_lens(lens).axes[0].images[0].get_clim() == (0, 1)

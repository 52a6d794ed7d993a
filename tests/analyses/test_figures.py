"""Figures checked for what a test can see (`analyses.figure_checks`): nothing outside the canvas, no overprinted
text, a colour bar on every heatmap, no text under 7 pt. The checker is tested on figures built to fail; then every
report figure, the CLI's attention grid and the interactive views' static twins are run through it."""

import json
import math
from pathlib import Path

import matplotlib
import pytest
import torch
from helpers import checked_report

from analyses.figure_checks import figure_problems
from models import HookedTransformer, HookedTransformerConfig, load
from models.data.tokenizer import ByteTokenizer
from models.io.checkpoint import resolve

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

pytestmark = pytest.mark.e2e  # every figure of a report, drawn and checked

TEXT = torch.tensor(list((Path(__file__).resolve().parents[2] / "analyses" / "scores.py").read_bytes()[:6000]))


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


# --- the checker itself ----------------------------------------------------------------------------------
def test_clean_figure_passes():
    fig, ax = plt.subplots(figsize=(4, 3), layout="constrained")
    im = ax.imshow(torch.rand(5, 5).numpy())
    fig.colorbar(im, ax=ax, label="probability")
    ax.set_title("fine")
    assert figure_problems(fig) == []


@pytest.mark.parametrize("label", ["", "value"])
def test_colour_bar_must_name_its_quantity(label):
    fig, ax = plt.subplots(figsize=(4, 3), layout="constrained")
    fig.colorbar(ax.imshow(torch.rand(5, 5).numpy()), ax=ax, label=label)
    assert figure_problems(fig) == [f"a colour bar is labelled {label!r}: name its quantity and unit"]


def test_title_outside_the_canvas():
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot([0, 1])
    ax.set_title("a title far too long to fit on a figure only three inches wide at all")
    assert any("canvas" in p for p in figure_problems(fig))


def test_overlapping_annotations():
    fig, ax = plt.subplots(figsize=(4, 4), layout="constrained")
    ax.scatter([1, 1], [1, 1])
    ax.annotate("L1H1", (1, 1))
    ax.annotate("L1H2", (1, 1))
    assert any("'L1H1'" in p and "overlaps" in p and "'L1H2'" in p for p in figure_problems(fig))


def test_label_running_into_the_next_panel():
    fig, axes = plt.subplots(1, 2, figsize=(4, 2))
    axes[1].set_yticks([0.5], ["a very long tick label here"])
    assert any("runs into the panel" in p for p in figure_problems(fig))


def test_heatmap_without_colour_bar_and_shared_scale():
    fig, axes = plt.subplots(1, 2, figsize=(6, 3), layout="constrained")
    for ax in axes:
        ax.imshow(torch.rand(4, 4).numpy(), vmin=0, vmax=1)
    assert sum("no colour bar" in p for p in figure_problems(fig)) == 2
    fig.colorbar(axes[0].images[0], ax=list(axes), label="probability")  # one bar for both: same map, same limits
    assert figure_problems(fig) == []
    axes[1].images[0].set_clim(0, 2)  # now the second panel has a scale of its own, without a bar
    assert sum("no colour bar" in p for p in figure_problems(fig)) == 1


def test_small_text():
    fig, ax = plt.subplots(figsize=(4, 3), layout="constrained")
    ax.plot([0, 1])
    ax.set_title("tiny", fontsize=5)
    assert any("5.0 pt" in p for p in figure_problems(fig))


# --- every figure a report writes, on a model whose labels are real bytes ----------------------------------
def _run_folder(path: Path) -> Path:
    """A training run's metrics.jsonl with a phase change at 20k tokens (as tests/test_dynamics' synthetic run)."""
    path.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(30):
        tokens = int(1000 * 1.3**i) if i else 0
        formed = tokens >= 20_000
        ind = [[0.02, 0.03], [0.05, 0.8 if formed else 0.02]]
        val = 6 - 0.3 * math.log1p(tokens / 1000) - (0.8 if formed else 0.0)
        lines.append(json.dumps({"step": i, "tokens": tokens, "train_loss": val + 0.05, "val_loss": val,
                                 "icl_score": -0.45 if formed else -0.1, "icl_score_se": 0.05,
                                 "induction_scores_50": ind}))
    (path / "metrics.jsonl").write_text("\n".join(lines))
    return path


def test_report_figures(tmp_path, monkeypatch):
    cfg = HookedTransformerConfig(n_layers=2, d_model=32, n_ctx=64, d_vocab=259, n_heads=4, d_mlp=None,
                                  normalization_type=None, positional_embedding_type="shortformer", seed=0)
    model = HookedTransformer(cfg, tokenizer=ByteTokenizer())
    found, _ = checked_report(monkeypatch, model, tmp_path / "r", tokens=TEXT, folder=_run_folder(tmp_path / "run"))
    expect = {"direct_path_bigrams", "attention_patterns", "head_scores", "ov_eigenvalues", "head_ablation",
              "composition", "qk_ov_positivity", "loss_by_position", "training_dynamics", "path_patching",
              "discovery_circuit"}
    assert set(found) == expect
    assert {k: v for k, v in found.items() if v} == {}


def test_token_pattern_grids():
    """`circuits attention`'s figure: one head with its tokens, a grid with them, a grid too long for them."""
    from analyses.plots import plot_token_patterns

    for n_heads, n_tok in ((1, 40), (8, 22), (8, 60)):
        pats = [torch.rand(n_tok, n_tok).tril().numpy() for _ in range(n_heads)]
        labels = [f"tok{i}" for i in range(n_tok)]
        fig = plot_token_patterns(pats, labels, [f"L0H{h}" for h in range(n_heads)])
        assert figure_problems(fig) == [], (n_heads, n_tok)


def test_interactive_static_twins():
    from analyses.interactive import DLA_QUANTITY, attention_view, next_token_attribution, token_values_view
    from analyses.labels import token_labels
    from circuits.testing import build_induction_model

    model, _ = build_induction_model(d_vocab=12, n_ctx=24, dtype="float32")
    model.tokenizer = ByteTokenizer()
    t = torch.tensor([0, 5, 3, 9, 10, 11, 5, 3, 9, 10, 11])  # bytes: \t and \n among them
    assert figure_problems(attention_view(model, t).figure()) == []
    dla, names = next_token_attribution(model, t)
    view = token_values_view(token_labels(model, t[1:].tolist()), dla, names, "direct logit attribution", DLA_QUANTITY)
    fig = view.figure()
    assert figure_problems(fig) == [] and fig.axes[-1].get_ylabel() == DLA_QUANTITY


@pytest.mark.slow
@pytest.mark.parametrize("name", ["attn-only-1l", "attn-only-2l"])
def test_zoo_report_figures(tmp_path, monkeypatch, name):
    found, _ = checked_report(monkeypatch, load(name), tmp_path, folder=resolve(name))
    assert found and {k: v for k, v in found.items() if v} == {}

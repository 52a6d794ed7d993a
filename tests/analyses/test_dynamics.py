"""Training dynamics from a run folder: a synthetic metrics.jsonl with a known phase change, and the zoo run."""

import json
import math

import matplotlib
import pytest

from analyses.dynamics import FORMED, plot_training_dynamics, training_dynamics

matplotlib.use("Agg")


def write_run(path, change_at=20_000, n=30, torn=True):
    """Loss falls smoothly, then drops fast at `change_at` tokens while layer-1 head 1's induction score jumps."""
    path.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(n):
        tokens = int(1000 * 1.3**i) if i else 0
        formed = tokens >= change_at
        ind = [[0.02, 0.03], [0.05, 0.8 if formed else (0.3 if tokens >= change_at / 1.3 else 0.02)]]
        val = 6 - 0.3 * math.log1p(tokens / 1000) - (0.8 if formed else 0.0)
        rec = {"step": i, "tokens": tokens, "train_loss": val + 0.05, "val_loss": val,
               "icl_score": -0.45 if formed else -0.1, "induction_scores_50": ind, "induction_scores_20": ind}
        lines.append(json.dumps(rec))
    text = "\n".join(lines) + "\n" + ('{"step": 99, "tok' if torn else "")
    (path / "metrics.jsonl").write_text(text)
    (path / "checkpoints" / "step-000010").mkdir(parents=True, exist_ok=True)
    return path


def test_window_bump_and_icl(tmp_path):
    run = write_run(tmp_path / "run")
    d = training_dynamics(run)
    assert d.induction_key == "induction_scores_50"
    start, end = d.formation_window
    assert end >= 20_000 > start and end / start < 1.3**2 * 1.01
    assert start <= d.bump <= end * 1.3
    assert d.icl_before == pytest.approx(-0.1) and d.icl_after == pytest.approx(-0.45)
    assert d.best_induction[-1][1] == pytest.approx(0.8)
    assert len(d.checkpoints) == 1
    assert "induction heads formed" in d.markdown() and "L1H1 0.80" in d.markdown()
    fig = plot_training_dynamics(d)
    fig.savefig(tmp_path / "d.png")
    assert (tmp_path / "d.png").stat().st_size > 5000


@pytest.mark.parametrize("settings, expect", [
    (dict(data="synthetic:repeat"), ("train (synthetic:repeat)", "validation (synthetic:repeat)")),
    (dict(data="stdlib", repeat_fraction=0.5), ("train (text + synthetic repeats)", "validation (text)")),
    (dict(data="stdlib", repeat_fraction=0.0), ("train (text)", "validation (text)")),
    (None, ("train", "validation")),
])
def test_loss_legend_comes_from_the_runs_own_config(tmp_path, settings, expect):
    import matplotlib.pyplot as plt

    from models.training.loop import TrainConfig

    run = write_run(tmp_path / "run")
    if settings is not None:
        (run / "train_config.json").write_text(TrainConfig(**settings).to_json())
    fig = plot_training_dynamics(training_dynamics(run))
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    plt.close(fig)
    assert legend == list(expect)


def test_no_phase_change(tmp_path):
    run = tmp_path / "flat"
    run.mkdir()
    recs = [{"step": i, "tokens": 100 * i, "val_loss": 5 - 0.01 * i, "icl_score": -0.05,
             "induction_scores_50": [[0.1]]} for i in range(5)]
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in recs))
    d = training_dynamics(run)
    assert d.formation_window is None and d.icl_before == pytest.approx(-0.05)
    assert f"no head reached {FORMED:.1f}" in d.markdown()
    plot_training_dynamics(d)


def test_missing_metrics(tmp_path):
    with pytest.raises(FileNotFoundError, match="metrics.jsonl"):
        training_dynamics(tmp_path)


def test_zoo_attn_only_2l_forms_induction_heads():
    from models.io.checkpoint import ZOO_DIR

    d = training_dynamics(ZOO_DIR / "attn-only-2l")
    assert d.formation_window is not None, str(d)
    assert d.icl_after < d.icl_before


def test_checkpoint_scores(tmp_path):
    import torch

    from analyses.dynamics import checkpoint_scores
    from circuits.testing import build_induction_model

    run = write_run(tmp_path / "run", n=3, torn=False)
    (run / "checkpoints" / "step-000010").rmdir()
    for step, gain in ((0, 0.0), (2, 10.0)):  # the "trained" checkpoint has the induction head switched on
        m, _ = build_induction_model(d_vocab=24, n_ctx=48, copy_gain=gain, dtype="float32")
        if not gain:
            with torch.no_grad():
                m.blocks[1].attn.W_Q.zero_()
        m.save(run / "checkpoints" / f"step-{step:06d}")
    from circuits.testing import induction_tokens

    w = induction_tokens(24, 23, batch=4)[:, :48]
    cs = checkpoint_scores(run, w, early=3, late=40)
    assert cs.steps == [0, 2] and cs.tokens == [0, 1690]
    assert cs.best_induction[0] < 0.1 < 0.8 < cs.best_induction[1]
    assert cs.icl[1] < cs.icl[0]
    assert "best induction score" in cs.markdown()

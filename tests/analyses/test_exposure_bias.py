"""The exposure-bias measures on hand-built oracles whose errors are known by construction (always right from the
source alone; the previous symbol plus the aligned source symbol, which carries any wrong input forward; the same with
one planted mistake), against the true and the prefix-consistent target; the prefix-consistent targets of every task
against a hand-written loop; the statistics against published t-table values, hand formulas and a simulation; the
stopping rule of a tiny training run; and the figures through the whole pipeline at small scale."""

from __future__ import annotations

import math

import matplotlib
import pytest
import torch

from analyses import exposure_bias as eb
from analyses import exposure_bias_experiment as ex
from analyses.exposure_bias_plots import plot_injected, plot_per_position
from analyses.figure_checks import figure_problems
from models import EncoderDecoderConfig
from models.data.seq2seq import ANY_SYMBOL, BOS, EOS, NO_TARGET, PAD, TASKS, Seq2SeqBatches, make_task
from models.training.config import TrainConfig

matplotlib.use("Agg")
K, FIRST = 5, 3


def split(n=64, lo=3, hi=6, seed=0, task="cumsum"):
    b = Seq2SeqBatches(make_task(f"seq2seq:{task}", K, lo, hi), hi, hi + 2)
    return b.split(b.val_batch(n, seed=seed))


def consistent_by_loop(task_name, src, read, gold):
    """The rule of each task written out per row and position, in plain Python ints."""
    out = []
    for s_row, r_row, g_row in zip(src.tolist(), read.tolist(), gold.tolist()):
        row = []
        for j, (r, g) in enumerate(zip(r_row, g_row)):
            if task_name not in ("cumsum", "walk"):
                row.append(g)  # the target never reads earlier target symbols
                continue
            x = s_row[j] if j < len(s_row) else PAD
            if j == 0 and r == BOS and task_name == "walk":
                row.append(ANY_SYMBOL)  # any start is the rule's
            elif x < FIRST or not ((j == 0 and r == BOS) or (j > 0 and r >= FIRST)):
                row.append(NO_TARGET)
            else:
                prev = 0 if j == 0 else r - FIRST
                row.append((prev + x - FIRST) % K + FIRST)
        out.append(row)
    return torch.tensor(out)


@pytest.mark.parametrize("name", sorted(TASKS))
def test_consistent_targets_equal_a_hand_loop(name):
    """True prefixes, random prefixes (symbols, and now and then BOS / EOS / PAD in the middle)."""
    if name == "date":
        b = Seq2SeqBatches(make_task("seq2seq:date"), 12, 12)
    else:
        b = Seq2SeqBatches(make_task(f"seq2seq:{name}", K, 1, 5), 5, 7)
    src, tgt, _, _ = b.split(b.val_batch(40, seed=3))
    gold, _ = eb.symbols_of(tgt)
    n = gold.shape[1]
    g = torch.Generator().manual_seed(0)
    random_read = torch.randint(FIRST, FIRST + K, (len(src), n), generator=g)
    random_read[:, 0] = BOS
    odd = torch.rand(random_read.shape, generator=g) < 0.1
    random_read = torch.where(odd, torch.randint(0, FIRST, random_read.shape, generator=g), random_read)
    for read in (tgt[:, :n], random_read):
        got = b.task.consistent_targets(src, read, gold)
        assert torch.equal(got, consistent_by_loop(name, src, read, gold))
    if name in ("cumsum", "walk"):  # from the true prefix the rule gives the true target (walk: but its free start)
        got = b.task.consistent_targets(src, tgt[:, :n], gold)
        _, valid = eb.symbols_of(tgt)
        keep = valid.clone()
        keep[:, 0] &= name != "walk"
        assert torch.equal(got[keep], gold[keep])


def one_hot(ids):
    return torch.nn.functional.one_hot(ids, K + FIRST).float()


class Perfect:
    """Reads only the source: the running sum of its first t + 1 symbols at decoder position t, EOS after them."""

    def __call__(self, src, tgt, src_mask, tgt_mask=None):
        sums = (src - FIRST).clamp(min=0).cumsum(1) % K + FIRST
        length = src_mask.sum(1, keepdim=True)
        t = torch.arange(tgt.shape[1])[None]
        ids = torch.where(t < length, sums.gather(1, t.clamp(max=src.shape[1] - 1).expand(len(src), -1)),
                          torch.where(t == length, EOS, PAD))
        return one_hot(ids)


class PreviousPlusSource:
    """y_t = (its own input at t, BOS read as 0) + x_t mod K, plus `plant` at target position `at`: right from true
    prefixes (unless planted), and it carries any wrong input forward."""

    def __init__(self, at=None, plant=1):
        self.at, self.plant = at, plant

    def __call__(self, src, tgt, src_mask, tgt_mask=None):
        prev = torch.where(tgt >= FIRST, tgt - FIRST, 0)
        t = torch.arange(tgt.shape[1])[None]
        x = src.gather(1, t.clamp(max=src.shape[1] - 1).expand(len(src), -1)) - FIRST
        value = (prev + x + (self.plant * (t == self.at) if self.at is not None else 0)) % K
        length = src_mask.sum(1, keepdim=True)
        return one_hot(torch.where(t < length, value + FIRST, torch.where(t == length, EOS, PAD)))


def test_perfect_oracle_makes_no_error_and_propagates_none():
    s = split()
    gen = torch.Generator().manual_seed(0)
    for errors, valid in (eb.gold_prefix_errors(Perfect(), *s), eb.free_running_errors(Perfect(), *s)):
        assert valid.sum() > 0 and not errors.any()
    for k in range(4):
        for free in (False, True):
            e, b, v = eb.injected_errors(Perfect(), *s, k, K, gen, free=free)
            assert v.sum() > 0 and not e.any() and not b.any()


def test_a_model_that_ignores_its_prefix_is_wrong_for_the_prefix_it_read_just_after_a_wrong_symbol():
    """Perfect reads the source alone: against the prefix-consistent target it misses the one symbol after the wrong
    one (the rule continues from the wrong symbol), then reads its own right symbols and is consistent again."""
    s = split()
    task, gen = make_task("seq2seq:cumsum", K, 3, 6), torch.Generator().manual_seed(0)
    for errors, valid in (eb.gold_prefix_errors(Perfect(), *s, task=task), eb.free_running_errors(Perfect(), *s,
                                                                                                    task=task)):
        assert valid.sum() > 0 and not errors.any()
    for k in range(4):
        for free in (False, True):
            e, b, v = eb.injected_errors(Perfect(), *s, k, K, gen, free=free, task=task)
            assert not b.any() and e[:, k + 1][v[:, k + 1]].all() and not e[:, k + 2:].any()


def test_previous_plus_source_carries_an_injected_error_forward():
    s = split()
    oracle, gen = PreviousPlusSource(), torch.Generator().manual_seed(0)
    task = make_task("seq2seq:cumsum", K, 3, 6)
    assert not eb.gold_prefix_errors(oracle, *s)[0].any() and not eb.free_running_errors(oracle, *s)[0].any()
    for k in range(4):
        e, b, v = eb.injected_errors(oracle, *s, k, K, gen, free=False)  # later inputs true: only k + 1 is wrong
        assert not b.any() and e[:, k + 1][v[:, k + 1]].all() and not e[:, k + 2:].any()
        e, b, v = eb.injected_errors(oracle, *s, k, K, gen, free=True)  # its own continuation: all later wrong
        assert not b.any() and e[v].all() and not e[~v].any()
        assert v[:, : k + 1].sum() == 0 and v.sum() > 0
        for free in (False, True):  # against what it read, it never errs: the rule is what it computes
            e, b, v = eb.injected_errors(oracle, *s, k, K, gen, free=free, task=task)
            assert v.sum() > 0 and not e.any() and not b.any()


def test_one_planted_mistake_compounds_only_when_free_running():
    s = split(lo=4, hi=6)
    at, task = 1, make_task("seq2seq:cumsum", K, 4, 6)
    gold_e, valid = eb.gold_prefix_errors(PreviousPlusSource(at), *s)
    free_e, _ = eb.free_running_errors(PreviousPlusSource(at), *s)
    expected_gold = torch.zeros(valid.shape[1]).index_fill(0, torch.tensor([at]), 1.0)
    assert torch.equal(eb.rate(gold_e, valid), expected_gold)
    assert torch.equal(eb.rate(free_e, valid), (torch.arange(valid.shape[1]) >= at).float())
    assert float(eb.rate(free_e, valid, None)) > float(eb.rate(gold_e, valid, None))
    # against the prefix-consistent target free running errs exactly where teacher forcing does: no exposure bias
    tf_c = eb.gold_prefix_errors(PreviousPlusSource(at), *s, task=task)[0]
    free_c = eb.free_running_errors(PreviousPlusSource(at), *s, task=task)[0]
    assert torch.equal(tf_c, gold_e) and torch.equal(free_c, gold_e)


def test_walk_needs_the_models_own_symbols():
    """walk's start is not in the source: its target from true prefixes is the previous symbol plus the source symbol,
    and a model that reads its own previous symbol is right against the prefix-consistent target in every mode
    (whatever start it picks), while against the true target it is wrong wherever its start differs."""
    b = Seq2SeqBatches(make_task("seq2seq:walk", K, 3, 6), 6, 8)
    rows = b.val_batch(400, seed=0)
    src, tgt, src_mask, tgt_mask = b.split(rows)
    gold, valid = eb.symbols_of(tgt)
    starts = torch.bincount((gold[:, 0] - FIRST - (src[:, 0] - FIRST)) % K, minlength=K).float() / len(src)
    assert (starts - 1 / K).abs().max() < 0.06  # every start, about equally often
    steps = (gold[:, 1:] - gold[:, :-1] - (src[:, 1 : gold.shape[1]] - FIRST)) % K
    assert (steps[valid[:, 1:]] == 0).all()
    assert (b.task.target(src[0, : int(src_mask[0].sum())].numpy(), 0) ==
            make_task("seq2seq:cumsum", K, 3, 6).target(src[0, : int(src_mask[0].sum())].numpy())).all()
    s, oracle, gen = (src, tgt, src_mask, tgt_mask), PreviousPlusSource(), torch.Generator().manual_seed(0)
    for errors, v in (eb.gold_prefix_errors(oracle, *s, task=b.task), eb.free_running_errors(oracle, *s,
                                                                                           task=b.task)):
        assert v.sum() > 0 and not errors.any()
    for k in range(3):
        for free in (False, True):
            e, base, v = eb.injected_errors(oracle, *s, k, K, gen, free=free, task=b.task)
            assert v.sum() > 0 and not e.any() and not base.any()
    free_gold = eb.free_running_errors(oracle, *s)[0]
    assert 0.7 < float(eb.rate(free_gold, valid, None)) < 1.0


def test_compounded_by_hand():
    assert eb.compounded([0.1, 0.2, 0.0]).tolist() == pytest.approx([0.1, 0.28, 0.28])


def test_wrong_tokens_are_other_symbols_uniformly():
    gold = torch.full((20000,), FIRST + 2)
    w = eb.wrong_tokens(gold, K, torch.Generator().manual_seed(1))
    assert ((w >= FIRST) & (w < FIRST + K) & (w != gold)).all()
    counts = torch.bincount(w - FIRST, minlength=K).float() / len(w)
    assert counts[2] == 0 and (counts[[0, 1, 3, 4]] - 0.25).abs().max() < 0.015


def test_intervals_and_power_by_hand():
    m, lo, hi = eb.mean_interval([1.0, 2.0, 3.0])  # s = 1, n = 3: half width t_{0.975,2} / √3 = 4.303 / √3
    assert m == 2.0 and hi - m == pytest.approx(4.3027 / math.sqrt(3), abs=1e-3) and m - lo == pytest.approx(hi - m)
    a, b = [1.0, 2.0, 3.0, 4.0], [0.0, 0.0, 1.0, 1.0]  # variances 5/3 and 1/3, n 4 each
    d, lo, hi = eb.welch_difference(a, b)
    se = math.sqrt((5 / 3 + 1 / 3) / 4)
    df = se**4 / ((5 / 12) ** 2 / 3 + (1 / 12) ** 2 / 3)
    assert d == 2.0 and hi - d == pytest.approx(eb.t_quantile(0.975, df) * se, rel=1e-9)
    assert eb.detectable_difference(a, b) == pytest.approx((eb.t_quantile(0.975, df) + eb.t_quantile(0.8, df)) * se)
    # many seeds: the normal-theory value (1.960 + 0.8416) · σ · √(2/n)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(4000, generator=g, dtype=torch.float64), torch.randn(4000, generator=g, dtype=torch.float64)
    sd = math.sqrt((float(x.var()) + float(y.var())) / 2)
    assert eb.detectable_difference(x, y) == pytest.approx(2.8016 * sd * math.sqrt(2 / 4000), rel=2e-3)


def test_prediction_interval_by_hand_and_the_chance_of_falling_outside_the_means_interval_by_simulation():
    m, lo, hi = eb.prediction_interval([1.0, 2.0, 3.0])  # s = 1, n = 3: t_{0.975,2} · √(1 + 1/3)
    assert m == 2.0 and hi - m == pytest.approx(4.3027 * math.sqrt(4 / 3), abs=1e-3)
    g = torch.Generator().manual_seed(0)
    for n in (3, 5, 8):
        x = torch.randn(200_000, n + 1, generator=g, dtype=torch.float64)
        mean, sd = x[:, :n].mean(1), x[:, :n].std(1)
        half = eb.t_quantile(0.975, n - 1) * sd / math.sqrt(n)
        outside = ((x[:, n] - mean).abs() > half).double().mean()
        assert eb.outside_mean_interval_chance(n) == pytest.approx(float(outside), abs=0.005)
        outside_pi = ((x[:, n] - mean).abs() > half * math.sqrt(n + 1)).double().mean()
        assert float(outside_pi) == pytest.approx(0.05, abs=0.003)


def tiny_model_and_config(steps):
    cfg = EncoderDecoderConfig(d_model=16, n_heads=2, d_mlp=32, n_encoder_layers=1, n_decoder_layers=1,
                               d_vocab_src=K + 3, d_vocab_tgt=K + 3, n_ctx_src=4, n_ctx_tgt=6, init_range=0.1, seed=0)
    tc = TrainConfig(data="seq2seq:cumsum", task_symbols=K, task_min_len=2, task_max_len=4, steps=steps,
                     batch_size=16, lr=3e-3, warmup_steps=2, val_sequences=4, exact_match_sequences=1,
                     eval_every=1000, log_every=1000, num_threads=1, progress=False)
    return cfg, tc


def test_training_stops_at_the_first_step_over_the_threshold():
    cfg, tc = tiny_model_and_config(40)
    b = Seq2SeqBatches(make_task("seq2seq:cumsum", K, 2, 4), 4, 6)
    stop = b.split(b.val_batch(64, seed=2))
    model, steps, history = eb.train_to_accuracy(cfg, tc, stop, 0.24)
    assert steps == len(history) < 40 and history[-1] >= 0.24 and max(history[:-1]) < 0.24
    assert eb.teacher_forced_accuracy(model, *stop) == history[-1] and not model.training
    _, steps, history = eb.train_to_accuracy(cfg, tiny_model_and_config(3)[1], stop, 1.01)  # never reached
    assert steps == len(history) == 3


def test_experiment_summary_and_figures_at_small_scale(tmp_path):
    """Oracles stand in for trained seeds (seeds 0–2 main, 3 held out): the summary's intervals against both targets,
    the held-out check, and the figures' text and labels."""
    s = split(n=48, lo=4, hi=6)
    task = make_task("seq2seq:cumsum", K, 4, 6)
    runs = []
    for seed in range(4):
        for name, oracle in (("teacher forcing", PreviousPlusSource(at=seed % 2 + 1)), ("linear", Perfect())):
            r = ex.measure(oracle, s, seed=seed if seed < 3 else 1, n_symbols=K, task=task)  # seed 3 repeats 1
            if name == "teacher forcing":  # wrong only at the planted position from true prefixes
                assert r["base_next_gold_by_k"] == [float(k + 1 == seed % 2 + 1) for k in range(5)]
            runs.append(dict(r, task="cumsum", schedule=name, seed=seed, steps=10, reached=True,
                             stop_accuracy=0.94 + 0.001 * (seed if seed < 3 else 1),
                             history_tail=[0.9, 0.95, 0.93, 0.94],
                             measured_teacher_forced_accuracy=1 - r["tf_gold"]))
    result = {"setup": {}, **ex.summarise(runs, n_seeds=3)}
    cum = result["tasks"]["cumsum"]
    lin, tf = cum["schedules"]["linear"], cum["schedules"]["teacher forcing"]
    assert lin["seeds"] == [0, 1, 2] and lin["held_out_seeds"] == [3]
    assert lin["free_gold"] == (0.0, 0.0, 0.0) and lin["after1_gold"] == (0.0, 0.0, 0.0)
    # the source-only oracle: wrong for what it read right after a wrong symbol, consistent after that
    assert lin["after1_consistent"] == (1.0, 1.0, 1.0) and lin["later_consistent"] == (0.0, 0.0, 0.0)
    assert tf["next_gold"][0] > 0.9  # not 1: where the planted +1 cancels the wrong input
    assert tf["gap_gold"][0] > 0 and tf["gap_gold"][1] < tf["gap_gold"][0] < tf["gap_gold"][2]
    assert tf["gap_consistent"] == (0.0, 0.0, 0.0) and tf["later_excess_consistent"] == (0.0, 0.0, 0.0)
    assert tf["overshoot"][0] == pytest.approx(0.941 - 0.93) and tf["all_seeds"]["overshoot"][0] == pytest.approx(0.011)
    # the planted oracle carries its one error to the end: free running equals the compounded true-prefix error
    compounded = [t[0] for t in tf["compounded_by_position"]]
    assert compounded == pytest.approx([t[0] for t in tf["free_gold_by_position"]])
    diff = cum["versus_teacher_forcing"]["linear"]["next_gold"]
    assert diff["difference"][0] == pytest.approx(-tf["next_gold"][0])
    # seed 3 repeats seed 1, and one of n = 3 values lies within 1.15 s of their mean, inside both intervals
    for entry in (tf, lin):
        for part in ("scalars", "per_position"):
            check = entry["held_out_check"][part]
            assert check["values"] > 0 and check["outside_mean_interval"] == check["outside_prediction_interval"] == 0
    assert cum["held_out_total"]["scalars"]["values"] == 2 * len(ex.CHECKED)
    md = ex.results_markdown(result)
    assert "| seeds (reached the stop) | 3 (3) | 3 (3) |" in md and _fmt(tf["tf_gold"]) in md
    for plot in (plot_per_position, plot_injected):
        fig = plot(result, "cumsum")
        assert figure_problems(fig) == []
        legends = fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
        texts = [t.get_text() for leg in legends for t in leg.get_texts()] + [ax.get_title() for ax in fig.axes]
        assert any("teacher forcing (3 seeds)" in t for t in texts)
        fig.savefig(tmp_path / "f.png")


def _fmt(t) -> str:
    return "{:.3f} [{:.3f}, {:.3f}]".format(*t)


def _signed(t) -> str:
    return "{:+.3f} [{:+.3f}, {:+.3f}]".format(*t)


def quoted_numbers(result: dict) -> dict[str, list[str]]:
    """Every number README's notebook-05 row and the notebook's conclusions quote, formatted from results.json."""
    cum, walk = result["tasks"]["cumsum"], result["tasks"]["walk"]
    tf, wtf = cum["schedules"]["teacher forcing"], walk["schedules"]["teacher forcing"]
    vs = cum["versus_teacher_forcing"]  # the schedules with at least 2 seeds
    ss = [cum["schedules"][name] for name in vs]
    held, expected = cum["held_out_total"]["scalars"], cum["held_out_expected"]
    det = [v["gap_consistent"]["detectable_at_80_power"] for v in vs.values()]
    both = [_fmt(tf["tf_gold"]), _fmt(tf["free_gold"]), f"{tf['next_gold'][0]:.3f}", _fmt(tf["free_consistent"]),
            _fmt(tf["tf_consistent"]), _signed(tf["gap_consistent"]), _signed(tf["after1_excess_consistent"]),
            _signed(tf["later_excess_consistent"]), _signed(wtf["gap_consistent"]),
            f"{held['outside_mean_interval']} of {held['values']}",
            f"{held['outside_prediction_interval']} of {held['values']}",
            f"{expected['outside_mean_interval']:.2f}", f"±{max(det):.3f}",
            f"{min(e['overshoot'][0] for e in cum['schedules'].values()):.3f}–"
            f"{max(e['overshoot'][0] for e in cum['schedules'].values()):.3f}"]
    notebook = [_fmt(tf["after1_consistent"]), _fmt(tf["base_after1_consistent"]), _fmt(wtf["tf_consistent"]),
                _fmt(wtf["free_consistent"]), _signed(wtf["after1_excess_consistent"]),
                _signed(wtf["later_excess_consistent"]), f"{tf['base_next_gold'][0]:.3f}",
                *(_signed(e["after1_excess_consistent"]) for e in ss), _fmt(tf["jitter"]),
                _signed(tf["all_seeds"]["after1_excess_consistent"]),
                "{outside_prediction_interval} of {values}".format(**cum["held_out_total"]["per_position"])]
    ss_after1 = [_signed(e["after1_excess_consistent"]) for e in ss]
    return {"readme": both + ss_after1, "notebook": both + notebook}


def test_quoted_numbers_match_the_committed_results():
    """README's notebook-05 row, the notebook's text and docs/exposure_bias/results.md quote results.json."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    result = json.loads((root / "docs" / "exposure_bias" / "results.json").read_text())
    assert (root / "docs" / "exposure_bias" / "results.md").read_text().endswith(ex.results_markdown(result))
    readme = next(line for line in (root / "README.md").read_text().splitlines() if "05_encoder_decoder" in line)
    notebook = (root / "notebooks" / "src" / "05_encoder_decoder.py").read_text()
    notebook = " ".join(line.lstrip("# ") for line in notebook.splitlines())  # a quote may wrap across lines
    quoted = quoted_numbers(result)
    for q in quoted["readme"]:
        assert q in readme, q
    for q in quoted["notebook"]:
        assert q in notebook, q
    assert "**Exposure bias is there" not in notebook  # the claim the gold-target numbers had been read as

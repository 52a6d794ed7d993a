"""The exposure-bias experiment of notebook 05: teacher forcing against each scheduled-sampling schedule on
`seq2seq:cumsum` (the running sum mod 10, y_j = y_{j−1} + x_j) and `seq2seq:walk` (the same from a random start the
source does not hold), sources of 4–8 symbols, several seeds each; every run stops after the first step at which its
teacher-forced per-symbol accuracy on 500 held-out sources reaches `THRESHOLD`; then the measures of
`analyses.exposure_bias` on 2,000 other held-out rows against the true and the prefix-consistent target, their means
with 95 % Student-t intervals over the main seeds, the held-out seeds checked against them, the differences to
teacher forcing with Welch intervals and the smallest difference detectable at 80 % power.

    python -m analyses.exposure_bias_experiment --out docs/exposure_bias [--seeds 5] [--held-out-seeds 3]

writes one JSON per run under OUT/runs/ (a run already there is not trained again; processes given disjoint seeds
with --first-seed share OUT), then OUT/results.json, OUT/results.md and the figures (`FIGURES`,
`analyses.exposure_bias_plots`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from models import EncoderDecoderConfig
from models.data.seq2seq import Seq2SeqBatches, make_task
from models.files.atomic import atomic_write_json
from models.training.config import TrainConfig

from . import exposure_bias as eb
from .train_metrics import hardware

N_SYMBOLS, MIN_LEN, MAX_LEN = 10, 4, 8
THRESHOLD = 0.93
STOP_ROWS, MEASURE_ROWS = 500, 2000
TASK_NAMES = ("cumsum", "walk")
TARGETS = ("gold", "consistent")  # the true target; the prefix-consistent one (analyses.exposure_bias.errors)
HISTORY_TAIL = 20  # the last accuracies of the stopping rule kept per run (its step-to-step jitter)
# scheduled sampling: own-prediction probability 0.5 · (1 − ε_i); each ε_i is below 0.02 by about step 400, where
# teacher forcing first reaches THRESHOLD (models.training.tasks.sampling_probability)
SCHEDULES = {"teacher forcing": ("none", None), "linear": ("linear", 400.0), "exponential": ("exponential", 0.99),
             "inverse sigmoid": ("inverse_sigmoid", 40.0)}
SAMPLING_MAX = 0.5


def model_config(seed: int) -> EncoderDecoderConfig:
    """One encoder and one decoder layer, 2 heads, d_model 32, an MLP of 64 (the modular sum needs a nonlinearity)."""
    return EncoderDecoderConfig(d_model=32, n_heads=2, d_mlp=64, n_encoder_layers=1, n_decoder_layers=1,
                                d_vocab_src=N_SYMBOLS + 3, d_vocab_tgt=N_SYMBOLS + 3, n_ctx_src=MAX_LEN,
                                n_ctx_tgt=MAX_LEN + 2, positional_embedding_type="standard", init_range=0.1,
                                seed=seed)


def train_config(schedule: str, seed: int, steps: int = 2000, task: str = "cumsum") -> TrainConfig:
    kind, k = SCHEDULES[schedule]
    return TrainConfig(data=f"seq2seq:{task}", task_symbols=N_SYMBOLS, task_min_len=MIN_LEN, task_max_len=MAX_LEN,
                       steps=steps, batch_size=64, lr=1e-3, warmup_steps=50, seed=seed, eval_every=10**6,
                       log_every=10**6, val_sequences=8, exact_match_sequences=1, num_threads=1,
                       sampling_schedule=kind, sampling_k=k, sampling_max=SAMPLING_MAX)


def batches(task: str = "cumsum") -> Seq2SeqBatches:
    return Seq2SeqBatches(make_task(f"seq2seq:{task}", N_SYMBOLS, MIN_LEN, MAX_LEN), MAX_LEN, MAX_LEN + 2)


def splits(task: str = "cumsum") -> tuple[tuple, tuple]:
    """(rows the stopping rule reads, rows measured): two draws from the held-out split."""
    b = batches(task)
    return b.split(b.val_batch(STOP_ROWS, seed=2)), b.split(b.val_batch(MEASURE_ROWS, seed=1))


def _list(t: torch.Tensor) -> list:
    return [None if v != v else round(float(v), 6) for v in t]


def measure(model, split, seed: int = 0, n_symbols: int = N_SYMBOLS, task=None) -> dict:
    """Every measure of one trained model on `split`, against the true target (`gold_*`) and, for a `task`
    (`models.data.seq2seq.Task`; default cumsum's), the prefix-consistent one (`consistent_*`): per position j from
    true prefixes (`tf_*`) and free running (`free_*`); per injection position k the next symbol's error after one
    wrong input symbol, the later inputs true (`next_*_by_k`, beside `base_next_*_by_k`); and the model's own greedy
    continuation after it by distance d = j − k (`after_*_by_offset`, beside `base_after_*_by_offset`, the same
    positions continued from the true prefix). Pooled rates over positions: `tf_*`, `free_*`, `next_*`, `after1_*`
    (d = 1), `later_*` (d ≥ 2) and their bases."""
    task = task if task is not None else batches().task
    src, tgt = split[0], split[1]
    _, valid = eb.symbols_of(tgt)
    n = valid.shape[1]
    decoded = {"tf": eb.teacher_forced(model, *split), "free": eb.free_running(model, *split)}
    out = {}
    for t, tk in zip(TARGETS, (None, task)):
        for way, d in decoded.items():
            e = eb.errors(d, src, tgt, tk) & valid
            out[f"{way}_{t}_by_position"] = _list(eb.rate(e, valid))
            out[f"{way}_{t}"] = float(eb.rate(e, valid, None))
    counts = {f"{name}_{t}": torch.zeros(2, n - 1, dtype=torch.int64)  # [errors, rows] by k or by offset d − 1
              for name in ("next", "base_next", "after", "base_after") for t in TARGETS}
    gen = torch.Generator().manual_seed(seed)
    offsets = torch.arange(n)
    for k in range(n - 1):
        wrong, base, v = eb.injected(model, *split, k, n_symbols, gen, free=False)
        for t, tk in zip(TARGETS, (None, task)):
            for name, d in (("next", wrong), ("base_next", base)):
                e = eb.errors(d, src, tgt, tk)[:, k + 1] & v[:, k + 1]
                counts[f"{name}_{t}"][:, k] += torch.stack([e.sum(), v[:, k + 1].sum()])
        wrong, base, v = eb.injected(model, *split, k, n_symbols, gen, free=True)
        at = offsets[k + 1 :] - k - 1  # offset d − 1 of positions k + 1 .. n − 1
        for t, tk in zip(TARGETS, (None, task)):
            for name, d in (("after", wrong), ("base_after", base)):
                e = (eb.errors(d, src, tgt, tk) & v)[:, k + 1 :]
                counts[f"{name}_{t}"][0, at] += e.sum(0)
                counts[f"{name}_{t}"][1, at] += v[:, k + 1 :].sum(0)
    for name, c in counts.items():
        by = "by_k" if "next" in name else "by_offset"
        out[f"{name}_{by}"] = _list(c[0] / c[1])
        if "next" in name:
            out[name] = float(c[0].sum() / c[1].sum())
        else:
            pre = name.replace("after", "{}")
            out[pre.format("after1")] = float(c[0, 0] / c[1, 0])
            out[pre.format("later")] = float(c[0, 1:].sum() / c[1, 1:].sum())
    return out


def run_one(schedule: str, seed: int, steps: int = 2000, task: str = "cumsum") -> dict:
    stop, measured = splits(task)
    the_task = batches(task).task
    model, trained, history = eb.train_to_accuracy(model_config(seed), train_config(schedule, seed, steps, task),
                                                   stop, THRESHOLD, task=the_task)
    return {"task": task, "schedule": schedule, "seed": seed, "steps": trained, "budget": steps,
            "reached": bool(history and history[-1] >= THRESHOLD),
            "stop_accuracy": history[-1] if history else None, "history_tail": history[-HISTORY_TAIL:],
            "measured_teacher_forced_accuracy": eb.teacher_forced_accuracy(model, *measured, task=the_task),
            **measure(model, measured, seed, task=the_task)}


BASE_SCALARS = ("tf", "free", "next", "base_next", "after1", "base_after1", "later", "base_later")
DERIVED = {"gap": ("free", "tf"), "next_excess": ("next", "base_next"), "after1_excess": ("after1", "base_after1"),
           "later_excess": ("later", "base_later")}
SCALARS = ("measured_teacher_forced_accuracy", "overshoot", "steps",
           *(f"{m}_{t}" for t in TARGETS for m in (*BASE_SCALARS, *DERIVED)))
PER_POSITION = tuple(f"{m}_{t}_{by}" for t in TARGETS for m, by in (
    ("tf", "by_position"), ("free", "by_position"), ("next", "by_k"), ("base_next", "by_k"), ("after", "by_offset"),
    ("base_after", "by_offset")))
# the values the held-out seeds are checked on: every quoted scalar except the derived ones
CHECKED = ("measured_teacher_forced_accuracy", *(f"{m}_{t}" for t in TARGETS for m in BASE_SCALARS))


def _scalars(r: dict) -> dict:
    """A run's record with its derived scalars: the stopping rule's overshoot (the accuracy it stopped at minus
    `THRESHOLD`) and each measure minus its base."""
    out = dict(r, overshoot=r["stop_accuracy"] - THRESHOLD)
    for t in TARGETS:
        for name, (a, b) in DERIVED.items():
            out[f"{name}_{t}"] = r[f"{a}_{t}"] - r[f"{b}_{t}"]
    return out


def _jitter(r: dict) -> float:
    """The standard deviation of the stopping rule's accuracy from one step to the next over the run's last steps."""
    h = torch.tensor(r["history_tail"], dtype=torch.float64)
    return float(h.diff().std()) if len(h) > 2 else float("nan")


def _held_out_check(main: list[dict], extra: list[dict]) -> dict:
    """How many of the held-out seeds' values (`CHECKED` scalars, and every per-position value) fall outside the main
    seeds' 95 % interval of the mean, and outside their 95 % prediction interval (`eb.prediction_interval`)."""
    counts = {"values": 0, "outside_mean_interval": 0, "outside_prediction_interval": 0}
    per = dict(counts, values=0)
    for r in extra:
        for key in CHECKED:
            _, lo, hi = eb.mean_interval([m[key] for m in main])
            _, plo, phi = eb.prediction_interval([m[key] for m in main])
            counts["values"] += 1
            counts["outside_mean_interval"] += int(not lo <= r[key] <= hi)
            counts["outside_prediction_interval"] += int(not plo <= r[key] <= phi)
        for key in PER_POSITION:
            for j, v in enumerate(r[key]):
                col = [m[key][j] for m in main if m[key][j] is not None]
                if v is None or len(col) < 2:
                    continue
                _, lo, hi = eb.mean_interval(col)
                _, plo, phi = eb.prediction_interval(col)
                per["values"] += 1
                per["outside_mean_interval"] += int(not lo <= v <= hi)
                per["outside_prediction_interval"] += int(not plo <= v <= phi)
    return {"scalars": counts, "per_position": per}


def _entry(rs: list[dict], extra: list[dict]) -> dict:
    entry = {"seeds": [r["seed"] for r in rs], "held_out_seeds": [r["seed"] for r in extra],
             "steps_list": [r["steps"] for r in rs], "reached": sum(r["reached"] for r in rs),
             "stop_accuracy": [r["stop_accuracy"] for r in rs],
             "jitter": eb.mean_interval([_jitter(r) for r in rs + extra])}
    for key in SCALARS:
        entry[key] = eb.mean_interval([r[key] for r in rs])
    for key in PER_POSITION:
        entry[key] = [eb.mean_interval([r[key][j] for r in rs if r[key][j] is not None])
                      for j in range(len(rs[0][key]))]
    comp = [eb.compounded(r["tf_gold_by_position"]).tolist() for r in rs]
    entry["compounded_by_position"] = [eb.mean_interval([c[j] for c in comp]) for j in range(len(comp[0]))]
    entry["all_seeds"] = {key: eb.mean_interval([r[key] for r in rs + extra]) for key in SCALARS}
    entry["held_out_check"] = _held_out_check(rs, extra) if extra else None
    return entry


def summarise(runs: list[dict], n_seeds: int = 5) -> dict:
    """Per task and schedule, over seeds 0 .. `n_seeds` − 1: means with 95 % t-intervals (scalars and per position);
    the later seeds (held out) checked against them (`_held_out_check`) and pooled with them in `all_seeds`; and
    each scheduled-sampling schedule minus teacher forcing: Welch 95 % interval and the smallest difference
    detectable at 80 % power, from the main seeds and from all seeds."""
    out = {}
    for task in TASK_NAMES:
        mine = [_scalars(r) for r in runs if r.get("task", "cumsum") == task]
        by = {s: [r for r in mine if r["schedule"] == s] for s in SCHEDULES}
        by = {s: rs for s, rs in by.items() if any(r["seed"] < n_seeds for r in rs)}
        if not by:
            continue
        split = {s: ([r for r in rs if r["seed"] < n_seeds], [r for r in rs if r["seed"] >= n_seeds])
                 for s, rs in by.items()}
        entry = {"schedules": {s: _entry(*split[s]) for s in by}, "versus_teacher_forcing": {}}
        tf, tf_extra = split.get("teacher forcing", ([], []))
        for s, (rs, extra) in split.items():
            if s == "teacher forcing" or len(tf) < 2 or len(rs) < 2:
                continue
            entry["versus_teacher_forcing"][s] = {
                key: {"difference": eb.welch_difference([r[key] for r in rs], [r[key] for r in tf]),
                      "detectable_at_80_power": eb.detectable_difference([r[key] for r in rs], [r[key] for r in tf]),
                      "detectable_all_seeds": eb.detectable_difference([r[key] for r in rs + extra],
                                                                       [r[key] for r in tf + tf_extra])}
                for key in SCALARS}
        checks = [e["held_out_check"] for e in entry["schedules"].values() if e["held_out_check"]]
        if checks:
            entry["held_out_total"] = {
                part: {k: sum(c[part][k] for c in checks) for k in checks[0][part]} for part in checks[0]}
            entry["held_out_expected"] = {"outside_mean_interval": eb.outside_mean_interval_chance(n_seeds),
                                          "outside_prediction_interval": 0.05}
        out[task] = entry
    return {"tasks": out}


LABELS = {"measured_teacher_forced_accuracy": "teacher-forced per-symbol accuracy (2,000 rows)",
          "overshoot": "stop overshoot: stopping accuracy − 0.93",
          "tf": "error from true prefixes (teacher forced)", "free": "error free running (greedy)",
          "gap": "free running − true prefixes",
          "next": "next symbol after one wrong input symbol (later inputs true)",
          "base_next": "  the same symbols, no wrong input (base)",
          "after1": "own continuation, first symbol after a wrong one",
          "base_after1": "  the same symbols, no wrong one (base)",
          "after1_excess": "  first symbol after a wrong one − base",
          "later": "own continuation, 2nd and later symbols after a wrong one",
          "base_later": "  the same symbols, no wrong one (base)",
          "later_excess": "  later symbols after a wrong one − base"}
TARGET_LABELS = {"gold": "against the true target (the compounding the task imposes)",
                 "consistent": "against the prefix-consistent target (the rule applied to what the model read)"}
VERSUS = ("measured_teacher_forced_accuracy", "overshoot", "tf", "gap", "next", "after1_excess", "later_excess")
PER_POSITION_ROWS = (("tf", "by_position", "teacher forced, position j"),
                     ("free", "by_position", "free running, position j"),
                     ("after", "by_offset", "own continuation, d = j − k after a wrong symbol k"),
                     ("base_after", "by_offset", "  base (no wrong symbol), same d"))


def _cell(t) -> str:
    return "–" if t[0] is None or t[0] != t[0] else "{:.3f} [{:.3f}, {:.3f}]".format(*t)


def task_targets(task: str) -> tuple[str, ...]:
    """The targets results.md reports for a task: walk's true target starts at random, so only its prefix-consistent
    one means anything."""
    return ("consistent",) if task == "walk" else TARGETS


def results_markdown(result: dict) -> str:
    """The results as Markdown tables (every number from `result`), per task: means [95 % t-interval] over the main
    seeds per schedule and target; per position; each schedule minus teacher forcing [Welch 95 %] with the smallest
    difference detectable at 80 % power (main seeds, all seeds); the held-out seeds against the main seeds'
    intervals."""
    lines = []
    for task, tr in result["tasks"].items():
        sch = tr["schedules"]
        names = list(sch)
        first = sch[names[0]]
        lines += [f"## seq2seq:{task}", "",
                  f"Means [95 % t-interval] over seeds {first['seeds'][0]}–{first['seeds'][-1]}; held-out seeds "
                  f"{', '.join(map(str, first['held_out_seeds'])) or 'none'}.", "",
                  "| | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names),
                  "| seeds (reached the stop) | " + " | ".join(f"{len(sch[n]['seeds'])} ({sch[n]['reached']})"
                                                              for n in names) + " |",
                  "| steps to the stop (min–max) | " + " | ".join(
                      f"{min(sch[n]['steps_list'])}–{max(sch[n]['steps_list'])}" for n in names) + " |",
                  "| step-to-step jitter of the stopping accuracy (sd) | " + " | ".join(
                      _cell(sch[n]["jitter"]) for n in names) + " |"]
        for key in ("measured_teacher_forced_accuracy", "overshoot"):
            lines.append(f"| {LABELS[key]} | " + " | ".join(_cell(sch[n][key]) for n in names) + " |")
        for t in task_targets(task):
            lines.append(f"| **{TARGET_LABELS[t]}** |" + " |" * len(names))
            for m in ("tf", "free", "gap", "next", "base_next", "after1", "base_after1", "after1_excess", "later",
                      "base_later", "later_excess"):
                lines.append(f"| {LABELS[m]} | " + " | ".join(_cell(sch[n][f"{m}_{t}"]) for n in names) + " |")
        for t in task_targets(task):
            width = len(first[f"tf_{t}_by_position"])
            lines += ["", f"Per position, {TARGET_LABELS[t]}: mean [95 % t-interval]", "",
                      "| schedule | measure | " + " | ".join(str(j) for j in range(width)) + " |",
                      "|---|---|" + "---:|" * width]
            for n in names:
                for m, by, label in PER_POSITION_ROWS:
                    cells = sch[n][f"{m}_{t}_{by}"]
                    cells = ([("–",) * 3] if by == "by_offset" else []) + cells  # offsets start at d = 1
                    lines.append(f"| {n} | {label} | " + " | ".join(
                        "–" if c[0] == "–" else _cell(c) for c in cells) + " |")
        others = list(tr["versus_teacher_forcing"])
        if others:
            lines += ["", "Minus teacher forcing: difference [Welch 95 %]; smallest difference detectable at 80 % "
                      "power with the main seeds / with all seeds", "",
                      "| | " + " | ".join(others) + " |", "|---|" + "---:|" * len(others)]
            for t in task_targets(task):
                for m in VERSUS:
                    key = m if m in ("measured_teacher_forced_accuracy", "overshoot") else f"{m}_{t}"
                    if m in ("measured_teacher_forced_accuracy", "overshoot") and t != task_targets(task)[0]:
                        continue
                    label = LABELS.get(m, m).strip() + ("" if key == m else f" ({t})")
                    cells = []
                    for n in others:
                        v = tr["versus_teacher_forcing"][n][key]
                        d, lo, hi = v["difference"]
                        cells.append(f"{d:+.3f} [{lo:+.3f}, {hi:+.3f}]; ±{v['detectable_at_80_power']:.3f} / "
                                     f"±{v['detectable_all_seeds']:.3f}")
                    lines.append(f"| {label} | " + " | ".join(cells) + " |")
        if tr.get("held_out_total"):
            tot, exp = tr["held_out_total"], tr["held_out_expected"]
            lines += ["", "Held-out seeds against the main seeds' intervals: values outside the 95 % interval of the "
                      "mean (expected fraction for one more seed if all is well: "
                      f"{exp['outside_mean_interval']:.2f}) and outside the 95 % prediction interval (expected "
                      f"{exp['outside_prediction_interval']:.2f})", "",
                      "| | values | outside the mean's interval | outside the prediction interval |",
                      "|---|---:|---:|---:|"]
            for n in names:
                c = sch[n]["held_out_check"]
                if c:
                    for part in ("scalars", "per_position"):
                        lines.append(f"| {n}, {part.replace('_', ' ')} | {c[part]['values']} | "
                                     f"{c[part]['outside_mean_interval']} | {c[part]['outside_prediction_interval']} |")
            for part in ("scalars", "per_position"):
                v = tot[part]
                lines.append(f"| **all, {part.replace('_', ' ')}** | {v['values']} | {v['outside_mean_interval']} "
                             f"({v['outside_mean_interval'] / v['values']:.2f}) | {v['outside_prediction_interval']} "
                             f"({v['outside_prediction_interval'] / v['values']:.2f}) |")
        lines.append("")
    return "\n".join(lines)


def setup() -> dict:
    """The experiment's settings, as recorded in results.json."""
    return {"tasks": {t: f"seq2seq:{t}" for t in TASK_NAMES}, "n_symbols": N_SYMBOLS, "lengths": [MIN_LEN, MAX_LEN],
            "model": model_config(0).to_dict(),
            "train": {k: v for k, v in train_config("teacher forcing", 0).to_dict().items()
                      if k not in ("sampling_schedule", "sampling_k", "seed", "data")},
            "schedules": {s: {"sampling_schedule": kind, "sampling_k": k} for s, (kind, k) in SCHEDULES.items()},
            "stop_rule": f"after the first step whose teacher-forced per-symbol accuracy (prefix-consistent target) "
                         f"on {STOP_ROWS} held-out rows is >= {THRESHOLD} (checked every step), or at the step "
                         "budget",
            "measured_rows": MEASURE_ROWS, "interval": "95 % Student t over seeds (Student 1908)",
            "prediction_interval": "95 %, mean ± t s sqrt(1 + 1/n) (Hahn & Meeker 1991)",
            "differences": "Welch 95 % interval (Welch 1947); detectable: two-sided alpha 0.05, power 0.8"}


MAX_SEEDS, MAX_STEPS = 10_000, 10**7


class _Parser(argparse.ArgumentParser):
    """Bad usage: one line on stderr and exit code 2, instead of the usage block."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _arguments(argv) -> argparse.Namespace:
    """The command line, every value checked before anything is written (one line and exit 2 otherwise)."""
    p = _Parser(prog="python -m analyses.exposure_bias_experiment", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seeds", type=int, default=5, help="seeds 0 .. N − 1, the ones the intervals are over (N >= 1)")
    p.add_argument("--held-out-seeds", type=int, default=3, help="H more seeds N .. N + H − 1, trained afterwards and "
                   "checked against the N seeds' intervals (>= 0)")
    p.add_argument("--first-seed", type=int, default=0, help="train only seeds from this one on (another process "
                   "can take the earlier ones); the summary reads every run in OUT/runs/")
    p.add_argument("--steps", type=int, default=2000, help="step budget per run (>= 1)")
    p.add_argument("--schedules", nargs="*", default=list(SCHEDULES), choices=list(SCHEDULES), metavar="SCHEDULE",
                   help=f"any of {', '.join(repr(s) for s in SCHEDULES)} (default: all)")
    p.add_argument("--tasks", nargs="*", default=list(TASK_NAMES), choices=list(TASK_NAMES), metavar="TASK",
                   help=f"any of {', '.join(TASK_NAMES)} (default: all), trained in this order")
    p.add_argument("--summarise-only", action="store_true", help="train nothing: publish the summary of the runs "
                   "already in OUT/runs/ (results.md names the runs missing)")
    args = p.parse_args(argv)
    if not 1 <= args.seeds <= MAX_SEEDS:
        p.error(f"--seeds {args.seeds}: give the number of seeds, 1 … {MAX_SEEDS}")
    if not 0 <= args.held_out_seeds <= MAX_SEEDS:
        p.error(f"--held-out-seeds {args.held_out_seeds}: give a number of seeds, 0 … {MAX_SEEDS}")
    total = args.seeds + args.held_out_seeds
    if not 0 <= args.first_seed < total:
        p.error(f"--first-seed {args.first_seed}: give a seed in 0 … {total - 1} (below --seeds + --held-out-seeds)")
    if not 1 <= args.steps <= MAX_STEPS:
        p.error(f"--steps {args.steps}: give a step budget in 1 … {MAX_STEPS:,}")
    if not args.schedules:
        p.error("--schedules: give at least one schedule")
    if not args.tasks:
        p.error("--tasks: give at least one task")
    return args


def run_name(task: str, schedule: str, seed: int) -> str:
    """A run's record under OUT/runs/."""
    return f"{task}-{SCHEDULES[schedule][0]}-seed{seed}.json"


def legacy(folder: Path):
    """A results folder written before folders carried marks: it holds runs/ or results.json, and nothing but what
    `run_experiment` writes."""
    from models.io.run_folder import Mark

    names = {p.name for p in folder.iterdir()}
    ours = names & {"runs", "results.json"} and names <= set(OUTPUTS) | {"runs"}
    return Mark("exposure-bias") if ours else None


FIGURES = {"cumsum": ("per_position.png", "injected.png"), "walk": ("walk_per_position.png", "walk_injected.png")}
OUTPUTS = ("results.json", "results.md", *(f for pair in FIGURES.values() for f in pair))


def _read_runs(folder: Path) -> list[dict]:
    """Every run's record in `folder` (OUT/runs/), sorted by name; a file that is not one raises `FolderError`."""
    from models.errors import FolderError
    from models.files.safe_read import JSON_LIMIT, read_json

    runs = []
    for f in sorted(folder.glob("*.json")):
        r = read_json(f, JSON_LIMIT, FolderError, "a run's record (remove it to train that run again)")
        if not isinstance(r, dict) or r.get("schedule") not in SCHEDULES or r.get("task") not in TASK_NAMES:
            raise FolderError(f"{f}: not a run's record of this experiment; remove it to train that run again")
        runs.append(r)
    return runs


def run_experiment(argv=None) -> int:
    """Train the runs missing from OUT/runs/ (each record written as it finishes), then publish the summary, its
    Markdown and the two figures into OUT in one atomic swap (`models.io.run_folder.staged`). Bad arguments or a
    foreign OUT: one line and exit 2, nothing written."""
    import sys

    from models.errors import ToyCircuitsError
    from models.io.run_folder import check_folder, claim, lock, staged

    args = _arguments(argv)
    prog = "python -m analyses.exposure_bias_experiment"
    try:
        check_folder(args.out, "exposure-bias", legacy)
        torch.set_num_threads(1)
        # task-major, then seed-major: a cut run has every schedule at its first seeds
        for task, seed, s in ((t, seed, s) for t in args.tasks
                              for seed in range(args.first_seed, args.seeds + args.held_out_seeds)
                              for s in args.schedules):
            path = args.out / "runs" / run_name(task, s, seed)
            if path.exists() or args.summarise_only:
                continue
            r = run_one(s, seed, args.steps, task)
            with lock(args.out, wait=True):  # processes that share OUT (--first-seed) write one at a time
                claim(args.out, "exposure-bias")
                (args.out / "runs").mkdir(exist_ok=True)
                atomic_write_json(path, r)
            print(f"{task} {s:<16} seed {seed}: stopped after {r['steps']} steps at accuracy "
                  f"{r['stop_accuracy']:.3f}; free running {r['free_consistent']:.3f} (prefix-consistent), "
                  f"{r['free_gold']:.3f} (true target)", flush=True)
        with staged(args.out, "exposure-bias", legacy, wait=True) as stage:
            _write_results(args, _read_runs(args.out / "runs"), stage)
    except ToyCircuitsError as e:
        print(f"{prog}: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 1 if isinstance(e, OSError) else 2
    return 0


def _write_results(args, runs: list[dict], stage: Path) -> None:
    """results.json, results.md and the figures of `runs` (the requested seeds) into the staging folder `stage`."""
    import matplotlib

    matplotlib.use("Agg")  # figures go to files
    import matplotlib.pyplot as plt

    from .exposure_bias_plots import plot_injected, plot_per_position

    total = args.seeds + args.held_out_seeds
    runs = [r for r in runs if r["seed"] < total]
    cpu = hardware()
    result = {"setup": setup(), "cpu": cpu, "torch": torch.__version__, "runs": runs, **summarise(runs, args.seeds)}
    have = {(r["task"], r["schedule"], r["seed"]) for r in runs}
    missing = [f"{t} {s} seed {seed}" for t in args.tasks for s in args.schedules for seed in range(total)
               if (t, s, seed) not in have]
    result["missing_runs"] = missing
    (stage / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    command = (f"python -m analyses.exposure_bias_experiment --out {args.out} --seeds {args.seeds} --held-out-seeds "
               f"{args.held_out_seeds}" + " --summarise-only" * args.summarise_only)
    head = (f"# Exposure bias: results\n\nWritten by `{command}` ({cpu}); see "
            "notebooks/05_encoder_decoder.ipynb. Every run stops after the first step whose teacher-forced accuracy "
            f"on {STOP_ROWS} held-out rows reaches {THRESHOLD}; measured on {MEASURE_ROWS:,} other held-out rows.\n\n"
            + (f"Not trained (cut for CPU time): {'; '.join(missing)}.\n\n" if missing else ""))
    (stage / "results.md").write_text(head + results_markdown(result))
    for task, names in FIGURES.items():
        if task not in result["tasks"]:
            continue
        for name, plot in zip(names, (plot_per_position, plot_injected)):
            fig = plot(result, task)
            try:
                fig.savefig(stage / name, dpi=100)
            finally:
                plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(run_experiment())

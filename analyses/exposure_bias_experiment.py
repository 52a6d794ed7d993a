"""The exposure-bias experiment of notebook 05: teacher forcing against each scheduled-sampling schedule on
`seq2seq:cumsum` (the running sum mod 10, y_j = y_{j−1} + x_j, sources of 4–8 symbols), several seeds each, every
run stopped after the first step at which its teacher-forced per-symbol accuracy on 500 held-out sources reaches
`THRESHOLD`; then the measures of `analyses.exposure_bias` on 2,000 other held-out rows, and their means with 95 %
Student-t intervals over seeds, the differences to teacher forcing with Welch intervals and the smallest difference
detectable at 80 % power.

    python -m analyses.exposure_bias_experiment --out docs/exposure_bias [--seeds 8]

writes one JSON per run under OUT/runs/ (a run already there is not trained again), then OUT/results.json and the
figures OUT/per_position.png and OUT/injected.png (`analyses.exposure_bias_plots`).
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


def train_config(schedule: str, seed: int, steps: int = 2000) -> TrainConfig:
    kind, k = SCHEDULES[schedule]
    return TrainConfig(data="seq2seq:cumsum", task_symbols=N_SYMBOLS, task_min_len=MIN_LEN, task_max_len=MAX_LEN,
                       steps=steps, batch_size=64, lr=1e-3, warmup_steps=50, seed=seed, eval_every=10**6,
                       log_every=10**6, val_sequences=8, exact_match_sequences=1, num_threads=1,
                       sampling_schedule=kind, sampling_k=k, sampling_max=SAMPLING_MAX)


def batches() -> Seq2SeqBatches:
    return Seq2SeqBatches(make_task("seq2seq:cumsum", N_SYMBOLS, MIN_LEN, MAX_LEN), MAX_LEN, MAX_LEN + 2)


def splits() -> tuple[tuple, tuple]:
    """(rows the stopping rule reads, rows measured): two draws from the held-out split."""
    b = batches()
    return b.split(b.val_batch(STOP_ROWS, seed=2)), b.split(b.val_batch(MEASURE_ROWS, seed=1))


def _list(t: torch.Tensor) -> list:
    return [None if v != v else round(float(v), 6) for v in t]


def measure(model, split, seed: int = 0, n_symbols: int = N_SYMBOLS) -> dict:
    """Every measure of one trained model on `split`: per position (gold prefixes, free running), and per injection
    position k the next symbol's error after the wrong symbol (later inputs true) and the mean error of the model's
    own continuation after it, each beside its base rate; pooled rates over all positions."""
    gold_e, gold_v = eb.gold_prefix_errors(model, *split)
    free_e, free_v = eb.free_running_errors(model, *split)
    n = gold_e.shape[1]
    gen = torch.Generator().manual_seed(seed)
    out = {"gold_by_position": _list(eb.rate(gold_e, gold_v)), "free_by_position": _list(eb.rate(free_e, free_v)),
           "gold": float(eb.rate(gold_e, gold_v, None)), "free": float(eb.rate(free_e, free_v, None))}
    pooled = {"injected_next": [0, 0], "base_next": [0, 0], "injected_continuation": [0, 0],
              "base_continuation": [0, 0]}
    for name in ("injected_next", "base_next", "injected_continuation", "base_continuation"):
        out[f"{name}_by_k"] = []
    for k in range(n - 1):
        e, b, v = eb.injected_errors(model, *split, k, n_symbols, gen, free=False)
        nxt = v[:, k + 1]
        for name, x in (("injected_next", e[:, k + 1]), ("base_next", b[:, k + 1])):
            out[f"{name}_by_k"].append(float(x.sum() / nxt.sum()))
            pooled[name][0] += int(x.sum())
            pooled[name][1] += int(nxt.sum())
        e, b, v = eb.injected_errors(model, *split, k, n_symbols, gen, free=True)
        for name, x in (("injected_continuation", e), ("base_continuation", b)):
            out[f"{name}_by_k"].append(float(eb.rate(x, v, None)))
            pooled[name][0] += int(x.sum())
            pooled[name][1] += int(v.sum())
    out.update({name: hits / total for name, (hits, total) in pooled.items()})
    return out


def run_one(schedule: str, seed: int, steps: int = 2000) -> dict:
    stop, measured = splits()
    model, trained, history = eb.train_to_accuracy(model_config(seed), train_config(schedule, seed, steps), stop,
                                                   THRESHOLD)
    return {"schedule": schedule, "seed": seed, "steps": trained, "budget": steps,
            "reached": bool(history and history[-1] >= THRESHOLD),
            "stop_accuracy": history[-1] if history else None,
            "measured_teacher_forced_accuracy": eb.teacher_forced_accuracy(model, *measured),
            **measure(model, measured, seed)}


SCALARS = ("gold", "free", "gap", "injected_next", "base_next", "next_excess", "injected_continuation",
           "base_continuation", "continuation_excess")


def _scalars(r: dict) -> dict:
    return dict(r, gap=r["free"] - r["gold"], next_excess=r["injected_next"] - r["base_next"],
                continuation_excess=r["injected_continuation"] - r["base_continuation"])


def summarise(runs: list[dict]) -> dict:
    """Means with 95 % t-intervals over seeds per schedule (scalars and per position), and each scheduled-sampling
    schedule minus teacher forcing: Welch 95 % interval and the smallest difference detectable at 80 % power."""
    by = {s: [_scalars(r) for r in runs if r["schedule"] == s] for s in SCHEDULES}
    by = {s: rs for s, rs in by.items() if rs}
    out = {"schedules": {}, "versus_teacher_forcing": {}}
    for s, rs in by.items():
        entry = {"seeds": [r["seed"] for r in rs], "steps": [r["steps"] for r in rs],
                 "stop_accuracy": [r["stop_accuracy"] for r in rs],
                 "measured_teacher_forced_accuracy": eb.mean_interval([r["measured_teacher_forced_accuracy"]
                                                                    for r in rs])}
        for key in SCALARS:
            entry[key] = eb.mean_interval([r[key] for r in rs])
        for key in ("gold_by_position", "free_by_position", "injected_next_by_k", "base_next_by_k",
                    "injected_continuation_by_k", "base_continuation_by_k"):
            entry[key] = [eb.mean_interval([r[key][j] for r in rs]) for j in range(len(rs[0][key]))]
        comp = [eb.compounded(r["gold_by_position"]).tolist() for r in rs]
        entry["compounded_by_position"] = [eb.mean_interval([c[j] for c in comp]) for j in range(len(comp[0]))]
        out["schedules"][s] = entry
    tf = by.get("teacher forcing", [])
    for s, rs in by.items():
        if s == "teacher forcing" or len(tf) < 2 or len(rs) < 2:
            continue
        out["versus_teacher_forcing"][s] = {
            key: {"difference": eb.welch_difference([r[key] for r in rs], [r[key] for r in tf]),
                  "detectable_at_80_power": eb.detectable_difference([r[key] for r in rs], [r[key] for r in tf])}
            for key in SCALARS}
    return out


LABELS = {"measured_teacher_forced_accuracy": "teacher-forced per-symbol accuracy",
          "gold": "per-symbol error from true prefixes", "free": "per-symbol error free running (greedy)",
          "gap": "free running − true prefixes", "injected_next": "next symbol after one wrong input symbol",
          "base_next": "the same symbols, no wrong input (base)",
          "injected_continuation": "own continuation after one wrong symbol",
          "base_continuation": "the same continuation, no wrong symbol (base)"}


def results_markdown(result: dict) -> str:
    """The results as Markdown tables (every number from `result`): means [95 % t-interval] per schedule, and each
    schedule minus teacher forcing [Welch 95 %] with the smallest difference detectable at 80 % power."""
    names = list(result["schedules"])
    sch = result["schedules"]
    lines = ["| mean [95 % t-interval] over seeds | " + " | ".join(names) + " |",
             "|---|" + "---:|" * len(names),
             "| seeds | " + " | ".join(str(len(sch[n]["seeds"])) for n in names) + " |",
             "| steps to the stop (min–max) | " + " | ".join(f"{min(sch[n]['steps'])}–{max(sch[n]['steps'])}"
                                                          for n in names) + " |"]
    for key, label in LABELS.items():
        lines.append(f"| {label} | " + " | ".join("{:.3f} [{:.3f}, {:.3f}]".format(*sch[n][key]) for n in names)
                     + " |")
    others = list(result["versus_teacher_forcing"])
    if others:
        lines += ["", "| minus teacher forcing: difference [Welch 95 %], detectable at 80 % power | "
                  + " | ".join(others) + " |", "|---|" + "---:|" * len(others)]
        for key in ("gold", "free", "gap", "injected_next", "injected_continuation", "continuation_excess"):
            label = LABELS.get(key, "continuation after a wrong symbol − its base")
            cells = []
            for n in others:
                (d, lo, hi), mdd = (result["versus_teacher_forcing"][n][key][k] for k in
                                    ("difference", "detectable_at_80_power"))
                cells.append(f"{d:+.3f} [{lo:+.3f}, {hi:+.3f}], ±{mdd:.3f}")
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def setup() -> dict:
    """The experiment's settings, as recorded in results.json."""
    return {"task": "seq2seq:cumsum", "n_symbols": N_SYMBOLS, "lengths": [MIN_LEN, MAX_LEN],
            "model": model_config(0).to_dict() if hasattr(model_config(0), "to_dict") else None,
            "train": {k: v for k, v in train_config("teacher forcing", 0).to_dict().items()
                      if k not in ("sampling_schedule", "sampling_k", "seed")},
            "schedules": {s: {"sampling_schedule": kind, "sampling_k": k} for s, (kind, k) in SCHEDULES.items()},
            "stop_rule": f"after the first step whose teacher-forced per-symbol accuracy on {STOP_ROWS} held-out "
                         f"rows is >= {THRESHOLD} (checked every step), or at the step budget",
            "measured_rows": MEASURE_ROWS, "interval": "95 % Student t over seeds (Student 1908)",
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
    p.add_argument("--seeds", type=int, default=8, help="seeds 0 .. N − 1 (N >= 1)")
    p.add_argument("--first-seed", type=int, default=0, help="train only seeds from this one on (another process "
                   "can take the earlier ones); the summary reads every run in OUT/runs/")
    p.add_argument("--steps", type=int, default=2000, help="step budget per run (>= 1)")
    p.add_argument("--schedules", nargs="*", default=list(SCHEDULES), choices=list(SCHEDULES), metavar="SCHEDULE",
                   help=f"any of {', '.join(repr(s) for s in SCHEDULES)} (default: all)")
    args = p.parse_args(argv)
    if not 1 <= args.seeds <= MAX_SEEDS:
        p.error(f"--seeds {args.seeds}: give the number of seeds, 1 … {MAX_SEEDS}")
    if not 0 <= args.first_seed < args.seeds:
        p.error(f"--first-seed {args.first_seed}: give a seed in 0 … {args.seeds - 1} (below --seeds)")
    if not 1 <= args.steps <= MAX_STEPS:
        p.error(f"--steps {args.steps}: give a step budget in 1 … {MAX_STEPS:,}")
    if not args.schedules:
        p.error("--schedules: give at least one schedule")
    return args


def legacy(folder: Path):
    """A results folder written before folders carried marks: it holds runs/ or results.json, and nothing but what
    `run_experiment` writes."""
    from models.io.run_folder import Mark

    names = {p.name for p in folder.iterdir()}
    ours = names & {"runs", "results.json"} and names <= set(OUTPUTS) | {"runs"}
    return Mark("exposure-bias") if ours else None


OUTPUTS = ("results.json", "results.md", "per_position.png", "injected.png")


def _read_runs(folder: Path) -> list[dict]:
    """Every run's record in `folder` (OUT/runs/), sorted by name; a file that is not one raises `FolderError`."""
    from models.errors import FolderError
    from models.files.safe_read import JSON_LIMIT, read_text

    runs = []
    for f in sorted(folder.glob("*.json")):
        try:
            r = json.loads(read_text(f, JSON_LIMIT, FolderError, "a run's record"))
        except json.JSONDecodeError as e:
            raise FolderError(f"{f}: a run's record is not valid JSON ({e.msg}); remove it to train that run "
                              "again") from None
        if not isinstance(r, dict) or r.get("schedule") not in SCHEDULES:
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
        for seed in range(args.first_seed, args.seeds):  # seed-major: a cut run has every schedule at its first seeds
            for s in args.schedules:
                path = args.out / "runs" / f"{SCHEDULES[s][0]}-seed{seed}.json"
                if path.exists():
                    continue
                r = run_one(s, seed, args.steps)
                with lock(args.out, wait=True):  # processes that share OUT (--first-seed) write one at a time
                    claim(args.out, "exposure-bias")
                    (args.out / "runs").mkdir(exist_ok=True)
                    atomic_write_json(path, r)
                print(f"{s:<16} seed {seed}: stopped after {r['steps']} steps at accuracy {r['stop_accuracy']:.3f}; "
                      f"gold {r['gold']:.3f} free {r['free']:.3f}", flush=True)
        with staged(args.out, "exposure-bias", legacy, wait=True) as stage:
            _write_results(args, _read_runs(args.out / "runs"), stage)
    except ToyCircuitsError as e:
        print(f"{prog}: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 1 if isinstance(e, OSError) else 2
    return 0


def _write_results(args, runs: list[dict], stage: Path) -> None:
    """results.json, results.md and the two figures of `runs` into the staging folder `stage`."""
    import matplotlib

    matplotlib.use("Agg")  # figures go to files
    import matplotlib.pyplot as plt

    from .exposure_bias_plots import plot_injected, plot_per_position

    cpu = hardware()
    result = {"setup": setup(), "cpu": cpu, "torch": torch.__version__, "runs": runs, **summarise(runs)}
    (stage / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    head = (f"Written by `python -m analyses.exposure_bias_experiment --out {args.out} --seeds {args.seeds}` "
            f"({cpu}, torch {torch.__version__}); see notebooks/05_encoder_decoder.ipynb.\n\n")
    (stage / "results.md").write_text(head + results_markdown(result))
    for name, plot in (("per_position.png", plot_per_position), ("injected.png", plot_injected)):
        fig = plot(result)
        try:
            fig.savefig(stage / name, dpi=100)
        finally:
            plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(run_experiment())

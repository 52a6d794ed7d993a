"""`circuits train | zoo`: train a zoo preset or your own config, and list the shipped models. torch is imported
inside the `run_*` functions (fast `--help`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from .common import (
    Command,
    UsageError,
    add_common,
    emit,
    read_json_object,
    resolve_device,
    seed_int,
    table,
)


# --- train --------------------------------------------------------------------------------------------
def _train_args(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--preset", help="a zoo preset (see `circuits zoo`): model and training settings in code")
    src.add_argument("--config", help="model config JSON, or {\"model\": {...}, \"train\": {...}}; a file, or "
                     "inline text starting with {; \"model_type\": \"encoder_decoder\" or \"encoder\" picks those "
                     "models")
    p.add_argument("--train-config", help="training settings JSON over the preset's (models.training.loop.TrainConfig "
                   "fields); a file, or inline text starting with {")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="output folder: model, metrics.jsonl, checkpoints/, card. Must be new, "
                   "empty or an earlier run of the same kind (a folder of other files, or a seed sweep's member, is "
                   "refused, exit 2; files you add to a run folder are kept); locked while training (a second run on "
                   "it exits 2); a link trains into its target")
    p.add_argument("--steps", type=int, help="training steps; fewer than the preset's (or config's) scale its "
                   "log-spaced checkpoints, and a warm-up longer than the run, to the run "
                   "(models.training.config.shortened)")
    p.add_argument("--batch-size", type=int)
    p.add_argument("--lr", type=float)
    seed = p.add_mutually_exclusive_group()
    seed.add_argument("--seed", type=seed_int)
    seed.add_argument("--seeds", help="a seed sweep: one model per seed, trained together in one process "
                      "(models.training.sweep), e.g. 0-7 or 0,3,5; --out then holds seed-K/ per seed and sweep.json")
    p.add_argument("--data", help="'stdlib' (default: the pinned, checksummed snapshot of Python 3.11.7's standard "
                   "library the zoo is measured on), 'python-stdlib' (the running Python's own library: differs "
                   "between Python builds), a text folder or file, 'synthetic:repeat', or for encoder-decoder models "
                   "'seq2seq:copy|reverse|sort|cumsum|date'")
    p.add_argument("--tokenizer", help="'bpe-2048' (default), 'bytes', or a tokenizer.json")
    p.add_argument("--repeat-fraction", type=float, help="fraction of sequences with a repeated segment")
    p.add_argument("--label-smoothing", type=float)
    p.add_argument("--sampling-schedule", choices=["none", "linear", "exponential", "inverse_sigmoid"],
                   help="encoder-decoder: teacher forcing (none) or scheduled sampling with this schedule")
    p.add_argument("--device", help="auto (default: cuda, then mps, then cpu), cpu, cuda[:N], mps")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--no-scores", action="store_true", help="skip the checkpoint head scores")
    p.add_argument("--json", action="store_true", help="print the run summary as JSON")


def train_settings(args) -> tuple:
    """(model config, TrainConfig, description) from the command line."""
    import dataclasses

    from models.io.checkpoint import config_from_dict
    from models.training.config import shortened
    from models.training.loop import TrainConfig

    if args.preset:
        from models.training.presets import get_preset

        try:
            model_cfg, cfg, about = get_preset(args.preset)
        except KeyError as e:
            raise UsageError(e.args[0]) from None
    else:
        d = read_json_object(args.config, "config")
        model_d, train_d = (d["model"], d.get("train", {})) if "model" in d else (d, {})
        model_cfg, about = config_from_dict(model_d), "custom model"
        cfg = TrainConfig.from_dict(train_d)
    base_steps, given = cfg.steps, {}
    if args.train_config:
        given = read_json_object(args.train_config, "training config")
        cfg = TrainConfig.from_dict(dict(cfg.to_dict(), **given))
    over = {"steps": args.steps, "batch_size": args.batch_size, "lr": args.lr, "seed": args.seed,
            "data": args.data, "tokenizer": args.tokenizer, "repeat_fraction": args.repeat_fraction,
            "label_smoothing": args.label_smoothing, "device": args.device,
            "sampling_schedule": args.sampling_schedule}
    cfg = dataclasses.replace(cfg, **{k: v for k, v in over.items() if v is not None}, out_dir=args.out,
                              progress=not (args.no_progress or args.json))
    cfg.validate()
    # a run shorter than its preset's (or config file's) schedule: that schedule scaled to it (`shortened`)
    cfg, args.schedule_notes = shortened(dataclasses.replace(cfg, steps=base_steps), cfg.steps,
                                         fixed=set(given) - {"steps"})
    cfg.validate()
    from models.files.size_checks import check_train_sizes

    models = len(getattr(args, "seed_list", None) or [None])  # a sweep trains them all at once
    check_train_sizes(model_cfg, cfg, UsageError, models)  # as train() does, before the corpus is read for evaluation
    return model_cfg, cfg, about


def run_train(args) -> int:
    import shlex

    from models.arch.kind import DECODER, ENCODER_DECODER, model_kind
    from models.training.loop import train

    from ..train_metrics import eval_inputs, make_eval_fn, make_report_fn

    if args.device is not None:  # checked as the analyses check it (case-insensitive; exit 2 when absent)
        args.device = "auto" if args.device.lower() == "auto" else str(resolve_device(args.device))
    args.seed_list = None
    if args.seeds is not None:
        from models.training.sweep import parse_seeds

        args.seed_list = parse_seeds(args.seeds)  # TrainConfigError: exit 2, one line
    model_cfg, cfg, about = train_settings(args)
    if args.seed_list is not None:
        from models.training.stacked import check_stackable

        check_stackable(model_cfg)
    if args.device is None and cfg.device != "auto":  # a device from --config / --train-config
        resolve_device(cfg.device)
    command = "circuits " + shlex.join(["train"] + list(args.argv))
    eval_fn, tok, name = None, None, args.preset or "custom"
    kind = model_kind(model_cfg)
    if kind == ENCODER_DECODER:  # exact match is the task's own checkpoint metric
        from ..seq2seq_card import make_seq2seq_report_fn

        report_fn = make_seq2seq_report_fn(name, about, command, cfg)
    else:
        tok, val, seen, corpus = eval_inputs(cfg, model_cfg)  # fails early on an unusable corpus
        if not args.no_scores and kind == DECODER:  # scores of next-token predictors
            eval_fn = make_eval_fn(tok, val, seen, periods=(50, 100))
        report_fn = make_report_fn(name, about, command, cfg, corpus, val, seen)
    if args.seeds is not None:
        code = _run_sweep(args, model_cfg, cfg, eval_fn, tok, command, name, about, corpus, val, seen)
        _say_notes(args)
        return code
    model, summary = train(model_cfg, cfg, eval_fn=eval_fn, report_fn=report_fn, resume=args.resume, tokenizer=tok)
    _say_notes(args)
    em = f", held-out exact match {summary['final_exact_match']:.2%}" if "final_exact_match" in summary else ""
    emit(args, dict(summary, out=args.out),
         f"trained {args.preset or 'model'}: {summary['steps']} steps, {summary['tokens_seen']} tokens, "
         f"{summary['wall_time']:.0f} s, final validation loss "
         f"{summary.get('final_val_loss', float('nan')):.4f}{em} → {args.out}")
    return 0


def score_definitions() -> dict:
    """Which functions computed the checkpoint scores a run records (each named with its docstring's first
    paragraph)."""
    from .. import scores

    return {"induction_scores_{p}": _first_line(scores.induction_scores),
            "previous_token_scores": _first_line(scores.previous_token_scores),
            "icl_score": _first_line(scores.in_context_learning_differences)}


def _first_line(fn) -> str:
    first = (fn.__doc__ or "").strip().split("\n\n")[0]  # the docstring's first paragraph
    return f"{fn.__module__}.{fn.__qualname__}: " + " ".join(first.split())


def _say_notes(args) -> None:
    """The schedule changes `train_settings` made (`shortened`), on stderr once the run has finished, so that an error
    stays the only line when the run fails."""
    import sys

    for note in getattr(args, "schedule_notes", ()):
        print(f"circuits train: note: {note}", file=sys.stderr)


def _run_sweep(args, model_cfg, cfg, eval_fn, tok, command, name, about, corpus, val, seen) -> int:
    """`circuits train --seeds ...`: the members' cards as a single run's, each with its own seed and folder."""
    from models.training.sweep import train_sweep

    from ..train_metrics import make_report_fn

    def report_fn_for(member_cfg):
        return make_report_fn(name, about, command, member_cfg, corpus, val, seen)

    sweep = train_sweep(model_cfg, cfg, args.seed_list, eval_fn=eval_fn, report_fn_for=report_fn_for,
                        resume=args.resume, tokenizer=tok, command=command, notes=score_definitions())
    ok = [m for m in sweep["members"] if m["status"] == "finished"]
    losses = ", ".join(f"seed {m['seed']} {m['final_val_loss']:.4f}" for m in ok)
    failed = [str(m["seed"]) for m in sweep["members"] if m["status"] == "failed"]
    emit(args, dict(sweep, out=args.out),
         f"trained a sweep of {len(sweep['members'])} {args.preset or 'model'}s ({sweep['steps']} steps each, "
         f"{sweep.get('wall_time', 0):.0f} s): final validation loss {losses}"
         + (f"; failed (diverged): seed {', '.join(failed)}" if failed else "") + f" → {args.out}")
    return 0


# --- zoo ----------------------------------------------------------------------------------------------
def _zoo_args(p: argparse.ArgumentParser) -> None:
    add_common(p, progress=False, csv=True)  # --device/--seed/--no-progress accepted everywhere (no effect here)


def run_zoo(args) -> int:
    from models.io.checkpoint import zoo_cards

    cards = zoo_cards()
    headers = ["name", "layers", "heads", "d_model", "kind", "positions", "val loss", "about"]
    rows = [[c["name"], str(c["n_layers"]), c["n_heads"], c["d_model"], "attn-only" if c["attn_only"] else "mlp",
             c["positions"], c["val_loss"], c["about"]] for c in cards]
    # validation losses to 4 significant digits: the encoder-decoders' 8.35e-06 is no 0.000
    shown = [r[:6] + [None if r[6] is None else f"{r[6]:.4g}"] + r[7:] for r in rows]
    emit(args, {"models": cards}, table(headers, shown) if cards else "(no zoo models)", table=(headers, rows))
    return 0


# --- sweep --------------------------------------------------------------------------------------------
SWEEP_OUTPUTS = ("sweep.json", "sweep.md", "sweep.png")


def _sweep_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("sweep", help="a seed-sweep folder (`circuits train --seeds ... --out OUT`); an unfinished or "
                   "running sweep is read up to its newest checkpoint")
    p.add_argument("--out", metavar="DIR",
                   help="also write sweep.json (the sweep's record with this analysis under 'analysis'), "
                   "sweep.md (the report section) and sweep.png (the figure) into this folder; it must be new or hold "
                   "only those files")
    p.add_argument("--no-copying", action="store_true", help="skip the OV copying scores (which load each seed's "
                   "weights)")
    add_common(p, progress=False, figure=True, csv=True)  # --device/--seed: no effect (nothing random, on the CPU)


def run_sweep(args) -> int:
    from pathlib import Path

    from ..sweep import SUMMARISED, plot_sweep

    s, text = write_sweep(Path(args.sweep), None if args.out is None else Path(args.out), copying=not args.no_copying)
    headers = ["seed", "status", *SUMMARISED]
    rows = [[r.get(k) for k in headers] for r in s["seeds"]]
    emit(args, s, text + (f"\nwrote {', '.join(SWEEP_OUTPUTS)} → {args.out}" if args.out else ""),
         table=(headers, rows), figure=lambda: plot_sweep(s))
    return 0


def write_sweep(folder, dest, copying: bool = True, report_name: str | None = None) -> tuple[dict, str]:
    """Analyse the seed sweep in `folder` (`analyses.sweep.sweep_summary`) and, with `dest`, write sweep.json (the
    sweep's record with the analysis under 'analysis'), sweep.md (or `report_name`: the same text under a title, a
    report folder) and sweep.png into it, staged and published in one atomic swap (`models.io.run_folder.staged`):
    `dest` must be new, empty or a report of the same kind. Returns (summary, section)."""
    import os

    from models.training.sweep import SWEEP_FILE

    from ..sweep import sweep_markdown, sweep_summary

    if not os.path.lexists(folder / SWEEP_FILE):  # one that is not a regular file: its reader says so
        raise UsageError(f"{folder} is not a seed sweep (no {SWEEP_FILE}); give the --out folder of "
                         "`circuits train --seeds`")
    if dest is None:
        s = sweep_summary(folder, copying=copying)
        return s, sweep_markdown(s)
    from models.io.run_folder import Mark, staged

    outputs = ("sweep.json", report_name or "sweep.md", "sweep.png")
    kind = "sweep-report" if report_name is None else "report"

    def legacy(f: Path) -> Mark | None:  # written before folders carried marks: only these files
        names = {p.name for p in f.iterdir()}
        return Mark(kind) if names and names <= set(outputs) else None

    with staged(dest, kind, legacy) as stage:
        return _write_sweep_files(folder, stage, outputs, copying, report_name)


def _write_sweep_files(folder, stage, outputs, copying, report_name) -> tuple[dict, str]:
    """The analysis of the sweep in `folder` and its three files in the staging folder `stage`."""
    import json

    import matplotlib

    matplotlib.use("Agg")  # figures go to files
    import matplotlib.pyplot as plt

    from models.training.sweep import sweep_json

    from ..sweep import plot_sweep, sweep_markdown, sweep_summary

    s = sweep_summary(folder, copying=copying)
    text = sweep_markdown(s)
    page = text if report_name is None else (f"# Circuits report: seed sweep {folder.name}\n\n{text}\n"
                                             "![every seed's validation loss and induction score](sweep.png)\n")
    fig = plot_sweep(s)
    try:
        fig.savefig(stage / outputs[2], dpi=100)
    finally:
        plt.close(fig)
    (stage / outputs[0]).write_text(json.dumps(dict(sweep_json(folder), analysis=s), indent=1) + "\n")
    (stage / outputs[1]).write_text(page)
    return s, text


COMMANDS = [
    Command("zoo", "list the shipped models with one-line cards", _zoo_args, run_zoo),
    Command("train", "train a model (a zoo preset or a config) with checkpoints and metrics", _train_args, run_train),
    Command("sweep", "a seed sweep's formation points, circuits and their spread across seeds, with a figure",
            _sweep_args, run_sweep),
]

"""`circuits train | zoo`: train a zoo preset or your own config, and list the shipped models. torch is imported
inside the `run_*` functions (fast `--help`)."""

from __future__ import annotations

import argparse

from .common import (
    Command,
    UsageError,
    add_common,
    emit,
    read_json_object,
    resolve_device,
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
    p.add_argument("--out", required=True, help="output folder: model, metrics.jsonl, checkpoints/, card. Must be new, "
                   "empty or an earlier run (a folder of other files is refused, exit 2; files you add to a run "
                   "folder are kept); locked while training (a second run on it exits 2); a link trains into its "
                   "target")
    p.add_argument("--steps", type=int)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--lr", type=float)
    p.add_argument("--seed", type=int)
    p.add_argument("--data", help="'stdlib' (default), a text folder or file, 'synthetic:repeat', or for "
                   "encoder-decoder models 'seq2seq:copy|reverse|sort|date'")
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
    if args.train_config:
        cfg = TrainConfig.from_dict(dict(cfg.to_dict(), **read_json_object(args.train_config, "training config")))
    over = {"steps": args.steps, "batch_size": args.batch_size, "lr": args.lr, "seed": args.seed,
            "data": args.data, "tokenizer": args.tokenizer, "repeat_fraction": args.repeat_fraction,
            "label_smoothing": args.label_smoothing, "device": args.device,
            "sampling_schedule": args.sampling_schedule}
    cfg = dataclasses.replace(cfg, **{k: v for k, v in over.items() if v is not None}, out_dir=args.out,
                              progress=not (args.no_progress or args.json))
    if args.steps is not None and cfg.keep_checkpoints is not None:
        cfg.keep_checkpoints = sorted({s for s in cfg.keep_checkpoints if s <= cfg.steps} | {cfg.steps})
    cfg.validate()
    from models.io.size_checks import check_train_sizes

    check_train_sizes(model_cfg, cfg, UsageError)  # as train() does, before the corpus is read for evaluation
    return model_cfg, cfg, about


def run_train(args) -> int:
    import shlex

    from models.arch.config import HookedTransformerConfig
    from models.training.loop import train

    from ..train_metrics import eval_inputs, make_eval_fn, make_report_fn

    if args.device is not None:  # checked as the analyses check it (case-insensitive; exit 2 when absent)
        args.device = "auto" if args.device.lower() == "auto" else str(resolve_device(args.device))
    model_cfg, cfg, about = train_settings(args)
    if args.device is None and cfg.device != "auto":  # a device from --config / --train-config
        resolve_device(cfg.device)
    command = "circuits " + shlex.join(["train"] + list(args.argv))
    eval_fn, tok, name = None, None, args.preset or "custom"
    if hasattr(model_cfg, "d_vocab_src"):  # encoder-decoder: exact match is the task's own checkpoint metric
        from ..seq2seq_card import make_seq2seq_report_fn

        report_fn = make_seq2seq_report_fn(name, about, command, cfg)
    else:
        tok, val, seen, corpus = eval_inputs(cfg, model_cfg)  # fails early on an unusable corpus
        if not args.no_scores and type(model_cfg) is HookedTransformerConfig:  # scores of next-token predictors
            eval_fn = make_eval_fn(tok, val, seen, periods=(50, 100))
        report_fn = make_report_fn(name, about, command, cfg, corpus, val, seen)
    model, summary = train(model_cfg, cfg, eval_fn=eval_fn, report_fn=report_fn, resume=args.resume, tokenizer=tok)
    em = f", held-out exact match {summary['final_exact_match']:.2%}" if "final_exact_match" in summary else ""
    emit(args, dict(summary, out=args.out),
         f"trained {args.preset or 'model'}: {summary['steps']} steps, {summary['tokens_seen']} tokens, "
         f"{summary['wall_time']:.0f} s, final validation loss "
         f"{summary.get('final_val_loss', float('nan')):.4f}{em} → {args.out}")
    return 0


# --- zoo ----------------------------------------------------------------------------------------------
def _zoo_args(p: argparse.ArgumentParser) -> None:
    add_common(p, progress=False)  # --json, and --device/--seed, accepted everywhere (no effect here)


def run_zoo(args) -> int:
    from models.io.checkpoint import zoo_cards

    cards = zoo_cards()
    lines = [f"{c['name']:<14} {c['n_layers']}L x {c['n_heads']}H d_model={c['d_model']} "
             f"{'attn-only' if c['attn_only'] else 'mlp'} {c['positions']}  val loss "
             f"{c['val_loss'] if c['val_loss'] is None else round(c['val_loss'], 3)}  {c['about']}" for c in cards]
    emit(args, {"models": cards}, "\n".join(lines) or "(no zoo models)")
    return 0


COMMANDS = [
    Command("zoo", "list the shipped models with one-line cards", _zoo_args, run_zoo),
    Command("train", "train a model (a zoo preset or a config) with checkpoints and metrics", _train_args, run_train),
]

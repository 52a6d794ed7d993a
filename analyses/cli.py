"""The `circuits` command line.

Each subcommand is a `Command`: a name, a one-line help, a function that adds its arguments and a function
that runs it (`run(args) -> int`). Adding one is a small function pair plus one line in `COMMANDS`.
Heavy imports (torch, transformer-lens) happen inside `run`, so `circuits --help` stays fast.

`train` and `zoo` live here; `info`, `report`, `attention`, `generate` in `cli_model`; `heads`, `eigen`,
`compose`, `paths`, `trigrams` in `cli_circuits`; the shared options, model loading (zoo name, folder, or a
TransformerLens state dict with `--config`) and `UsageError` in `cli_common`.

Exit codes: 0 ok; 2 bad usage or bad input (a one-line message on stderr, no traceback); 1 internal failure.
"""

from __future__ import annotations

import argparse
import json
import sys

from . import cli_circuits, cli_model, cli_patch
from .cli_common import Command, UsageError, add_common, emit, read_json_object  # noqa: F401  (re-exported)


def _user_errors() -> tuple:
    """Exception types that mean 'bad input' (imported lazily: they live in torch-importing modules)."""
    from circuits._validate import NonFiniteError
    from models.checkpoint import CheckpointError
    from models.config import ConfigError
    from models.data import CorpusError
    from models.tokenizer import TokenizerError
    from models.train import TrainConfigError

    from .patching import PatchingError

    return (UsageError, ConfigError, CheckpointError, CorpusError, TokenizerError, TrainConfigError, NonFiniteError,
            PatchingError, FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError)


# --- train --------------------------------------------------------------------------------------------
def _train_args(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--preset", help="a zoo preset (see `circuits zoo`): model and training settings in code")
    src.add_argument("--config", help="model config JSON, or {\"model\": {...}, \"train\": {...}}; a file, or "
                     "inline text starting with {")
    p.add_argument("--train-config", help="training settings JSON over the preset's (models.train.TrainConfig "
                   "fields); a file, or inline text starting with {")
    p.add_argument("--out", required=True, help="output folder: model, metrics.jsonl, checkpoints/, card")
    p.add_argument("--steps", type=int)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--lr", type=float)
    p.add_argument("--seed", type=int)
    p.add_argument("--data", help="'stdlib' (default), a text folder or file, or 'synthetic:repeat'")
    p.add_argument("--tokenizer", help="'bpe-2048' (default), 'bytes', or a tokenizer.json")
    p.add_argument("--repeat-fraction", type=float, help="fraction of sequences with a repeated segment")
    p.add_argument("--label-smoothing", type=float)
    p.add_argument("--device", help="auto (default), cpu, cuda, mps")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--no-scores", action="store_true", help="skip the checkpoint head scores")
    p.add_argument("--json", action="store_true", help="print the run summary as JSON")


def train_settings(args) -> tuple:
    """(model config, TrainConfig, description) from the command line."""
    import dataclasses

    from models.config import HookedTransformerConfig
    from models.train import TrainConfig

    if args.preset:
        from models.train_presets import get_preset

        try:
            model_cfg, cfg, about = get_preset(args.preset)
        except KeyError as e:
            raise UsageError(e.args[0]) from None
    else:
        d = read_json_object(args.config, "config")
        model_d, train_d = (d["model"], d.get("train", {})) if "model" in d else (d, {})
        model_cfg, about = HookedTransformerConfig.from_dict(model_d), "custom model"
        cfg = TrainConfig.from_dict(train_d)
    if args.train_config:
        cfg = TrainConfig.from_dict(dict(cfg.to_dict(), **read_json_object(args.train_config, "training config")))
    over = {"steps": args.steps, "batch_size": args.batch_size, "lr": args.lr, "seed": args.seed,
            "data": args.data, "tokenizer": args.tokenizer, "repeat_fraction": args.repeat_fraction,
            "label_smoothing": args.label_smoothing, "device": args.device}
    cfg = dataclasses.replace(cfg, **{k: v for k, v in over.items() if v is not None}, out_dir=args.out,
                              progress=not (args.no_progress or args.json))
    if args.steps is not None and cfg.keep_checkpoints is not None:
        cfg.keep_checkpoints = sorted({s for s in cfg.keep_checkpoints if s <= cfg.steps} | {cfg.steps})
    cfg.validate()
    return model_cfg, cfg, about


def run_train(args) -> int:
    import shlex

    from models.train import train

    from .train_metrics import eval_inputs, make_eval_fn, make_report_fn

    model_cfg, cfg, about = train_settings(args)
    eval_fn = report_fn = None
    tok, val, seen, corpus = eval_inputs(cfg, model_cfg)  # fails early on an unusable corpus
    if not args.no_scores:
        eval_fn = make_eval_fn(tok, val, seen, periods=(50, 100))
    command = "circuits " + shlex.join(["train"] + list(args.argv))
    report_fn = make_report_fn(args.preset or "custom", about, command, cfg, corpus, val, seen)
    model, summary = train(model_cfg, cfg, eval_fn=eval_fn, report_fn=report_fn, resume=args.resume, tokenizer=tok)
    emit(args, dict(summary, out=args.out), f"trained {args.preset or 'model'}: {summary['steps']} steps, "
         f"{summary['tokens_seen']} tokens, {summary['wall_time']:.0f} s, final validation loss "
         f"{summary.get('final_val_loss', float('nan')):.4f} → {args.out}")
    return 0


# --- zoo ----------------------------------------------------------------------------------------------
def _zoo_args(p: argparse.ArgumentParser) -> None:
    add_common(p, progress=False)  # --json, and --device/--seed, accepted everywhere (no effect here)


def zoo_cards() -> list[dict]:
    """One entry per shipped model: name, one-line description, architecture, validation loss."""
    from pathlib import Path

    zoo = Path(__file__).resolve().parent.parent / "models" / "zoo"
    out = []
    for d in sorted(zoo.iterdir()) if zoo.is_dir() else []:
        if not (d / "config.json").is_file():
            continue
        cfg = json.loads((d / "config.json").read_text())
        summary = json.loads((d / "summary.json").read_text()) if (d / "summary.json").is_file() else {}
        about = ""
        if (d / "card.md").is_file():
            lines = [ln.strip() for ln in (d / "card.md").read_text().splitlines()]
            about = next((ln for ln in lines if ln and not ln.startswith("#")), "")
        out.append({"name": d.name, "about": about, "n_layers": cfg["n_layers"], "n_heads": cfg["n_heads"],
                    "d_model": cfg["d_model"], "n_ctx": cfg["n_ctx"], "d_vocab": cfg["d_vocab"],
                    "attn_only": cfg["attn_only"], "positions": cfg["positional_embedding_type"],
                    "val_loss": summary.get("final_val_loss"), "path": str(d)})
    return out


def run_zoo(args) -> int:
    cards = zoo_cards()
    lines = [f"{c['name']:<14} {c['n_layers']}L x {c['n_heads']}H d_model={c['d_model']} "
             f"{'attn-only' if c['attn_only'] else 'mlp'} {c['positions']}  val loss "
             f"{c['val_loss'] if c['val_loss'] is None else round(c['val_loss'], 3)}  {c['about']}" for c in cards]
    emit(args, {"models": cards}, "\n".join(lines) or "(no zoo models)")
    return 0


COMMANDS = [
    Command("zoo", "list the shipped models with one-line cards", _zoo_args, run_zoo),
    cli_model.COMMANDS["info"],
    Command("train", "train a model (a zoo preset or a config) with checkpoints and metrics", _train_args, run_train),
    cli_model.COMMANDS["report"],
    *cli_circuits.COMMANDS.values(),
    cli_model.COMMANDS["attention"],
    cli_model.COMMANDS["generate"],
    *cli_patch.COMMANDS.values(),
]


class _Parser(argparse.ArgumentParser):
    """Bad usage: one line on stderr (pointing at --help) and exit code 2, instead of the full usage block."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


EPILOG = """examples:
  circuits zoo                                   the shipped models
  circuits report attn-only-2l --out report      full report: markdown + figures
  circuits heads attn-only-2l                    induction / previous-token / copying heads
  circuits compose attn-only-2l --kind k         K-composition scores minus the random baseline
  circuits info old.pth --config config.json     a legacy TransformerLens state dict

MODEL is a zoo name, a saved model folder, or a .pth/.safetensors state dict with --config.
Exit codes: 0 ok, 2 bad usage or input, 1 internal failure. `circuits COMMAND --help` for each command."""


def build_parser(commands=None) -> argparse.ArgumentParser:
    p = _Parser(prog="circuits", description="Toy transformers and the math of transformer circuits.",
                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for c in commands or COMMANDS:
        sp = sub.add_parser(c.name, help=c.help, description=c.help)
        c.add_arguments(sp)
        sp.set_defaults(_run=c.run)
    return p


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)  # bad usage: argparse prints one line and exits with 2
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    args.argv = argv[1:]
    try:
        return args._run(args)
    except KeyboardInterrupt:
        print("circuits: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if isinstance(e, _user_errors()):
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            print(f"circuits {args.command}: error: {msg}", file=sys.stderr)
            return 2
        import traceback

        traceback.print_exc()
        print(f"circuits {args.command}: internal error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

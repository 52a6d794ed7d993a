"""`circuits sae train | report`: sparse autoencoders on a model's hook point, through SAELens (`models.sae`;
optional: `pip install sae-lens`). torch and SAELens are imported inside the `run_*` functions (fast `--help`)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from models.arch.kind import DECODER

from .common import (
    Command,
    UsageError,
    add_common,
    add_model,
    emit,
    positive_int,
    read_text_tokens,
    save_figure,
    validation_windows,
)

#: Tokens of the training split (or --text-file) the activation source draws windows from.
TRAIN_TOKENS = 2_000_000


def _positive_float(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {s!r}") from None
    if not v >= 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {s}")
    return v


def _sae_args(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="sae_command", metavar="{train,report}", required=True)
    t = sub.add_parser("train", help="train an SAE on one hook point (SAELens' standard SAE and trainer)",
                       description="Train SAELens' standard SAE on one hook point of MODEL and write a folder "
                                   "SAELens' SAE.load_from_disk reads (cfg.json, sae_weights.safetensors, "
                                   "training.json).")
    add_model(t)
    t.add_argument("--hook", required=True, help="hook point, e.g. blocks.1.hook_mlp_out, blocks.0.hook_resid_post, "
                   "blocks.1.attn.hook_z (concatenated over heads)")
    t.add_argument("--out", required=True, metavar="DIR", help="new (or empty) folder for the SAE; never overwritten")
    t.add_argument("--steps", type=positive_int, default=1000, help="training batches (default 1000)")
    t.add_argument("--expansion", type=positive_int, default=8, help="d_sae / d_in (default 8)")
    t.add_argument("--l1", type=_positive_float, default=2.0,
                   help="L1 coefficient (SAELens' l1_coefficient, on activations scaled to mean squared norm d_in; "
                        "default 2)")
    t.add_argument("--batch-size", type=positive_int, default=4096, help="token activations per batch (default 4096)")
    t.add_argument("--lr", type=_positive_float, default=3e-3, help="Adam learning rate (default 3e-3)")
    t.add_argument("--text-file", metavar="FILE", help="training text (default: the training split of the model's "
                   "training corpus)")
    add_common(t)
    r = sub.add_parser("report", help="FVU, L0, dead features, spliced loss and the top features of an SAE",
                       description="Measure an SAE on MODEL's validation text and write sae_report.md and "
                                   "sae_report.png into --out.")
    add_model(r)
    r.add_argument("sae_dir", metavar="SAE_DIR", help="a folder `circuits sae train` (or SAELens) wrote")
    r.add_argument("--out", required=True, metavar="DIR", help="folder for sae_report.md and sae_report.png")
    r.add_argument("--windows", type=positive_int, default=32, help="validation windows of n_ctx tokens (default 32)")
    r.add_argument("--top", type=positive_int, default=8, help="features shown (default 8)")
    r.add_argument("--html", action="store_true", help="also write sae_report.html: one self-contained page, the "
                   "figure embedded, that opens offline")
    r.add_argument("--text-file", metavar="FILE",
                   help="validation text (default: the validation split of the model's training corpus)")
    add_common(r)


def _sae_check(args) -> None:
    """`--out` and SAE_DIR checked before the model loads."""
    out = Path(args.out)
    if args.sae_command == "train" and out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"--out {out} exists and is not an empty folder; give a new folder (nothing is overwritten)")
    if args.sae_command == "report":
        if out.exists() and not out.is_dir():
            raise UsageError(f"--out {out} exists and is not a folder")
        if not Path(args.sae_dir).is_dir():
            raise UsageError(f"SAE_DIR {args.sae_dir} is not a folder")


def run_sae(args, loaded) -> int:
    return run_sae_train(args, loaded) if args.sae_command == "train" else run_sae_report(args, loaded)


def _bos(model):
    from ..sequences import bos_token_id

    return bos_token_id(model) if model.tokenizer is not None else None


def _text(loaded, args, split: str, max_tokens: int):
    """A 1-D token stream: --text-file, else the `split` ("train" / "val") of the model's training corpus."""
    import torch

    if args.text_file:
        return read_text_tokens(loaded.model, args.text_file, max_tokens), args.text_file
    from ..report import training_corpus

    corpus = training_corpus(loaded.model, loaded.folder)
    if corpus is None:
        raise UsageError(f"{loaded.name} has no training text here (no tokenizer, synthetic data or its corpus is "
                         "unavailable); pass --text-file FILE")
    arr = corpus.train if split == "train" else corpus.val
    what = f"the {'training' if split == 'train' else 'validation'} split of {corpus.name}"
    return torch.from_numpy(arr[:max_tokens].astype("int64")), what


def run_sae_train(args, loaded) -> int:
    from models.io.sae import check_model, save_sae
    from models.training.sae import train_sae

    out = Path(args.out)
    check_model(loaded.model, "circuits sae train")  # SAEError: exit 2, one line
    tokens, what = _text(loaded, args, "train", TRAIN_TOKENS)
    trained = train_sae(loaded.model, args.hook, tokens, steps=args.steps, expansion=args.expansion, l1=args.l1,
                        batch_size=args.batch_size, lr=args.lr, seed=args.seed, bos=_bos(loaded.model),
                        progress=not args.no_progress)
    trained.settings["text"] = what
    save_sae(trained, out)
    obj = {"model": loaded.name, "sae": str(out), **trained.settings}
    emit(args, obj, f"wrote {out}: SAE on {args.hook} of {loaded.name}, d_sae {trained.settings['d_sae']}, "
                    f"{args.steps} steps in {trained.seconds:.0f} s; `circuits sae report {args.model} {out} --out "
                    "DIR` measures it")
    return 0


def run_sae_report(args, loaded) -> int:
    import torch

    from models.files.atomic import atomic_write_text
    from models.io.readers import SAE_TRAINING_FILE, read_sae_training
    from models.io.sae import load_sae

    from ..sae_report import analyse, markdown, plot

    out, device = Path(args.out), loaded.device
    sae_dir = Path(args.sae_dir)
    sae = load_sae(sae_dir, loaded.model)  # every file of the folder read and checked once (models.io.readers)
    training = sae_dir / SAE_TRAINING_FILE
    settings = read_sae_training(training) if os.path.lexists(training) else None
    win, what, _ = validation_windows(loaded, args, args.windows, args.seed)
    if win is None:
        raise UsageError(f"{loaded.name}: {what}; pass --text-file FILE")
    win, bos = win.to(device), _bos(loaded.model)
    with torch.no_grad():
        report = analyse(loaded.model, sae, win, bos, top=args.top)
    out.mkdir(parents=True, exist_ok=True)
    md_path, png_path = out / "sae_report.md", out / "sae_report.png"
    save_figure(plot(report, loaded.name), png_path)
    text = markdown(report, loaded.name, settings, what)  # "N windows of n_ctx tokens of ..."
    text += f"\n![feature densities and losses]({png_path.name})\n"
    atomic_write_text(md_path, text)
    html_path = None
    if args.html:
        from ..report.html import write_page

        html_path = write_page(text, out / "sae_report.html", f"SAE report: {loaded.name}")
    obj = {"model": loaded.name, "sae": str(sae_dir), "report": str(md_path), "figure": str(png_path),
           "html": None if html_path is None else str(html_path),
           **report.stats, "losses": report.losses,
           "features": [{"index": f.index, "frequency": f.frequency, "max_act": f.max_act,
                         "contexts": [{"before": b, "token": t, "after": a, "activation": v} for b, t, a, v in
                                      f.contexts],
                         "promoted": None if f.promoted is None else [{"token": t, "logit_weight": v}
                                                                      for t, v in f.promoted]}
                        for f in report.features]}
    lo = report.losses
    wrote = f"{md_path}, {png_path} and {html_path}" if html_path else f"{md_path} and {png_path}"
    emit(args, obj, f"wrote {wrote}: FVU {report.stats['fvu']:.3f}, L0 {report.stats['l0']:.1f}, "
                    f"dead {report.stats['dead']}/{report.stats['d_sae']}, loss clean {lo['clean']:.3f} / spliced "
                    f"{lo['spliced']:.3f} / zero-ablated {lo['zero_ablated']:.3f}")
    return 0


COMMANDS = [Command("sae", "sparse autoencoders through SAELens: `sae train` on a hook point, `sae report` on one",
                    _sae_args, {DECODER: run_sae}, check=_sae_check)]

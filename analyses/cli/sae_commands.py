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


def _feature_list(s: str) -> list[int]:
    try:
        out = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected feature numbers separated by commas, got {s!r}") from None
    if not out or min(out) < 0:
        raise argparse.ArgumentTypeError(f"expected feature numbers >= 0 separated by commas, got {s!r}")
    return out


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
    r.add_argument("--out", required=True, metavar="DIR", help="new folder (or one `sae report` wrote) for "
                   "sae_report.md, sae_report.png and sae_report.html")
    r.add_argument("--windows", type=positive_int, default=32, help="validation windows of n_ctx tokens (default 32)")
    r.add_argument("--top", type=positive_int, default=8,
                   help="features shown: the N of largest activation (default 8)")
    r.add_argument("--features", type=_feature_list, metavar="LIST",
                   help="the features shown instead, e.g. 12,40,301")
    r.add_argument("--html", action="store_true", help="also write sae_report.html: one self-contained page that "
                   "opens offline, the figure embedded, a page per feature (activation histogram, the tokens it "
                   "promotes and suppresses, its top contexts token by token)")
    r.add_argument("--text-file", metavar="FILE",
                   help="validation text (default: the validation split of the model's training corpus)")
    add_common(r)


def _sae_check(args) -> None:
    """`--out` and SAE_DIR checked before the model loads."""
    out = Path(args.out)
    if args.sae_command == "train" and out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"--out {out} exists and is not an empty folder; give a new folder (nothing is overwritten)")
    if args.sae_command == "report":
        from models.io.run_folder import check_folder

        check_folder(out, "sae-report")  # FolderError: a file, a foreign folder or another kind's, before any work
        if not Path(args.sae_dir).is_dir():
            raise UsageError(f"SAE_DIR {args.sae_dir} is not a folder")


def run_sae(args, loaded) -> int:
    return run_sae_train(args, loaded) if args.sae_command == "train" else run_sae_report(args, loaded)


def _bos(model):
    from ..sequences import bos_token_id

    return bos_token_id(model) if model.tokenizer is not None else None


def _text(loaded, args, split: str, max_tokens: int):
    """`(1-D token stream, what it is, record)`: --text-file, else the `split` ("train" / "val") of the model's
    training corpus; `record` says which text it was (`data`: the corpus name train_config.json gives, or the file;
    the corpus' name, its token counts and its cache key, a SHA-256 of its files and the tokenizer)."""
    import torch

    if args.text_file:
        return read_text_tokens(loaded.model, args.text_file, max_tokens), args.text_file, {"data": args.text_file}
    from models.data.corpora import recorded_data

    from ..report import folder_train_config, training_corpus

    corpus = training_corpus(loaded.model, loaded.folder)
    if corpus is None:
        raise UsageError(f"{loaded.name} has no training text here (no tokenizer, synthetic data or its corpus is "
                         "unavailable); pass --text-file FILE")
    arr = corpus.train if split == "train" else corpus.val
    what = f"the {'training' if split == 'train' else 'validation'} split of {corpus.name}"
    data = recorded_data(loaded.folder, folder_train_config(loaded.folder).get("data")) if loaded.folder else "stdlib"
    record = {"data": data if isinstance(data, str) else [Path(d).name for d in data], "corpus": corpus.name,
              "corpus_tokens": {"train": int(corpus.train.size), "val": int(corpus.val.size)},
              "corpus_key": corpus.folder.name if corpus.folder is not None else None,
              f"{split}_tokens_read": int(min(max_tokens, arr.size))}
    return torch.from_numpy(arr[:max_tokens].astype("int64")), what, record


def run_sae_train(args, loaded) -> int:
    from models.io.sae import check_model, save_sae
    from models.training.sae import train_sae

    out = Path(args.out)
    check_model(loaded.model, "circuits sae train")  # SAEError: exit 2, one line
    tokens, what, record = _text(loaded, args, "train", TRAIN_TOKENS)
    trained = train_sae(loaded.model, args.hook, tokens, steps=args.steps, expansion=args.expansion, l1=args.l1,
                        batch_size=args.batch_size, lr=args.lr, seed=args.seed, bos=_bos(loaded.model),
                        progress=not args.no_progress)
    trained.settings.update(text=what, **record)
    save_sae(trained, out)
    obj = {"model": loaded.name, "sae": str(out), **trained.settings}
    emit(args, obj, f"wrote {out}: SAE on {args.hook} of {loaded.name}, d_sae {trained.settings['d_sae']}, "
                    f"{args.steps} steps in {trained.seconds:.0f} s; `circuits sae report {args.model} {out} --out "
                    "DIR` measures it")
    return 0


def feature_json(f) -> dict:
    """A feature of the report as JSON: its contexts (text and token by token), logit weights and histogram."""
    def tokens(items):
        return None if items is None else [{"token": t, "logit_weight": v} for t, v in items]

    h = f.histogram
    return {"index": f.index, "frequency": f.frequency, "max_act": f.max_act,
            "contexts": [{"before": b, "token": t, "after": a, "activation": v, "tokens": c.labels, "acts": c.acts,
                          "at": c.at} for (b, t, a, v), c in zip(f.contexts, f.windows)],
            "promoted": tokens(f.promoted), "demoted": tokens(f.demoted),
            "histogram": None if h is None else {"edges": h.edges, "counts": h.counts, "zeros": h.zeros}}


def run_sae_report(args, loaded) -> int:
    import torch

    from models.files.atomic import atomic_write_text
    from models.io.readers import SAE_TRAINING_FILE, read_sae_training
    from models.io.run_folder import staged
    from models.io.sae import load_sae

    from ..sae_report import PAGES_HEADING, analyse, markdown, plot

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
        report = analyse(loaded.model, sae, win, bos, top=args.top, features=args.features, contexts=8, promoted=8,
                         before=20, after=4)
    md_path, png_path, html_path = out / "sae_report.md", out / "sae_report.png", None
    text = markdown(report, loaded.name, settings, what)  # "N windows of n_ctx tokens of ..."
    text += f"\n![feature densities and losses]({png_path.name})\n"
    with staged(out, "sae-report") as stage:  # models.io.run_folder: published in one swap, or not at all
        save_figure(plot(report, loaded.name), stage / png_path.name)
        atomic_write_text(stage / md_path.name, text)
        if args.html:
            from ..report.html import write_page
            from ..sae_page import features_html

            page = markdown(report, loaded.name, settings, what, features=False)
            page = page.replace(f"## {PAGES_HEADING}", f"![feature densities and losses]({png_path.name})\n\n"
                                f"## {PAGES_HEADING}")
            write_page(page, stage / "sae_report.html", f"SAE report: {loaded.name}", features_html(report),
                       anchor=PAGES_HEADING)
            html_path = out / "sae_report.html"
    lo, st = report.losses, report.stats
    obj = {"model": loaded.name, "sae": str(sae_dir), "report": str(md_path), "figure": str(png_path),
           "html": None if html_path is None else str(html_path), "text": what, "windows": int(win.shape[0]),
           **st, "losses": lo, "features": [feature_json(f) for f in report.features]}
    wrote = f"{md_path}, {png_path} and {html_path}" if html_path else f"{md_path} and {png_path}"
    emit(args, obj, f"wrote {wrote}: FVU {st['fvu']:.3f}, L0 {st['l0']:.1f}, dead {st['dead']}/{st['d_sae']}, "
                    f"loss clean {lo['clean']:.3f} / spliced {lo['spliced']:.3f} / zero-ablated "
                    f"{lo['zero_ablated']:.3f}, loss recovered {lo['recovered']:.1%} ({what})")
    return 0


COMMANDS = [Command("sae", "sparse autoencoders through SAELens: `sae train` on a hook point, `sae report` on one",
                    _sae_args, {DECODER: run_sae}, check=_sae_check)]

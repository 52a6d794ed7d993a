"""`circuits info | report | attention | generate`: a model's make-up, its full report, one attention pattern, and
sampling. Imports of torch and the analyses happen inside the `run_*` functions (fast `--help`)."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from models.arch.kind import DECODER, ENCODER, ENCODER_DECODER

from . import encdec_cli
from .common import (
    Command,
    UsageError,
    add_common,
    add_model,
    emit,
    parameter_counts,
    parse_head,
    positive_int,
    progress,
    read_text_tokens,
    refuse_options,
    table,
    warn,
)


# --- info ---------------------------------------------------------------------------------------------
def _info_args(p: argparse.ArgumentParser) -> None:
    add_model(p)
    add_common(p, progress=False, csv=True)


def run_info(args, loaded) -> int:

    device = loaded.device
    model, cfg = loaded.model, loaded.model.cfg
    counts = parameter_counts(model)
    hooks = model.firing_hook_names()  # not the opt-in points that are switched off
    tok = model.tokenizer
    tok_desc = None if tok is None else f"{getattr(tok, 'kind', type(tok).__name__)}, {tok.vocab_size} ids"
    card = summary = None
    if loaded.folder is not None:
        from models.errors import CheckpointError
        from models.files.safe_read import JSON_LIMIT, read_text
        from models.io.readers import read_summary

        if os.path.lexists(loaded.folder / "summary.json"):
            summary = read_summary(loaded.folder / "summary.json")
        if (loaded.folder / "card.md").is_file():
            lines = [ln.strip() for ln in read_text(loaded.folder / "card.md", JSON_LIMIT, CheckpointError, "the card",
                                                    contained=True).splitlines()]
            card = next((ln for ln in lines if ln and not ln.startswith("#")), None)
    obj = {"name": loaded.name, "source": str(loaded.folder or args.model), "config": cfg.to_dict(),
           "parameters": counts, "tokenizer": tok_desc, "hooks": hooks, "card": card,
           "final_val_loss": (summary or {}).get("final_val_loss"), "device": str(device)}
    kind = "attention-only" if cfg.attn_only or cfg.d_mlp is None else f"MLP d_mlp={cfg.d_mlp} ({cfg.act_fn})"
    lines = [f"{loaded.name}: {cfg.n_layers} layer(s) x {cfg.n_heads} head(s), d_model {cfg.d_model}, d_head "
             f"{cfg.d_head}, {kind}, n_ctx {cfg.n_ctx}, d_vocab {cfg.d_vocab}",
             f"positions {cfg.positional_embedding_type}, normalization {cfg.normalization_type}, "
             f"bias {cfg.use_bias}, dtype {cfg.dtype}, tokenizer {tok_desc or 'none'}"]
    if card:
        lines.append(card)
    if obj["final_val_loss"] is not None:
        lines.append(f"final validation loss {obj['final_val_loss']:.4f} nats")
    lines += ["", "config:"] + [f"  {k} = {v!r}" for k, v in cfg.to_dict().items() if k != "extra"]
    lines += ["", table(["component", "parameters"], [[k, v] for k, v in counts.items()])]
    lines += ["", f"{len(hooks)} hook points:"]
    lines += ["  " + h for h in hooks]
    emit(args, obj, "\n".join(lines), table=(["component", "parameters"], [[k, v] for k, v in counts.items()]))
    return 0


# --- report -------------------------------------------------------------------------------------------
def _report_args(p: argparse.ArgumentParser) -> None:
    add_model(p)
    p.add_argument("--out", required=True, metavar="DIR", help="folder for report.md and the PNG figures")
    p.add_argument("--sections", help="comma-separated section keys (default: every section that fits the model)")
    p.add_argument("--windows", type=positive_int, default=64, help="validation windows of n_ctx tokens (default 64)")
    p.add_argument("--text-file", metavar="FILE",
                   help="validation text (default: the validation split of the model's training corpus)")
    p.add_argument("--html", action="store_true",
                   help="also write report.html: one self-contained page, figures embedded, attention interactive")
    add_common(p)


def _report_sweep(args, out: Path) -> int:
    """`circuits report SWEEP_FOLDER`: the seed sweep's section (`circuits sweep`) as report.md with its figure."""
    from .train_commands import write_sweep

    if args.sections or args.html or args.text_file or args.config or args.tokenizer:
        raise UsageError(f"{args.model} is a seed sweep: its report is one section (report.md, sweep.png, "
                         "sweep.json); --sections, --html, --text-file, --config and --tokenizer do not apply")
    s, _ = write_sweep(Path(args.model), out, report_name="report.md")
    obj = {"model": str(args.model), "report": str(out / "report.md"), "sections": ["sweep"], "failed": [],
           "figures": [str(out / "sweep.png")], "analysis": s}
    emit(args, obj, f"wrote {out / 'report.md'} (seed sweep of {s['n_seeds']} seeds, 1 figure)")
    return 0


def _report_check(args) -> int | None:
    """`--sections` and `--out` checked before the model loads; a seed-sweep folder answered here (it holds no
    model)."""
    from ..report import ENCDEC_SECTIONS, SECTIONS

    keys = [s[0] for s in SECTIONS + ENCDEC_SECTIONS]
    if args.sections:
        bad = [s for s in _sections(args) if s not in keys]
        if bad:
            raise UsageError(f"unknown section(s) {', '.join(bad)}; sections: {', '.join(keys)}")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} exists and is not a folder")
    from models.io.readers import SWEEP_FILE  # not models.training.sweep: the report needs no training code

    if os.path.lexists(Path(args.model) / SWEEP_FILE):  # a sweep, even one whose sweep.json is not a file
        return _report_sweep(args, out)
    return None


def _sections(args) -> list[str] | None:
    return [s.strip() for s in args.sections.split(",") if s.strip()] if args.sections else None


def run_report(args, loaded) -> int:
    import sys

    from ..report import build_report

    out = Path(args.out)
    tokens = None
    if args.text_file:
        tokens = read_text_tokens(loaded.model, args.text_file)
    before = set(os.listdir(out)) if out.is_dir() else None
    t0 = time.perf_counter()
    try:
        report = build_report(loaded.model, out, folder=loaded.folder, name=loaded.name, tokens=tokens,
                              sections=_sections(args), n_windows=args.windows, seed=args.seed,
                              progress=not args.no_progress, num_threads=args.threads or 1, html=args.html)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: no figures without their report.md
        _remove_new_files(out, before)
        raise
    figs = [str(f) for f in report.files if f.suffix == ".png"]
    obj = {"model": loaded.name, "report": str(report.path), "sections": report.sections, "failed": report.failed,
           "seconds": report.seconds, "figures": figs}
    pages = [f for f in report.files if f.suffix == ".html"]
    if pages:
        obj["html"] = str(pages[0])
    text = (f"wrote {report.path}{''.join(f' and {p}' for p in pages)} ({len(report.sections)} sections, "
            f"{len(figs)} figures, {time.perf_counter() - t0:.0f} s)")  # wall: sections may run in two processes
    emit(args, obj, text)
    if report.failed:
        for k, v in report.failed.items():
            print(f"circuits report: section {k} failed: {v}", file=sys.stderr)
        return 1
    return 0


def _remove_new_files(out: Path, before: set | None) -> None:
    """Remove what an interrupted report wrote into `out`: the names that were not there before it began (and `out`
    itself when the report created it and it is left empty). Files that were there before are never touched."""
    if not out.is_dir():
        return
    for name in set(os.listdir(out)) - (before or set()):
        if (out / name).is_file() and not (out / name).is_symlink():
            (out / name).unlink()
    if before is None and not any(out.iterdir()):
        out.rmdir()


# --- attention ----------------------------------------------------------------------------------------
def _attention_args(p: argparse.ArgumentParser) -> None:
    add_model(p)
    p.add_argument("--text", help="the text to run (tokenized with the model's tokenizer)")
    p.add_argument("--source", help="encoder-decoder models: the source text (cross-attention patterns are drawn)")
    p.add_argument("--target", help="encoder-decoder models: the target text (default: the greedy decoding)")
    p.add_argument("--head", help="LAYER.HEAD (e.g. 1.4) or L1H4 (C0H1: a cross-attention head); default: every head")
    add_common(p, figure=True, legacy_png_out=True)


def run_attention(args, loaded) -> int:
    import torch

    refuse_options(args, loaded, ("--source", "--target"), "--text")
    model, cfg = loaded.model, loaded.model.cfg
    heads = [parse_head(args.head, cfg)] if args.head is not None else None  # --head "" is an error too
    if cfg.n_layers == 0:
        raise UsageError(f"{loaded.name} has no attention layers (n_layers = 0)")
    if model.tokenizer is None:
        raise UsageError(f"{loaded.name} has no tokenizer; pass --tokenizer TOKENIZER.json")
    if not args.text:
        raise UsageError("--text is empty")
    tokens = model.to_tokens(args.text, truncate=False)  # [1, pos], BOS first
    n_text, n_ctx = tokens.shape[1], cfg.n_ctx
    if n_text > n_ctx:  # the figure shows the model's view of the text's end
        tokens = tokens[:, -n_ctx:]
        warn(f"circuits attention: --text has {n_text} tokens, more than n_ctx={n_ctx}: showing its last {n_ctx}")
    from ..labels import token_labels

    labels = token_labels(model, tokens[0].tolist(), max_len=10)
    from ..scores import attention_patterns

    with torch.no_grad():
        pat = attention_patterns(model, tokens)[:, 0]  # [layer, head, q, k]
    heads = heads or [(l, h) for l in range(cfg.n_layers) for h in range(cfg.n_heads)]
    from models.arch.model import head_label

    from ..plots import plot_token_patterns

    def figure():
        return plot_token_patterns([pat[l, h].numpy() for l, h in heads], labels,
                                   [head_label(l, h) for l, h in heads])

    lines = [f"attention patterns of {len(heads)} head(s) on {len(labels)} tokens"]
    obj = {"tokens": list(model.to_str_tokens(tokens[0])), "text_tokens": n_text,
           "dropped_tokens": n_text - tokens.shape[1], "heads": {}}
    for l, h in heads:
        p = pat[l, h]
        top = p.argmax(-1).tolist()
        obj["heads"][head_label(l, h)] = {"pattern": [[round(float(x), 5) for x in row] for row in p],
                                     "argmax_key": top}
        if len(heads) == 1:
            lines.append("query token -> most-attended key token (weight)")
            lines += [f"  {q:>3} {labels[q]!r:<16} -> {k:>3} {labels[k]!r} ({float(p[q, k]):.2f})"
                      for q, k in enumerate(top)]
    emit(args, obj, "\n".join(lines), figure=figure)
    return 0


# --- generate -----------------------------------------------------------------------------------------
def _generate_args(p: argparse.ArgumentParser) -> None:
    add_model(p)
    p.add_argument("--prompt", help="text to continue (decoder-only models)")
    p.add_argument("--source", help="encoder-decoder models: the source text to decode (greedy by default)")
    p.add_argument("--beams", type=positive_int, help="encoder-decoder models: beam search with N beams")
    p.add_argument("--max-new-tokens", type=int, default=40, help="tokens to sample (default 40)")
    p.add_argument("--temperature", type=float, default=1.0, help="0 = greedy (default 1.0)")
    p.add_argument("--top-k", type=positive_int, help="sample from the k most likely tokens")
    p.add_argument("--top-p", type=float, help="nucleus sampling: the smallest set with this probability")
    p.add_argument("--samples", type=positive_int, default=1, help="independent samples (default 1)")
    add_common(p)


def _generate_check(args) -> None:
    if args.max_new_tokens < 0:
        raise UsageError(f"--max-new-tokens must be >= 0, got {args.max_new_tokens}")
    if not args.temperature >= 0 or args.temperature == float("inf"):  # `not >=` also refuses NaN
        raise UsageError(f"--temperature must be a number >= 0, got {args.temperature}")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        raise UsageError(f"--top-p must be in (0, 1], got {args.top_p}")


def run_generate(args, loaded) -> int:
    refuse_options(args, loaded, ("--source", "--beams"), "--prompt")
    model = loaded.model
    if model.tokenizer is None:
        raise UsageError(f"{loaded.name} has no tokenizer; pass --tokenizer TOKENIZER.json")
    import warnings

    from models.generation.generate import ContextWindowWarning

    prompt = model.to_tokens(args.prompt, truncate=False)
    n_prompt, limit = prompt.shape[1], model.cfg.positions.max_context
    seen = n_prompt if limit is None else min(n_prompt, limit)
    if seen < n_prompt:
        warn(f"circuits generate: the prompt has {n_prompt} tokens, more than n_ctx={limit}: the model sees its last "
             f"{limit} (a window that slides as tokens are generated)")
    samples = []
    bar = progress(args, args.samples, "generate")
    for i in range(args.samples):
        with warnings.catch_warnings():  # said once above
            warnings.simplefilter("ignore", ContextWindowWarning)
            ids = model.generate(prompt, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                                 top_k=args.top_k, top_p=args.top_p, seed=args.seed + i)
        bos = model.cfg.default_prepend_bos
        samples.append({"text": model.to_string(ids[0, int(bos):]), "completion": model.to_string(ids[0, n_prompt:]),
                        "tokens": ids[0].tolist()})
        bar.update()
    bar.close()
    obj = {"model": loaded.name, "prompt": args.prompt, "samples": samples,
           "context": {"prompt_tokens": n_prompt, "prompt_tokens_seen": seen, "first_token_seen": n_prompt - seen,
                       "n_ctx": limit},
           "settings": {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "top_k": args.top_k,
                        "top_p": args.top_p, "seed": args.seed}}
    text = "\n---\n".join(s["text"] for s in samples)
    emit(args, obj, text)
    return 0


COMMANDS = [
    Command("info", "a model's config, parameter counts and hook names", _info_args,
            {DECODER: run_info, ENCODER: run_info, ENCODER_DECODER: encdec_cli.encdec_info}),
    Command("report", "full circuits report (markdown + PNG figures) of a model", _report_args,
            {DECODER: run_report, ENCODER: run_report, ENCODER_DECODER: run_report}, check=_report_check),
    Command("attention", "plot attention patterns on a text", _attention_args,
            {DECODER: run_attention, ENCODER: run_attention, ENCODER_DECODER: encdec_cli.encdec_attention}),
    Command("generate", "sample a continuation of a prompt", _generate_args,
            {DECODER: run_generate, ENCODER_DECODER: encdec_cli.encdec_generate}, check=_generate_check,
            why={ENCODER: "a masked-language model fills masked positions; it does not continue a prompt"}),
]

"""`circuits patch | lens`: activation and path patching between a clean and a corrupted prompt, and the logit lens.
torch is imported inside the `run_*` functions (`circuits --help` stays fast)."""

from __future__ import annotations

import argparse

from models.arch.kind import DECODER, ENCODER, ENCODER_DECODER

from .common import (
    Command,
    UsageError,
    add_common,
    add_model,
    emit,
    need_layers,
    progress,
    table,
)

WHAT = ("resid", "heads", "paths")
METRIC_NAMES = {"logit-diff": "logit_diff", "loss": "loss", "prob": "prob"}


#: why an encoder–decoder is refused
ONE_TEXT = ("patching and the logit lens run one decoder-only text (clean and corrupted prompts); read "
            "cross-attention with `circuits paths --source ... --target ...`")


def _text_model(args, loaded):
    import matplotlib

    matplotlib.use("Agg")
    need_layers(loaded, 2 if getattr(args, "what", None) == "paths" else 1, f"{getattr(args, 'what', 'lens')}")
    if loaded.model.tokenizer is None:
        raise UsageError(f"{loaded.name} has no tokenizer; pass --tokenizer TOKENIZER.json")
    return loaded


# --- patch --------------------------------------------------------------------------------------------
def _patch_args(p: argparse.ArgumentParser) -> None:
    add_model(p)
    p.add_argument("--clean", required=True, help="the clean prompt (text)")
    p.add_argument("--corrupt", required=True, help="the corrupted prompt: the same number of tokens")
    p.add_argument("--answer", required=True,
                   help="the clean answer: one token, as text (e.g. ' b') or as its id (digits are read as an id)")
    p.add_argument("--wrong", help="the corrupted answer (one token, text or id) for the logit difference")
    p.add_argument("--what", choices=WHAT, default="heads",
                   help="resid: residual stream by layer and position; heads: each head's output, query, key, value "
                        "and pattern; paths: path patching from each head to each later head's Q, K and V "
                        "(default heads)")
    p.add_argument("--metric", choices=tuple(METRIC_NAMES),
                   help="logit-diff (default with --wrong), loss (default without) or prob of the answer")
    p.add_argument("--direction", choices=("denoising", "noising"),
                   help="denoising: corrupted run, clean activation patched in (default for resid and heads); "
                        "noising: the reverse (default for paths, as in Wang et al. 2022)")
    p.add_argument("--pos", type=int, default=-1, help="position whose next-token prediction is read (default -1)")
    p.add_argument("--top", type=int, default=12, help="cells to list (default 12)")
    add_common(p, figure=True, csv=True, legacy_png_out=True)


def _ids(text: str) -> int | str:
    return int(text) if text.strip().lstrip("-").isdigit() else text


def _patch_check(args) -> None:
    if args.top < 1:
        raise UsageError(f"--top must be >= 1, got {args.top}")


def run_patch(args, loaded) -> int:
    import torch

    from ..patching import activation_patching, answers, metric, path_patching_matrix, plot_patching
    from ..patching.inputs import prompt_tokens, token_pair

    loaded = _text_model(args, loaded)
    model = loaded.model
    clean, corrupt = token_pair(model, prompt_tokens(model, args.clean, "--clean"), prompt_tokens(model, args.corrupt,
                                                                                         "--corrupt"))
    if not -clean.shape[1] <= args.pos < clean.shape[1]:
        raise UsageError(f"--pos {args.pos} is out of range for prompts of {clean.shape[1]} tokens")
    name = METRIC_NAMES[args.metric] if args.metric else ("logit_diff" if args.wrong is not None else "loss")
    ans = answers(model, 1, _ids(args.answer), None if args.wrong is None else _ids(args.wrong), args.pos)
    met = metric(name, ans)
    direction = args.direction or ("noising" if args.what == "paths" else "denoising")
    kinds = {"resid": ["resid_pre"], "heads": ["z", "q", "k", "v", "pattern"], "paths": ["path"]}[args.what]
    bar = progress(args, len(kinds), f"patch {loaded.name}")
    results = []
    with torch.no_grad():
        for kind in kinds:
            bar.set_postfix_str(kind)
            if kind == "path":
                results.append(path_patching_matrix(model, clean, corrupt, met, direction=direction, progress=False))
            else:
                results.append(activation_patching(model, clean, corrupt, met, kind=kind, direction=direction,
                                                   progress=False))
            bar.update()
    bar.close()
    first = results[0]
    head = (f"{name} of {args.answer!r}" + (f" vs {args.wrong!r}" if args.wrong is not None else "") +
            f" at position {args.pos}: clean {first.clean_value:.4f}, corrupted {first.corrupt_value:.4f} "
            f"({direction}; share = part of the clean−corrupted difference the patched activation "
            f"{'restores' if direction == 'denoising' else 'removes'})")
    obj = {"model": loaded.name, "what": args.what, "metric": name, "direction": direction, "position": args.pos,
           "clean": first.clean_value, "corrupt": first.corrupt_value,
           "results": {r.kind: r.to_dict() for r in results}}
    lines = [head, ""]
    if args.what == "heads":
        shares = {r.kind: r.share() for r in results}
        L, H = shares["z"].shape
        rows = [[f"L{l}H{h}"] + [float(shares[k][l, h]) for k in kinds] for l in range(L) for h in range(H)]
        rows.sort(key=lambda r: -max(abs(v) for v in r[1:]))
        headers = ["head", "output (z)", "query", "key", "value", "pattern"]
    else:
        headers = ["patched", f"{name} (patched)", "share"]
        rows = [list(t) for t in first.top(first.share().numel())]
    lines.append(table(headers, rows[: args.top]))
    shown = results[0] if args.what != "heads" else _stack_heads(results)
    emit(args, obj, "\n".join(lines), table=(headers, rows), figure=lambda: plot_patching(shown))
    return 0


def _stack_heads(results):
    """The five head sweeps as one `PatchResult` with a leading 'kind' axis (one panel each, one colour scale)."""
    import torch

    from ..patching import PatchResult

    r0 = results[0]
    names = tuple({"z": "output (z)"}.get(r.kind, r.kind) for r in results)
    return PatchResult("head", r0.direction, r0.metric, ("kind", *r0.axes), (names, *r0.labels),
                       torch.stack([r.per_prompt for r in results]), r0.clean, r0.corrupt, r0.tokens)


# --- lens ---------------------------------------------------------------------------------------------
def _lens_args(p: argparse.ArgumentParser) -> None:
    add_model(p)
    p.add_argument("--text", required=True, help="the text to read (tokenized with the model's tokenizer)")
    p.add_argument("--top", type=int, default=3, help="top predictions kept per layer and position (default 3)")
    add_common(p, figure=True, csv=True, legacy_png_out=True)


def _lens_check(args) -> None:
    if args.top < 1:
        raise UsageError(f"--top must be >= 1, got {args.top}")
    if not args.text:
        raise UsageError("--text is empty")


def run_lens(args, loaded) -> int:
    from ..patching import logit_lens, plot_logit_lens
    from ..util import token_str

    loaded = _text_model(args, loaded)
    bar = progress(args, 1, f"lens {loaded.name}")
    lens = logit_lens(loaded.model, args.text, top_k=min(args.top, loaded.model.cfg.d_vocab))
    bar.update()
    bar.close()
    show = lambda i: token_str(loaded.model, int(i))
    rows = []
    for p in range(len(lens.tokens) - 1):
        row = [p, show(lens.tokens[p]), show(lens.tokens[p + 1])]
        for e in range(len(lens.labels)):
            row.append(f"{show(lens.top_ids[e, p, 0])} {float(lens.top_probs[e, p, 0]):.2f} "
                       f"| {float(lens.next_prob[e, p]):.2f}")
        rows.append(row)
    lines = ["Logit lens: the residual stream before each layer (and after the last) read through the final norm and "
             "the unembedding. Each cell: top prediction, its probability | probability of the actual next token.",
             "", table(["pos", "token", "next"] + lens.labels, rows)]
    obj = {"model": loaded.name, **lens.to_dict()}
    long = [[p, show(lens.tokens[p]), show(lens.tokens[p + 1]), label, show(lens.top_ids[e, p, 0]),
             float(lens.top_probs[e, p, 0]), float(lens.next_prob[e, p])]
            for p in range(len(lens.tokens) - 1) for e, label in enumerate(lens.labels)]
    emit(args, obj, "\n".join(lines), figure=lambda: plot_logit_lens(lens),
         table=(["pos", "token", "next", "layer", "top prediction", "top probability", "next-token probability"], long))
    return 0


COMMANDS = [
    Command("patch", "activation or path patching between a clean and a corrupted prompt", _patch_args,
            {DECODER: run_patch, ENCODER: run_patch}, check=_patch_check, why={ENCODER_DECODER: ONE_TEXT}),
    Command("lens", "the logit lens: each layer's residual stream read through the unembedding", _lens_args,
            {DECODER: run_lens, ENCODER: run_lens}, check=_lens_check, why={ENCODER_DECODER: ONE_TEXT}),
]

"""`circuits discover`: the edges of a model's graph that carry a behaviour (EAP, EAP-IG, ACDC), written as a
folder (`--out`: result.json, circuit.json, circuit.png, faithfulness.png). torch is imported inside `run`."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from models.arch.kind import DECODER, ENCODER, ENCODER_DECODER

from .common import Command, UsageError, add_common, add_model, emit, positive_int, progress, table

METHODS = ("eap", "eap-ig", "acdc")
SHIPPED = ("induction", "previous-token", "skip-trigram", "reversal", "sorting")
#: an encoder–decoder's default task, by the seq2seq task its config names (`extra["task"]`)
SEQ2SEQ_DEFAULT = {"seq2seq:reverse": "reversal", "seq2seq:sort": "sorting"}
FOLDER_KIND = "discovery"
WHY = ("edge patching reads a decoder's residual stream as a sum of its components' outputs, from the embeddings to "
       "the logits; an encoder alone has no shipped task to discover a circuit for")


def _args(p: argparse.ArgumentParser) -> None:
    add_model(p)
    p.add_argument("--task",
                   help=f"a shipped task ({', '.join(SHIPPED)}; default induction, or an encoder–decoder's own "
                        "seq2seq task: reversal, sorting) or a JSON file of prompt pairs (decoder-only models): "
                        '{"clean": [...], "corrupt": [...], "answer": ..., "wrong": ..., "metric": ...}')
    p.add_argument("--method", choices=METHODS, default="eap", help="eap (default), eap-ig or acdc")
    p.add_argument("--threshold", type=float,
                   help="ACDC's τ (default 0.01), or EAP's smallest |score| kept (default: the fewest top edges "
                        "recovering --faithfulness of the behaviour)")
    p.add_argument("--faithfulness", type=float, default=0.9,
                   help="the faithfulness EAP's default circuit reaches (0.9)")
    p.add_argument("--steps", type=positive_int, default=5, help="EAP-IG interpolation points (default 5)")
    p.add_argument("--metric", choices=("kl", "task"), default="kl",
                   help="ACDC's distance: kl (from the clean model, default) or task (the task metric)")
    p.add_argument("--ablation", choices=("corrupt", "mean"), default="corrupt",
                   help="what a removed edge carries: the corrupted prompt's output (default) or the mean output")
    p.add_argument("--n-prompts", type=positive_int, default=20, help="prompts of a shipped task (default 20)")
    p.add_argument("--seq-len", type=positive_int, default=20, help="|R| of the induction tasks (default 20)")
    p.add_argument("--corrupt-copy", choices=("first", "second", "both"), default="first",
                   help="induction: which copy of R is resampled (default first, the report's probe)")
    p.add_argument("--vocab", choices=("all", "seen"), default="all",
                   help="ids a shipped task draws from: every non-special id (default) or those seen in the pinned "
                        "training text (a text model's own tokens; needs the model's tokenizer)")
    p.add_argument("--batch", type=positive_int, default=32, help="ACDC: removals tried per pass (default 32)")
    p.add_argument("--top", type=positive_int, default=15, help="edges listed (default 15)")
    p.add_argument("--out", metavar="DIR", help="a folder: result.json, circuit.json, circuit.png, faithfulness.png")
    add_common(p, figure=True, csv=True)


def _task_file(spec: str) -> Path | None:
    path = Path(spec)
    return path if spec.endswith(".json") or path.exists() else None


def _check(args) -> None:
    from models.io.readers import read_discovery_task
    from models.io.run_folder import check_folder

    if args.task is None:
        args.task_spec = None
    elif _task_file(args.task) is not None:
        args.task_spec = read_discovery_task(_task_file(args.task))
    elif args.task not in SHIPPED:
        raise UsageError(f"unknown task {args.task!r}; tasks: {', '.join(SHIPPED)}, or a JSON file of prompt pairs")
    else:
        args.task_spec = None
    if args.threshold is not None and (not math.isfinite(args.threshold) or args.threshold < 0):
        raise UsageError(f"--threshold must be a finite number >= 0, got {args.threshold}")
    if not 0 < args.faithfulness <= 1:
        raise UsageError(f"--faithfulness must lie in (0, 1], got {args.faithfulness}")
    if args.steps > 1000:
        raise UsageError(f"--steps must be at most 1000, got {args.steps}")
    if args.out is not None:
        check_folder(args.out, FOLDER_KIND)  # a foreign or other kind of folder: refused before any work


def _task(args, model):
    from models.arch.kind import ENCODER_DECODER, model_kind

    from ..discovery import discovery_task, user_task

    spec = args.task_spec
    if model_kind(model) == ENCODER_DECODER:
        if spec is not None:
            raise UsageError(f"a task file of prompt pairs serves decoder-only models; an encoder–decoder takes the "
                             f"shipped tasks {', '.join(SEQ2SEQ_DEFAULT.values())}")
        name = args.task or SEQ2SEQ_DEFAULT.get((getattr(model.cfg, "extra", None) or {}).get("task"))
        if name is None:
            raise UsageError(f"this encoder–decoder's config names no task discovery ships; give --task "
                             f"{' or '.join(SEQ2SEQ_DEFAULT.values())}")
        return discovery_task(model, name, n_prompts=args.n_prompts, seed=args.seed)
    if spec is None:
        args.task = args.task or "induction"
        kw = {"seq_len": args.seq_len}
        if args.vocab == "seen":
            import torch

            from models.data.corpora import build_token_corpus

            if model.tokenizer is None:
                raise UsageError("--vocab seen needs the model's tokenizer; this model has none")
            kw["tokens_from"] = torch.from_numpy(build_token_corpus("stdlib", model.tokenizer).seen_ids())
        if args.task == "induction":
            kw["corrupt"] = args.corrupt_copy
        return discovery_task(model, args.task, n_prompts=args.n_prompts, seed=args.seed, **kw)
    return user_task(model, spec["clean"], spec["corrupt"], spec["answer"], spec.get("wrong"), spec.get("metric"),
                     spec.get("name", "user"))


def _write(out, result) -> None:
    import json

    from models.io.run_folder import staged

    from ..discovery.plots import plot_circuit, plot_faithfulness
    from .common import clean_json

    with staged(out, FOLDER_KIND) as stage:
        (stage / "result.json").write_text(json.dumps(clean_json(result.to_json()), indent=1) + "\n")
        circuit = [{"sender": s, "receiver": r, "score": result.scores[(s, r)]} for s, r in result.circuit]
        (stage / "circuit.json").write_text(json.dumps(clean_json(circuit), indent=1) + "\n")
        for name, fig in (("circuit.png", plot_circuit(result)), ("faithfulness.png", plot_faithfulness(result))):
            import matplotlib.pyplot as plt

            fig.savefig(stage / name, dpi=100)
            plt.close(fig)


def _digits(result) -> int:
    """Decimals that show the largest |score| to three significant digits (at least 3): EAP's scores at a nearly
    perfect model's loss are of order 1e-5."""
    top = max((abs(v) for v in result.scores.values() if math.isfinite(v)), default=0.0)
    return 3 if top == 0 or top >= 0.1 else min(12, 2 - math.floor(math.log10(top)))


def run_discover(args, loaded) -> int:
    import matplotlib

    matplotlib.use("Agg")
    from ..discovery import discover

    model = loaded.model
    task = _task(args, model)
    bar = progress(args, 1, f"discover {loaded.name} ({args.method})")
    result = discover(model, task, args.method, args.threshold, steps=args.steps, metric=args.metric,
                      ablation=args.ablation, batch=args.batch, target=args.faithfulness)
    bar.update()
    bar.close()
    obj = {"model": loaded.name, **result.to_json()}
    p = result.passes
    lines = [f"{loaded.name}, task {task.name} ({task.metric}: clean {result.values['clean']:.4g}, every edge "
             f"ablated {result.values['empty']:.4g}), {args.method}: {len(result.circuit)} of {len(result.edges)} "
             f"edges; faithfulness {result.faithfulness:.3f} (the circuit alone), {result.complement:.3f} (the graph "
             f"without it); {p['forward']} forward and {p['backward']} backward passes ({p['rows']} prompt rows)", "",
             table(["sender", "receiver", "score", "in circuit"], result.table(args.top), digits=_digits(result))]
    if args.out is not None:
        _write(args.out, result)
        obj["out"] = str(args.out)
        lines += ["", f"wrote {args.out}/ (result.json, circuit.json, circuit.png, faithfulness.png)"]
    rows = result.table()  # every edge, the largest |score| first

    def figure():
        from ..discovery.plots import plot_circuit

        return plot_circuit(result)

    emit(args, obj, "\n".join(lines), table=(["sender", "receiver", "score", "in_circuit"], rows), figure=figure)
    return 0


COMMANDS = [
    Command("discover", "circuit discovery: the edges carrying a behaviour (EAP, EAP-IG, ACDC)", _args,
            {DECODER: run_discover, ENCODER_DECODER: run_discover}, check=_check, why={ENCODER: WHY}),
]

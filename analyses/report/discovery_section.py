"""The report's circuit-discovery sections: the edges of the model's graph (`circuits.graph`) that carry a
behaviour, scored by edge attribution patching, with the faithfulness of the top-k edges measured by exact edge
patching (`analyses.discovery`) and the circuit found by hand checked in one line.

On the CPU budget of the report: the scores are gradient scores (one batched forward and backward pass, plus the
two forward passes that record the senders' clean and corrupted outputs) and the faithfulness is a handful of exact
patching runs (`KS`, each k alone and its complement, in one batched pass); no ACDC, whose cost grows with the
number of edges. Decoder-only models: EAP (Syed et al. 2023) on the path-patching section's induction probe (two
layers or more) or on the skip-trigram task (one layer: no induction circuit to find). Encoder–decoders: EAP-IG
(Hanna et al. 2024, 5 interpolation points, still one batched backward pass) on the model's own seq2seq task, because
the zoo's encoder–decoders are nearly perfect on it (a clean loss about 1e-5 nats), where the loss's gradient, and so
EAP's first-order score, is about zero whatever the edge carries.
"""

from __future__ import annotations

from circuits.graph import edge_graph

from ..discovery.methods import discover
from ..discovery.result import DiscoveryResult
from ..util import markdown_table

#: the top-k edges (by |score|) whose faithfulness the section measures (encoder–decoders, with more edges: `ENCDEC_KS`)
KS = (5, 10, 20, 40)
ENCDEC_KS = (5, 10, 20, 40, 60)
#: the circuit the structure check reads: the fewest of those top-k edges recovering this much of the behaviour
TARGET = 0.9
#: edges listed in the section's table
TOP = 10
#: EAP-IG's interpolation points on encoder–decoders
IG_STEPS = 5
#: cross-attention heads whose alignment score (the alignment section) reaches this are the hand-found ones
ALIGNED = 0.8


def ranked_circuit(model, task, steps: int | None = None, name: str = "", ks=KS) -> DiscoveryResult:
    """`discover` by EAP (`steps` None) or EAP-IG (`steps` interpolation points) with the faithfulness curve at the
    top-k sizes `ks` below the edge count only, its circuit the fewest of them reaching `TARGET` (every edge when
    none does), named `name`."""
    n = len(edge_graph(model))
    r = discover(model, task, "eap" if steps is None else "eap-ig", steps=steps or 5, target=TARGET,
                 ks=[k for k in ks if k < n])  # the whole and the empty graph are run once, for the normalisation
    r.model = name
    return r


def _ks(r: DiscoveryResult) -> str:
    return ", ".join(map(str, r.curve["k"]))


def _tables(r: DiscoveryResult, units: str) -> list[str]:
    c = r.curve
    faith = [[k, f, g] for k, f, g in zip(c["k"], c["circuit_faithfulness"], c["complement_faithfulness"])]
    return [
        f"The {TOP} edges of largest |score| ({r.method.upper()}: the first-order estimate of the change of the "
        f"{units} when the edge alone is removed; {len(r.edges)} edges in the graph):", "",
        markdown_table(["sender", "receiver", "score", "in the circuit"],
                       [[s, rr, v, "yes" if inside else "no"] for s, rr, v, inside in r.table(TOP)]), "",
        "Faithfulness of the top-k edges by exact edge patching: the metric of the top k edges run alone (every "
        "other edge carrying its corrupted value), and of the graph without them, as a share of the clean − "
        "corrupted difference (1 = the whole model's behaviour, 0 = none of it):", "",
        markdown_table(["k", "top k alone", "graph without the top k"], faith), "",
    ]


def _mark(ok: bool) -> str:
    return "yes" if ok else "**no**"


def _figure(ctx, r: DiscoveryResult, what: str) -> str:
    from ..discovery.plots import plot_circuit

    return ctx.figure(plot_circuit(r), "discovery_circuit",
                      f"The circuit of {what}: the {len(r.circuit)} top edges by {r.method.upper()} score that "
                      f"recover {r.faithfulness:.2f} of the behaviour (columns: layers; line width ∝ |score|; "
                      "colour: the input the edge enters).")


def _induction_check(ctx, r: DiscoveryResult) -> str:
    """One line: the detected previous-token heads → the induction heads' keys, the token embedding → their values,
    the induction heads → the logits, each in the circuit or not."""
    from models.arch.model import head_label

    ind, prev = ctx.detection()
    inds = [h for h in ind.heads if h[0] >= 1]
    prevs = [p for p in prev.heads if inds and p[0] < max(h[0] for h in inds)]
    if not (inds and prevs):
        return ("Known structure: the detection section finds no previous-token head feeding a later induction "
                "head, so there is no hand-found induction circuit to check.")
    c = set(r.circuit)
    lab = lambda h: head_label(*h)
    keys = [(lab(p), f"{lab(i)}.k") for i in inds for p in prevs if p[0] < i[0]]
    values = [("embed", f"{lab(i)}.v") for i in inds]
    out = [(lab(i), "logits") for i in inds]
    part = lambda es: f"{sum(e in c for e in es)}/{len(es)}: {_mark(all(e in c for e in es))}"
    return (f"Known structure (the detection section's previous-token heads {', '.join(map(lab, prevs))} and "
            f"induction heads {', '.join(map(lab, inds))}) in the {len(r.circuit)}-edge circuit: previous-token "
            f"head → induction head K {part(keys)}; token embedding → induction head V {part(values)}; induction "
            f"head → logits {part(out)}.")


def _skip_trigram_check(r: DiscoveryResult) -> str:
    """One line: the query edges carry exactly nothing (the last token is the same in both prompts), the context
    reaches the logits through keys and values."""
    q = [e for e in r.edges if e[1].endswith(".q")]
    kv = [e for e in r.circuit if e[1].endswith((".k", ".v"))]
    zero = max((abs(r.scores[e]) for e in q), default=0.0) == 0.0
    return (f"Known structure (Elhage et al. 2021: a one-layer head reads the context token through its key and "
            f"value, the last token through its query): every edge into a query scores exactly 0: "
            f"{_mark(zero)} (the last token is the same in both prompts, and a one-layer model's other positions "
            f"do not reach the last one's logits except through keys and values); {len(kv)} of the circuit's "
            f"{len(r.circuit)} edges enter a key or a value input.")


def discovery(ctx) -> str:
    """EAP on the induction probe (two layers or more) or the skip-trigram task (one layer), the top edges, the
    faithfulness of the top-k edges, the known-structure check and the circuit's figure."""
    from ..discovery.tasks import DiscoveryTask, skip_trigram_task
    from ..patching.metrics import next_token_answers
    from ..patching.report_section import induction_probe

    model = ctx.model
    if model.cfg.n_layers >= 2:
        clean, corrupt, _, n = induction_probe(model, ctx.vocab, ctx.seed)  # the path-patching section's probe
        task = DiscoveryTask("induction", clean, corrupt, next_token_answers(clean, range(n + 1, 2 * n)), "loss")
        what = (f"induction: the path-patching section's probe ({clean.shape[0]} prompts [BOS] + R + R, |R| = {n}, "
                "the first copy resampled in the corrupted prompts), the loss on the second copy")
    else:
        task = skip_trigram_task(model, n_prompts=20, seed=ctx.seed, tokens_from=ctx.vocab)
        n = None
        what = (f"skip-trigrams: {task.clean.shape[0]} prompts [BOS] + X + [t] against [BOS] + X' + [t] (the same "
                "last token, another context), the logit difference between the model's top next token on the clean "
                "prompt and its top token on the corrupted one")
    r = ranked_circuit(model, task, None, ctx.name)
    check = _induction_check(ctx, r) if n is not None else _skip_trigram_check(r)
    units = "loss (nats)" if task.metric == "loss" else "logit difference"
    p = r.passes
    return "\n".join([
        "Circuit discovery (`circuits discover`) finds the edges of the model's graph — embeddings, each head's "
        "query, key and value inputs and its output, MLPs, the logits — that carry a behaviour. Task: " + what +
        f"; clean {r.values['clean']:.3f}, every edge corrupted {r.values['empty']:.3f}. Edge attribution patching "
        f"scores every edge from {p['forward']} forward and {p['backward']} backward pass"
        + ("" if p["backward"] == 1 else "es") + f"; its circuit is the fewest top edges (among k = {_ks(r)}) whose "
        f"exact patching recovers {TARGET} of the behaviour.", "",
        *_tables(r, units),
        check, "",
        _figure(ctx, r, what.split(":")[0]),
    ])


def _alignment_check(ctx, r: DiscoveryResult) -> str:
    """One line: each hand-found alignment head (alignment score ≥ `ALIGNED`, the alignment section) reaches the
    logits in the circuit and reads its values (and keys) from the encoder."""
    scores = ctx.cache.get("alignment_scores")
    if scores is None:
        return "Known structure: the alignment section did not run, so there are no hand-found alignment heads."
    heads = [(l, h) for l in range(scores.shape[0]) for h in range(scores.shape[1]) if scores[l, h] >= ALIGNED]
    if not heads:
        return f"Known structure: no cross-attention head aligns (alignment score ≥ {ALIGNED}); nothing to check."
    c = set(r.circuit)
    enc_into = lambda l, h, part: any(s.startswith("enc.") and rr == f"dec.L{l}H{h}.{part}" for s, rr in c)
    out = [(f"dec.L{l}XH{h}", "dec.logits") in c for l, h in heads]
    vals = [enc_into(l, h, "xv") for l, h in heads]
    keys = [enc_into(l, h, "xk") for l, h in heads]
    pos_zero = max((abs(v) for (s, _), v in r.scores.items() if s.endswith("pos_embed")), default=0.0) == 0.0
    note = (" Keys that find their source position from the positions alone cannot show: the source and target "
            "positions are the same in the clean and the corrupted prompts, so every edge from a positional embedding "
            "scores exactly 0." if pos_zero and not all(keys) else "")
    return (f"Known structure (the alignment section's heads with score ≥ {ALIGNED}: "
            f"{', '.join(f'C{l}H{h}' for l, h in heads)}) in the {len(r.circuit)}-edge circuit: head → logits "
            f"{sum(out)}/{len(heads)}: {_mark(all(out))}; values from the encoder {sum(vals)}/{len(heads)}: "
            f"{_mark(all(vals))}; keys from the encoder {sum(keys)}/{len(heads)}.{note}")


def encdec_discovery(ctx) -> str:
    """EAP-IG on the model's own seq2seq task (reversal or sorting), the top edges, the faithfulness of the top-k
    edges, the alignment heads checked, and the circuit's figure."""
    from ..discovery.tasks import discovery_task

    name = {"seq2seq:reverse": "reversal", "seq2seq:sort": "sorting"}[ctx.cfg.extra["task"]]
    task = discovery_task(ctx.model, name, n_prompts=20, seed=ctx.seed)
    r = ranked_circuit(ctx.model, task, IG_STEPS, ctx.name, ENCDEC_KS)
    p = r.passes
    return "\n".join([
        "Circuit discovery (`circuits discover`) finds the edges of the model's graph — each stack's embeddings, "
        "heads (their query, key and value inputs and output) and MLPs, the cross-attention heads (queries from the "
        "decoder, keys and values from the encoder's output), the logits — that carry a behaviour. Task: "
        f"{name}, {task.clean.shape[0]} held-out sources against other held-out sources (resampled), the decoder "
        "reading the clean gold target prefix in both runs, the loss on the clean answers: "
        f"clean {r.values['clean']:.2e} nats, every edge corrupted {r.values['empty']:.3f}. EAP-IG "
        f"({IG_STEPS} interpolation points) scores every edge from {p['forward']} forward and {p['backward']} "
        "backward pass (plain EAP's gradient is about zero at so small a loss); its circuit is the fewest top edges "
        f"(among k = {_ks(r)}) whose exact patching recovers {TARGET} of the behaviour.", "",
        *_tables(r, "loss (nats)"),
        _alignment_check(ctx, r), "",
        _figure(ctx, r, name),
    ])


def fits_encdec(ctx) -> bool:
    """An encoder–decoder pre-norm model trained on reversal or sorting (the tasks discovery ships)."""
    return (ctx.cfg.normalization_position == "pre"
            and (getattr(ctx.cfg, "extra", None) or {}).get("task") in ("seq2seq:reverse", "seq2seq:sort"))


def fits_decoder(ctx) -> bool:
    """A pre-norm decoder-only model with at least one layer and one key/value head per query head."""
    cfg = ctx.cfg
    from models.arch.kind import DECODER, model_kind

    return (model_kind(ctx.model) == DECODER and cfg.n_layers >= 1 and cfg.normalization_position == "pre"
            and cfg.n_key_value_heads == cfg.n_heads)


__all__ = ["ALIGNED", "ENCDEC_KS", "IG_STEPS", "KS", "TARGET", "TOP", "discovery", "encdec_discovery", "fits_decoder",
           "fits_encdec", "ranked_circuit"]

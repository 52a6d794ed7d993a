"""`circuits heads | eigen | compose | paths | trigrams`: head scores and verdicts, eigenvalue copying scores,
composition scores, term importance and skip-trigrams. torch is imported inside the `run_*` functions."""

from __future__ import annotations

import argparse

from models.arch.kind import DECODER, ENCODER, ENCODER_DECODER

from . import encdec_cli
from .common import (
    Command,
    UsageError,
    add_common,
    add_model,
    emit,
    need_layers,
    parse_head,
    positive_int,
    progress,
    table,
    validation_windows,
)


def _text_arg(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--text-file", metavar="FILE",
                   help=f"natural text for {what} (default: the validation split of the model's training corpus)")


# --- heads --------------------------------------------------------------------------------------------
def _heads_args(p: argparse.ArgumentParser) -> None:
    add_model(p)
    p.add_argument("--threshold", type=float, default=0.4, help="score threshold of the verdicts (ARENA: 0.4)")
    _text_arg(p, "the previous-token score")
    add_common(p, figure=True, csv=True)


def _heads_check(args) -> None:
    import math

    if not math.isfinite(args.threshold):
        raise UsageError(f"--threshold must be a finite number, got {args.threshold}")


def run_heads(args, loaded) -> int:
    import textwrap

    from models.arch.model import head_label

    from ..detect import detect_induction_heads, detect_previous_token_heads
    from ..one_layer import COPYING_THRESHOLD, DIAGONAL_THRESHOLD, copying_verdict

    need_layers(loaded, 1, "heads")
    model = loaded.model
    bar = progress(args, 3, f"heads {loaded.name}")
    bar.set_postfix_str("text")
    from ..report import corpus_warning, training_corpus

    corpus = None if args.text_file else training_corpus(model, loaded.folder)
    text, text_about, vocab = validation_windows(loaded, args, 8, args.seed, corpus)
    bar.update()
    bar.set_postfix_str("previous-token")
    prev = detect_previous_token_heads(model, text, threshold=args.threshold, seed=args.seed)
    bar.update()
    bar.set_postfix_str("induction")
    ind = detect_induction_heads(model, seed=args.seed, tokens_from=vocab, prev_tokens=text,
                                 threshold=args.threshold, prefix_threshold=args.threshold)
    bar.update()
    bar.close()
    rows, heads = [], []
    for r in ind.table:
        p = prev.row(r.layer, r.head)
        verdict = [v for v in ("induction" if r.positive else "", "previous-token" if p.positive else "",
                               copying_verdict(r.ov_copying, r.ov_top1)) if v]
        rec = {"head": head_label(r.layer, r.head), "layer": r.layer, "index": r.head, "induction": r.induction,
               "induction_arena": r.induction_arena, "prefix_matching": r.prefix_matching,
               "previous_token": p.previous, "current_token": p.current, "first_token": p.first,
               "copying_behavioural": r.copying, "ov_copying": r.ov_copying, "ov_top1": r.ov_top1,
               "ov_top5": r.ov_top5,
               "k_composition_partner": head_label(*r.partner) if r.partner else None,
               "k_composition_excess": r.k_composition, "qk_same_matching": r.qk_same_matching,
               "mechanism": r.mechanism, "verdict": verdict}
        heads.append(rec)
        rows.append([rec["head"], r.induction, r.induction_arena, r.prefix_matching, p.previous, r.copying,
                     r.ov_copying, r.ov_top1, r.ov_top5, ", ".join(verdict) or "—"])
    obj = {"model": loaded.name, "heads": heads, "induction_heads": [head_label(*h) for h in ind.heads],
           "previous_token_heads": [head_label(*h) for h in prev.heads],
           "thresholds": {**ind.thresholds, **prev.thresholds, "OV copying score (Σλ/Σ|λ|)": COPYING_THRESHOLD,
                          "OV top-1 diagonal accuracy": DIAGONAL_THRESHOLD},
           "previous_token_text": text_about}
    pool = ("all non-special ids" if vocab is None else
            f"the {vocab.numel()} ids of {'--text-file' if args.text_file else 'the training split'}")
    obj["thresholds"] = {k.replace("the given ids", pool): v for k, v in obj["thresholds"].items()}
    obj["induction_probe"] = f"[BOS] + R + R, |R| = 50, batch 10, R from {pool}"
    obj["induction_arena_probe"] = ("ARENA 1.2's induction_attn_detector: mean of the whole stripe "
                                    "pattern.diagonal(1 - |R|) of [BOS] + R + R (two first-copy queries included), "
                                    "|R| = 50, batch 10, R from all non-special ids")
    crit = "; ".join(f"{k} ≥ {v}" for k, v in obj["thresholds"].items())
    headers = ["head", "induction", "ind. ARENA", "prefix-match", "prev-token", "copy behav.", "OV copying", "OV top-1",
               "OV top-5", "verdict"]

    def figure():
        import torch

        from ..plots import plot_score_panels

        grid = lambda key: torch.tensor([r[key] for r in heads], dtype=torch.float32).reshape(
            model.cfg.n_layers, model.cfg.n_heads)
        return plot_score_panels({"induction score": grid("induction"), "prefix-matching score":
                                  grid("prefix_matching"), "previous-token score": grid("previous_token"),
                                  "OV top-1 diagonal accuracy": grid("ov_top1")}, threshold=args.threshold)

    notes = [("induction", "attention from each token of the second copy of [BOS] + R + R (|R| = 50, 10 sequences) "
              f"to the token after its first occurrence; R from {pool}"),
             ("ind. ARENA", "ARENA 1.2's induction_attn_detector: the mean of the whole stripe, which adds two "
              "first-copy queries (one to BOS); R uniform over all non-special ids"),
             ("prefix-match", "the same on 25 random tokens repeated 4 times (Olsson et al.)"),
             ("prev-token", "attention to position i-1 on " + ("random tokens" if text is None else "text")),
             ("copy behav.", "Olsson's behavioural copying score in [-1, 1]: +1 raises exactly the attended token, "
              "about -0.92 raises tokens wherever it attends, -1 lowers them"),
             ("OV copying", "Σλ/Σ|λ| over the eigenvalues of W_E W_OV W_U, in [-1, 1]"),
             ("OV top-1/5", f"share of {pool} whose own logit W_E W_OV W_U raises most / among the 5 most "
              "(ARENA's diagonal accuracy); verdict 'copying' needs OV copying and top-1 over their thresholds, "
              "'OV-positive' means the eigenvalues pass but top-1 does not")]
    text_out = "\n".join([
        table(headers, rows), "",
        f"induction heads: {', '.join(obj['induction_heads']) or 'none'}; previous-token heads: "
        f"{', '.join(obj['previous_token_heads']) or 'none'}", ""]
        + [textwrap.fill(f"{k:<13} {v}", 110, subsequent_indent=" " * 14) for k, v in notes]
        + ["", textwrap.fill(f"verdicts: {crit}", 110, subsequent_indent="  ")])
    if text is not None and not args.text_file:  # one line when the text is not the corpus the card names
        obj["corpus_warning"] = corpus_warning(corpus, loaded.folder) or None
        text_out += f"\n\n{obj['corpus_warning']}" if obj["corpus_warning"] else ""
    emit(args, obj, text_out, table=(headers, rows), figure=figure)
    return 0


# --- eigen --------------------------------------------------------------------------------------------
def _eigen_args(p: argparse.ArgumentParser) -> None:
    add_model(p)
    p.add_argument("--eigenvalues", type=int, default=0, metavar="K",
                   help="also list each head's K largest full-OV eigenvalues (default 0)")
    add_common(p, figure=True, csv=True)


def _eigen_check(args) -> None:
    if args.eigenvalues < 0:
        raise UsageError(f"--eigenvalues must be >= 0, got {args.eigenvalues}")


def run_eigen(args, loaded) -> int:
    import torch

    from circuits.composition import composition_scores
    from circuits.eigen import copying_score, eigenvalues, positive_eigenvalue_fraction
    from circuits.factored import full_ov_circuit, full_qk_circuit, k_composition_circuit
    from models.arch.model import head_label

    from ..util import weight_view

    need_layers(loaded, 1, "eigen")
    m = weight_view(loaded.model)
    L, H = m.cfg.n_layers, m.cfg.n_heads
    bar = progress(args, 2 * L, f"eigen {loaded.name}")
    with torch.no_grad():
        ov_score, ov_pos, qk_score, qk_pos, eig = [], [], [], [], []
        for l in range(L):
            ov = full_ov_circuit(m, l)  # [head, d_vocab, d_vocab], factored
            ov_score.append(copying_score(ov).float().cpu())
            ov_pos.append(positive_eigenvalue_fraction(ov).float().cpu())
            if args.eigenvalues > 0:
                eig.append(eigenvalues(ov)[..., : args.eigenvalues].cpu())
            bar.update()
            qk = full_qk_circuit(m, l)
            qk_score.append(copying_score(qk).float().cpu())
            qk_pos.append(positive_eigenvalue_fraction(qk).float().cpu())
            bar.update()
        kcomp = composition_scores(m, "k").float().cpu() if L > 1 else None
    bar.close()
    heads, rows = [], []
    for l in range(L):
        for h in range(H):
            rec = {"head": head_label(l, h), "layer": l, "index": h, "ov_copying": float(ov_score[l][h]),
                   "ov_positive_fraction": float(ov_pos[l][h]), "qk_copying": float(qk_score[l][h]),
                   "qk_positive_fraction": float(qk_pos[l][h]), "k_partner": None, "k_same_matching": None}
            if l >= 1:
                partner = max(((l1, h1) for l1 in range(l) for h1 in range(H)),
                              key=lambda x: float(kcomp[x[0], x[1], l, h]))
                with torch.no_grad():
                    rec["k_partner"] = head_label(*partner)
                    rec["k_same_matching"] = float(copying_score(k_composition_circuit(m, (l, h), partner)))
            if eig:
                rec["ov_eigenvalues"] = [[round(float(z.real), 6), round(float(z.imag), 6)] for z in eig[l][h]]
            heads.append(rec)
            rows.append([rec["head"], rec["ov_copying"], rec["ov_positive_fraction"], rec["qk_copying"],
                         rec["qk_positive_fraction"], rec["k_partner"], rec["k_same_matching"]])
    obj = {"model": loaded.name, "heads": heads}
    headers = ["head", "OV copying", "OV λ>0", "QK copying", "QK λ>0", "K-comp partner", "K-comp QK same"]
    lines = [table(headers, rows),
             "", "OV copying = Σλ/Σ|λ| of the full OV circuit W_E W_V W_O W_U (+1: copies its source token; ≈ 0 for "
             "random). QK copying = Σλ/Σ|λ| of the direct-path QK circuit W_E W_Q W_Kᵀ W_Eᵀ (+1: attends to copies "
             "of the current token). K-comp QK same = Σλ/Σ|λ| of W_E W_QK (W_OV^partner)ᵀ W_Eᵀ with the earlier head "
             "it K-composes with most (+1: an induction head's 'same token matches'). λ>0: share of eigenvalues with "
             "positive real part."]
    if eig:
        lines.append("")
        for r in heads:
            vals = ", ".join(f"{re:+.3g}{im:+.3g}j" for re, im in r["ov_eigenvalues"])
            lines.append(f"{r['head']}: {vals}")
    from ..plots import plot_eigenvalues

    emit(args, obj, "\n".join(lines), table=(headers, rows), figure=lambda: plot_eigenvalues(loaded.model))
    return 0


# --- compose ------------------------------------------------------------------------------------------
def _compose_args(p: argparse.ArgumentParser) -> None:
    add_model(p)
    p.add_argument("--kind", choices=("q", "k", "v"), default="k", help="Q-, K- or V-composition (default k)")
    p.add_argument("--top", type=positive_int, default=10, help="list the N strongest pairs (default 10)")
    add_common(p, figure=True, csv=True)


def run_compose(args, loaded) -> int:
    import torch

    from circuits.composition import composition_baseline, composition_scores
    from models.arch.model import head_label

    from ..util import weight_view

    need_layers(loaded, 2, "compose")
    m = weight_view(loaded.model)
    L, H = m.cfg.n_layers, m.cfg.n_heads
    with torch.no_grad():
        scores = composition_scores(m, args.kind).float().cpu()  # [l1, h1, l2, h2]
    base = float(composition_baseline(m.cfg.d_model, m.cfg.d_head, args.kind))
    earlier = [(l, h) for l in range(L - 1) for h in range(H)]
    later = [(l, h) for l in range(1, L) for h in range(H)]
    pairs = sorted(((float(scores[a + b]), a, b) for a in earlier for b in later if a[0] < b[0]), reverse=True)
    matrix = [[float(scores[a + b]) if a[0] < b[0] else None for b in later] for a in earlier]
    obj = {"model": loaded.name, "kind": args.kind, "baseline": base,
           "earlier_heads": [head_label(*a) for a in earlier], "later_heads": [head_label(*b) for b in later],
           "scores": matrix,
           "top": [{"earlier": head_label(*a), "later": head_label(*b), "score": s, "excess": s - base}
                   for s, a, b in pairs[: args.top]]}
    k = args.kind.upper()
    lines = [f"{k}-composition scores ‖W_OV^h1 · R^h2‖ / (‖W_OV^h1‖ ‖R^h2‖) minus the random baseline {base:.4f} "
             f"(rows: earlier head h1 writes; columns: later head h2 reads with its {args.kind.upper()} input)", "",
             table(["h1 \\ h2"] + obj["later_heads"],
                   [[head_label(*a)] + [None if v is None else v - base for v in row]
                    for a, row in zip(earlier, matrix)]),
             "", f"strongest {len(obj['top'])} pairs:",
             table(["earlier", "later", "score", "score − baseline"],
                   [[t["earlier"], t["later"], t["score"], t["excess"]] for t in obj["top"]])]

    def figure():
        from ..plots import plot_composition
        from ..two_layer import composition_study

        return plot_composition(composition_study(loaded.model))

    emit(args, obj, "\n".join(lines), figure=figure,
         table=(["earlier", "later", "score", "score − baseline"],
                [[head_label(*a), head_label(*b), s, s - base] for s, a, b in pairs]))
    return 0


# --- paths --------------------------------------------------------------------------------------------
def _paths_args(p: argparse.ArgumentParser) -> None:
    add_model(p)
    p.add_argument("--windows", type=positive_int, default=8, help="text windows of n_ctx tokens (default 8)")
    p.add_argument("--top", type=positive_int, default=10, help="list the N most important single terms")
    p.add_argument("--source", help="encoder-decoder models: a source text (with --target; default: held-out pairs)")
    p.add_argument("--target", help="encoder-decoder models: the target text whose tokens are scored")
    _text_arg(p, "the losses")
    add_common(p, figure=True, csv=True)


def run_paths(args, loaded) -> int:
    import torch

    from circuits.importance import term_importance

    device = loaded.device
    if args.source is not None or args.target is not None:
        raise UsageError(f"--source/--target: only for encoder-decoder models; {loaded.name} reads --text-file")
    model = loaded.model
    if not (model.cfg.attn_only or model.cfg.d_mlp is None):
        raise UsageError(f"the path expansion is exact for attention-only models; {loaded.name} has MLPs")
    bar = progress(args, 2, f"paths {loaded.name}")
    tokens, about, _ = validation_windows(loaded, args, args.windows, args.seed)
    if tokens is None:
        from ..sequences import bos_token_id, random_tokens

        n = model.cfg.n_ctx - 1
        tokens = torch.cat([torch.full((args.windows, 1), bos_token_id(model)),
                            random_tokens(model, n, args.windows, args.seed)], 1)
        about += "; using random tokens instead (losses then say little about language)"
    bar.update()
    with torch.no_grad():
        imp = term_importance(model, tokens.to(device), per_term=True)
    bar.update()
    bar.close()
    top = sorted(imp.per_term.items(), key=lambda kv: -kv[1])[: args.top]
    obj = {"model": loaded.name, "tokens": about, "losses_by_order": list(imp.losses), "n_terms": list(imp.n_terms),
           "gains": list(imp.gains), "model_loss": imp.model_loss,
           "top_terms": [{"term": n, "loss_increase": v} for n, v in top], "per_term": imp.per_term}
    rows = [["0 (direct path)" if k == 0 else f"≤ {k}", imp.n_terms[k], loss, imp.gains[k - 1] if k else None]
            for k, loss in enumerate(imp.losses)]
    virtual = next((n for n in imp.per_term if "∘" in n), None)  # a two-head path, when the model has one
    note = "" if virtual is None else (f"; {virtual} = virtual head: {virtual.split('∘')[-1]}'s output read by "
                                       f"{virtual.split('∘')[-2]}")
    lines = [f"Term importance (attention patterns frozen) on {about}", "",
             table(["orders kept", "terms", "loss (nats)", "reduction"], rows),
             f"model loss {imp.model_loss:.4f} nats", "",
             f"largest single terms (loss increase when removed from the full expansion{note}):",
             table(["term", "loss increase"], [[n, v] for n, v in top])]
    from .figures import plot_term_importance

    emit(args, obj, "\n".join(lines),
         table=(["term", "loss increase"], sorted(([n, v] for n, v in imp.per_term.items()), key=lambda r: -r[1])),
         figure=lambda: plot_term_importance(list(imp.losses), list(imp.n_terms), imp.model_loss, top, about))
    return 0


# --- trigrams -----------------------------------------------------------------------------------------
def _trigram_args(p: argparse.ArgumentParser) -> None:
    add_model(p)
    p.add_argument("--head", required=True, help="LAYER.HEAD (e.g. 0.3) or L0H3")
    p.add_argument("--top", type=positive_int, default=20, help="number of skip-trigrams (default 20)")
    p.add_argument("--bugs", action="store_true", help="also list the skip-trigram 'bugs' the factorisation implies")
    add_common(p, figure=True, csv=True)


def run_trigrams(args, loaded) -> int:
    from models.arch.model import head_label

    from ..trigrams import skip_trigram_bugs, skip_trigrams

    need_layers(loaded, 1, "trigrams")
    layer, head = parse_head(args.head, loaded.model.cfg)
    bar = progress(args, 1, f"trigrams {loaded.name} {head_label(layer, head)}")
    t = skip_trigrams(loaded.model, layer, head, k=args.top)
    bar.update()
    bar.close()
    rows = [{"source": r.source, "destination": r.destination, "out": r.outs[0][0],
             "also": [o for o, _ in r.outs[1:]], "qk": r.qk, "ov": r.ov, "strength": r.strength, "ids": list(r.ids)}
            for r in t.rows]
    obj = {"model": loaded.name, "head": head_label(layer, head), "skip_trigrams": rows}
    headers = ["skip-trigram", "also raised", "QK", "OV", "strength"]
    cells = [[f"[{r['source']}] … [{r['destination']}] → [{r['out']}]", ", ".join(r["also"]), r["qk"], r["ov"],
              r["strength"]] for r in rows]
    lines = [f"Skip-trigrams [source] … [destination] → [out] of {head_label(layer, head)} (from the full QK and OV "
             "circuits; QK: centred attention score of the destination for the source; OV: centred logit raise of the "
             "out)", "",
             table(headers, cells)]
    if args.bugs:
        bugs = skip_trigram_bugs(t)
        obj["bugs"] = [{"kind": b.kind, "source": b.source, "destination": b.destination, "outs": b.outs,
                        "crossed": b.crossed} for b in bugs]
        lines += ["", "skip-trigram bugs (crossed predictions the factorisation forces):"]
        lines += [f"  {b.kind}: " + "; ".join(b.crossed[:6]) for b in bugs] or ["  none among these trigrams"]
    from .figures import plot_ranked_bars

    emit(args, obj, "\n".join(lines), table=(headers, cells),
         figure=lambda: plot_ranked_bars([c[0] for c in cells], [r["strength"] for r in rows],
                                         "strength = relu(centred QK) · relu(centred OV)",
                                         f"strongest skip-trigrams of {head_label(layer, head)} ({loaded.name})"))
    return 0


COMMANDS = [
    Command("heads", "every head's induction, prefix-matching, previous-token and copying scores, with verdicts",
            _heads_args, {DECODER: run_heads, ENCODER: run_heads, ENCODER_DECODER: encdec_cli.encdec_heads},
            check=_heads_check),
    Command("eigen", "OV and QK eigenvalue copying scores per head", _eigen_args,
            {DECODER: run_eigen, ENCODER: run_eigen, ENCODER_DECODER: encdec_cli.encdec_eigen}, check=_eigen_check),
    Command("compose", "Q/K/V composition scores between heads, minus the random baseline", _compose_args,
            {DECODER: run_compose, ENCODER: run_compose},
            why={ENCODER_DECODER: "composition scores are computed between the layers of one decoder-only stack; "
                                  "read cross-attention with `circuits heads`, `eigen` and `paths`"}),
    Command("paths", "term importance of the path expansion (direct, heads, virtual heads)", _paths_args,
            {DECODER: run_paths, ENCODER_DECODER: encdec_cli.encdec_paths},
            why={ENCODER: "its logits pass the masked-LM head's dense layer, activation and norm, so path terms "
                          "would not sum to them"}),
    Command("trigrams", "a head's strongest skip-trigrams", _trigram_args,
            {DECODER: run_trigrams, ENCODER: run_trigrams},
            why={ENCODER_DECODER: "skip-trigrams read one decoder-only layer's tokens attending to earlier tokens of "
                                  "the same text; use `circuits eigen` for the cross-attention OV circuits"}),
]

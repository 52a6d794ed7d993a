"""The sections of `analyses.report.build_report`. Each takes the shared `Context` and returns markdown; figures
are written with `ctx.figure(fig, name)`, which returns the markdown that embeds them. Every number shown comes
with a sentence saying what it measures."""

from __future__ import annotations

import torch

from models.arch.model import head_label

from ..labels import markdown_text
from ..util import fmt, markdown_table
from .context import Context


def _pool(ctx: Context) -> str:
    """Where the random probe tokens come from, in words."""
    if ctx.vocab is None:
        return "every non-special id"
    where = "the training split" if ctx.train_text is not None else "the given text"
    return f"the {ctx.vocab.numel()} ids of {where}"


def overview(ctx: Context) -> str:
    c = ctx.cfg
    n_params = sum(p.numel() for p in ctx.model.parameters()) if hasattr(ctx.model, "parameters") else None
    kind = "attention-only" if ctx.attn_only else f"with MLPs (d_mlp {c.d_mlp}, {c.act_fn})"
    lines = [f"`{ctx.name}` is a {c.n_layers}-layer {kind} transformer: {c.n_heads} heads per layer of width "
             f"{c.d_head}, residual width d_model = {c.d_model}, vocabulary {c.d_vocab}, context {c.n_ctx}, "
             f"positions `{c.positional_embedding_type}`, normalisation `{c.normalization_type}`"
             + (f", {n_params:,} parameters." if n_params else ".")]
    if ctx.windows is not None:
        with torch.no_grad():
            loss = float(ctx.model(ctx.windows.to(ctx.model.W_E.device), return_type="loss"))
        ctx.cache["val_loss"] = loss
        lines.append(f"On {ctx.windows.shape[0]} validation windows of {ctx.windows.shape[1]} tokens its mean "
                     f"next-token loss is **{loss:.3f} nats** (cross-entropy; lower is better; uniform guessing "
                     f"would cost ln {c.d_vocab} = {torch.log(torch.tensor(float(c.d_vocab))):.2f}).")
    else:
        lines.append("No validation text is available for this model (no tokenizer or corpus), so the sections "
                     "below use random-token probes only.")
    return "\n\n".join(lines)


def direct_path(ctx: Context) -> str:
    from ..zero_layer import bigram_table, direct_path_fit, plot_bigrams

    if ctx.text is None:
        return "Skipped: needs validation text to count bigrams."
    text, which = ((ctx.train_text, "the whole training split") if ctx.train_text is not None else
                   (ctx.text, "the given text"))
    table = bigram_table(text, ctx.cfg.d_vocab)
    fit = direct_path_fit(ctx.model, text, table=table)
    ctx.cache["bigrams"] = table
    role = ("this model *is* its direct path" if ctx.cfg.n_layers == 0 else
            "in a deeper model this is the direct-path (\"residual bigram\") term of the path expansion")
    out = [f"The direct path `W_E W_U` maps the current token straight to next-token logits; {role}. Over "
           f"{fit.n_tokens:,} bigrams of {which} (the text the direct path was fitted to):",
           f"- **bigram entropy {fit.bigram_entropy:.3f} nats**: the loss of the text's own bigram table "
           "(in-sample, so biased low: rare pairs are fitted exactly), the best any bigram model can do here;",
           f"- **direct-path loss {fit.direct_path_loss:.3f} nats**: the loss of softmax(W_E W_U) used as a "
           "bigram model on the same text;",
           f"- **frequency-weighted KL {fit.weighted_kl:.3f} nats** = Σ_a p(a) KL(P(·|a) ‖ softmax(W_E W_U)[a]), "
           "the gap between the two (0 = a perfect bigram model; the rank d_model limits it);",
           f"- **argmax agreement {fit.argmax_agreement:.1%}**: share of tokens (by frequency) whose most likely "
           "next token is the text's most frequent successor.",
           "", "The most frequent tokens and what the direct path predicts after them:", "", fit.table(), "",
           ctx.figure(plot_bigrams(ctx.model, text, table=table), "direct_path_bigrams",
                      "Left: the text's P(next | current) over its most frequent tokens; right: softmax(W_E W_U) on "
                      "the same rows and columns; each row renormalised over the shown columns, one colour scale (⏎ "
                      "newline, ␣ space).")]
    return "\n".join(out)


def attention(ctx: Context) -> str:
    from ..plots import plot_attention_patterns, plot_score_panels
    from ..scores import duplicate_token_scores, first_token_scores

    ind, prev = ctx.detection()
    L, H = ctx.cfg.n_layers, ctx.cfg.n_heads
    grid = lambda key, rows: torch.tensor([[getattr(r, key) for r in rows[l * H:(l + 1) * H]] for l in range(L)])
    ind_s, pm_s, prev_s = grid("induction", ind.table), grid("prefix_matching", ind.table), grid("previous", prev.table)
    arena = grid("induction_arena", ind.table)
    first = first_token_scores(ctx.model, ctx.windows[:8] if ctx.windows is not None else None, ctx.seed)
    dup = duplicate_token_scores(ctx.model, seed=ctx.seed, tokens_from=ctx.vocab,
                                 seq_len=min(25, (ctx.cfg.n_ctx - 1) // 4))
    panels = {"induction": ind_s, "ARENA stripe": arena, "prefix matching": pm_s, "previous token": prev_s,
              "first token": first, "duplicate token": dup}
    rows = [[head_label(l, h)] + [float(v[l, h]) for v in panels.values()] for l in range(L) for h in range(H)]
    seq = min(50, (ctx.cfg.n_ctx - 1) // 2)
    out = [f"Attention patterns on one random sequence repeated twice, [BOS] + R + R with |R| = {seq} drawn as for "
           "the induction score below: one row per layer, one column per head; a sub-diagonal line is a "
           "previous-token head, a line offset by the period in the second copy an induction head, a bright first "
           "column a head resting on the first token.", "",
           ctx.figure(plot_attention_patterns(ctx.model, seq_len=seq, seed=ctx.seed, tokens_from=ctx.vocab),
                      "attention_patterns", f"Attention patterns (rows: query position, columns: key position) on "
                      f"[BOS] + R + R, |R| = {seq}."),
           "Six behavioural scores per head, each a mean attention weight in [0, 1]:",
           f"- **induction**: from each token of the second copy of [BOS] + R + R (|R| = {seq}, 10 sequences) to "
           f"the token right after its first occurrence (threshold 0.4, ARENA's), R drawn from {_pool(ctx)} "
           "(distinct within R);",
           "- **ARENA stripe**: ARENA 1.2's `induction_attn_detector` literally, the mean of the whole stripe "
           "`pattern.diagonal(1 − |R|)`, which adds two first-copy queries (one of them to BOS) to the above, with R "
           "uniform over every non-special id of the vocabulary (ids never seen in training included);",
           "- **prefix matching** (Olsson et al.): the same on 25 random tokens repeated 4 times (shorter when the "
           "context is short), counting every earlier occurrence;",
           "- **previous token**: from position i to i − 1 on validation text (random tokens when there is none);",
           "- **first token**: to position 0, where heads with nothing to do often rest;",
           "- **duplicate token**: to earlier copies of the current token on a repeated random sequence.", "",
           markdown_table(["head"] + list(panels), rows), "",
           ctx.figure(plot_score_panels(panels), "head_scores", "The six scores as heatmaps (boxed: ≥ 0.4).")]
    return "\n".join(out)


def detection(ctx: Context) -> str:
    ind, prev = ctx.detection()
    names = lambda hs: ", ".join(head_label(*h) for h in hs) or "none"
    out = [f"**Previous-token heads: {names(prev.heads)}.** A head qualifies when it puts ≥ 0.4 of its "
           "attention on the previous token. 'Positional R²' (layer 0) is the share of the head's attention-score "
           "variance that the position-position term of its QK circuit explains (1 = purely positional; ≤ 0 when "
           "positions explain nothing).", "",
           prev.markdown(), "",
           f"**Induction heads: {names(ind.heads)}.** A head qualifies when both its induction score (R from "
           f"{_pool(ctx)}) and its prefix-matching score are ≥ 0.4 (two periods, so a positional shortcut that "
           "'looks back one period' does not pass); the ARENA-recipe induction score (R from every non-special id) "
           "stands beside it. The mechanistic columns read the weights: 'K-comp partner' is the earlier "
           "previous-token head its keys compose with most, 'K-comp − baseline' that composition score above what "
           "random heads of these shapes give, 'QK same-matching' the eigenvalue positivity Σλ/Σ|λ| of the "
           "K-composition circuit W_E W_QK (W_OV^prev)ᵀ W_Eᵀ (+1: it matches a token with itself), 'OV copying' "
           "the positivity of the head's full OV circuit (+1: it copies what it attends to). 'Mechanism' is yes "
           "when all three are positive with a previous-token partner. 'Copying (behav.)' is Olsson et al.'s "
           "behavioural copying score in [−1, 1]: +1 when the head raises exactly the token it attends to, about "
           "−0.92 when it raises tokens wherever it attends, −1 when it lowers them.", "", ind.markdown()]
    return "\n".join(out)


def copying(ctx: Context) -> str:
    from ..one_layer import copying_heads_table
    from ..plots import plot_eigenvalues

    t = copying_heads_table(ctx.model, vocab=ctx.vocab)
    ctx.cache["copying"] = t
    return "\n".join([
        f"**{len(t.heads)} of {t.copying_score.numel()} heads copy** by both measures (OV copying score ≥ "
        f"{t.threshold} and top-1 diagonal accuracy ≥ {t.diagonal}); {len(t.ov_positive)} more pass the eigenvalue "
        "score only ('OV-positive': attending to a token raises its own logit on balance, but for fewer than half "
        "of the tokens is it the most raised). The OV "
        "copying score is Σλ/Σ|λ| over the eigenvalues of the head's full OV circuit W_E W_OV W_U (+1 when "
        "attending to a token raises that token's own logit, ≈ 0 for random matrices); 'positive eigenvalues' is "
        "the share of eigenvalues with positive real part; top-1 / top-5 diagonal accuracy is the share of "
        "source tokens whose own logit is the most / among the 5 most raised"
        + (f", over the {t.n_ids} ids seen in training and over all {t.n_ids_all} non-special ids (the "
           f"{t.n_ids_all - t.n_ids} never-trained ids count there too)" if t.top1_all is not None else
           f", over {t.n_ids} non-special ids") + ".", "", t.markdown(), "",
        ctx.figure(plot_eigenvalues(ctx.model), "ov_eigenvalues",
                   "Eigenvalues of each head's full OV circuit in the complex plane (scaled to the unit circle); "
                   "heads that raise the attended token have them on the right. Colours: blue copying score ≥ 0.5 "
                   "(OV-positive; the copying verdict also needs top-1 ≥ 0.5), olive 0–0.5, red < 0.")])


def skip_trigram_section(ctx: Context) -> str:
    from ..trigrams import skip_trigram_bugs, skip_trigrams

    heads = [(0, h) for h in range(ctx.cfg.n_heads)][:8]
    vocab, note = ctx.vocab, ""
    if ctx.text is not None:  # common tokens only: rare ids give large but irrelevant circuit entries
        counts = torch.bincount(ctx.text, minlength=ctx.cfg.d_vocab)
        vocab = torch.argsort(counts, descending=True)[: min(512, int((counts > 0).sum()))]
        note = f" Tokens are restricted to the {vocab.numel()} most frequent in the validation text."
    out = ["Skip-trigrams `[source] … [destination] → [out]` read off each layer-0 head's full QK and OV circuits: "
           "the head, at the destination token, attends to the source token (QK, centred score) and raises the out "
           "token's logit (OV, centred logit raise); strength = QK · OV over their positive parts." + note]
    for l, h in heads:
        t = skip_trigrams(ctx.model, l, h, k=8, vocab=vocab)
        bugs = skip_trigram_bugs(t, ctx.cache.get("bigrams"), max_bugs=2)
        out += ["", f"**{head_label(l, h)}**", "", t.markdown()]
        for b in bugs:
            extra = f" ({len(b.unseen_in_corpus)} never occur as a bigram in the text)" if b.unseen_in_corpus else ""
            out.append(f"\n- bug ({b.kind}): {'; '.join(markdown_text(c) for c in b.crossed[:4])}{extra}")
    out.append("\nA 'shared source' bug: the OV circuit depends on the source only, so every destination that "
               "attends to it gets all its outs (the Framework's 'keep … in mind' + 'keep … at bay' ⇒ 'keep … in "
               "bay'). A 'shared destination' bug: one destination attends to several sources with different outs.")
    return "\n".join(out)


def positional(ctx: Context) -> str:
    from ..one_layer import positional_vs_content

    r = positional_vs_content(ctx.model, seed=ctx.seed, vocab=ctx.vocab)
    return ("Content independence is 1 − the mean total-variation distance between a head's attention on two "
            "unrelated random sequences: 1 means the pattern depends on positions only. Entropy is the mean "
            "entropy of its attention rows (0 = one key). Positional R² (layer 0) as above.\n\n" + r.markdown())


def ablation(ctx: Context) -> str:
    from ..one_layer import head_ablation_losses
    from ..plots import plot_ablation

    if ctx.windows is None:
        return "Skipped: needs validation text."
    r = head_ablation_losses(ctx.model, ctx.windows)
    order = sorted(((float(r.delta[l, h]), float(r.se[l, h]), head_label(l, h)) for l in range(ctx.cfg.n_layers)
                    for h in range(ctx.cfg.n_heads)), reverse=True)
    ties = [f"{a[2]} / {b[2]}" for a, b in zip(order, order[1:]) if a[0] - b[0] < 2 * max(a[1], b[1])]
    caveat = ""
    if ctx.cfg.n_layers >= 2:
        _, prev = ctx.detection()
        minor = ", ".join(f"{head_label(*h)} {float(r.delta[h]):.3f} ± {float(r.se[h]):.3f} nats" for h in prev.heads
                          if h[0] < ctx.cfg.n_layers - 1)
        caveat = ("What this ablation cannot see: with every pattern frozen, the attention a head creates in later "
                  "heads stays in place, so a head whose job is to shape later heads' queries or keys loses only what "
                  "it writes directly and through values. " + (
                      f"The previous-token head(s) ({minor}) look minor here for that reason; path patching (below) "
                      "measures their effect through the induction heads' keys." if minor else ""))
    return "\n".join([
        "Pattern-preserving ablation: each head's output is set to zero while every attention pattern stays as in "
        f"the clean run; the table gives the loss increase in nats over the clean loss {r.clean_loss:.3f}, the "
        f"mean over {r.n_sequences} validation windows spread over the text, ± its standard error over the "
        "windows (larger = the head matters more). "
        + (f"Neighbours in the ranking closer than two standard errors: {', '.join(ties)}." if ties else
           "Every neighbour in the ranking is more than two standard errors apart.") + (" " + caveat if caveat else ""),
        "", r.markdown(), "",
        ctx.figure(plot_ablation(r), "head_ablation", "Loss increase when each head is removed (patterns frozen), "
                   "± one standard error over the windows.")])


def composition(ctx: Context) -> str:
    from ..plots import plot_composition, plot_positivity
    from ..two_layer import composition_study, find_induction_circuit

    study = composition_study(ctx.model)
    prev_tokens = ctx.windows[:8] if ctx.windows is not None else None
    circ = find_induction_circuit(ctx.model, prev_tokens, ctx.vocab, ctx.seed, detections=ctx.detection())
    base = ", ".join(f"{k.upper()} {v:.3f}" for k, v in study.baselines.items())
    out = ["Composition scores ‖W_OV^{h1} W^{h2}‖ / (‖W_OV^{h1}‖ ‖W^{h2}‖) measure how much a later head h2 reads "
           "(through its queries: Q, keys: K, values: V) what an earlier head h1 writes; random heads of these "
           f"shapes score about {base}, subtracted below. The largest pairs:", "", study.markdown(3), "",
           ctx.figure(plot_composition(study), "composition", "Q-, K- and V-composition scores minus the random "
                      "baseline (rows: earlier head, columns: later head)."), "",
           f"**Induction circuit** (previous-token head → induction head): {len(circ.pairs)} pair(s).", "",
           circ.markdown() if circ.pairs else "No induction head pairs with a previous-token head.", "",
           ctx.figure(plot_positivity(circ), "qk_ov_positivity", "Each layer ≥ 1 head at (QK positivity of its "
                      "K-composition circuit, OV copying positivity); induction heads in red.")]
    return "\n".join(out)


def term_importance_section(ctx: Context) -> str:
    from ..two_layer import term_importance_by_order, virtual_head_importance

    if ctx.windows is None:
        return "Skipped: needs validation text."
    w = ctx.windows[:4]
    imp = term_importance_by_order(ctx.model, w)
    out = ["The logits split exactly into path terms once attention patterns are frozen: the direct path, one term "
           "per head, and (two layers) one virtual-head term per pair of heads in successive layers. The loss of "
           "the expansion truncated at each order, on 4 validation windows:", "", imp.markdown(), "",
           "Removing all single-head terms of one layer costs: "
           + ", ".join(f"layer {l}: {fmt(v)} nats" for l, v in imp.by_layer.items()) + "."]
    if ctx.cfg.n_layers >= 2:
        rank = virtual_head_importance(ctx.model, w)
        out += ["", "The most important individual and virtual heads (loss increase when that single term is "
                "removed; virtual heads written later ∘ earlier):", "", rank.markdown(8)]
    return "\n".join(out)


def _icl_caveat(ctx: Context, n: int, early: int, late: int) -> str:
    """Why this model's ICL score is not the paper's number, from what the report knows of its training."""
    tc = ctx.train_config
    parts = [f"its context is {n} tokens, not 512, so the two positions are {early} and {late}",
             f"its vocabulary has {ctx.cfg.d_vocab} ids"
             + (f" ({markdown_text(tc['tokenizer'])})" if tc.get("tokenizer") else "")
             + ", not a ~50k-token BPE, so the same positions cover far less text"]
    if tc.get("repeat_fraction"):
        parts.append(f"{tc['repeat_fraction']:.0%} of its training sequences carried a synthetic repeated segment, "
                     "which rewards reading the context")
    if tc.get("data", "stdlib") in ("stdlib", "python-stdlib"):
        parts.append("its text is Python source, which repeats identifiers, so some of the gain needs no "
                     "induction head")
    card = ctx.run_dir is not None and (ctx.run_dir / "card.md").is_file()
    return ("Not directly comparable with Olsson et al.'s ≈ −0.4: " + "; ".join(parts) + "."
            + (" The model card (card.md) describes its training, with any control runs." if card else ""))


def in_context(ctx: Context) -> str:
    from ..plots import plot_position_loss
    from ..scores import icl_positions, icl_windows, in_context_learning_differences, position_losses

    if ctx.windows is None:
        return "Skipped: needs validation text."
    n = ctx.windows.shape[1]
    early, late = icl_positions(n)
    # One token per window makes the score noisy, so it gets its own, larger set of windows (ICL_EXAMPLES).
    w = icl_windows(ctx.model, ctx.text, ctx.seed, n) if ctx.text is not None else ctx.windows
    per = position_losses(ctx.model, w)
    diff = in_context_learning_differences(ctx.model, w, early, late, losses=per)
    s = float(diff.mean())
    se = float(diff.std() / diff.numel() ** 0.5) if diff.numel() > 1 else float("nan")
    ctx.cache["icl"] = (s, early, late, se)
    return "\n".join([
        f"**In-context learning score {s:+.3f} ± {se:.3f} nats** (± one standard error over windows): the loss "
        f"at token {late} minus the loss at token {early} "
        f"(Olsson et al.'s tokens 500 and 50 of 512, scaled to this context of {n}), averaged over "
        f"{w.shape[0]} validation windows. More negative = later tokens are predicted better thanks to "
        "the context; Olsson et al. report a change of < 0.15 nats before induction heads form and ≈ 0.4 after.",
        "", _icl_caveat(ctx, n, early, late),
        "", ctx.figure(plot_position_loss(ctx.model, w, (early, late), losses=per), "loss_by_position",
                       "Mean loss by position in the context, unsmoothed, ± one standard error over the windows "
                       "(dashed: the two positions of the ICL score).")])


def dynamics(ctx: Context) -> str:
    from ..dynamics import BUMP_MIN, BUMP_RATIO, FORMED, plot_training_dynamics, training_dynamics

    d = training_dynamics(ctx.run_dir)
    extra, cs = [], None
    if d.checkpoints:
        from ..dynamics import checkpoint_scores

        cs = checkpoint_scores(ctx.run_dir, ctx.windows, ctx.vocab, tokenizer=getattr(ctx.model, "tokenizer", None),
                               max_checkpoints=12)
        fw = cs.formation_window()
        formed = ("never reached 0.4 on these checkpoints" if fw is None else
                  f"formed between steps {fw[0]} and {fw[1]} by the same rule")
        extra = ["", f"Re-measured on {len(cs.steps)} of the {len(d.checkpoints)} saved checkpoints (ICL score ± its "
                 f"standard error on {'no' if ctx.windows is None else ctx.windows.shape[0]} validation windows; best "
                 f"layer ≥ 1 induction score on [BOS] + R + R, R from {_pool(ctx)}); induction heads {formed}. One "
                 "token per window makes the ICL score noisy: its standard error shrinks as 1/√windows (`--windows`).",
                 "", cs.markdown()]
    return "\n".join([
        f"From the training run's `metrics.jsonl` ({len(d.val_loss)} validation points, {len(d.induction)} "
        "checkpoints with head scores, measured during training: induction scores with R from the ids seen in "
        f"training). Induction heads 'formed' between the last checkpoint where the best layer ≥ 1 induction "
        f"score was below {0.2 * FORMED:.2f} and the first where it reached {FORMED}; the ICL score 'before' is "
        "taken at the first of the two, before the onset. A loss bump is a checkpoint after which the validation "
        f"loss falls at least {BUMP_RATIO:g}× as fast per e-fold of tokens (and ≥ {BUMP_MIN} nats per e-fold "
        "faster) over the next doubling of tokens as over the previous one; a curve that only levels off has none.",
        "", d.markdown(), "",
        ctx.figure(plot_training_dynamics(d, cs), "training_dynamics", "Loss, in-context-learning score and per-head "
                   "induction scores over training (tokens seen, log scale).")] + extra)


def mlp_note(ctx: Context) -> str:
    return ("This model has MLP layers, so the weight-space circuits above (full QK/OV circuits, composition, "
            "skip-trigrams) describe the attention-only paths only — MLP paths are not included. Norm weights are "
            "folded before reading circuits, and the final norm's scale is taken from the forward pass.")


__all__ = ["Context", "markdown_table"]

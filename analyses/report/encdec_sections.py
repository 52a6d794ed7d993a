"""The report sections for encoder–decoder models (`ENCDEC_SECTIONS`; `analyses.report.build_report` picks them by
model type). Probes are held-out pairs of the model's task (`models.data.seq2seq`, named by `train_config.json`'s
`data` or the config's `extra["task"]`); each section says what its numbers measure."""

from __future__ import annotations

import torch

from circuits.cross_attention import (
    cross_copying_scores,
    cross_diagonal_accuracy,
    full_cross_ov_circuit,
    full_cross_qk_circuit,
)

from ..alignment import alignment_scores, ranked, task_alignment
from ..one_layer import DIAGONAL_THRESHOLD
from ..util import markdown_table
from .discovery_section import encdec_discovery, fits_encdec
from .run import Section

THRESHOLD = 0.9
N_PROBES = 256


def seq2seq_task(model, train_config: dict | None = None) -> dict | None:
    """`{data, task_symbols, task_min_len, task_max_len}` of the model's seq2seq task (from its run's
    `train_config.json`, else its config's `extra`), or None when neither names one."""
    tc, extra = train_config or {}, getattr(model.cfg, "extra", {}) or {}
    data = tc.get("data") if str(tc.get("data", "")).startswith("seq2seq:") else extra.get("task")
    if not data:
        return None
    n = model.cfg.n_ctx_src
    return {"data": data, "task_symbols": tc.get("task_symbols", extra.get("task_symbols", model.cfg.d_vocab_src - 3)),
            "task_min_len": tc.get("task_min_len", extra.get("task_min_len", n)),
            "task_max_len": tc.get("task_max_len", extra.get("task_max_len", n))}


def held_out_probes(model, spec: dict, n: int, seed: int = 0):
    """`(batches, rows, src, tgt, src_mask, tgt_mask, aligned or None)`: `n` held-out pairs of the task `spec`
    (`seq2seq_task`), on the model's device, with their alignment (`analyses.alignment.task_alignment`)."""
    from models.data.seq2seq import Seq2SeqBatches, make_task

    task = make_task(spec["data"], spec["task_symbols"], spec["task_min_len"], spec["task_max_len"])
    batches = Seq2SeqBatches(task, model.cfg.n_ctx_src, model.cfg.n_ctx_tgt)
    rows = batches.val_batch(n, seed=seed)
    src, tgt, src_mask, tgt_mask = (t.to(model.device) for t in batches.split(rows))
    return batches, rows, src, tgt, src_mask, tgt_mask, task_alignment(task, src, src_mask, tgt.shape[1])


def task_spec(ctx) -> dict | None:
    return seq2seq_task(ctx.model, ctx.train_config)


def probes(ctx):
    """`held_out_probes` of the report's model (`N_PROBES` pairs), cached."""
    if "encdec_probes" not in ctx.cache:
        ctx.cache["encdec_probes"] = held_out_probes(ctx.model, task_spec(ctx), N_PROBES, ctx.seed + 3)
    return ctx.cache["encdec_probes"]


def has_alignment(ctx) -> bool:
    return task_spec(ctx) is not None and probes(ctx)[-1] is not None


def shares_vocabulary(ctx) -> bool:
    c = ctx.cfg
    tok = getattr(ctx.model, "tokenizer", None)
    same = c.d_vocab_src == c.d_vocab_tgt
    if same and tok is not None and hasattr(tok, "source"):
        same = list(tok.source.tokens) == list(tok.target.tokens)
    return same


def _labels(ctx, which: str, n: int) -> list[str]:
    tok = getattr(ctx.model, "tokenizer", None)
    vocab = None if tok is None else (tok.source if which == "src" else tok.target)
    return [vocab.id_to_token(i) if vocab is not None else str(i) for i in range(n)]


def seq2seq_overview(ctx) -> str:
    c = ctx.cfg
    lines = [f"An encoder–decoder transformer: encoder {c.n_encoder_layers} × decoder {c.n_decoder_layers} layers × "
             f"{c.n_heads} heads, d_model {c.d_model}, d_head {c.d_head}, "
             f"{'attention-only' if c.attn_only else f'MLPs of {c.d_mlp}'}, {c.positional_embedding_type} "
             f"positions, normalization {c.normalization_type} ({c.normalization_position}), source vocabulary "
             f"{c.d_vocab_src}, target vocabulary {c.d_vocab_tgt}.", "",
             "Heads are named `E{layer}H{head}` (encoder self-attention), `D{layer}H{head}` (decoder self-attention) "
             "and `C{layer}H{head}` (cross-attention: queries from the decoder, keys and values from the encoder's "
             "output; pattern `[target, source]`)."]
    spec = task_spec(ctx)
    if spec is None:
        return "\n".join(lines + ["", "No seq2seq task is recorded for this model: the sections that need probe "
                                  "pairs are left out."])
    from models.data.seq2seq import exact_match

    batches, rows, *_ = probes(ctx)
    em = exact_match(ctx.model, batches, rows)
    ctx.cache["exact_match"] = em
    lens = spec["task_min_len"] if spec["task_min_len"] == spec["task_max_len"] else \
        f"{spec['task_min_len']}–{spec['task_max_len']}"
    lines += ["", f"Task `{spec['data']}`: sources of {lens} symbols out of {spec['task_symbols']}. Probes: "
              f"{len(rows)} held-out pairs (never trained on). Exact match of greedy decoding (the whole target and "
              f"EOS right): **{em:.2%}**."]
    return "\n".join(lines)


def alignment(ctx) -> str:
    """Per-head alignment scores, the alignment heads, and one probe's cross-attention patterns."""
    from ..encdec_plots import plot_cross_patterns

    _, _, src, tgt, src_mask, tgt_mask, aligned = probes(ctx)
    scores = alignment_scores(ctx.model, src, tgt, aligned, src_mask, tgt_mask)
    ctx.cache["alignment_scores"] = scores
    heads = ranked(scores, THRESHOLD)
    L, H = scores.shape
    rows = [[f"C{layer}H{head}", float(scores[layer, head])] for layer in range(L) for head in range(H)]
    _, cache = ctx.model.run_with_cache(src[:1], tgt[:1], src_mask[:1], tgt_mask[:1],
                                        names_filter=lambda n: n.endswith("cross_attn.hook_pattern"))
    n_src, n_tgt = int(src_mask[0].sum()), int(tgt_mask[0].sum()) - 1  # decoder positions predicting a token
    pats = torch.stack([cache[f"decoder.{layer}.cross_attn.hook_pattern"][0] for layer in range(L)])
    src_lab = [f"{j}:{ctx.model.tokenizer.source.id_to_token(int(t))}" if ctx.model.tokenizer else str(j)
               for j, t in enumerate(src[0, :n_src])]
    nxt = list(tgt[0, 1:n_tgt]) + [ctx.cfg.eos_token_id]
    tgt_lab = [ctx.model.tokenizer.target.id_to_token(int(t)) if ctx.model.tokenizer else str(int(t)) for t in nxt]
    fig = plot_cross_patterns(pats[..., :n_tgt, :n_src].float().cpu(), aligned[0, :n_tgt, :n_src], src_lab, tgt_lab,
                              scores)
    found = ", ".join(f"**{h.label}** ({h.score:.3f})" for h in heads) or "none"
    return "\n".join([
        "The alignment score of a cross-attention head is the attention that the decoder position predicting a target "
        "token pays to the source position(s) that token comes from (the anti-diagonal for reversal, the identity "
        "for copying, the positions holding the symbol for sorting), averaged over every predicted symbol of the "
        f"{src.shape[0]} held-out probes (1 = all attention there; a head attending uniformly over n source "
        "positions scores about 1/n).", "",
        markdown_table(["head", "alignment score"], rows), "",
        f"Alignment heads (score ≥ {THRESHOLD}): {found}.", "",
        ctx.figure(fig, "cross_attention_patterns", "Cross-attention patterns of one held-out probe; rows: the "
                   "token each decoder position predicts; red squares: the aligned source positions; shared 0–1 "
                   "colour scale."),
    ])


def symbol_ids(model) -> list[int]:
    """The source ids that are task symbols: all but a seq2seq tokenizer's specials (PAD, BOS, EOS come first);
    every id for a model without one. The ids the cross-attention diagonal accuracies count."""
    from models.data.tokenizer import CHAR_SPECIALS, Seq2SeqTokenizer

    first = len(CHAR_SPECIALS) if isinstance(getattr(model, "tokenizer", None), Seq2SeqTokenizer) else 0
    return list(range(first, model.cfg.d_vocab_src))


def cross_copying(ctx) -> str:
    """Copying scores of the full cross-attention OV circuits, and the circuits themselves."""
    from ..encdec_plots import plot_full_cross_ov

    scores = cross_copying_scores(ctx.model)
    ctx.cache["cross_copying_scores"] = scores
    ov = full_cross_ov_circuit(ctx.model).AB.detach().float().cpu()  # [layers, heads, V_src, V_tgt]
    L, H = scores.shape
    symbols = symbol_ids(ctx.model)
    acc = cross_diagonal_accuracy(ctx.model, symbols, k=(1, 5))
    top1, top5 = acc[1].float().cpu(), acc[5].float().cpu()
    rows = [[f"C{layer}H{head}", float(scores[layer, head]), float(top1[layer, head]), float(top5[layer, head])]
            for layer in range(L) for head in range(H)]
    heads = [h for h in ranked(scores, THRESHOLD) if float(top1[h.layer, h.head]) >= DIAGONAL_THRESHOLD]
    found = ", ".join(f"**{h.label}** ({h.score:.3f}, top-1 {float(top1[h.layer, h.head]):.0%})"
                      for h in heads) or "none"
    fig = plot_full_cross_ov(ov, _labels(ctx, "src", ctx.cfg.d_vocab_src), scores)
    return "\n".join([
        "The full OV circuit of a cross-attention head, `W_E_src W_V W_O W_U` `[source token, target logit]`, says "
        "how attending to a source token changes the target logits along the direct path (Elhage et al. 2021). "
        "Its copying score `Σλ/Σ|λ|` over the eigenvalues is +1 when the circuit only raises the attended token's "
        "own logit (copying), −1 when it only lowers it, about 0 for a random matrix. Top-1 / top-5 diagonal "
        f"accuracy (ARENA's measure) is the share of the {len(symbols)} symbols whose own logit the circuit raises "
        "most / among the 5 most: how many tokens map to themselves, which the eigenvalues alone do not say.", "",
        markdown_table(["head", "copying score", "top-1 diag. acc.", "top-5 diag. acc."], rows), "",
        f"Cross-attention copying heads (copying score ≥ {THRESHOLD} and top-1 diagonal accuracy ≥ "
        f"{DIAGONAL_THRESHOLD}): {found}.", "",
        ctx.figure(fig, "cross_ov_circuits", "Full OV circuits of the cross-attention heads (rows: attended source "
                   "token, columns: target logit; one symmetric colour scale)."),
    ])


def positional_qk(ctx) -> str:
    """The positional part of each cross-attention head's full QK circuit."""
    from ..encdec_plots import plot_positional_cross_qk

    parts = full_cross_qk_circuit(ctx.model, positional=True)
    pos = (parts.pos_pos.AB / ctx.cfg.d_head ** 0.5).detach().float().cpu()
    fig = plot_positional_cross_qk(pos, ctx.cfg.n_ctx_tgt, ctx.cfg.n_ctx_src)
    return "\n".join([
        "The positional part of a cross-attention head's full QK circuit, `W_pos_tgt W_Q W_Kᵀ W_pos_srcᵀ / √d_head`: "
        "the attention score of decoder position i for source position j from the positional embeddings alone, "
        "along the direct path (the encoder's and the decoder's own layers skipped). An alignment head that "
        "finds its source position from the position embeddings directly shows the alignment here (the anti-diagonal "
        "for reversal); where it does not, the positions reach the head through the encoder's or the decoder's own "
        "attention heads (the `D…[pos]` and `C…∘E…` terms of the path expansion below).", "",
        ctx.figure(fig, "cross_qk_positional", "Positional part of the full cross-attention QK circuits (rows: "
                   "decoder positions, 0 holds BOS; columns: source positions; one symmetric colour scale)."),
    ])


def term_contributions(exp, tgt, tgt_mask) -> dict[str, float]:
    """Each path term's mean contribution to the logit of the correct next target token minus its mean over the
    target vocabulary, over every predicted position (`tgt_mask`), largest |value| first."""
    nxt, keep = tgt[:, 1:], tgt_mask[:, 1:]
    out = {}
    for name in exp.terms:
        logits = exp.terms[name][:, :-1]
        centred = logits - logits.mean(-1, keepdim=True)
        out[name] = float(centred.gather(-1, nxt[..., None])[..., 0][keep].mean())
    return dict(sorted(out.items(), key=lambda kv: -abs(kv[1])))


def path_terms(ctx) -> str:
    """Path expansion of the logits: which terms carry the correct token."""
    from circuits.encdec_paths import encdec_path_expansion

    _, _, src, tgt, src_mask, tgt_mask, _ = probes(ctx)
    src, tgt, src_mask, tgt_mask = src[:64], tgt[:64], src_mask[:64], tgt_mask[:64]
    exp = encdec_path_expansion(ctx.model, src, tgt, src_mask, tgt_mask)
    rows = [[name, exp.orders[name], v] for name, v in term_contributions(exp, tgt, tgt_mask).items()]
    return "\n".join([
        "With every attention pattern and norm scale frozen from the real forward pass, the logits split exactly "
        "into one term per path (Elhage et al. 2021, path expansion; `circuits.encdec_path_expansion`): source "
        "terms `[src]`/`[src pos]` pass encoder heads `E`, one cross-attention head `C`, then decoder self-attention "
        "heads `D`; target terms pass decoder heads only. The column is each term's mean contribution to the logit "
        "of the correct next token, minus its mean over the target vocabulary (nats), over every predicted "
        f"position of {src.shape[0]} held-out probes; the terms sum to the model's logits (relative error "
        f"{exp.reconstruction_error:.1e}). The {min(10, len(rows))} largest of {len(rows)} terms:", "",
        markdown_table(["term", "heads", "correct-token logit (centred)"], rows[:10]),
    ])


def _pre_norm_attn_only(ctx) -> bool:
    c = ctx.cfg
    return c.attn_only and (c.normalization_type is None or c.normalization_position == "pre")


#: The sections of encoder–decoder models in report order (`analyses.report.run.Section`: key, title, fits(ctx),
#: run(ctx), the `ctx.cache` keys it reads and writes).
ENCDEC_SECTIONS = [
    Section("encdec_overview", "Overview", lambda c: True, seq2seq_overview, writes=frozenset({"exact_match"})),
    Section("alignment", "Cross-attention alignment heads", has_alignment, alignment,
            writes=frozenset({"alignment_scores"})),
    Section("cross_copying", "Cross-attention copying heads: OV circuits", shares_vocabulary, cross_copying,
            writes=frozenset({"cross_copying_scores"})),
    Section("cross_qk_positional", "Cross-attention QK circuits: the positional part",
            lambda c: bool(c.cfg.positions.table), positional_qk),
    Section("encdec_paths", "Path expansion of the logits",
            lambda c: _pre_norm_attn_only(c) and task_spec(c) is not None, path_terms),
    Section("encdec_discovery", "Circuit discovery: the cross-attention circuit", fits_encdec, encdec_discovery,
            reads=frozenset({"alignment_scores"})),
]

"""The encoder–decoder side of `circuits info | attention | generate | heads | eigen | paths`: each command's run
function for the kind `encoder_decoder` (the command modules list them in their `Command`s; the dispatcher calls
them with the loaded model). torch and the analyses are imported inside, as in the command modules."""

from __future__ import annotations

from .common import UsageError, emit, parameter_counts, progress, table


def refuse_decoder_option(args, option: str, instead: str) -> None:
    """`UsageError` when the decoder-only `option` (e.g. `--text`) is given: an encoder–decoder takes `instead`."""
    if getattr(args, option.lstrip("-").replace("-", "_"), None) is not None:
        raise UsageError(f"an encoder-decoder model takes {instead} TEXT, not {option}")


def _train_config(loaded) -> dict:
    from ..report import folder_train_config  # a regular file of bounded size (models.files.safe_read)

    return folder_train_config(loaded.folder)


def parse_cross_head(spec: str, cfg) -> tuple[int, int]:
    """`"C1H0"`, `"L1H0"` or `"1.0"` → a cross-attention head `(layer, head)`, checked against the decoder."""
    s = spec.strip().upper()
    try:
        if s[:1] in ("C", "L") and "H" in s:
            layer, head = (int(x) for x in s[1:].split("H", 1))
        else:
            layer, head = (int(x) for x in s.split(".", 1))
    except ValueError:
        raise UsageError(f"--head {spec!r}: expected a cross-attention head as LAYER.HEAD (e.g. 0.1) or C0H1") from None
    if not (0 <= layer < cfg.n_decoder_layers and 0 <= head < cfg.n_heads):
        raise UsageError(f"--head {spec} is out of range: decoder layers 0..{cfg.n_decoder_layers - 1}, heads "
                         f"0..{cfg.n_heads - 1}")
    return layer, head


def _source(model, text: str | None, what: str = "--source"):
    if not text:
        raise UsageError(f"{what} is empty or missing: an encoder-decoder model needs a source text")
    if model.tokenizer is None:
        raise UsageError("this model has no tokenizer: the source and target texts cannot be encoded")
    src = model.to_tokens_src(text)
    if src.shape[1] > model.cfg.n_ctx_src:
        raise UsageError(f"{what} has {src.shape[1]} symbols; this model reads at most n_ctx_src="
                         f"{model.cfg.n_ctx_src}")
    return src


def _target(model, text: str, eos: bool = False):
    """`--target` as decoder-input ids (BOS first; `eos`: EOS appended), refused in one line past n_ctx_tgt: a
    target, like a source, is one whole input (no window of it is a meaningful target)."""
    import torch

    tgt = model.to_tokens_tgt(text)
    if eos:
        tgt = torch.cat([tgt, torch.tensor([[model.cfg.eos_token_id]], device=tgt.device)], 1)
    if tgt.shape[1] > model.cfg.n_ctx_tgt:
        raise UsageError(f"--target has {tgt.shape[1]} symbols with BOS{' and EOS' if eos else ''}; this model reads "
                         f"at most n_ctx_tgt={model.cfg.n_ctx_tgt}")
    return tgt


def encdec_info(args, loaded) -> int:
    model, cfg = loaded.model, loaded.model.cfg
    counts = parameter_counts(model)
    hooks = list(model.hook_dict)
    tok = model.tokenizer
    tok_desc = None if tok is None else (f"seq2seq, source {tok.source.vocab_size} ids, target "
                                         f"{tok.target.vocab_size} ids")
    obj = {"name": loaded.name, "source": str(loaded.folder or args.model), "model_type": "encoder_decoder",
           "config": cfg.to_dict(), "parameters": counts, "tokenizer": tok_desc, "hooks": hooks,
           "device": str(model.device)}
    kind = "attention-only" if cfg.attn_only else f"MLP d_mlp={cfg.d_mlp} ({cfg.act_fn})"
    lines = [f"{loaded.name}: encoder-decoder, {cfg.n_encoder_layers} encoder + {cfg.n_decoder_layers} decoder "
             f"layer(s) x {cfg.n_heads} head(s), d_model {cfg.d_model}, d_head {cfg.d_head}, {kind}",
             f"n_ctx_src {cfg.n_ctx_src}, n_ctx_tgt {cfg.n_ctx_tgt}, d_vocab_src {cfg.d_vocab_src}, d_vocab_tgt "
             f"{cfg.d_vocab_tgt}, positions {cfg.positional_embedding_type}, normalization {cfg.normalization_type} "
             f"({cfg.normalization_position}), tokenizer {tok_desc or 'none'}",
             "", table(["component", "parameters"], [[k, v] for k, v in counts.items()]), "",
             f"{len(hooks)} hook points:"] + ["  " + h for h in hooks]
    emit(args, obj, "\n".join(lines))
    return 0


def encdec_attention(args, loaded) -> int:
    """Cross-attention patterns `[target, source]` of `--source` (and `--target`, default: the greedy decoding)."""
    import torch

    from ..encdec_plots import plot_cross_patterns

    refuse_decoder_option(args, "--text", "--source")
    model, cfg = loaded.model, loaded.model.cfg
    src = _source(model, args.source)
    if args.target is not None:
        tgt = _target(model, args.target)
    else:
        tgt = model.generate(src, cfg.n_ctx_tgt - 1)
        tgt = tgt[:, : int((tgt[0] != cfg.pad_token_id).sum())]
        tgt = tgt[:, :-1] if int(tgt[0, -1]) == cfg.eos_token_id else tgt  # the decoder's inputs
    heads = [parse_cross_head(args.head, cfg)] if args.head else None
    with torch.no_grad():
        _, cache = model.run_with_cache(src, tgt, names_filter=lambda n: n.endswith("cross_attn.hook_pattern"))
    pats = torch.stack([cache[f"decoder.{layer}.cross_attn.hook_pattern"][0] for layer in range(cfg.n_decoder_layers)])
    src_lab = [f"{j}:{model.tokenizer.source.id_to_token(int(t))}" for j, t in enumerate(src[0])]
    tgt_lab = [model.tokenizer.target.id_to_token(int(t)) for t in tgt[0]]
    pats = pats.float().cpu()
    if heads:
        (layer, head), = heads
        pats = pats[layer : layer + 1, head : head + 1]
    def figure():
        fig = plot_cross_patterns(pats, None, src_lab, tgt_lab, ylabel="decoder input (BOS first)")
        if heads:
            fig.axes[0].set_title(f"C{layer}H{head}", fontsize=9)
        return fig

    chosen = heads or [(l, h) for l in range(cfg.n_decoder_layers) for h in range(cfg.n_heads)]
    full = torch.stack([cache[f"decoder.{layer}.cross_attn.hook_pattern"][0] for layer in range(cfg.n_decoder_layers)])
    obj = {"source": model.to_string_src(src[0]), "target_input": model.to_string_tgt(tgt[0]),
           "heads": {f"C{l}H{h}": {"pattern": [[round(float(x), 5) for x in row] for row in full[l, h]],
                                   "argmax_source": full[l, h].argmax(-1).tolist()} for l, h in chosen}}
    lines = [f"cross-attention of {len(chosen)} head(s), {src.shape[1]} source x {tgt.shape[1]} target "
             "positions (rows: decoder inputs, BOS first)"]
    for name, rec in obj["heads"].items():
        lines.append(f"  {name}: most-attended source position per decoder position {rec['argmax_source']}")
    emit(args, obj, "\n".join(lines), figure=figure)
    return 0


def encdec_generate(args, loaded) -> int:
    """Decode `--source`: greedy by default, `--beams N` beam search, `--top-k` / `--top-p` sampling."""
    refuse_decoder_option(args, "--prompt", "--source")
    model = loaded.model
    src = _source(model, args.source)
    if args.top_k is not None or args.top_p is not None:
        method = "top_k" if args.top_k is not None else "top_p"
    else:
        method = "beam" if args.beams and args.beams > 1 else "greedy"
    kw = {"temperature": args.temperature or 1.0, "seed": args.seed}
    if args.top_k is not None:
        kw["top_k"] = args.top_k
    if args.top_p is not None:
        kw["top_p"] = args.top_p
    if method == "beam":
        from models.generation.seq2seq import check_beam_memory

        check_beam_memory(model, args.beams, src.shape[0], UsageError, "--beams")
        kw["beams"] = args.beams
    n = min(args.max_new_tokens, model.cfg.n_ctx_tgt - 1)
    samples = []
    bar = progress(args, args.samples, "generate")
    for i in range(args.samples):
        kw["seed"] = args.seed + i
        ids = model.generate(src, n, method=method, **kw)[0]
        ids = ids[ids != model.cfg.pad_token_id]
        body = ids[1:-1] if int(ids[-1]) == model.cfg.eos_token_id else ids[1:]
        samples.append({"text": model.to_string_tgt(body), "tokens": ids.tolist(),
                        "ended": int(ids[-1]) == model.cfg.eos_token_id})
        bar.update()
    bar.close()
    obj = {"model": loaded.name, "source": args.source, "method": method, "samples": samples,
           "settings": {"max_new_tokens": n, **{k: v for k, v in kw.items()}}}
    emit(args, obj, "\n---\n".join(s["text"] for s in samples))
    return 0


def encdec_heads(args, loaded) -> int:
    """Per cross-attention head: alignment score on held-out pairs of the model's task and OV copying score."""
    from circuits.cross_attention import check_shared_vocabulary, cross_copying_scores, cross_diagonal_accuracy
    from models.errors import ConfigError

    from ..alignment import alignment_scores
    from ..one_layer import DIAGONAL_THRESHOLD, copying_verdict
    from ..report.encdec_sections import held_out_probes, seq2seq_task, symbol_ids

    model, cfg = loaded.model, loaded.model.cfg
    spec = seq2seq_task(model, _train_config(loaded))
    align = about = None
    if spec is not None:
        *_, src, tgt, src_mask, tgt_mask, aligned = held_out_probes(model, spec, 256, args.seed)
        if aligned is not None:
            align = alignment_scores(model, src, tgt, aligned, src_mask, tgt_mask)
            about = f"256 held-out pairs of {spec['data']}"
    try:
        check_shared_vocabulary(model, "copying")
        copy = cross_copying_scores(model)
        symbols = symbol_ids(model)
        acc = cross_diagonal_accuracy(model, symbols, k=(1, 5))
    except ConfigError:
        copy = acc = symbols = None
    rows, recs = [], []
    for layer in range(cfg.n_decoder_layers):
        for head in range(cfg.n_heads):
            a = None if align is None else float(align[layer, head])
            c = None if copy is None else float(copy[layer, head])
            t1, t5 = (None, None) if acc is None else (float(acc[1][layer, head]), float(acc[5][layer, head]))
            verdict = [v for v in ("alignment" if a is not None and a >= args.threshold else "",
                                   copying_verdict(c, t1, args.threshold)) if v]
            recs.append({"head": f"C{layer}H{head}", "layer": layer, "index": head, "alignment": a,
                         "ov_copying": c, "ov_top1": t1, "ov_top5": t5, "verdict": verdict})
            rows.append([f"C{layer}H{head}", a, c, t1, t5, ", ".join(verdict) or "—"])
    obj = {"model": loaded.name, "model_type": "encoder_decoder", "heads": recs, "threshold": args.threshold,
           "alignment_probe": about}
    notes = [f"alignment: attention on the source position each predicted token comes from, on {about}"
             if about else "alignment: — (no task with aligned source positions recorded for this model)",
             "OV copying: Σλ/Σ|λ| over the eigenvalues of W_E_src W_V W_O W_U" +
             ("" if copy is not None else " — (source and target vocabularies differ)"),
             "OV top-1/5: share of the " + (f"{len(symbols)} symbols" if symbols else "symbols") + " whose own logit "
             "W_E_src W_V W_O W_U raises most / among the 5 most (ARENA's diagonal accuracy)",
             f"verdicts: alignment score ≥ {args.threshold}; 'copying' needs OV copying ≥ {args.threshold} and OV "
             f"top-1 ≥ {DIAGONAL_THRESHOLD}, 'OV-positive' the eigenvalues only"]
    headers = ["head", "alignment", "OV copying", "OV top-1", "OV top-5", "verdict"]

    def figure():
        import torch

        from ..plots import plot_score_panels

        grid = lambda key: torch.tensor([float("nan") if r[key] is None else r[key] for r in recs]).reshape(
            cfg.n_decoder_layers, cfg.n_heads)
        return plot_score_panels({"alignment score": grid("alignment"), "OV copying score": grid("ov_copying"),
                                  "OV top-1 diagonal accuracy": grid("ov_top1")}, threshold=args.threshold)

    emit(args, obj, "\n".join([table(headers, rows), ""] + notes), table=(headers, rows), figure=figure)
    return 0


def encdec_eigen(args, loaded) -> int:
    """Copying scores and positive-eigenvalue fractions of the cross-attention and decoder self-attention
    full OV circuits."""
    from circuits.cross_attention import check_shared_vocabulary, stack_view
    from circuits.eigen import copying_score, eigenvalues, positive_eigenvalue_fraction
    from circuits.factored import full_ov_circuit

    model = loaded.model
    check_shared_vocabulary(model, "eigen")
    recs, rows = [], []
    for stack, tag in (("cross", "C"), ("decoder", "D")):
        ov = full_ov_circuit(stack_view(model, stack))
        cs, pos, lam = copying_score(ov), positive_eigenvalue_fraction(ov, weighted=True), eigenvalues(ov)
        for layer in range(cs.shape[0]):
            for head in range(cs.shape[1]):
                rec = {"head": f"{tag}{layer}H{head}", "ov_copying": float(cs[layer, head]),
                       "positive_fraction": float(pos[layer, head])}
                if args.eigenvalues:
                    rec["eigenvalues"] = [[float(z.real), float(z.imag)] for z in lam[layer, head, : args.eigenvalues]]
                recs.append(rec)
                rows.append([rec["head"], rec["ov_copying"], rec["positive_fraction"]])
    obj = {"model": loaded.name, "model_type": "encoder_decoder", "heads": recs}
    headers = ["head", "OV copying", "positive |λ| share"]
    text = "\n".join([table(headers, rows), "",
                      "C = cross-attention (W_E_src W_OV W_U), D = decoder self-attention (W_E_tgt W_OV W_U); "
                      "OV copying Σλ/Σ|λ|; positive |λ| share Σ_{Re λ>0}|λ| / Σ|λ|"])

    def figure():
        import torch

        from ..plots import plot_score_panels

        L, H = model.cfg.n_decoder_layers, model.cfg.n_heads
        grid = lambda tag: torch.tensor([r["positive_fraction"] for r in recs if r["head"][0] == tag]).reshape(L, H)
        return plot_score_panels({"cross-attention: positive |λ| share": grid("C"),
                                  "decoder self-attention: positive |λ| share": grid("D")}, threshold=None)

    emit(args, obj, text, table=(headers, rows), figure=figure)
    return 0


def encdec_paths(args, loaded) -> int:
    """Path expansion on `--source`/`--target` texts or held-out pairs of the model's task."""
    import torch

    from circuits.encdec_paths import encdec_path_expansion

    from ..report.encdec_sections import held_out_probes, seq2seq_task, term_contributions

    model = loaded.model
    if args.source is not None:
        src = _source(model, args.source)
        if args.target is None:
            raise UsageError("--source needs --target (the target text whose tokens are scored)")
        tgt = _target(model, args.target, eos=True)
        src_mask, tgt_mask, about = None, torch.ones_like(tgt, dtype=torch.bool), "--source/--target"
    else:
        spec = seq2seq_task(model, _train_config(loaded))
        if spec is None:
            raise UsageError("this model records no seq2seq task: pass --source TEXT --target TEXT")
        *_, src, tgt, src_mask, tgt_mask, _ = held_out_probes(model, spec, args.windows, args.seed)
        about = f"{args.windows} held-out pairs of {spec['data']}"
    with torch.no_grad():
        exp = encdec_path_expansion(model, src, tgt, src_mask, tgt_mask)
    contrib = term_contributions(exp, tgt, tgt_mask)
    top = list(contrib.items())[: args.top]
    obj = {"model": loaded.name, "pairs": about, "n_terms": len(contrib), "reconstruction_error":
           exp.reconstruction_error, "top_terms": [{"term": n, "heads": exp.orders[n], "correct_logit": v}
                                                   for n, v in top]}
    lines = [f"Path expansion (attention patterns frozen) on {about}: {len(contrib)} terms, summing to the logits "
             f"(relative error {exp.reconstruction_error:.1e})", "",
             "largest terms by their mean contribution to the correct next token's logit (centred over the target "
             "vocabulary); C0H1∘E0H0[src] = source tokens through encoder head E0H0, then cross-attention head C0H1:",
             table(["term", "heads", "correct logit"], [[n, exp.orders[n], v] for n, v in top])]
    from .figures import plot_ranked_bars

    emit(args, obj, "\n".join(lines),
         table=(["term", "heads", "correct logit"], [[n, exp.orders[n], v] for n, v in contrib.items()]),
         figure=lambda: plot_ranked_bars([n for n, _ in top], [v for _, v in top],
                                         "mean contribution to the correct token's logit (centred)",
                                         f"largest path terms of {loaded.name} on {about}"))
    return 0

"""Model cards of encoder–decoder models trained on a `models.data.seq2seq` task (`circuits train --preset
enc-dec-reverse`): exact match on held-out sources, each cross-attention head's alignment score and the copying score of
its OV circuit, and the training curve.

- alignment score of a cross-attention head: the mean, over held-out target tokens, of the attention that the decoder
  position predicting the token pays to the source positions the token comes from (`Task.alignment`: the
  anti-diagonal for reversal; for sorting, the positions holding the symbol);
- copying score of a cross-attention head: `circuits.eigen.copying_score` of its full OV circuit
  `W_E_src W_V W_O W_U` (Elhage et al. 2021), meaningful where source and target share their ids (copy, reverse, sort).
"""

from __future__ import annotations

import json

import numpy as np
import torch

from .train_metrics import hardware, png_bytes

ALIGNED = {"reverse": "the anti-diagonal", "copy": "the diagonal", "sort": "any position holding the symbol"}


@torch.no_grad()
def cross_alignment_scores(model, batches, rows) -> torch.Tensor | None:
    """`[n_decoder_layers, n_heads]` alignment scores (`analyses.alignment.alignment_scores`) on `rows` of `batches`,
    or None when the task's targets are not a rearrangement of its sources."""
    from .alignment import alignment_scores, task_alignment

    src, tgt, src_mask, tgt_mask = (t.to(model.device) for t in batches.split(rows))
    aligned = task_alignment(batches.task, src, src_mask, tgt.shape[1])
    if aligned is None:
        return None
    return alignment_scores(model, src, tgt, aligned, src_mask, tgt_mask).float()


def seq2seq_curve_png(metrics: list[dict], title: str) -> bytes:
    """Train / held-out loss and held-out exact match against training steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    for key, style, label in (("train_loss", "-", "train"), ("val_loss", "o-", "held-out (teacher forcing)")):
        points = [(r["step"], r[key]) for r in metrics if key in r]
        if points:
            ax[0].plot(*zip(*points), style, ms=3, lw=1, label=label)
    ax[0].set_yscale("log")
    ax[0].set_xlabel("step")
    ax[0].set_ylabel("loss (nats/token)")
    ax[0].legend()
    ax[0].set_title(title)
    em = [(r["step"], r["exact_match"]) for r in metrics if "exact_match" in r]
    if em:
        ax[1].plot(*zip(*em), "o-", ms=3)
    ax[1].set_ylim(-0.02, 1.02)
    ax[1].set_xlabel("step")
    ax[1].set_ylabel("fraction of held-out sequences")
    ax[1].set_title("exact match of greedy decoding (held-out)")
    return png_bytes(fig)


def _heads(t: torch.Tensor) -> str:
    return "; ".join(f"layer {layer}: " + ", ".join(f"{float(v):.3f}" for v in row) for layer, row in enumerate(t))


def cross_diagonal_line(model, numbers: dict) -> str:
    """The card line (and `numbers` entries) of the cross-attention OV circuits' top-1 / top-5 diagonal accuracy
    over the task's symbols (`circuits.cross_diagonal_accuracy`; the specials PAD, BOS, EOS left out)."""
    from circuits.cross_attention import cross_diagonal_accuracy

    from .report.encdec_sections import symbol_ids

    ids = symbol_ids(model)
    acc = cross_diagonal_accuracy(model, ids, k=(1, 5))
    for k in (1, 5):
        numbers[f"cross_top{k}_diagonal_accuracy"] = [[round(float(v), 4) for v in r] for r in acc[k].float().cpu()]
    return (f"- top-1 / top-5 diagonal accuracy of the same circuits over the {len(ids)} symbols (the share whose own "
            f"logit is raised most / among the 5 most): top-1 {_heads(acc[1].float().cpu())}; top-5 "
            f"{_heads(acc[5].float().cpu())}")


def make_seq2seq_report_fn(name: str, about: str, command: str, cfg, n_check: int = 2048):
    """`report_fn(model, summary, metrics) -> {"card.md", "training_curve.png", "measured.json"}` for
    `models.training.loop.train` on a seq2seq task (`n_check` held-out sources measured at the end)."""

    def report_fn(model, summary, metrics) -> dict:
        from models.data.seq2seq import Seq2SeqBatches, exact_match, make_task

        c = model.cfg
        batches = Seq2SeqBatches(make_task(cfg.data, cfg.task_symbols, cfg.task_min_len, cfg.task_max_len),
                                 c.n_ctx_src, c.n_ctx_tgt)
        rows = batches.val_batch(n_check, seed=2)
        model.eval()
        numbers = {"exact_match_held_out": exact_match(model, batches, rows), "held_out_sequences": n_check,
                   "final_val_loss": summary.get("final_val_loss")}
        align = cross_alignment_scores(model, batches, rows)
        lines = [f"- exact match of greedy decoding on {n_check:,} held-out sources: "
                 f"**{numbers['exact_match_held_out']:.2%}**",
                 f"- held-out loss (teacher forcing): {summary.get('final_val_loss', float('nan')):.2e} nats/token"]
        if align is not None:
            numbers["cross_alignment_scores"] = [[round(float(v), 4) for v in r] for r in align]
            lines.append(f"- cross-attention alignment scores (attention on the source positions the predicted token "
                         f"comes from: {ALIGNED[batches.task.name]}), per head: {_heads(align)} (max "
                         f"**{float(align.max()):.3f}**)")
        if c.d_vocab_src == c.d_vocab_tgt and batches.task.name != "date":
            from circuits.cross_attention import cross_copying_scores

            cs = cross_copying_scores(model).float().cpu()
            numbers["cross_copying_scores"] = [[round(float(v), 4) for v in r] for r in cs]
            lines.append(f"- copying scores Σλ/Σ|λ| of the cross-attention OV circuits W_E_src W_V W_O W_U: "
                         f"{_heads(cs)} (min **{float(cs.min()):.3f}**)")
            lines.append(cross_diagonal_line(model, numbers))
        from models.training.state import step_dir

        shipped = [s for s in cfg.keep_checkpoints or () if cfg.out_dir and step_dir(cfg.out_dir, s).is_dir()]
        tok_s = [r["tokens_per_s"] for r in metrics if "tokens_per_s" in r]
        numbers.update(wall_time_s=summary["wall_time"], tokens_per_s_median=float(np.median(tok_s)) if tok_s else None)
        arch = (f"encoder {c.n_encoder_layers} × decoder {c.n_decoder_layers} layers × {c.n_heads} heads, d_model "
                f"{c.d_model}, d_head {c.d_head}, {'attention-only' if c.attn_only else f'MLP d_mlp {c.d_mlp}'}, "
                f"{c.positional_embedding_type} positions, normalization {c.normalization_type} "
                f"({c.normalization_position}), biases {'on' if c.use_bias else 'off'}, n_ctx_src {c.n_ctx_src}, "
                f"n_ctx_tgt {c.n_ctx_tgt}, d_vocab_src {c.d_vocab_src}, d_vocab_tgt {c.d_vocab_tgt}")
        lens = f"{cfg.task_min_len}–{cfg.task_max_len}" if cfg.task_min_len != cfg.task_max_len else cfg.task_min_len
        decode = ("teacher forcing" if cfg.sampling_schedule == "none" else
                  f"scheduled sampling ({cfg.sampling_schedule}, up to {cfg.sampling_max:g})")
        text = [f"# {name}", "", about, "", "## Model", "", f"- {arch}",
                f"- parameters: {sum(p.numel() for p in model.parameters()):,}", "", "## Training", "",
                f"- data: `{cfg.data}`, sources of {lens} symbols out of {cfg.task_symbols} (models.data.seq2seq); "
                "held-out split: sources whose CRC-32 is 0 mod 10, never trained on",
                f"- {summary['steps']} steps × batch {cfg.batch_size} ({summary['tokens_seen']:,} source + target "
                f"positions, padding included); {decode}; AdamW lr {cfg.lr} (warm-up {cfg.warmup_steps}, cosine to "
                f"{cfg.lr * cfg.min_lr_ratio:g}), weight decay {cfg.weight_decay}, clip {cfg.grad_clip}, label "
                f"smoothing {cfg.label_smoothing}, random seed: {cfg.seed}",
                f"- wall time: {summary['wall_time']:.1f} s, median {numbers['tokens_per_s_median'] or 0:,.0f} "
                f"positions/s on {hardware()} (device {summary['device']}, shared machine)",
                f"- command: `{command}`", "", "## Measured (final model)", "", *lines, "",
                "Files: config.json, model.safetensors, tokenizer.json (source and target characters), metrics.jsonl "
                "(train/held-out loss, exact match at checkpoints), training_curve.png, train_config.json, "
                "summary.json, measured.json" + (f", checkpoints/ (steps {', '.join(map(str, shipped))})"
                                                 if shipped else "") + ".", ""]
        summary["card_numbers"] = numbers
        return {"card.md": "\n".join(text), "training_curve.png": seq2seq_curve_png(metrics, name),
                "measured.json": json.dumps(numbers, indent=1)}

    return report_fn

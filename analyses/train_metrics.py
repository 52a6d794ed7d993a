"""Training-time measurements and model cards, built from `analyses.scores` for `models.training.loop.train`.

`make_eval_fn(...)` returns the `eval_fn(model) -> dict` callback that `models.training.loop.train` calls at every
checkpoint (models/ never imports analyses/): each head's induction score on `[BOS] + R + R` (|R| = 50 and
a second period), each head's previous-token score on validation text, and the in-context-learning score
(loss at token late − loss at token early, positions scaled from Olsson et al.'s 50 and 500 of 512).
`make_report_fn(...)` returns the `report_fn` that writes `card.md` and `training_curve.png`.
"""

from __future__ import annotations

import io
import platform

import numpy as np
import torch


def _rounded(t: torch.Tensor) -> list:
    return [[round(float(x), 4) for x in row] for row in t]


def make_eval_fn(tokenizer, val_tokens, seen_ids, periods=(50,), batch: int = 16, seed: int = 0,
                 pattern_sequences: int = 32):
    """`eval_fn(model) -> dict` of the checkpoint scores (see the module docstring).

    `val_tokens [n, T]`: validation sequences starting with BOS (natural text): all of them for the ICL score
    (one token per sequence, so it needs hundreds), the first `pattern_sequences` for previous-token scores;
    `seen_ids`: the training ids that random probe tokens are drawn from (specials excluded)."""
    from .scores import icl_positions, in_context_learning_differences, induction_scores, previous_token_scores

    val = torch.as_tensor(np.asarray(val_tokens), dtype=torch.long)
    seen = torch.as_tensor(np.asarray(seen_ids), dtype=torch.long)

    @torch.no_grad()
    def eval_fn(model) -> dict:
        had = model.tokenizer
        model.tokenizer = model.tokenizer or tokenizer  # the probes' BOS and specials come from it
        try:
            out = {}
            early, late = icl_positions(min(model.cfg.n_ctx, val.shape[1]))
            diff = in_context_learning_differences(model, val.to(model.W_E.device), early, late)
            out["icl_score"] = round(float(diff.mean()), 4)
            out["icl_score_se"] = round(float(diff.std() / diff.numel() ** 0.5), 4) if diff.numel() > 1 else None
            if model.cfg.n_layers == 0:
                return out
            for p in periods:
                if 1 + 2 * p > model.cfg.n_ctx:
                    continue
                s = induction_scores(model, seq_len=p, batch=batch, seed=seed, tokens_from=seen)
                out[f"induction_scores_{p}"] = _rounded(s)
                out[f"max_induction_{p}"] = round(float(s[-1].max()), 4)
            prev = previous_token_scores(model, val[:pattern_sequences].to(model.W_E.device))
            out["previous_token_scores"] = _rounded(prev)
            out["max_previous_token"] = round(float(prev.max()), 4)
            return out
        finally:
            model.tokenizer = had

    return eval_fn


def eval_inputs(cfg, model_cfg, n_sequences: int | None = None):
    """(tokenizer, `n_sequences` validation sequences, seen ids, corpus) for `make_eval_fn`, from a
    `TrainConfig`'s data (default `analyses.scores.ICL_EXAMPLES` sequences)."""
    from models.training.loop import build_data

    from .scores import ICL_EXAMPLES

    n_sequences = ICL_EXAMPLES if n_sequences is None else n_sequences
    batches, tok, corpus = build_data(cfg, model_cfg)
    val = batches.val_batch(n_sequences)
    seen = corpus.seen_ids() if corpus is not None else batches.pool
    return tok, val, seen, corpus


# --- training curve ---------------------------------------------------------------------------------
def loss_labels(cfg) -> tuple[str, str]:
    """Legend labels of a run's (train, validation) loss curves from its own `TrainConfig` (None: plain labels):
    what the training sequences held and what the validation text is."""
    if cfg is None:
        return "train", "validation"
    data = str(getattr(cfg, "data", ""))
    if data.startswith("seq2seq:"):
        return f"train ({data})", f"held-out sources ({data})"
    if data.startswith("synthetic:"):
        return f"train ({data})", f"validation ({data})"
    synthetic = bool(getattr(cfg, "repeat_fraction", 0) or getattr(cfg, "synthetic_steps", 0))
    return ("train (text + synthetic repeats)" if synthetic else "train (text)"), "validation (text)"


def training_curve_png(metrics: list[dict], title: str, labels: tuple[str, str] = ("train", "validation")) -> bytes:
    """Train / validation loss against tokens (legend: `labels`, see `loss_labels`), with the best layer-1+
    induction score and the ICL score."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    tr = [(r["tokens"], r["train_loss"]) for r in metrics if "train_loss" in r]
    va = [(r["tokens"], r["val_loss"]) for r in metrics if "val_loss" in r]
    if tr:
        ax[0].plot(*zip(*tr), label=labels[0], lw=1)
    if va:
        ax[0].plot(*zip(*va), "o-", label=labels[1], ms=3)
    ax[0].set_xscale("symlog", linthresh=1e5)
    ax[0].set_xlabel("tokens")
    ax[0].set_ylabel("loss (nats/token)")
    ax[0].legend()
    ax[0].set_title(title)
    ind = [(r["tokens"], r["max_induction_50"]) for r in metrics if "max_induction_50" in r]
    icl = [(r["tokens"], r["icl_score"]) for r in metrics if "icl_score" in r]
    prev = [(r["tokens"], r["max_previous_token"]) for r in metrics if "max_previous_token" in r]
    if ind:
        ax[1].plot(*zip(*ind), "o-", ms=3, label="max induction score, last layer (|R|=50)")
    if prev:
        ax[1].plot(*zip(*prev), "s-", ms=3, label="max previous-token score")
    if icl:
        ax[1].plot(*zip(*icl), "^-", ms=3, label="ICL score (nats)")
    ax[1].set_xscale("symlog", linthresh=1e5)
    ax[1].set_xlabel("tokens")
    ax[1].axhline(0, color="grey", lw=0.5)
    if ind or prev or icl:
        ax[1].legend(fontsize=8)
    else:
        ax[1].text(0.5, 0.5, "no checkpoint scores (trained with --no-scores)", ha="center", va="center",
                   transform=ax[1].transAxes)
    ax[1].set_title("checkpoint scores")
    return png_bytes(fig)


def png_bytes(fig) -> bytes:
    """A matplotlib figure as PNG bytes (tight layout, 90 dpi); closes the figure."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return buf.getvalue()


def hardware() -> str:
    import os

    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = f", GPU {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ""
    return f"{cpu}, {os.cpu_count()} logical CPUs, torch {torch.__version__} ({torch.get_num_threads()} threads){gpu}"


def induction_onset(metrics: list[dict], threshold: float = 0.4) -> dict | None:
    """The first checkpoint whose best last-layer induction score (|R| = 50) passes `threshold`."""
    for r in metrics:
        if r.get("max_induction_50", 0) >= threshold:
            return r
    return None


# --- model card -----------------------------------------------------------------------------------------
def _fmt_heads(rows, layer: int) -> str:
    return ", ".join(f"{v:.2f}" for v in rows[layer])


def _last_scores(metrics: list[dict]) -> dict:
    return next((r for r in reversed(metrics) if "icl_score" in r), {})


def card_results(model, metrics, summary, corpus) -> tuple[list[str], dict]:
    """Markdown lines and a dict of the measured numbers for a card (scores at the final checkpoint)."""
    last = _last_scores(metrics)
    numbers = {"final_val_loss": summary.get("final_val_loss"), "unigram_val_loss": summary.get("unigram_val_loss"),
               "icl_score": last.get("icl_score")}
    lines = [
        f"- final validation loss: **{summary.get('final_val_loss', float('nan')):.4f}** nats/token",
        f"- unigram baseline (train-split unigram frequencies, add-one) on the same validation text: "
        f"**{summary.get('unigram_val_loss', float('nan')):.4f}** nats/token",
    ]
    L = model.cfg.n_layers
    if "icl_score" in last:
        from .scores import icl_positions

        early, late = icl_positions(model.cfg.n_ctx)
        lines.append(f"- in-context-learning score (loss at token {late} − loss at token {early}, validation text): "
                     f"**{last['icl_score']:+.3f}** nats")
    if L >= 1 and "previous_token_scores" in last:
        prev = last["previous_token_scores"]
        numbers["previous_token_scores"] = prev
        lines.append(f"- previous-token scores (validation text), layer 0 heads: {_fmt_heads(prev, 0)} "
                     f"(max **{max(prev[0]):.3f}**)")
    for p in (50, 100):
        key = f"induction_scores_{p}"
        if L >= 1 and key in last:
            s = last[key]
            numbers[key] = s
            lines.append(f"- induction scores (second copy of [BOS]+R+R → the token after the first occurrence), "
                         f"|R| = {p} (R drawn from ids seen in training), layer "
                         f"{L - 1} heads: {_fmt_heads(s, L - 1)} (max **{max(s[L - 1]):.3f}**)")
    if L >= 1 and 1 + 2 * 50 <= model.cfg.n_ctx:
        from .scores import arena_induction_scores

        s = _rounded(arena_induction_scores(model, 50, 10, 0))
        numbers["induction_scores_arena_50"] = s
        lines.append(f"- ARENA's induction score (ARENA 1.2's stripe mean, its two first-copy entries included; "
                     f"|R| = 50, batch 10, R uniform over every non-special id, never-trained ones included), layer "
                     f"{L - 1} heads: {_fmt_heads(s, L - 1)} (max **{max(s[L - 1]):.3f}**)")
    if L >= 2:
        onset = induction_onset(metrics, 0.4)
        numbers["induction_onset_step"] = onset["step"] if onset else None
        lines.append("- induction heads formed (best last-layer score ≥ 0.4 at |R| = 50): " + (
            f"by checkpoint step {onset['step']} ({onset['tokens']:,} tokens)" if onset else "not within this run"))
    if L == 1:
        from .one_layer import copying_heads_table

        t = copying_heads_table(model, vocab=corpus.seen_ids() if corpus is not None else None, behavioural=False)
        cs = t.copying_score
        numbers["copying_scores"] = _rounded(cs)
        numbers["ov_top1"], numbers["ov_top5"] = _rounded(t.top1), _rounded(t.top5)
        n_pos = len(t.heads) + len(t.ov_positive)
        lines.append(f"- copying scores Σλ/Σ|λ| of each head's full OV circuit W_E W_V W_O W_U: {_fmt_heads(cs, 0)} "
                     f"(**{n_pos} of {model.cfg.n_heads}** at or above {t.threshold})")
        lines.append(f"- top-1 / top-5 diagonal accuracy of each head's full OV circuit over the {t.n_ids} ids seen in "
                     f"training (ARENA's measure: the share of tokens whose own logit the head raises most / among "
                     f"the 5 most): top-1 {_fmt_heads(t.top1, 0)}; top-5 {_fmt_heads(t.top5, 0)}; copying heads by "
                     f"both measures (Σλ/Σ|λ| ≥ {t.threshold} and top-1 ≥ {t.diagonal}): **{len(t.heads)} of "
                     f"{model.cfg.n_heads}**")
    if L == 0 and corpus is not None:
        from .zero_layer import direct_path_fit

        fit = direct_path_fit(model, np.asarray(corpus.train))
        fit_val = direct_path_fit(model, np.asarray(corpus.val))
        numbers.update(bigram_entropy_train=fit.bigram_entropy, direct_path_kl_train=fit.weighted_kl,
                       bigram_entropy_val=fit_val.bigram_entropy, direct_path_kl_val=fit_val.weighted_kl)
        lines.append(f"- corpus bigram entropy H(next | current): training split **{fit.bigram_entropy:.4f}**, "
                     f"validation split (in-sample) {fit_val.bigram_entropy:.4f} nats/token")
        numbers["argmax_agreement_train"] = fit.argmax_agreement
        lines.append(f"- direct path vs the bigrams (frequency-weighted KL per token): **{fit.weighted_kl:.4f}** "
                     f"nats on the training split, {fit_val.weighted_kl:.4f} on the validation split; on the whole "
                     f"training split ({fit.n_tokens:,} bigrams) its argmax agrees with the split's most frequent next "
                     f"token for **{fit.argmax_agreement:.1%}** of tokens")
    return lines, numbers


def data_line(cfg, corpus, summary) -> str:
    if corpus is None:
        return f"- data: {cfg.data}"
    held = ("the `test`/`tests` packages" if cfg.data in ("stdlib", "python-stdlib")
            else "the held-out tail of the text")
    return (f"- data: {corpus.name} (sha256 {corpus.sha256}; {summary.get('train_tokens_in_corpus', 0):,} training "
            f"tokens; validation = {held}, {summary.get('val_tokens_in_corpus', 0):,} tokens), tokenizer "
            f"`{cfg.tokenizer}` (tokenizer.json)")


def mixture_line(cfg) -> str:
    """One sentence on what the training sequences held besides natural text."""
    if cfg.data == "synthetic:repeat":
        return "synthetic `[BOS] + R + R + ...` sequences only"
    if cfg.repeat_fraction:
        how = ("repeats from a random offset to the end of the sequence" if cfg.repeat_fill
               else "is copied once to a later random offset")
        mix = (f"{cfg.repeat_fraction:.0%} of the training sequences carry a segment of "
               f"{cfg.repeat_min_len}–{cfg.repeat_max_len} tokens that {how}; " + (
                   "every segment is random seen tokens" if cfg.repeat_random_fraction >= 1 else
                   f"{cfg.repeat_random_fraction:.0%} of the segments are random seen tokens, the rest natural text"))
    else:
        mix = "natural text only (no synthetic repeats)"
    if cfg.synthetic_steps:
        mix = (f"the first {cfg.synthetic_steps} steps train on synthetic `[BOS] + R + R + ...` sequences of seen "
               f"tokens, then {mix}")
    if cfg.repeat_until is not None and cfg.repeat_fraction:
        mix += f"; natural text only from step {cfg.repeat_until} on"
    if cfg.lr_multipliers:
        mix += "; per-parameter lr factors " + ", ".join(f"{k} ×{v:g}" for k, v in sorted(cfg.lr_multipliers.items()))
    return mix


def make_report_fn(name: str, about: str, command: str, cfg, corpus, val, seen, notes: str = ""):
    """`report_fn(model, summary, metrics) -> {"card.md": ..., "training_curve.png": ...}` for the training loop."""

    def report_fn(model, summary, metrics) -> dict:
        import json

        from models.training.presets import PRESETS

        c = model.cfg
        lines, numbers = card_results(model, metrics, summary, corpus)
        extra_notes = notes or PRESETS.get(name, {}).get("notes", "")
        mix = mixture_line(cfg)
        arch = (f"{c.n_layers} layers × {c.n_heads} heads, d_model {c.d_model}, d_head {c.d_head}, "
                f"{'attention-only' if c.attn_only else f'MLP d_mlp {c.d_mlp} ({c.act_fn})'}, "
                f"{c.positional_embedding_type} positions, normalization {c.normalization_type}, "
                f"biases {'on' if c.use_bias else 'off'}, n_ctx {c.n_ctx}, d_vocab {c.d_vocab}")
        text = [f"# {name}", "", about, "", "## Model", "", f"- {arch}",
                f"- parameters: {sum(p.numel() for p in model.parameters()):,}", "", "## Training", "",
                data_line(cfg, corpus, summary),
                f"- mixture: {mix}",
                f"- {summary['steps']} steps × batch {cfg.batch_size} × {cfg.seq_len or c.n_ctx} tokens = "
                f"{summary['tokens_seen']:,} tokens seen; AdamW lr {cfg.lr} (warm-up {cfg.warmup_steps}, cosine to "
                f"{cfg.lr * cfg.min_lr_ratio:g}), weight decay {cfg.weight_decay}, clip {cfg.grad_clip}, label "
                f"smoothing {cfg.label_smoothing}, random seed: {cfg.seed}",
                f"- wall time: {summary['wall_time']:.0f} s on {hardware()} (device {summary['device']}, "
                f"shared machine)",
                f"- command: `{command}`", "", "## Measured (final model)", "", *lines]
        if extra_notes:
            text += ["", "## Notes", "", extra_notes]
        kept = (f"checkpoints/ (the weights at steps {', '.join(map(str, cfg.keep_checkpoints))})"
                if cfg.keep_checkpoints else "(checkpoints were not shipped for this model)")
        text += ["", "Files: config.json, model.safetensors, tokenizer.json, metrics.jsonl (train/validation loss, "
                 "tokens, wall time; head scores at every checkpoint), training_curve.png, train_config.json, "
                 f"summary.json, measured.json, {kept}.", ""]
        summary["card_numbers"] = numbers
        return {"card.md": "\n".join(text), "training_curve.png": training_curve_png(metrics, name, loss_labels(cfg)),
                "measured.json": json.dumps(numbers, indent=1)}

    return report_fn

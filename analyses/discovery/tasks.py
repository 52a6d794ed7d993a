"""Discovery tasks: clean and corrupted prompts of the same length, the answers read off the logits, and a metric.

A circuit is discovered *for a behaviour*: the difference between the clean and the corrupted prompts is what the
found edges must carry. Shipped tasks (`discovery_task(model, name)`):

- `induction`: clean `[BOS] + R + R` (|R| = `seq_len`, 20 by default, distinct non-special ids drawn with a seeded
  `torch.Generator`); the answer at each position of the second copy is the token after that token's first
  occurrence. `corrupt` picks what is resampled: "first" (default: the first copy, so the second copy has no
  earlier occurrence to copy from — the probe of the report's path-patching section, so the faithfulness of a
  found circuit compares with its 0.889 through K), "second" (`[BOS] + R + R'`: the queries change, so the
  query-side edges show) or "both" (`[BOS] + R' + R''`: every route changes). Metric: the loss on the answers;
- `previous-token`: clean `[BOS] + R + R`, corrupted with the first copy's tokens permuted (the same tokens, in
  another order): only what a previous-token head reads — which token came before — is destroyed. Loss on the
  second copy;
- `skip-trigram` (one-layer models): clean `[BOS] + X + [t]`, corrupted `[BOS] + X' + [t]` (the same last token,
  other context); the answer is the model's own top next token on the clean prompt, the wrong answer its top token
  on the corrupted one, and the metric their logit difference at the last position: what the context adds to the
  last token's prediction, the skip-trigrams `source … destination → out` of Elhage et al. (2021);
- `reversal` and `sorting` (encoder–decoders trained on `seq2seq:reverse` / `seq2seq:sort`,
  `models.data.seq2seq`): clean sources are held-out sources of the task (`Seq2SeqBatches.val_batch`, every one
  `n_ctx_src` symbols long), corrupted sources other held-out sources (resampled, another seed); the decoder input,
  the same in both runs, is the clean pair's gold target prefix `[BOS] + y_0 … y_{n−2}`, so each position t asks for
  y_t, the clean source's answer. Metric: the loss on those answers. What the found edges must carry is how the
  source reaches the decoder: cross-attention;
- a user task (`user_task`, or a JSON file `{"clean": [...], "corrupt": [...], "answer": [...], "wrong": [...]}`,
  read by `models.io.readers.read_discovery_task`): prompt pairs (text or ids) and answer tokens at the last position.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..patching.inputs import PatchingError, token_pair
from ..patching.metrics import METRICS, Answers, answers, next_token_answers

TASKS = ("induction", "previous-token", "skip-trigram", "reversal", "sorting")
#: the encoder–decoder tasks → the seq2seq rule (`models.data.seq2seq.TASKS`) whose targets they ask for
SEQ2SEQ_RULES = {"reversal": "reverse", "sorting": "sort"}
#: metrics where a smaller value is the better behaviour
LOWER_IS_BETTER = ("loss",)


@dataclass
class DiscoveryTask:
    """`clean`, `corrupt` `[batch, pos]` ids, `answers` (positions and answer tokens per prompt) and the metric's
    name (`analyses.patching.METRICS`: "loss", "logit_diff", "prob")."""

    name: str
    clean: torch.Tensor
    corrupt: torch.Tensor
    answers: Answers
    metric: str = "loss"
    target: torch.Tensor | None = None  # an encoder–decoder's decoder input [batch, tgt_pos], shared by both runs

    def values(self, logits: torch.Tensor) -> torch.Tensor:
        """The metric per prompt `[batch]` of logits `[batch, pos, d_vocab]`."""
        return METRICS[self.metric](logits, self.answers)

    def value(self, logits: torch.Tensor) -> torch.Tensor:
        """The metric averaged over prompts (a scalar, differentiable)."""
        return self.values(logits).mean()

    @property
    def sign(self) -> int:
        """+1 when a larger metric is the better behaviour, −1 when a smaller is (the loss)."""
        return -1 if self.metric in LOWER_IS_BETTER else 1

    def to_json(self) -> dict:
        out = {"name": self.name, "metric": self.metric, "n_prompts": int(self.clean.shape[0]),
               "n_pos": int(self.clean.shape[1]), "n_answers": int(self.answers.positions.shape[1])}
        if self.target is not None:
            out["n_target_pos"] = int(self.target.shape[1])
        return out


def _check_count(n, name):
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise PatchingError(f"{name} must be a positive int, got {n!r}")


def induction_task(model, n_prompts: int = 20, seed: int = 0, seq_len: int = 20, corrupt: str = "first",
                   name: str = "induction", tokens_from=None) -> DiscoveryTask:
    """The induction task (module docstring). `corrupt` ∈ {"first", "second", "both"}; `tokens_from`: the ids R is
    drawn from (default every non-special id; a text model's ids seen in training give it text-like tokens)."""
    from ..sequences import random_tokens, repeated_tokens

    _check_count(n_prompts, "n_prompts")
    _check_count(seq_len, "seq_len")
    if corrupt not in ("first", "second", "both"):
        raise PatchingError(f"corrupt must be 'first', 'second' or 'both', got {corrupt!r}")
    if 1 + 2 * seq_len > model.cfg.n_ctx:
        raise PatchingError(f"seq_len {seq_len}: [BOS] + R + R has {1 + 2 * seq_len} tokens, more than the model's "
                            f"n_ctx {model.cfg.n_ctx}")
    clean = repeated_tokens(model, seq_len, 2, n_prompts, seed, tokens_from=tokens_from)
    bad = clean.clone()
    fresh = random_tokens(model, 2 * seq_len, n_prompts, seed + 1, tokens_from=tokens_from)
    if corrupt in ("first", "both"):
        bad[:, 1:seq_len + 1] = fresh[:, :seq_len]
    if corrupt in ("second", "both"):
        bad[:, seq_len + 1:] = fresh[:, seq_len:]
    if name == "previous-token":
        g = torch.Generator().manual_seed(seed + 2)
        perm = torch.stack([torch.randperm(seq_len, generator=g) for _ in range(n_prompts)])
        bad = clean.clone()
        bad[:, 1:seq_len + 1] = clean[:, 1:seq_len + 1].gather(1, perm)
    return DiscoveryTask(name, clean, bad, next_token_answers(clean, range(seq_len + 1, 2 * seq_len)), "loss")


def previous_token_task(model, n_prompts: int = 20, seed: int = 0, seq_len: int = 20,
                        tokens_from=None) -> DiscoveryTask:
    """The previous-token task (module docstring): the first copy's tokens permuted."""
    return induction_task(model, n_prompts, seed, seq_len, name="previous-token", tokens_from=tokens_from)


@torch.no_grad()
def skip_trigram_task(model, n_prompts: int = 20, seed: int = 0, seq_len: int = 20,
                      tokens_from=None) -> DiscoveryTask:
    """The skip-trigram task (module docstring); prompts whose two top tokens coincide are dropped."""
    from ..sequences import bos_token_id, random_tokens

    _check_count(n_prompts, "n_prompts")
    _check_count(seq_len, "seq_len")
    n = 4 * n_prompts  # drawn, then those where clean and corrupted agree on the top token are dropped
    last = random_tokens(model, 1, n, seed, tokens_from=tokens_from)
    bos = torch.full((n, 1), bos_token_id(model), dtype=torch.long)
    clean = torch.cat([bos, random_tokens(model, seq_len, n, seed + 1, tokens_from=tokens_from), last], 1)
    bad = torch.cat([bos, random_tokens(model, seq_len, n, seed + 2, tokens_from=tokens_from), last], 1)
    top_c, top_x = model(clean)[:, -1].argmax(-1), model(bad)[:, -1].argmax(-1)
    keep = (top_c != top_x).nonzero().reshape(-1)[:n_prompts]
    if keep.numel() == 0:
        raise PatchingError("skip-trigram: the context never changes this model's top next token")
    k = keep.numel()
    return DiscoveryTask("skip-trigram", clean[keep], bad[keep],
                         answers(model, k, top_c[keep], top_x[keep], positions=-1), "logit_diff")


def seq2seq_pairs_task(model, name: str = "reversal", n_prompts: int = 20, seed: int = 0) -> DiscoveryTask:
    """The `reversal` or `sorting` task of an encoder–decoder (module docstring): held-out sources of the model's
    seq2seq rule (`SEQ2SEQ_RULES`; `task_symbols` from the config's `extra`, else every non-special source id),
    corrupted by resampling, the clean gold target prefix as the decoder input, the loss on the clean answers."""
    from models.data.seq2seq import Seq2SeqBatches, make_task

    _check_count(n_prompts, "n_prompts")
    rule = SEQ2SEQ_RULES[name]
    cfg = model.cfg
    extra = getattr(cfg, "extra", None) or {}
    trained = extra.get("task")
    if trained and trained != f"seq2seq:{rule}":
        raise PatchingError(f"task {name!r} asks for seq2seq:{rule} targets, but this model was trained on {trained}")
    n = cfg.n_ctx_src
    task = make_task(rule, int(extra.get("task_symbols", cfg.d_vocab_src - 3)), n, n)
    if cfg.n_ctx_tgt < n:
        raise PatchingError(f"task {name!r}: the decoder reads {cfg.n_ctx_tgt} positions, fewer than the {n} answers")
    batches = Seq2SeqBatches(task, n, max(cfg.n_ctx_tgt, n + 2))
    src, tgt, _, _ = batches.split(batches.val_batch(n_prompts, seed=seed))
    bad = batches.split(batches.val_batch(n_prompts, seed=seed + 1))[0]
    positions = torch.arange(n).expand(n_prompts, n).clone()
    dev = model.device
    return DiscoveryTask(name, src.to(dev), bad.to(dev), Answers(positions, tgt[:, 1:n + 1].clone()), "loss",
                         tgt[:, :n].to(dev))


def _served(model, name: str) -> None:
    """Refuse a task the model's kind has no behaviour for: the seq2seq tasks need an encoder–decoder, the others a
    decoder-only model."""
    from models.arch.kind import DECODER, ENCODER_DECODER, model_kind

    kind = model_kind(model)
    need = ENCODER_DECODER if name in SEQ2SEQ_RULES else DECODER
    if kind != need:
        served = ", ".join(t for t in TASKS if (t in SEQ2SEQ_RULES) == (kind == ENCODER_DECODER))
        words = {DECODER: "decoder-only", ENCODER_DECODER: "encoder–decoder"}
        raise PatchingError(f"task {name!r} needs a {words[need]} model; this one is "
                            f"{words.get(kind, kind)}" + (f" (its tasks: {served})" if served else ""))


def user_task(model, clean, corrupt, answer, wrong=None, metric: str | None = None,
              name: str = "user") -> DiscoveryTask:
    """A task from prompt pairs (text or ids, clean and corrupted of the same token length) and the answer token
    of each (a token, or one per prompt; `wrong` likewise) at the last position. `metric`: "logit_diff" when a
    wrong answer is given, else "loss" by default."""
    from models.arch.kind import DECODER, model_kind

    if model_kind(model) != DECODER:
        raise PatchingError("a user task (prompt pairs and answers) serves decoder-only models; an encoder–decoder "
                            f"takes the shipped tasks {', '.join(SEQ2SEQ_RULES)}")
    if isinstance(clean, (list, tuple)) and len(clean) == 0 or isinstance(corrupt, (list, tuple)) and not corrupt:
        raise PatchingError("a task needs at least one clean and one corrupted prompt")
    if isinstance(clean, (list, tuple)) and isinstance(corrupt, (list, tuple)) and len(clean) != len(corrupt):
        raise PatchingError(f"clean and corrupt must hold the same number of prompts: {len(clean)} vs "
                            f"{len(corrupt)}")
    c, x = token_pair(model, clean, corrupt)
    metric = metric or ("logit_diff" if wrong is not None else "loss")
    if metric not in METRICS:
        raise PatchingError(f"unknown metric {metric!r}; allowed: {', '.join(METRICS)}")
    if metric == "logit_diff" and wrong is None:
        raise PatchingError("metric 'logit_diff' needs wrong answers")
    return DiscoveryTask(name, c, x, answers(model, c.shape[0], answer, wrong, positions=-1), metric)


def discovery_task(model, name: str, n_prompts: int = 20, seed: int = 0, **kw) -> DiscoveryTask:
    """The shipped task `name` (`TASKS`) on `model`: `induction` (kw `seq_len`, `corrupt`, `tokens_from`),
    `previous-token` and `skip-trigram` (`seq_len`, `tokens_from`) on a decoder-only model; `reversal` and `sorting`
    on an encoder–decoder (no kw)."""
    makers = {"induction": induction_task, "previous-token": previous_token_task, "skip-trigram": skip_trigram_task}
    if name not in makers and name not in SEQ2SEQ_RULES:
        raise PatchingError(f"unknown task {name!r}; tasks: {', '.join(TASKS)} (or a JSON file of prompt pairs)")
    _served(model, name)
    if name in SEQ2SEQ_RULES:
        if kw:
            raise PatchingError(f"task {name!r} takes no options, got {', '.join(sorted(kw))}")
        return seq2seq_pairs_task(model, name, n_prompts=n_prompts, seed=seed)
    return makers[name](model, n_prompts=n_prompts, seed=seed, **kw)


__all__ = ["DiscoveryTask", "SEQ2SEQ_RULES", "TASKS", "discovery_task", "induction_task", "previous_token_task",
           "seq2seq_pairs_task", "skip_trigram_task", "user_task"]

"""What one training step computes for each kind of model: the training loop (`models.training.loop`) is the same for
all, and asks its task for the loss of a batch, the validation loss and the checkpoint metrics.

- `LanguageModelling` (`HookedTransformer`): next-token cross-entropy of `[BOS] + text` rows.
- `Seq2Seq` (`HookedEncoderDecoder`): next-token cross-entropy of the target given the source, padding left out,
  with teacher forcing or scheduled sampling (`sampling_probability`); exact match of greedy decoding on held-out
  sources at checkpoints.
- `MaskedLM` (`HookedEncoder`): BERT's masked-language-model loss (`mask_tokens`).

A batch is an int64 array whose rows data-parallel ranks split (`models.data.batches`, `models.data.seq2seq`); every
random choice a task makes is drawn from `step_rng(seed, step, stream)` for the whole global batch and split the same
way (`rank_rows`), so runs stay deterministic, resumable and the same on any number of ranks.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..arch.encoder import mlm_cross_entropy
from ..arch.model import lm_cross_entropy
from ..data.batches import step_rng
from ..data.seq2seq import Seq2SeqBatches, exact_match

SAMPLING_STREAM, MLM_STREAM = 2, 3


def rank_rows(draw: np.ndarray, rank: int, world: int) -> np.ndarray:
    """The rows of `draw` (drawn for the global batch) that belong to data-parallel rank `rank` of `world`."""
    per = draw.shape[0] // world
    return draw[rank * per : (rank + 1) * per]


def sampling_probability(cfg, step: int) -> float:
    """Scheduled sampling (Bengio et al. 2015, §2.4): the probability, at training step i, of feeding the decoder its
    own previous prediction instead of the true previous token, `sampling_max · (1 − ε_i)`, where ε_i, the
    teacher-forcing probability, decays by `cfg.sampling_schedule`:
    "linear" ε_i = max(0, 1 − i / k) (k defaults to `steps`); "exponential" ε_i = k^i (k < 1, default 0.999);
    "inverse_sigmoid" ε_i = k / (k + exp(i / k)) (k ≥ 1, default steps / 10). "none": 0 (teacher forcing)."""
    kind, k = cfg.sampling_schedule, cfg.sampling_k
    if kind == "none":
        return 0.0
    if kind == "linear":
        eps = max(0.0, 1.0 - step / (k or cfg.steps))
    elif kind == "exponential":
        eps = (k or 0.999) ** step
    else:
        k = k or max(cfg.steps / 10, 1.0)
        eps = k / (k + math.exp(min(step / k, 700.0)))
    return cfg.sampling_max * (1.0 - eps)


def mask_tokens(rows: np.ndarray, rng: np.random.Generator, probability: float, mask_id: int,
                pool: np.ndarray, part: tuple[int, int] = (0, 1)) -> tuple[np.ndarray, np.ndarray]:
    """BERT's masking (Devlin et al. 2019, §3.1): each position but the first (BOS) is chosen with `probability`;
    a chosen token becomes `mask_id` (80 %), a random id from `pool` (10 %) or stays (10 %). Returns `(inputs,
    labels)`, labels the original ids at chosen positions and −100 elsewhere. `rows` are rank `part[0]`'s of
    `part[1]` ranks; the choices are drawn for all of them (`rank_rows`)."""
    shape = (rows.shape[0] * part[1], rows.shape[1])
    chosen = rank_rows(rng.random(shape) < probability, *part)
    chosen[:, 0] = False
    how = rank_rows(rng.random(shape), *part)
    replacement = rank_rows(pool[rng.integers(0, pool.size, shape)], *part)
    inputs = rows.copy()
    inputs[chosen & (how < 0.8)] = mask_id
    randomised = chosen & (how >= 0.8) & (how < 0.9)
    inputs[randomised] = replacement[randomised]
    return inputs, np.where(chosen, rows, -100)


class LanguageModelling:
    """Next-token prediction on `[BOS] + text` rows."""

    def __init__(self, batches):
        self.batches = batches

    def loss(self, module, rows: torch.Tensor, cfg, step: int, autocast, model=None, part=(0, 1)) -> torch.Tensor:
        with autocast:
            logits = module(rows)
        return lm_cross_entropy(logits, rows, label_smoothing=cfg.label_smoothing)

    @torch.no_grad()
    def evaluate(self, model, rows: torch.Tensor, chunk: int = 16) -> float:
        """Mean next-token loss of `rows` (float32), in chunks of `chunk` sequences."""
        return _mean_over_chunks(model, rows, chunk, lambda t: float(lm_cross_entropy(model(t), t)))

    def metrics(self, model) -> dict:
        return {}


def _mean_over_chunks(model, rows: torch.Tensor, chunk: int, loss_of) -> float:
    was = model.training
    model.eval()
    total = 0.0
    for i in range(0, rows.shape[0], chunk):
        total += loss_of(rows[i : i + chunk]) * rows[i : i + chunk].shape[0]
    model.train(was)
    return total / rows.shape[0]


class Seq2Seq:
    """Source → target rows (`Seq2SeqBatches`): teacher forcing or scheduled sampling, exact match at checkpoints."""

    def __init__(self, batches: Seq2SeqBatches, cfg):
        self.batches, self.cfg = batches, cfg
        self.exact_rows = batches.val_batch(cfg.exact_match_sequences, seed=1)

    def inputs(self, rows: torch.Tensor) -> tuple:
        return tuple(t.to(rows.device) for t in self.batches.split(rows))

    def loss(self, module, rows: torch.Tensor, cfg, step: int, autocast, model=None, part=(0, 1)) -> torch.Tensor:
        src, tgt, src_mask, tgt_mask = self.inputs(rows)
        feed = tgt
        p = sampling_probability(cfg, step)
        if p > 0:  # the decoder reads its own greedy predictions at a fraction p of the positions after BOS
            with torch.no_grad(), autocast:
                pred = (model or module)(src, tgt, src_mask, tgt_mask).argmax(-1)  # [batch, pos]: token i + 1
            draw = step_rng(cfg.seed, step, SAMPLING_STREAM).random((tgt.shape[0] * part[1], tgt.shape[1]))
            own = torch.as_tensor(rank_rows(draw, *part) < p, device=tgt.device)
            own[:, 0] = False
            own &= tgt_mask
            feed = torch.where(own, torch.cat([tgt[:, :1], pred[:, :-1]], 1), tgt)
        with autocast:
            logits = module(src, feed, src_mask, tgt_mask)
        return lm_cross_entropy(logits, tgt, label_smoothing=cfg.label_smoothing, attention_mask=tgt_mask)

    @torch.no_grad()
    def evaluate(self, model, rows: torch.Tensor, chunk: int = 256) -> float:
        """Mean target loss of `rows` under teacher forcing."""
        return _mean_over_chunks(model, rows, chunk, lambda t: float(model(*self.inputs(t), return_type="loss")))

    def metrics(self, model) -> dict:
        return {"exact_match": exact_match(model, self.batches, self.exact_rows)}


class MaskedLM:
    """Masked-language modelling on `[BOS] + text` rows (`mask_tokens`)."""

    def __init__(self, batches, mask_id: int, pool, probability: float):
        self.batches, self.mask_id, self.probability = batches, mask_id, probability
        self.pool = np.asarray(pool, dtype=np.int64)

    def masked(self, rows: torch.Tensor, rng: np.random.Generator, part=(0, 1)) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, labels = mask_tokens(rows.cpu().numpy(), rng, self.probability, self.mask_id, self.pool, part)
        return torch.as_tensor(inputs, device=rows.device), torch.as_tensor(labels, device=rows.device)

    def loss(self, module, rows: torch.Tensor, cfg, step: int, autocast, model=None, part=(0, 1)) -> torch.Tensor:
        inputs, labels = self.masked(rows, step_rng(cfg.seed, step, MLM_STREAM), part)
        with autocast:
            logits = module(inputs)
        return mlm_cross_entropy(logits, labels, cfg.label_smoothing)

    @torch.no_grad()
    def evaluate(self, model, rows: torch.Tensor, chunk: int = 16) -> float:
        """MLM loss of `rows`, masked the same way at every evaluation."""
        inputs, labels = self.masked(rows, step_rng(0, 0, MLM_STREAM + 1))
        return _mean_over_chunks(model, torch.cat([inputs, labels], 1), chunk, lambda t: float(mlm_cross_entropy(
            model(t[:, : rows.shape[1]]), t[:, rows.shape[1] :])))

    def metrics(self, model) -> dict:
        return {}

"""Training batches: the batch of step `s` is a pure function of `(seed, s)` (never of iterator state), so a run
resumed from a checkpoint sees exactly the data an uninterrupted run sees; data-parallel ranks take contiguous
slices of the same global batch.

- `TextBatches`: `[BOS] + window` of a tokenised corpus (`models.data.corpora`), with an optional `Mixture`: a
  fraction of the sequences carry a repeated segment of random length at random offsets (the period and the offset
  both vary: a fixed period teaches a positional shortcut instead of induction);
- `RepeatBatches`: the synthetic task `[BOS] + R + R + ...` of random tokens;
- `Curriculum`: one source for the first steps, another after.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from ..errors import CorpusError
from .corpora import TokenCorpus


@dataclass
class Mixture:
    """Synthetic structure mixed into natural-text batches.

    `repeat_fraction` of the sequences get one segment of length L ~ U[min_len, max_len] copied from a random
    offset a to a random later offset b ≥ a + L (period b − a varies too); with `fill`, the segment instead
    repeats from a to the end of the sequence (period L, many copies). With probability `random_fraction`
    the segment is first overwritten with random seen tokens, so that only in-context copying (not bigram
    statistics) can predict its later occurrences.
    """

    repeat_fraction: float = 0.0
    min_len: int = 8
    max_len: int = 64
    random_fraction: float = 0.5
    fill: bool = False  # True: from offset a on, the segment repeats until the end of the sequence

    def validate(self, seq_len: int) -> None:
        if not 0.0 <= self.repeat_fraction <= 1.0:
            raise ValueError(f"repeat_fraction must be in [0, 1], got {self.repeat_fraction}")
        if not 0.0 <= self.random_fraction <= 1.0:
            raise ValueError(f"random_fraction must be in [0, 1], got {self.random_fraction}")
        if self.repeat_fraction > 0:
            if not 1 <= self.min_len <= self.max_len:
                raise ValueError(f"need 1 <= min_len <= max_len, got {self.min_len}, {self.max_len}")
            if 2 * self.min_len > seq_len - 1:
                raise ValueError(f"min_len={self.min_len} is too long: two copies must fit in seq_len-1={seq_len - 1}")

    def to_dict(self) -> dict:
        return asdict(self)


def step_rng(seed: int, step: int, stream: int = 0) -> np.random.Generator:
    """The random generator of one training step: a pure function of (seed, step, stream)."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(seed), int(step), int(stream)])))


def _windows(tokens: np.ndarray, starts: np.ndarray, length: int) -> np.ndarray:
    return np.stack([np.asarray(tokens[s : s + length], dtype=np.int64) for s in starts])


def insert_repeats(seqs: np.ndarray, rng: np.random.Generator, mixture: Mixture, pool: np.ndarray) -> np.ndarray:
    """In place: give each row (position 0 = BOS, untouched) a repeated segment with probability
    `mixture.repeat_fraction` (see `Mixture`)."""
    B, T = seqs.shape
    chosen = rng.random(B) < mixture.repeat_fraction
    for i in np.flatnonzero(chosen):
        L = int(rng.integers(mixture.min_len, min(mixture.max_len, (T - 1) // 2) + 1))
        a = int(rng.integers(1, T - 2 * L + 1))
        b = int(rng.integers(a + L, T - L + 1))
        if rng.random() < mixture.random_fraction:
            seqs[i, a : a + L] = pool[rng.integers(0, pool.size, L)]
        if mixture.fill:
            seqs[i, a + L :] = np.resize(seqs[i, a : a + L], T - a - L)
        else:
            seqs[i, b : b + L] = seqs[i, a : a + L]
    return seqs


class TextBatches:
    """Batches `[BOS] + window` of a `TokenCorpus`, plus an optional `Mixture` of repeated segments."""

    def __init__(self, corpus: TokenCorpus, seq_len: int, mixture: Mixture | None = None):
        corpus.check(seq_len)
        self.corpus, self.seq_len = corpus, seq_len
        self.mixture = mixture or Mixture()
        self.mixture.validate(seq_len)
        self.pool = corpus.seen_ids() if self.mixture.repeat_fraction > 0 else None

    def batch(self, seed: int, step: int, batch_size: int, rank: int = 0, world_size: int = 1) -> np.ndarray:
        """Rows `rank*B/W .. (rank+1)*B/W` of the global batch of `step`: int64 `[batch_size/world, seq_len]`."""
        rng = step_rng(seed, step)
        T = self.seq_len
        starts = rng.integers(0, self.corpus.train.size - (T - 1) + 1, batch_size)
        seqs = np.empty((batch_size, T), dtype=np.int64)
        seqs[:, 0] = self.corpus.bos_id
        seqs[:, 1:] = _windows(self.corpus.train, starts, T - 1)
        if self.mixture.repeat_fraction > 0:
            insert_repeats(seqs, rng, self.mixture, self.pool)
        per = batch_size // world_size
        return seqs[rank * per : (rank + 1) * per]

    def val_batch(self, n: int, seed: int = 0) -> np.ndarray:
        """`n` fixed validation sequences `[BOS] + window` of natural text (evenly spaced windows)."""
        T, val = self.seq_len, self.corpus.val
        starts = np.linspace(0, val.size - (T - 1), num=n).astype(np.int64)
        seqs = np.empty((n, T), dtype=np.int64)
        seqs[:, 0] = self.corpus.bos_id
        seqs[:, 1:] = _windows(val, starts, T - 1)
        return seqs


class RepeatBatches:
    """Pure synthetic task: `[BOS] + R + R + ...` (truncated to seq_len), R uniform random tokens of a length
    drawn per sequence from [min_len, max_len] (the period varies), ids from `pool` (specials excluded)."""

    def __init__(self, pool, bos_id: int, seq_len: int, min_len: int = 4, max_len: int | None = None):
        self.pool = np.asarray(pool, dtype=np.int64)
        if self.pool.size == 0:
            raise CorpusError("the repeated-tokens task needs a non-empty pool of token ids")
        self.bos_id, self.seq_len = bos_id, seq_len
        self.min_len = min_len
        self.max_len = max_len or max(min_len, (seq_len - 1) // 2)
        if not 1 <= self.min_len <= self.max_len:
            raise ValueError(f"need 1 <= min_len <= max_len, got {self.min_len}, {self.max_len}")

    def _make(self, rng: np.random.Generator, n: int) -> np.ndarray:
        seqs = np.empty((n, self.seq_len), dtype=np.int64)
        seqs[:, 0] = self.bos_id
        for i in range(n):
            L = int(rng.integers(self.min_len, self.max_len + 1))
            R = self.pool[rng.integers(0, self.pool.size, L)]
            reps = -(-(self.seq_len - 1) // L)
            seqs[i, 1:] = np.tile(R, reps)[: self.seq_len - 1]
        return seqs

    def batch(self, seed: int, step: int, batch_size: int, rank: int = 0, world_size: int = 1) -> np.ndarray:
        seqs = self._make(step_rng(seed, step), batch_size)
        per = batch_size // world_size
        return seqs[rank * per : (rank + 1) * per]

    def val_batch(self, n: int, seed: int = 0) -> np.ndarray:
        return self._make(step_rng(seed, -1 % (1 << 32), stream=1), n)


class Curriculum:
    """The first `switch_step` steps draw their batch from `first` (e.g. `RepeatBatches`), the rest from `then`;
    validation text always comes from `then`. A batch stays a pure function of (seed, step), so resumption and
    data parallelism are unchanged."""

    def __init__(self, first, then, switch_step: int):
        self.first, self.then, self.switch_step = first, then, int(switch_step)

    def batch(self, seed: int, step: int, batch_size: int, rank: int = 0, world_size: int = 1) -> np.ndarray:
        source = self.first if step < self.switch_step else self.then
        return source.batch(seed, step, batch_size, rank, world_size)

    def val_batch(self, n: int, seed: int = 0) -> np.ndarray:
        return self.then.val_batch(n, seed)

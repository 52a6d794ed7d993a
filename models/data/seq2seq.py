"""Synthetic sequence-to-sequence tasks for encoder–decoder models, with their character vocabularies and batches.

Tasks (`TASKS`): `copy`, `reverse` and `sort` strings of `n_symbols` letters of a length drawn from
`[min_len, max_len]`; `cumsum`, their running sum mod `n_symbols` (each target token depends on the one before it);
`walk`, the same running sum from a random start that the source does not hold (so only the target's own earlier
symbols tell it); and `date`, a character-level date-format translation ("nov 23, 2023" → "2023-11-23") whose
source and target vocabularies differ. Every vocabulary starts with the specials PAD = 0, BOS = 1, EOS = 2 (the
defaults of `models.EncoderDecoderConfig`).

Held-out split: a pair belongs to the held-out split when the CRC-32 of its source ids is ≡ 0 mod 10
(`is_held_out`), so training never sees a held-out source, on any machine. A batch row is `[source padded to n_src |
BOS target EOS padded to n_tgt]` (int64, `Seq2SeqBatches`); the batch of step s is a pure function of (seed, s), as
for text (`models.data.batches`).

Prefix-consistent targets (`Task.consistent_targets`): the symbol the task's rule gives at each target position for
the prefix a decoder actually reads, which may hold its own (or an injected) wrong symbols; where the rule does not
read earlier target symbols this is the true target. It is defined here, one method per task, beside the rule it
restates, so that a task and its rule cannot drift apart and a new task states both in one place; the exposure-bias
measures (`analyses.exposure_bias`) score predictions against it as well as against the true target.
"""

from __future__ import annotations

import datetime
import zlib

import numpy as np
import torch

from ..errors import TrainConfigError
from .batches import step_rng
from .tokenizer import CHAR_BOS as BOS
from .tokenizer import CHAR_EOS as EOS
from .tokenizer import CHAR_PAD as PAD
from .tokenizer import CHAR_SPECIALS as SPECIALS
from .tokenizer import CharVocab, Seq2SeqTokenizer  # noqa: F401  (re-exported)

LETTERS = "abcdefghijklmnopqrstuvwxyz"
MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
HELD_OUT_MOD = 10
NO_TARGET = -1  # consistent_targets: the prefix read is not one the rule continues (a non-symbol after BOS)
ANY_SYMBOL = -2  # consistent_targets: the rule admits every symbol here (a free choice, as walk's first symbol)


def is_held_out(src_ids) -> bool:
    """True when a source belongs to the held-out split: CRC-32 of its int64 ids ≡ 0 (mod 10)."""
    return zlib.crc32(np.asarray(src_ids, dtype=np.int64).tobytes()) % HELD_OUT_MOD == 0


class Task:
    """A seq2seq task: `sample(rng) -> (source ids, target ids)` without specials, over `tokenizer`'s vocabularies."""

    name = ""
    max_src = max_tgt = 0

    def __init__(self, n_symbols: int = 10, min_len: int = 1, max_len: int = 8):
        if not 2 <= n_symbols <= len(LETTERS):
            raise TrainConfigError(f"task_symbols must be in 2..{len(LETTERS)}, got {n_symbols}")
        if not 1 <= min_len <= max_len:
            raise TrainConfigError(f"need 1 <= task_min_len <= task_max_len, got {min_len}, {max_len}")
        self.n_symbols, self.min_len, self.max_len = n_symbols, min_len, max_len
        vocab = CharVocab(LETTERS[:n_symbols])
        self.tokenizer = Seq2SeqTokenizer(vocab, vocab)
        self.max_src, self.max_tgt = max_len, max_len

    def source(self, rng: np.random.Generator) -> np.ndarray:
        n = int(rng.integers(self.min_len, self.max_len + 1))
        return rng.integers(len(SPECIALS), len(SPECIALS) + self.n_symbols, n)

    def target(self, src: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def alignment(self, src: np.ndarray) -> np.ndarray | None:
        """`[len(target), len(src)]` bool: True where target token j may come from source position i (the same symbol
        at the place the task moves it to), or None when the target is not a rearrangement of the source."""
        return None

    def sample(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        src = self.source(rng)
        return src, self.target(src)

    def consistent_targets(self, src: torch.Tensor, read: torch.Tensor, gold: torch.Tensor) -> torch.Tensor:
        """`[batch, n]` ids: the symbol the task's rule gives at target position j = 0 .. n − 1 when the decoder has
        read `read [batch, n]` (BOS at position 0, then the symbols it was fed: true, its own or injected), for
        sources `src [batch, n_src]`; `gold [batch, n]` is the true target. `NO_TARGET` where the prefix is not one
        the rule continues, `ANY_SYMBOL` where the rule admits every symbol. This task's target does not read earlier
        target symbols, so the consistent target is the true one whatever the prefix."""
        return gold.clone()


class Copy(Task):
    """The target is the source."""

    name = "copy"

    def target(self, src):
        return src

    def alignment(self, src):
        return np.eye(len(src), dtype=bool)


class Reverse(Task):
    """The target is the source reversed: target position j aligns with source position L − 1 − j."""

    name = "reverse"

    def target(self, src):
        return src[::-1]

    def alignment(self, src):  # the anti-diagonal
        return np.eye(len(src), dtype=bool)[::-1].copy()


class Sort(Task):
    """The target is the source's symbols in alphabetical order."""

    name = "sort"

    def target(self, src):
        return np.sort(src)

    def alignment(self, src):  # any source position holding the symbol (repeated symbols are interchangeable)
        return np.sort(src)[:, None] == src[None, :]


class CumSum(Task):
    """The running sum mod k = `n_symbols` of the source's symbol values (letter a = 0, b = 1, ...): target symbol
    y_j = (y_{j−1} + x_j) mod k with y_{−1} = 0, so each target token is the previous one plus the aligned source
    token. Not a rearrangement of the source (no alignment)."""

    name = "cumsum"

    def target(self, src):
        first = len(SPECIALS)
        return (np.cumsum(np.asarray(src, dtype=np.int64) - first) % self.n_symbols) + first

    def consistent_targets(self, src, read, gold):
        """y_j = (the symbol read at j + x_j) mod k, the symbol read at position 0 being BOS (value 0): the rule
        applied to the decoder's own prefix (which equals `gold` when the prefix is the true one)."""
        return _running_sum_next(src, read, self.n_symbols)


def _running_sum_next(src: torch.Tensor, read: torch.Tensor, k: int) -> torch.Tensor:
    """(value of the symbol read at j, BOS read as 0) + x_j mod k, as an id; `NO_TARGET` where the symbol read is not
    a symbol (after BOS) or the source has no symbol j."""
    first = len(SPECIALS)
    n = read.shape[1]
    x = torch.full_like(read, PAD)
    width = min(n, src.shape[1])
    x[:, :width] = src[:, :width]
    j = torch.arange(n, device=read.device)
    prev = torch.where((j == 0) & (read == BOS), 0, read - first)
    ok = (((j == 0) & (read == BOS)) | ((j > 0) & (read >= first))) & (x >= first)
    return torch.where(ok, (prev + x - first) % k + first, NO_TARGET)


class Walk(Task):
    """The running sum mod k from a random start: y_j = (s + x_0 + … + x_j) mod k with s uniform in 0 .. k − 1, drawn
    with the source but not in it. The first symbol is uniform whatever the source, and y_j = (y_{j−1} + x_j) mod k
    after it, so a decoder can know the later symbols only from the target symbols before them: it must rely on its
    own earlier outputs. Not a rearrangement of the source (no alignment)."""

    name = "walk"

    def target(self, src, start: int = 0):
        """The target of `src` from start value `start` (0 gives cumsum's target)."""
        first = len(SPECIALS)
        return ((start + np.cumsum(np.asarray(src, dtype=np.int64) - first)) % self.n_symbols) + first

    def sample(self, rng):
        src = self.source(rng)
        return src, self.target(src, int(rng.integers(0, self.n_symbols)))

    def consistent_targets(self, src, read, gold):
        """Any symbol at position 0 (`ANY_SYMBOL`: every start is the rule's), then y_j = (the symbol read at j +
        x_j) mod k."""
        out = _running_sum_next(src, read, self.n_symbols)
        out[:, 0] = torch.where(read[:, 0] == BOS, ANY_SYMBOL, NO_TARGET)
        return out


class Date(Task):
    """Date-format translation: "mon d, yyyy" (e.g. "nov 3, 2023") → ISO 8601 "yyyy-mm-dd", dates 1950–2049."""

    name = "date"
    FIRST = datetime.date(1950, 1, 1).toordinal()
    DAYS = datetime.date(2050, 1, 1).toordinal() - FIRST

    def __init__(self, n_symbols: int = 10, min_len: int = 1, max_len: int = 8):
        src_chars = sorted(set("0123456789 ,") | set("".join(MONTHS)))
        self.tokenizer = Seq2SeqTokenizer(CharVocab(src_chars), CharVocab("0123456789-"))
        self.max_src, self.max_tgt = len("sep 30, 2023"), len("2023-09-30")

    @staticmethod
    def formats(day: datetime.date) -> tuple[str, str]:
        return f"{MONTHS[day.month - 1]} {day.day}, {day.year}", day.isoformat()

    def sample(self, rng):
        day = datetime.date.fromordinal(self.FIRST + int(rng.integers(0, self.DAYS)))
        src, tgt = self.formats(day)
        return (np.asarray(self.tokenizer.source.encode(src), dtype=np.int64),
                np.asarray(self.tokenizer.target.encode(tgt), dtype=np.int64))


TASKS: dict[str, type[Task]] = {t.name: t for t in (Copy, Reverse, Sort, CumSum, Walk, Date)}


def make_task(spec: str, n_symbols: int = 10, min_len: int = 1, max_len: int = 8) -> Task:
    """The task of a data spec `"seq2seq:NAME"` (NAME in `TASKS`)."""
    name = spec.split(":", 1)[1] if spec.startswith("seq2seq:") else spec
    if name not in TASKS:
        raise TrainConfigError(f"unknown seq2seq task {name!r}; tasks: {', '.join('seq2seq:' + t for t in TASKS)}")
    return TASKS[name](n_symbols, min_len, max_len)


class Seq2SeqBatches:
    """Rows `[source, PAD… | BOS, target, EOS, PAD…]` of width `n_src + n_tgt` (see the module docstring)."""

    def __init__(self, task: Task, n_src: int, n_tgt: int):
        if task.max_src > n_src or task.max_tgt + 2 > n_tgt:
            raise TrainConfigError(f"task {task.name!r} needs n_ctx_src >= {task.max_src} and n_ctx_tgt >= "
                                   f"{task.max_tgt + 2} (BOS and EOS), the model has {n_src} and {n_tgt}")
        self.task, self.n_src, self.n_tgt = task, n_src, n_tgt

    def _rows(self, rng: np.random.Generator, n: int, held_out: bool) -> np.ndarray:
        out = np.full((n, self.n_src + self.n_tgt), PAD, dtype=np.int64)
        i = 0
        while i < n:
            src, tgt = self.task.sample(rng)
            if is_held_out(src) != held_out:
                continue
            out[i, : len(src)] = src
            out[i, self.n_src : self.n_src + len(tgt) + 2] = np.concatenate([[BOS], tgt, [EOS]])
            i += 1
        return out

    def batch(self, seed: int, step: int, batch_size: int, rank: int = 0, world_size: int = 1) -> np.ndarray:
        """Rows `rank*B/W .. (rank+1)*B/W` of the global training batch of `step`."""
        rows = self._rows(step_rng(seed, step), batch_size, held_out=False)
        per = batch_size // world_size
        return rows[rank * per : (rank + 1) * per]

    def val_batch(self, n: int, seed: int = 0) -> np.ndarray:
        """`n` fixed rows of the held-out split."""
        return self._rows(step_rng(seed, -1 % (1 << 32), stream=1), n, held_out=True)

    def split(self, rows) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """`(src, tgt, src_mask, tgt_mask)` of rows (a target's mask keeps BOS, the symbols and EOS)."""
        rows = torch.as_tensor(rows)
        src, tgt = rows[:, : self.n_src], rows[:, self.n_src :]
        tgt_mask = torch.ones_like(tgt, dtype=torch.bool)
        tgt_mask[:, 1:] = tgt[:, 1:] != PAD
        return src, tgt, src != PAD, tgt_mask


@torch.no_grad()
def exact_match(model, batches: Seq2SeqBatches, rows, chunk: int = 256) -> float:
    """Fraction of `rows` whose greedy decoding (`model.generate`) equals the target up to and including EOS."""
    was = model.training
    model.eval()
    hits = 0
    for i in range(0, len(rows), chunk):
        src, tgt, src_mask, _ = batches.split(rows[i : i + chunk])
        src, tgt, src_mask = src.to(model.device), tgt.to(model.device), src_mask.to(model.device)
        out = model.generate(src, batches.n_tgt - 1, src_mask=src_mask)
        width = min(out.shape[1], tgt.shape[1])
        same = (out[:, :width] == tgt[:, :width]) | (tgt[:, :width] == PAD)
        hits += int((same.all(-1) & (out[:, :width] == EOS).any(-1)).sum())
    model.train(was)
    return hits / len(rows)

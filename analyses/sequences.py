"""Seeded probe sequences for the behavioural scores: random tokens, repeated random tokens.

"Random tokens" are drawn uniformly from a pool of ids: every id of the vocabulary
except the special tokens (BOS / PAD / EOS of `model.tokenizer`, when it has them), or, with
`tokens_from`, the distinct ids of a given array (e.g. the training corpus), minus the specials. Byte-level
vocabularies hold ids that never occur in text; reference.md suggests drawing from ids the model has seen.

A model without a tokenizer (a hand-built test model) uses id 0 as BOS, and 0 is left out of the pool.
"""

from __future__ import annotations

import torch

from circuits.checks import check_int
from models.arch.model import int_ids


def special_token_ids(model) -> list[int]:
    """BOS / PAD / EOS ids of `model.tokenizer` (those it defines); `[0]` when the model has no tokenizer."""
    tok = getattr(model, "tokenizer", None)
    if tok is None:
        return [0]
    ids = {getattr(tok, f"{n}_token_id", None) for n in ("bos", "pad", "eos")}
    ids = sorted(int(i) for i in ids if i is not None and 0 <= int(i) < model.cfg.d_vocab)
    return ids or [0]


def bos_token_id(model) -> int:
    """The id prepended to probe sequences: the tokenizer's BOS (else its first special id), or 0."""
    tok = getattr(model, "tokenizer", None)
    bos = getattr(tok, "bos_token_id", None) if tok is not None else None
    if bos is not None and 0 <= int(bos) < model.cfg.d_vocab:
        return int(bos)
    return special_token_ids(model)[0]


def token_pool(model, tokens_from=None) -> torch.Tensor:
    """Sorted int64 ids that random probe tokens are drawn from (see the module docstring)."""
    if tokens_from is None:
        pool = torch.arange(model.cfg.d_vocab)
    else:
        pool = torch.unique(int_ids(tokens_from, "tokens_from must be").reshape(-1).cpu())
        pool = pool[(pool >= 0) & (pool < model.cfg.d_vocab)]
    specials = torch.tensor(special_token_ids(model), dtype=torch.long)
    pool = pool[~torch.isin(pool, specials)]
    if pool.numel() < 2:
        raise ValueError(f"need at least 2 non-special token ids to draw random tokens from, got {pool.numel()}")
    return pool


def random_tokens(model, seq_len: int, batch: int = 1, seed: int = 0, tokens_from=None,
                  distinct: bool = False) -> torch.Tensor:
    """`[batch, seq_len]` ids drawn uniformly from `token_pool`, seeded, on CPU: with replacement, or with
    `distinct` without replacement within each row (when the pool holds at least `seq_len` ids)."""
    seq_len, batch, seed = check_int(seq_len, "seq_len", 0), check_int(batch, "batch"), check_int(seed, "seed", 0)
    pool = token_pool(model, tokens_from)
    g = torch.Generator().manual_seed(seed)
    if distinct and pool.numel() >= seq_len:
        return pool[torch.rand(batch, pool.numel(), generator=g).argsort(-1)[:, :seq_len]]
    return pool[torch.randint(0, pool.numel(), (batch, seq_len), generator=g)]


def repeated_tokens(model, seq_len: int, n_repeats: int = 2, batch: int = 1, seed: int = 0,
                    tokens_from=None, prepend_bos: bool = True, distinct: bool = True) -> torch.Tensor:
    """`[BOS] + R * n_repeats` with R `[batch, seq_len]` random tokens: `[batch, 1 + n_repeats*seq_len]`.

    R's tokens are distinct within a row (`distinct`, whenever the pool allows), so that every token of a
    later copy has exactly one occurrence per earlier copy: ARENA draws with replacement from 50k ids, where
    repeats inside R are rare; with a small vocabulary they would split an induction head's attention between
    several "earlier occurrences" and blur the scores. Raises `ValueError` when the sequence does not fit the
    model's learned positions (n_ctx)."""
    seq_len, n_repeats, batch = (check_int(v, n) for v, n in ((seq_len, "seq_len"), (n_repeats, "n_repeats"),
                                                               (batch, "batch")))
    length = int(prepend_bos) + n_repeats * seq_len
    if length > model.cfg.n_ctx:
        raise ValueError(
            f"a sequence of {n_repeats} x {seq_len} random tokens{' + BOS' if prepend_bos else ''} has {length} "
            f"positions, more than the model's n_ctx={model.cfg.n_ctx}; use a shorter seq_len"
        )
    r = random_tokens(model, seq_len, batch, seed, tokens_from, distinct)
    parts = [torch.full((batch, 1), bos_token_id(model), dtype=torch.long)] if prepend_bos else []
    return torch.cat(parts + [r] * n_repeats, dim=1)

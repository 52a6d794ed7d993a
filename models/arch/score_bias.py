"""Attention-score biases: what is added to a head's scores `q·kᵀ / √d_head` before the softmax.

A `ScoreBias` answers two questions for `n_q` query and `n_k` key positions:

- `additive(n_q, n_k, dtype, device)`: a finite term `[heads or 1, n_q, n_k]` added to the scores (ALiBi's
  −slope·|i − j|, Press et al. 2021), or None;
- `keep(n_q, n_k, device)`: a bool mask `[n_q, n_k]`, True where the query may attend to the key, or None for
  "every key" (a causal mask keeps j ≤ i, Vaswani et al. 2017).

Queries are the last `n_q` of the `n_k` key positions (equal lengths in a plain forward pass; with a prefix of
cached keys, a query at i still sees keys 0..i). The attention layer reads `dense` (the additive term with −inf
where masked) on its explicit path and `sdpa_args` for `F.scaled_dot_product_attention`. The attention mask comes
from the config's `attention_dir` (`attention_mask`), a positional bias from the positional scheme
(`models.arch.positions`); `combine` adds them. A new kind (a padding mask, say) is one subclass here.
"""

from __future__ import annotations

import functools

import torch


class ScoreBias:
    """Base class: adds nothing and masks nothing (bidirectional attention)."""

    #: True when `keep` may mask every key of a query (a padding mask): the explicit path then reads the softmax's
    #: NaN row as zeros, as `F.scaled_dot_product_attention` does.
    empty_rows = False

    def additive(self, n_q: int, n_k: int, dtype: torch.dtype, device=None) -> torch.Tensor | None:
        """The finite term added to the scores, `[heads or 1, n_q, n_k]`, or None."""
        return None

    def keep(self, n_q: int, n_k: int, device=None) -> torch.Tensor | None:
        """`[n_q, n_k]` bool, True where a query may attend to a key; None when every key is kept."""
        return None

    def dense(self, n_q: int, n_k: int, dtype: torch.dtype, device=None) -> torch.Tensor | None:
        """`additive` with −inf where `keep` is False (`[n_q, n_k]` or `[heads, n_q, n_k]`), or None for nothing.
        Built once per shape, dtype and device on this object (the model makes one per forward pass, which every
        layer reads): callers must not modify it."""
        memo = self.__dict__.setdefault("_dense_memo", {})
        key = (n_q, n_k, dtype, None if device is None else torch.device(device))
        if key not in memo:
            memo[key] = self._dense(n_q, n_k, dtype, device)
        return memo[key]

    def _dense(self, n_q: int, n_k: int, dtype: torch.dtype, device=None) -> torch.Tensor | None:
        add, keep = self.additive(n_q, n_k, dtype, device), self.keep(n_q, n_k, device)
        if keep is None:
            return add
        out = torch.zeros(n_q, n_k, dtype=dtype, device=device) if add is None else add
        return out.masked_fill(~keep, float("-inf"))  # broadcasts: a per-sequence mask gives [batch, 1, n_q, n_k]

    def sdpa_args(self, n_q: int, n_k: int, dtype: torch.dtype, device=None) -> tuple[torch.Tensor | None, bool]:
        """`(attn_mask, is_causal)` for `F.scaled_dot_product_attention` (which adds a float mask to its scores)."""
        return self.dense(n_q, n_k, dtype, device), False


class Bidirectional(ScoreBias):
    """Every query attends to every key (encoders, `attention_dir="bidirectional"`)."""


class Causal(ScoreBias):
    """A query at position i attends to keys j ≤ i only (decoders, `attention_dir="causal"`)."""


    def keep(self, n_q: int, n_k: int, device=None) -> torch.Tensor | None:
        if n_q == 1:  # one query, the last position (a decoding step with a key/value cache): it sees every key
            return None
        return torch.ones(n_q, n_k, dtype=torch.bool, device=device).tril(n_k - n_q)

    def sdpa_args(self, n_q: int, n_k: int, dtype: torch.dtype, device=None) -> tuple[torch.Tensor | None, bool]:
        if n_q == n_k:  # the fused kernel's own causal mask, no [pos, key] tensor
            return None, True
        return super().sdpa_args(n_q, n_k, dtype, device)


class Padding(ScoreBias):
    """Padding: key j of sequence b is kept only where `attention_mask[b, j]` is 1 (TransformerLens' `attention_mask`,
    Hugging Face's convention). `attention_mask [batch, n_k]` covers every key, cached ones included. `keep` is
    `[batch, 1, n_q, n_k]`; a query whose every key is masked (a left pad) attends nowhere: its pattern row is 0, as
    TransformerLens 2.x (which turns the softmax's NaN row into zeros)."""

    empty_rows = True

    def __init__(self, attention_mask: torch.Tensor):
        self.attention_mask = attention_mask.bool()

    def keep(self, n_q, n_k, device=None):
        if self.attention_mask.shape[1] != n_k:
            raise ValueError(f"attention_mask covers {self.attention_mask.shape[1]} positions, the keys are {n_k}")
        return self.attention_mask[:, None, None, :].to(device).expand(-1, 1, n_q, n_k)


class Sum(ScoreBias):
    """Several biases at once: their additive terms add, their masks intersect."""

    def __init__(self, *parts: ScoreBias):
        self.parts = parts
        self.empty_rows = any(p.empty_rows for p in parts)

    def additive(self, n_q, n_k, dtype, device=None):
        terms = [t for p in self.parts if (t := p.additive(n_q, n_k, dtype, device)) is not None]
        return sum(terms[1:], terms[0]) if terms else None

    def keep(self, n_q, n_k, device=None):
        masks = [m for p in self.parts if (m := p.keep(n_q, n_k, device)) is not None]
        return functools.reduce(torch.logical_and, masks) if masks else None  # broadcasts a per-batch mask

    def sdpa_args(self, n_q, n_k, dtype, device=None):
        args = [p.sdpa_args(n_q, n_k, dtype, device) for p in self.parts]
        active = [a for a in args if a[0] is not None or a[1]]
        if len(active) <= 1:  # at most one part does anything: its own (possibly fused-kernel) form
            return active[0] if active else (None, False)
        return self.dense(n_q, n_k, dtype, device), False


class KeyPadding(ScoreBias):
    """Padding: no query attends to a key whose `keys [batch, n_k]` entry is False (a padded position). Its mask is
    per sequence, `[batch, 1, 1, n_k]`, broadcasting over heads and queries (so `dense` is `[batch, 1, n_q, n_k]`)."""

    def __init__(self, keys: torch.Tensor):
        self.keys = keys

    def keep(self, n_q: int, n_k: int, device=None) -> torch.Tensor:
        return self.keys[:, None, None, -n_k:].to(device)


def combine(*parts: ScoreBias | None) -> ScoreBias:
    """The biases `parts` together (None entries skipped): one of them as it is, several as a `Sum`."""
    kept = [p for p in parts if p is not None]
    if not kept:
        return Bidirectional()
    return kept[0] if len(kept) == 1 else Sum(*kept)


#: `attention_dir` → its attention mask.
MASKS: dict[str, type[ScoreBias]] = {"causal": Causal, "bidirectional": Bidirectional}


def attention_mask(cfg) -> ScoreBias:
    """The mask of `cfg.attention_dir` (causal when the config has none, as TransformerLens' default)."""
    return MASKS[getattr(cfg, "attention_dir", "causal")]()

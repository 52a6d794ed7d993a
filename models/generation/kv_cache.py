"""The key/value cache of incremental decoding, as TransformerLens 2.x's `HookedTransformerKeyValueCache`: the one
cache of every model type (decoder-only, and the encoder–decoder's decoder self-attention).

`forward(tokens, past_kv_cache=cache)` runs only the new positions: each attention layer prepends the keys and values
it cached for the earlier positions (before the rotation, so a rotary model rotates every key by its own position)
and appends the new ones. The cache also keeps the attention mask of every position seen, so padding and positions
stay right across calls. `freeze()` stops it growing (many continuations of one prefix).

The API and results are TransformerLens 2.18's (`transformer_lens/past_key_value_caching.py`), whose `append` is a
`torch.cat` of everything cached with the new positions. Here the cached keys, values and mask live in buffers that
grow by doubling (`_Growing`), and an unfrozen append writes the new positions into them in place, so a decoding
step copies only what it adds, not the whole prefix. `past_keys`, `past_values` and `previous_attention_mask` read
as TransformerLens' tensors (views of the filled part; positions already cached are never written again, so a view
taken earlier keeps its values) and can be assigned. A frozen cache, and an append that autograd must track (new
keys that require grad), take TransformerLens' `torch.cat`.
"""

from __future__ import annotations

import torch


class _Growing:
    """A tensor that grows along one dimension `dim`: `buf` holds capacity for more, the first `n` entries along
    `dim` are filled. `view()` is the filled part; `extend(new)` writes `new` after it in place and returns the
    filled part, reallocating (capacity doubled) when full."""

    def __init__(self, t: torch.Tensor, dim: int):
        self.buf, self.n, self.dim = t, t.shape[dim], dim

    def view(self) -> torch.Tensor:
        return self.buf.narrow(self.dim, 0, self.n)

    def fits(self, new: torch.Tensor) -> bool:
        """`extend(new)` gives what `torch.cat([view(), new], dim)` gives: same device, dtype (no promotion) and
        sizes off `dim`, and no autograd to track (history in the buffer to overwrite, or a new part that requires
        grad)."""
        buf, d = self.buf, self.dim
        return (new.device == buf.device and new.dtype == buf.dtype and not buf.requires_grad
                and not new.requires_grad and new.shape[:d] == buf.shape[:d] and new.shape[d + 1:] == buf.shape[d + 1:])

    def extend(self, new: torch.Tensor) -> torch.Tensor:
        n, add, dim = self.n, new.shape[self.dim], self.dim
        if n + add > self.buf.shape[dim]:
            shape = list(self.buf.shape)
            shape[dim] = max(n + add, 2 * shape[dim], 16)
            buf = self.buf.new_empty(shape)
            buf.narrow(dim, 0, n).copy_(self.view())
            self.buf = buf
        self.buf.narrow(dim, n, add).copy_(new)
        self.n = n + add
        return self.view()

    def append(self, new: torch.Tensor, keep: bool) -> torch.Tensor:
        """`torch.cat([view(), new], dim)`, TransformerLens' append, kept as the filled part when `keep`: written in
        place when it `fits`, else the concatenation itself becomes the buffer."""
        if keep and self.fits(new):
            return self.extend(new)
        out = torch.cat([self.view(), new], self.dim)
        if keep:
            self.buf, self.n = out, out.shape[self.dim]
        return out


def _head_major(name: str, doc: str) -> property:
    """A `[batch, pos, head, d_head]` attribute kept as the head-major `_Growing` buffer `name`."""
    return property(lambda self: getattr(self, name).view().transpose(1, 2),
                    lambda self, value: setattr(self, name, _Growing(value.transpose(1, 2), 2)), doc=doc)


class HookedTransformerKeyValueCacheEntry:
    """One layer's cache: `past_keys`, `past_values` `[batch, pos_so_far, n_key_value_heads, d_head]`.

    Stored head-major (`[batch, head, pos, d_head]`, what the attention kernel reads), so the tensors given out are
    transposed views of the buffers."""

    def __init__(self, past_keys: torch.Tensor, past_values: torch.Tensor, frozen: bool = False):
        self.past_keys, self.past_values, self.frozen = past_keys, past_values, frozen

    @classmethod
    def init_cache_entry(cls, cfg, device=None, batch_size: int = 1) -> HookedTransformerKeyValueCacheEntry:
        # the heads the attention makes keys for: `n_key_value_heads`, or every query head when ungrouped
        # (`ungroup_grouped_query_attention`; TransformerLens 2.18 sizes the cache by n_key_value_heads there and fails)
        grouped = cfg.n_key_value_heads and not getattr(cfg, "ungroup_grouped_query_attention", False)
        shape = (batch_size, 0, cfg.n_key_value_heads if grouped else cfg.n_heads, cfg.d_head)
        dtype = _torch_dtype(cfg)
        return cls(torch.empty(shape, device=device, dtype=dtype), torch.empty(shape, device=device, dtype=dtype))

    past_keys = _head_major("_keys", "`[batch, pos_so_far, n_key_value_heads, d_head]`, before rotation")
    past_values = _head_major("_values", "`[batch, pos_so_far, n_key_value_heads, d_head]`")

    def append(self, new_keys: torch.Tensor, new_values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The cached keys and values followed by the new ones (`[batch, pos_so_far + new, heads, d_head]`); kept
        unless frozen."""
        keep = not self.frozen
        return (self._keys.append(new_keys.transpose(1, 2), keep).transpose(1, 2),
                self._values.append(new_values.transpose(1, 2), keep).transpose(1, 2))

    def select(self, rows: torch.Tensor) -> None:
        """Keep the batch rows `rows` (beam search: each beam continues its parent's cache)."""
        self.past_keys, self.past_values = self.past_keys[rows], self.past_values[rows]

    def __repr__(self) -> str:
        return (f"HookedTransformerKeyValueCacheEntry(past_keys={tuple(self.past_keys.shape)}, "
                f"past_values={tuple(self.past_values.shape)}, frozen={self.frozen})")


class HookedTransformerKeyValueCache:
    """One `HookedTransformerKeyValueCacheEntry` per layer and `previous_attention_mask [batch, pos_so_far]`."""

    def __init__(self, entries: list, previous_attention_mask: torch.Tensor, frozen: bool = False):
        self.entries, self.previous_attention_mask, self.frozen = entries, previous_attention_mask, frozen

    @classmethod
    def init_cache(cls, cfg, device=None, batch_size: int = 1) -> HookedTransformerKeyValueCache:
        entries = [HookedTransformerKeyValueCacheEntry.init_cache_entry(cfg, device, batch_size)
                   for _ in range(cfg.n_layers)]
        return cls(entries, torch.empty((batch_size, 0), device=device, dtype=torch.int))

    @property
    def previous_attention_mask(self) -> torch.Tensor:
        return self._mask.view()

    @previous_attention_mask.setter
    def previous_attention_mask(self, value: torch.Tensor) -> None:
        self._mask = _Growing(value, 1)

    def freeze(self) -> None:
        self.frozen = True
        for entry in self.entries:
            entry.frozen = True

    def unfreeze(self) -> None:
        self.frozen = False
        for entry in self.entries:
            entry.frozen = False

    def append_attention_mask(self, attention_mask: torch.Tensor) -> torch.Tensor:
        """The mask of every position so far, the new `attention_mask [batch, new]` last; kept unless frozen."""
        if attention_mask.shape[0] != self._mask.buf.shape[0]:
            raise ValueError(f"the cache holds a batch of {self._mask.buf.shape[0]}, the input has "
                             f"{attention_mask.shape[0]}; init_cache(cfg, device, batch_size) with the input's batch "
                             "size")
        return self._mask.append(attention_mask.to(self._mask.buf), not self.frozen)

    def select(self, rows: torch.Tensor) -> None:
        """Keep the batch rows `rows` of every layer and of the mask (beam search: each beam continues its parent's
        cache)."""
        self.previous_attention_mask = self.previous_attention_mask[rows]
        for entry in self.entries:
            entry.select(rows)

    @property
    def n_past(self) -> int:
        """How many positions the cache holds."""
        return self._mask.n

    def __getitem__(self, layer: int) -> HookedTransformerKeyValueCacheEntry:
        return self.entries[layer]

    def __repr__(self) -> str:
        return (f"HookedTransformerKeyValueCache({len(self.entries)} layers, previous_attention_mask="
                f"{tuple(self.previous_attention_mask.shape)}, frozen={self.frozen})")


def _torch_dtype(cfg) -> torch.dtype:
    dtype = getattr(cfg, "torch_dtype", None) or cfg.dtype
    return dtype if isinstance(dtype, torch.dtype) else getattr(torch, str(dtype))

"""The key/value cache of incremental decoding, as TransformerLens 2.x's `HookedTransformerKeyValueCache`.

`forward(tokens, past_kv_cache=cache)` runs only the new positions: each attention layer prepends the keys and values
it cached for the earlier positions (before the rotation, so a rotary model rotates every key by its own position)
and appends the new ones. The cache also keeps the attention mask of every position seen, so padding and positions
stay right across calls. `freeze()` stops it growing (many continuations of one prefix).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class HookedTransformerKeyValueCacheEntry:
    """One layer's cache: `past_keys`, `past_values` `[batch, pos_so_far, n_key_value_heads, d_head]`."""

    past_keys: torch.Tensor
    past_values: torch.Tensor
    frozen: bool = False

    @classmethod
    def init_cache_entry(cls, cfg, device=None, batch_size: int = 1) -> HookedTransformerKeyValueCacheEntry:
        shape = (batch_size, 0, cfg.n_key_value_heads or cfg.n_heads, cfg.d_head)
        dtype = _torch_dtype(cfg)
        return cls(torch.empty(shape, device=device, dtype=dtype), torch.empty(shape, device=device, dtype=dtype))

    def append(self, new_keys: torch.Tensor, new_values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The cached keys and values followed by the new ones (`[batch, pos_so_far + new, heads, d_head]`); kept
        unless frozen."""
        keys = torch.cat([self.past_keys, new_keys], dim=1)
        values = torch.cat([self.past_values, new_values], dim=1)
        if not self.frozen:
            self.past_keys, self.past_values = keys, values
        return keys, values


@dataclass
class HookedTransformerKeyValueCache:
    """One `HookedTransformerKeyValueCacheEntry` per layer and `previous_attention_mask [batch, pos_so_far]`."""

    entries: list
    previous_attention_mask: torch.Tensor
    frozen: bool = False

    @classmethod
    def init_cache(cls, cfg, device=None, batch_size: int = 1) -> HookedTransformerKeyValueCache:
        entries = [HookedTransformerKeyValueCacheEntry.init_cache_entry(cfg, device, batch_size)
                   for _ in range(cfg.n_layers)]
        return cls(entries, torch.empty((batch_size, 0), device=device, dtype=torch.int))

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
        if attention_mask.shape[0] != self.previous_attention_mask.shape[0]:
            raise ValueError(f"the cache holds a batch of {self.previous_attention_mask.shape[0]}, the input has "
                             f"{attention_mask.shape[0]}; init_cache(cfg, device, batch_size) with the input's batch "
                             "size")
        mask = torch.cat([self.previous_attention_mask, attention_mask.to(self.previous_attention_mask)], dim=-1)
        if not self.frozen:
            self.previous_attention_mask = mask
        return mask

    @property
    def n_past(self) -> int:
        """How many positions the cache holds."""
        return self.previous_attention_mask.shape[1]

    def __getitem__(self, layer: int) -> HookedTransformerKeyValueCacheEntry:
        return self.entries[layer]


def _torch_dtype(cfg) -> torch.dtype:
    dtype = getattr(cfg, "torch_dtype", None) or cfg.dtype
    return dtype if isinstance(dtype, torch.dtype) else getattr(torch, str(dtype))

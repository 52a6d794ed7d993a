"""Padding: which positions of a padded batch are real tokens, and the positions they take (TransformerLens 2.x)."""

from __future__ import annotations

import torch

PADDING_SIDES = ("left", "right")


def padding_side_of(model, padding_side: str | None) -> str:
    """`padding_side` if given, else the tokenizer's (`"right"` without one); checked against `PADDING_SIDES`."""
    side = padding_side or getattr(model.tokenizer, "padding_side", None) or "right"
    if side not in PADDING_SIDES:
        raise ValueError(f"padding_side={side!r} is not supported; allowed: {PADDING_SIDES}")
    return side


def infer_attention_mask(model, tokens: torch.Tensor, prepend_bos: bool | None = None,
                         padding_side: str | None = None) -> torch.Tensor:
    """`[batch, pos]` int64, 0 on padding, as TransformerLens' `utils.get_attention_mask`: only the pad ids before
    the first other token (left padding) or after the last (right padding) are padding; when the pad id is also
    the BOS id and a BOS was prepended, the last leading pad is that BOS. All ones without a tokenizer or pad id."""
    mask = torch.ones_like(tokens)
    pad = getattr(model.tokenizer, "pad_token_id", None)
    if pad is None:
        return mask
    real = tokens.ne(pad)
    if padding_side_of(model, padding_side) == "right":
        mask[real.flip(-1).cumsum(-1).flip(-1) == 0] = 0
        return mask
    leading = real.cumsum(-1) == 0
    mask[leading] = 0
    prepend_bos = model.cfg.default_prepend_bos if prepend_bos is None else prepend_bos
    if prepend_bos and getattr(model.tokenizer, "bos_token_id", None) == pad:
        mask[torch.arange(mask.shape[0]), (leading.sum(-1) - 1).clamp(min=0)] = 1
    return mask


def position_ids(attention_mask: torch.Tensor, n_past: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The positions of the last `pos - n_past` columns of `attention_mask [batch, pos]`: the count of real tokens
    before each (TransformerLens' `cumsum − 1`, clamped at 0), and which of them are real (bool)."""
    ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)[:, n_past:]
    return ids, attention_mask[:, n_past:].bool()

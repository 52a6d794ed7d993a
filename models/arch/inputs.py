"""Checks of a model's inputs (decoder-only `validate_tokens` and the encoder–decoder's): token ids against one
vocabulary and context, padding masks against
their tokens. Each refusal is an `InputError` naming the argument and what is allowed."""

from __future__ import annotations

import torch

from ..errors import InputError


def check_tokens(tokens, name: str, d_vocab: int, max_context: int | None, device, positions: str = ""
                 ) -> torch.Tensor:
    """`tokens` (a tensor, array or nested list of ints; `[pos]` or `[batch, pos]`) as int64 `[batch, pos]` on
    `device`, its ids in `0..d_vocab-1` and its length within `max_context` (None: any; `positions` names the
    positional type in the message)."""
    if not isinstance(tokens, torch.Tensor):
        try:
            tokens = torch.as_tensor(tokens)
        except (TypeError, ValueError, RuntimeError) as e:
            raise InputError(f"{name} must be integer token ids [batch, pos], got {type(tokens).__name__}: "
                             f"{e}") from None
    if tokens.ndim == 1:
        tokens = tokens[None]
    if tokens.ndim != 2:
        raise InputError(f"{name} must have shape [batch, pos] or [pos], got {tuple(tokens.shape)}")
    if tokens.numel() == 0:
        raise InputError(f"{name} is empty (shape {tuple(tokens.shape)}); give at least one token")
    if tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool:
        raise InputError(f"{name} must be integer token ids (int64), got dtype {tokens.dtype}")
    # the range check reads the values: inside `torch.compile` it would break the graph, and the embedding's own
    # index check stands in for it there
    lo, hi = (0, 0) if torch.compiler.is_compiling() else (int(tokens.min()), int(tokens.max()))
    if lo < 0 or hi >= d_vocab:
        raise InputError(f"{name}: token id {lo if lo < 0 else hi} is out of range; allowed ids are 0..{d_vocab - 1}")
    if max_context is not None and tokens.shape[1] > max_context:
        kind = f" ({positions})" if positions else ""
        raise InputError(f"{name}: context of {tokens.shape[1]} tokens is longer than n_ctx={max_context}, the "
                         f"number of learned positions{kind}; truncate to at most {max_context}")
    return tokens.to(device=device, dtype=torch.long)


def check_mask(mask, tokens: torch.Tensor, name: str, first_kept: bool) -> torch.Tensor | None:
    """`mask` (None, or booleans / 0-1 numbers of the tokens' shape `[batch, pos]`: True at real tokens) as a bool
    tensor. Every row must keep a token; with `first_kept` (a causal decoder, whose first query sees only the first
    key) the first one, that is, padding on the right."""
    if mask is None:
        return None
    mask = torch.as_tensor(mask, device=tokens.device)
    if mask.ndim == 1 and tokens.shape[0] == 1:
        mask = mask[None]
    if tuple(mask.shape) != tuple(tokens.shape):
        raise InputError(f"{name} has shape {tuple(mask.shape)} but its tokens have {tuple(tokens.shape)}; a mask is "
                         "[batch, pos], True (1) at real tokens and False (0) at padding")
    if mask.dtype != torch.bool:
        if mask.dtype.is_complex or not bool(((mask == 0) | (mask == 1)).all()):
            raise InputError(f"{name} must hold booleans or 0/1 values, got dtype {mask.dtype} with other values")
        mask = mask.bool()
    if not bool(mask.any(-1).all()):
        raise InputError(f"{name} masks every position of a sequence; each needs at least one real token")
    if first_kept and not bool(mask[:, 0].all()):
        raise InputError(f"{name} masks the first position of a sequence; pad targets on the right")
    return mask

"""Sampling and beam search for `HookedTransformer` (no KV cache: toy contexts are short, and every
step runs the ordinary hookable forward, so hooks apply during generation too)."""

from __future__ import annotations

import math
import warnings

import torch


def _check_int(name: str, v, lo: int) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or v < lo:
        raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")


class ContextWindowWarning(UserWarning):
    """A prompt longer than the model's context: the model conditions on its last tokens only."""


def check_sampling(max_new_tokens, temperature, top_k, top_p) -> None:
    """`ValueError` naming the first sampling setting out of range (NaN included)."""
    _check_int("max_new_tokens", max_new_tokens, 0)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 <= temperature < math.inf:
        raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {temperature!r}")
    if top_k is not None:
        _check_int("top_k", top_k, 1)
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1):
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")


def prompt_ids(model, tokens) -> torch.Tensor:
    """A prompt as `[batch, pos]` ids, text encoded whole. Past a learned positional table (`n_ctx` rows) the model
    conditions on the prompt's last `n_ctx` tokens, a window that slides as tokens are generated; the prompt stays
    whole in the output, and `ContextWindowWarning` says how many tokens fell out of view."""
    if isinstance(tokens, str) or (isinstance(tokens, list) and tokens and isinstance(tokens[0], str)):
        tokens = model.to_tokens(tokens, truncate=False)
    tokens = model.validate_tokens(tokens, check_length=False)
    limit = model.cfg.positions.max_context
    if limit is not None and tokens.shape[1] > limit:
        warnings.warn(f"the prompt has {tokens.shape[1]} tokens, more than n_ctx={limit}: the model sees its last "
                      f"{limit} (the first {tokens.shape[1] - limit} are out of view)", ContextWindowWarning,
                      stacklevel=3)
    return tokens


def _context(model, tokens: torch.Tensor) -> torch.Tensor:
    """The last n_ctx tokens when positions are a learned table (no later rows exist); everything otherwise."""
    limit = model.cfg.positions.max_context
    return tokens[:, -limit:] if limit is not None else tokens


def filter_logits(logits: torch.Tensor, top_k: int | None, top_p: float | None) -> torch.Tensor:
    """Keep the top-k logits (Fan et al. 2018) and/or the smallest set whose probability reaches top_p (nucleus
    sampling, Holtzman et al. 2019); the rest → −inf."""
    if top_k is not None and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, idx = logits.sort(dim=-1, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop = cum - sorted_logits.softmax(-1) >= top_p  # keep the token that crosses top_p
        logits = logits.masked_fill(drop.scatter(-1, idx, drop), float("-inf"))
    return logits


@torch.no_grad()
def generate(model, tokens, max_new_tokens=20, temperature=1.0, top_k=None, top_p=None, seed=None,
             stop_at_eos: bool = False, eos_token_id: int | None = None):
    """Sample `max_new_tokens` continuations. `temperature=0` is greedy. Text in → text out; ids in →
    `[batch, pos + new]` ids out. Seeded with its own generator (the global RNG is untouched). A prompt longer than
    the context is kept whole; the model sees its last n_ctx tokens (`prompt_ids`)."""
    check_sampling(max_new_tokens, temperature, top_k, top_p)
    as_text = isinstance(tokens, str)
    tokens = prompt_ids(model, tokens)
    gen = torch.Generator(device=tokens.device)
    if seed is not None:
        gen.manual_seed(seed)
    else:
        gen.seed()
    done = torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)
    for _ in range(max_new_tokens):
        logits = model(_context(model, tokens))[:, -1].float()  # [batch, d_vocab]
        if temperature == 0:
            nxt = logits.argmax(-1)
        else:
            probs = filter_logits(logits / temperature, top_k, top_p).softmax(-1)
            nxt = torch.multinomial(probs, 1, generator=gen)[:, 0]
        if eos_token_id is not None:
            nxt = torch.where(done, torch.full_like(nxt, eos_token_id), nxt)
            done |= nxt == eos_token_id
        tokens = torch.cat([tokens, nxt[:, None]], dim=1)
        if stop_at_eos and eos_token_id is not None and bool(done.all()):
            break
    return model.to_string(tokens[0]) if as_text else tokens


@torch.no_grad()
def beam_search(model, tokens, beams: int = 4, max_new_tokens: int = 20):
    """Deterministic beam search over one prompt. Returns `(sequences [beams, pos + new], log_probs [beams])`,
    best first; log_probs are the summed log-probabilities of the generated tokens."""
    _check_int("beams", beams, 1)
    _check_int("max_new_tokens", max_new_tokens, 0)
    tokens = prompt_ids(model, tokens)
    if tokens.shape[0] != 1:
        raise ValueError(f"beam_search takes one prompt, got a batch of {tokens.shape[0]}")
    seqs, scores = tokens, torch.zeros(1, device=tokens.device)
    for _ in range(max_new_tokens):
        logp = model(_context(model, seqs))[:, -1].float().log_softmax(-1)  # [n_beams, d_vocab]
        total = (scores[:, None] + logp).reshape(-1)
        scores, flat = total.topk(min(beams, total.numel()))
        parent, nxt = flat // logp.shape[-1], flat % logp.shape[-1]
        seqs = torch.cat([seqs[parent], nxt[:, None]], dim=1)
    return seqs, scores

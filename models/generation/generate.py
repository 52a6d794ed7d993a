"""Sampling and beam search for `HookedTransformer`. Every step runs the ordinary hookable forward, so hooks apply
during generation too (with the key/value cache, on the new position only, as TransformerLens)."""

from __future__ import annotations

import math
import warnings

import torch

from ..arch.padding import infer_attention_mask
from ..errors import ContextWindowWarning, InputError
from .beam import batched_beam_search, check_beams
from .kv_cache import HookedTransformerKeyValueCache


def _check_int(name: str, v, lo: int) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or v < lo:
        raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")


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


RETURN_TYPES = ("input", "str", "tokens", "embeds")


def sample(logits: torch.Tensor, tokens: torch.Tensor, gen: torch.Generator, do_sample: bool, temperature: float,
           top_k, top_p, freq_penalty: float) -> torch.Tensor:
    """The next token of each row from its last logits `[batch, d_vocab]`: argmax when greedy (`do_sample=False` or
    `temperature=0`), else a draw from softmax(logits / temperature − freq_penalty · count of the token in `tokens`)
    after top-k / top-p filtering (TransformerLens 2.x's `sample_logits`)."""
    if not do_sample or temperature == 0:
        return logits.argmax(-1)
    logits = logits / temperature
    if freq_penalty:
        counts = torch.zeros_like(logits).scatter_add_(-1, tokens, torch.ones_like(tokens, dtype=logits.dtype))
        logits = logits - freq_penalty * counts
    probs = filter_logits(logits, top_k, top_p).softmax(-1)
    return torch.multinomial(probs, 1, generator=gen)[:, 0]


def prompt_embeds(model, embeds: torch.Tensor) -> torch.Tensor:
    """A prompt given as token embeddings `[batch, pos, d_model]` (float), on the model's device and dtype, or
    `InputError`. Past a learned positional table the model sees the last `n_ctx` of them (`ContextWindowWarning`)."""
    if embeds.ndim != 3 or embeds.shape[-1] != model.cfg.d_model or 0 in embeds.shape[:2]:
        raise InputError(f"embeddings to generate from must be a float tensor [batch, pos, d_model={model.cfg.d_model}]"
                         f" with batch, pos >= 1, got shape {tuple(embeds.shape)}")
    limit = model.cfg.positions.max_context
    if limit is not None and embeds.shape[1] > limit:
        warnings.warn(f"the prompt has {embeds.shape[1]} embeddings, more than n_ctx={limit}: the model sees its last "
                      f"{limit}", ContextWindowWarning, stacklevel=3)
    return embeds.to(model.W_E.device, model.W_E.dtype)


def _embeds_logits(model, embeds: torch.Tensor, cache) -> torch.Tensor:
    """The last position's logits `[batch, d_vocab_out]` from token embeddings, as TransformerLens 2.x's `generate`:
    positions added by `get_residual` (`hook_embed` does not fire: there are no ids), then every block. Without a
    cache `embeds` is the whole context; with a key/value cache, the positions after those it holds."""
    if cache is None:
        resid, pos_qk = model.get_residual(_context(model, embeds))
        return model(resid, start_at_layer=0, shortformer_pos_embed=pos_qk)[:, -1].float()
    n_past = cache.n_past
    mask = cache.append_attention_mask(torch.ones(embeds.shape[:2], dtype=torch.long, device=embeds.device))
    resid, pos_qk = model.get_residual(embeds, n_past, attention_mask=mask)
    return model(resid, start_at_layer=0, shortformer_pos_embed=pos_qk, attention_mask=mask,
                 past_kv_cache=cache)[:, -1].float()


@torch.no_grad()
def generate(model, input, max_new_tokens=20, temperature=1.0, top_k=None, top_p=None, seed=None,
             stop_at_eos: bool = False, eos_token_id: int | None = None, do_sample: bool = True,
             freq_penalty: float = 0.0, use_past_kv_cache: bool | None = None, prepend_bos: bool | None = None,
             padding_side: str | None = None, return_type: str = "input", verbose: bool = False):
    """Continue `input` (text, a list of texts, ids `[batch, pos]`, or token embeddings `[batch, pos, d_model]`) by
    `max_new_tokens` tokens, TransformerLens 2.x's `generate`. Greedy when `do_sample=False` or `temperature=0`;
    sampling is seeded by `seed` with its own generator (the global RNG is untouched). With `stop_at_eos` a sequence
    that produced `eos_token_id` (default: the tokenizer's) continues with it, and generation stops once every
    sequence has. `use_past_kv_cache` (default: True for causal attention, False for bidirectional, see
    `wants_cache`) runs each step on the new token only (`models.generation.kv_cache`); it falls back to the full
    forward when the sequence would outgrow a learned positional table (the cache-free path then keeps the last n_ctx
    positions). `return_type`: `"input"` (text for text, ids for ids, embeddings for embeddings),
    `"str"` (text
    without the BOS), `"tokens"` `[batch, pos + new]` (from embeddings: the new tokens only, as TransformerLens) or
    `"embeds"` `[batch, pos + new, d_model]` (the input's embeddings, then `model.embed` of each new token).
    `freq_penalty` needs ids or text (embeddings have no ids to count)."""
    check_sampling(max_new_tokens, temperature, top_k, top_p)
    use_past_kv_cache = wants_cache(model, use_past_kv_cache)
    if return_type not in RETURN_TYPES:
        raise ValueError(f"return_type={return_type!r} is not supported; allowed: {RETURN_TYPES}")
    text_in = isinstance(input, str) or (isinstance(input, list) and input and isinstance(input[0], str))
    embeds = None
    if isinstance(input, torch.Tensor) and input.is_floating_point():
        if freq_penalty:
            raise InputError("freq_penalty needs token ids or text to count; embeddings have none")
        embeds = prompt_embeds(model, input)
        tokens = torch.empty(embeds.shape[0], 0, dtype=torch.long, device=embeds.device)  # the new tokens only
    elif text_in:
        tokens = prompt_ids(model, model.to_tokens(input, prepend_bos=prepend_bos, padding_side=padding_side,
                                                   truncate=False))
    else:
        tokens = prompt_ids(model, input)
    if return_type == "input":
        return_type = "str" if text_in else "embeds" if embeds is not None else "tokens"
    if stop_at_eos and eos_token_id is None:
        eos_token_id = getattr(model.tokenizer, "eos_token_id", None)
        if eos_token_id is None:
            raise ValueError("stop_at_eos needs eos_token_id= or a tokenizer with an EOS token")
    gen = torch.Generator(device=tokens.device)
    if seed is not None:
        gen.manual_seed(seed)
    else:
        gen.seed()
    mask = None
    if model.tokenizer is not None and embeds is None:
        mask = infer_attention_mask(model, tokens, prepend_bos, padding_side)
        if bool(mask.all()):
            mask = None  # nothing padded: the plain forward
    limit = model.cfg.positions.max_context
    n_prompt = tokens.shape[1] if embeds is None else embeds.shape[1]
    cache = None
    if use_past_kv_cache and (limit is None or n_prompt + max_new_tokens <= limit):
        cache = HookedTransformerKeyValueCache.init_cache(model.cfg, tokens.device, tokens.shape[0])
    done = torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)
    steps = range(max_new_tokens)
    if verbose:
        from tqdm.auto import tqdm

        steps = tqdm(steps, desc="generate")
    new = tokens
    new_embeds = []  # with embeddings in: each new token's, concatenated once (a cached step reads only its own)
    for _ in steps:
        if embeds is not None:
            step = embeds if cache is None or not new_embeds else new_embeds[-1]
            logits = _embeds_logits(model, step, cache)
        elif cache is not None:
            # an explicit mask: without one, a cached forward infers padding from the pad id, and a generated token
            # equal to it (a pad, or EOS where pad = EOS) would be masked out of every later step
            step_mask = torch.ones_like(new) if mask is None else mask[:, -new.shape[1]:]
            logits = model(new, past_kv_cache=cache, attention_mask=step_mask)[:, -1].float()
        elif mask is not None:
            logits = model(tokens, attention_mask=mask)[:, -1].float()
        else:
            logits = model(_context(model, tokens))[:, -1].float()  # [batch, d_vocab]
        nxt = sample(logits, tokens, gen, do_sample, temperature, top_k, top_p, freq_penalty)
        if eos_token_id is not None:
            nxt = torch.where(done, torch.full_like(nxt, eos_token_id), nxt)
            done |= nxt == eos_token_id
        new = nxt[:, None]
        tokens = torch.cat([tokens, new], dim=1)
        if embeds is not None:
            new_embeds.append(model.embed(new))
            if cache is None:  # the cache-free forward reads the whole context
                embeds = torch.cat([embeds, new_embeds.pop()], dim=1)
        if mask is not None:
            mask = torch.cat([mask, torch.ones_like(new)], dim=1)
        if stop_at_eos and bool(done.all()):
            break
    if return_type == "tokens":
        return tokens
    if return_type == "embeds":
        return torch.cat([embeds, *new_embeds], dim=1) if embeds is not None else model.embed(tokens)
    bos = getattr(model.tokenizer, "bos_token_id", None) if embeds is None else None  # embeddings: new tokens only
    rows = [row if mask is None else row[m.bool()] for row, m in zip(tokens, tokens if mask is None else mask)]
    texts = [model.to_string(row[1:] if len(row) and row[0] == bos else row) for row in rows]  # no padding, no BOS
    return texts if isinstance(input, list) or len(texts) > 1 else texts[0]  # one prompt: one string


class _Steps:
    """Next-token logits of a decoder-only model for growing prefixes (a `models.generation.beam.Stepper`): on the
    key/value cache, or, where the prefixes would outgrow a learned positional table, on the last n_ctx tokens."""

    def __init__(self, model, use_cache: bool):
        self.model, self.use_cache, self.cache, self.done = model, use_cache, None, 0

    def __call__(self, seqs: torch.Tensor) -> torch.Tensor:
        if not self.use_cache:
            return self.model(_context(self.model, seqs))[:, -1]
        if self.cache is None:
            self.cache = HookedTransformerKeyValueCache.init_cache(self.model.cfg, seqs.device, seqs.shape[0])
        new = seqs[:, self.done:]
        self.done = seqs.shape[1]
        return self.model(new, past_kv_cache=self.cache, attention_mask=torch.ones_like(new))[:, -1]

    def select(self, rows: torch.Tensor) -> None:
        if self.cache is not None:
            self.cache.select(rows)


def wants_cache(model, use_past_kv_cache: bool | None) -> bool:
    """Whether decoding may keep a key/value cache: by default (None) for causal attention only. Under bidirectional
    attention every earlier position attends to each new token, so the keys and values of earlier positions change
    with every step and a cache of them is wrong by construction: decoding recomputes the whole sequence, and an
    explicit `use_past_kv_cache=True` raises `InputError`."""
    if use_past_kv_cache is not None and not isinstance(use_past_kv_cache, bool):
        raise InputError(f"use_past_kv_cache must be True, False or None (the default), got {use_past_kv_cache!r}")
    bidirectional = model.cfg.attention_dir == "bidirectional"
    if use_past_kv_cache and bidirectional:
        raise InputError("use_past_kv_cache=True with attention_dir='bidirectional': every earlier position attends "
                         "to each new token, so cached keys and values are stale; use use_past_kv_cache=False (the "
                         "default for bidirectional models)")
    return not bidirectional if use_past_kv_cache is None else use_past_kv_cache


def beam_search(model, tokens, beams: int = 4, max_new_tokens: int = 20, use_past_kv_cache: bool | None = None):
    """Deterministic beam search over one prompt (`models.generation.beam`). Returns `(sequences [beams, pos + new],
    log_probs [beams])`, best first (fewer rows where fewer continuations exist); log_probs are the summed
    log-probabilities of the generated tokens. `use_past_kv_cache` as in `generate` (`wants_cache`)."""
    use_past_kv_cache = wants_cache(model, use_past_kv_cache)
    _check_int("beams", beams, 1)
    _check_int("max_new_tokens", max_new_tokens, 0)
    tokens = prompt_ids(model, tokens)
    if tokens.shape[0] != 1:
        raise ValueError(f"beam_search takes one prompt, got a batch of {tokens.shape[0]}")
    limit = model.cfg.positions.max_context
    n_pos = tokens.shape[1] + max_new_tokens if limit is None else min(tokens.shape[1] + max_new_tokens, limit)
    check_beams(beams, 1, model.cfg.d_vocab, model.cfg.d_model, 2 * model.cfg.n_layers * n_pos, InputError)
    cached = use_past_kv_cache and (limit is None or tokens.shape[1] + max_new_tokens <= limit)
    seqs, scores = batched_beam_search(_Steps(model, cached), tokens, beams, max_new_tokens)
    kept = scores[0] > float("-inf")
    return seqs[0][kept], scores[0][kept]

"""Decoding for `HookedEncoderDecoder`: greedy, top-k (Fan et al. 2018), top-p (nucleus, Holtzman et al. 2019)
sampling and beam search (`models.generation.beam`), with the encoder run once and the decoder's self-attention keys
and values cached (`models.generation.kv_cache`), so each step runs the decoder on the newest token only.
Cross-attention projects the fixed memory again at each step (a `[src_pos, d_model]` matmul per layer). Hooks fire on
every step, as in the forward pass."""

from __future__ import annotations

import torch

from ..errors import InputError
from .beam import batched_beam_search, check_beams
from .generate import _check_int, filter_logits
from .kv_cache import HookedTransformerKeyValueCache

METHODS = ("greedy", "top_k", "top_p", "beam")


class _Decoder:
    """Next-token logits for growing target prefixes over a fixed memory, with or without the key/value cache."""

    def __init__(self, model, memory: torch.Tensor, src_mask, use_cache: bool):
        self.model, self.memory, self.src_mask, self.use_cache = model, memory, src_mask, use_cache
        self.cache = None  # a HookedTransformerKeyValueCache of the decoder's self-attention, made at the first step
        self.done = 0  # target positions already in the cache

    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        """`[batch, d_vocab_tgt]` float32 logits of the token after `tokens [batch, pos]`."""
        m = self.model
        if not self.use_cache:
            return m._decode(tokens, self.memory, self.src_mask, None)[:, -1].float()
        if self.cache is None:
            self.cache = HookedTransformerKeyValueCache.init_cache(m.dec_cfg, tokens.device, tokens.shape[0])
        new = tokens[:, self.done:]
        logits = m._decode(new, self.memory, self.src_mask, None, self.cache, self.done)[:, -1].float()
        self.done = tokens.shape[1]
        return logits

    def select(self, rows: torch.Tensor) -> None:
        self.memory = self.memory[rows]
        self.src_mask = None if self.src_mask is None else self.src_mask[rows]
        if self.cache is not None:
            self.cache.select(rows)


def check_beam_memory(model, beams: int, batch: int, error: type[Exception], option: str = "beams") -> None:
    """`check_beams` for an encoder-decoder: per beam, the memory it carries (`n_ctx_src` rows), the cross-attention
    keys and values of each decoder layer (2 × `n_ctx_src`) and its cached self-attention keys and values
    (2 × `n_ctx_tgt`)."""
    cfg = model.cfg
    rows = cfg.n_ctx_src + 2 * cfg.n_decoder_layers * (cfg.n_ctx_src + cfg.n_ctx_tgt)
    check_beams(beams, batch, cfg.d_vocab_tgt, cfg.d_model, rows, error, option)


@torch.no_grad()
def generate_seq2seq(model, src, max_new_tokens: int = 20, method: str = "greedy", src_mask=None,
                     temperature: float = 1.0, top_k: int = 5, top_p: float = 0.9, beams: int = 4,
                     seed: int | None = None, use_cache: bool = True, stop_at_eos: bool = True) -> torch.Tensor:
    """Target ids `[batch, 1 + n]` for source ids `src`: BOS, then up to `max_new_tokens` tokens (fewer where the
    target's learned positions run out), the pad id after a sequence's EOS. `method`: "greedy" (argmax), "top_k" /
    "top_p" (sampling at `temperature` from the `top_k` most likely tokens / the smallest set with probability
    `top_p`, seeded by `seed` with a generator of its own) or "beam" (`beams` beams per source, summed
    log-probabilities, the best beam returned). `use_cache=False` reruns the decoder on the whole prefix each step
    (the reference the cache is tested against)."""
    if method not in METHODS:
        raise InputError(f"method={method!r} is not supported; allowed: {', '.join(map(repr, METHODS))}")
    for name, value, lo in (("max_new_tokens", max_new_tokens, 0), ("beams", beams, 1), ("top_k", top_k, 1)):
        try:
            _check_int(name, value, lo)
        except ValueError as e:
            raise InputError(str(e)) from None
    if not (isinstance(top_p, (int, float)) and 0 < top_p <= 1):
        raise InputError(f"top_p must be in (0, 1], got {top_p!r}")
    if not isinstance(temperature, (int, float)) or not temperature > 0:
        raise InputError(f"temperature must be a number > 0, got {temperature!r}")
    cfg = model.cfg
    limit = model.dec_cfg.positions.max_context
    if limit is not None:
        max_new_tokens = min(max_new_tokens, limit - 1)
    src, src_mask = model.validate_src(src, src_mask)
    if method == "beam":
        check_beam_memory(model, beams, src.shape[0], InputError)
    memory = model._encode(src, src_mask)  # the encoder runs once
    step = _Decoder(model, memory, src_mask, use_cache)
    tgt = torch.full((src.shape[0], 1), cfg.bos_token_id, dtype=torch.long, device=src.device)
    if method == "beam":
        seqs, scores = batched_beam_search(step, tgt, beams, max_new_tokens, cfg.eos_token_id, cfg.pad_token_id,
                                           stop_at_eos)
        return seqs[torch.arange(seqs.shape[0], device=seqs.device), scores.argmax(-1)]  # each source's best beam
    gen = torch.Generator(device=src.device)
    gen.manual_seed(seed) if seed is not None else gen.seed()
    done = torch.zeros(src.shape[0], dtype=torch.bool, device=src.device)
    for _ in range(max_new_tokens):
        logits = step(tgt)
        if method == "greedy":
            nxt = logits.argmax(-1)
        else:
            kept = filter_logits(logits / temperature, top_k if method == "top_k" else None,
                                 top_p if method == "top_p" else None)
            nxt = torch.multinomial(kept.softmax(-1), 1, generator=gen)[:, 0]
        nxt = nxt.masked_fill(done, cfg.pad_token_id)
        done |= nxt == cfg.eos_token_id
        tgt = torch.cat([tgt, nxt[:, None]], 1)
        if stop_at_eos and bool(done.all()):
            break
    return tgt

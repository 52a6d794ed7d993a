"""Beam search (Graves 2012; Sutskever et al. 2014, §3.2), batched and cached: one search for every model type.

A `Stepper` gives the next-token logits of a batch of prefixes and follows the beams' reordering (`select`), so its
key/value cache, and anything else it holds per row (an encoder–decoder's memory), moves with the beam it belongs to.
"""

from __future__ import annotations

from typing import Protocol

import torch


class Stepper(Protocol):
    def __call__(self, seqs: torch.Tensor) -> torch.Tensor:
        """Float logits `[rows, d_vocab]` of the token after each prefix `seqs [rows, pos]` (the prefixes only grow
        by one token between calls, so a cache may run the newest position alone)."""

    def select(self, rows: torch.Tensor) -> None:
        """Keep the rows `rows` (an index into the current rows, repeats allowed) for the next call."""


def check_beams(beams: int, batch: int, d_vocab: int, d_model: int, layers_x_positions: int, error: type[Exception],
                option: str = "beams") -> None:
    """Refuse `beams` whose search state exceeds the memory bound of every size option
    (`models.files.size_checks.check_memory`). Per beam and prompt, float32 and counted twice for a step's temporaries:
    three vocabulary rows (log-probabilities, the scores they add to, top-k's input) and `layers_x_positions`
    residual-width rows (cached keys and values, an encoder's memory: the caller sums layers × positions)."""
    from ..files.size_checks import check_memory

    check_memory(option, beams, batch * 8 * (3 * d_vocab + layers_x_positions * d_model), error)


@torch.no_grad()
def batched_beam_search(step: Stepper, prefix: torch.Tensor, beams: int, max_new_tokens: int,
                        eos_token_id: int | None = None, pad_token_id: int | None = None,
                        stop_at_eos: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The `beams` most likely continuations of each prefix `[batch, pos]` by up to `max_new_tokens` tokens, scored by
    the sum of their tokens' log-probabilities. Returns `(seqs [batch, beams, pos + n], scores [batch, beams])`, each
    source's beams best first; a beam with no finite score (fewer than `beams` continuations exist) scores −inf.
    With `eos_token_id`, a beam that produced it is finished and continues with `pad_token_id` at no cost; with
    `stop_at_eos` the search ends once every beam is finished."""
    B, dev = prefix.shape[0], prefix.device
    step.select(torch.arange(B, device=dev).repeat_interleave(beams))
    seqs = prefix.repeat_interleave(beams, 0)  # [batch·beams, pos]
    scores = torch.full((B, beams), float("-inf"), device=dev)
    scores[:, 0] = 0.0  # the beams start equal: keep one until they differ
    done = torch.zeros(B * beams, dtype=torch.bool, device=dev)
    offsets = torch.arange(B, device=dev)[:, None] * beams
    for _ in range(max_new_tokens):
        logp = step(seqs).float().log_softmax(-1)  # [batch·beams, vocab]
        V = logp.shape[-1]
        if eos_token_id is not None:
            finished = torch.full_like(logp, float("-inf"))
            finished[:, pad_token_id] = 0.0
            logp = torch.where(done[:, None], finished, logp)
        total = (scores.reshape(-1, 1) + logp).reshape(B, beams * V)
        scores, flat = total.topk(beams, dim=-1)  # [batch, beams], best first
        parent = (flat // V + offsets).reshape(-1)
        nxt = (flat % V).reshape(-1)
        step.select(parent)
        seqs = torch.cat([seqs[parent], nxt[:, None]], 1)
        if eos_token_id is not None:
            done = done[parent] | (nxt == eos_token_id)
            if stop_at_eos and bool(done.all()):
                break
    return seqs.view(B, beams, -1), scores

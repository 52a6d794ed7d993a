"""How much of the loss each order of path terms explains, patterns frozen (Framework's term importance)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from models.arch.model import lm_cross_entropy

from .checks import as_tokens
from .paths import path_expansion


def _loss(logits: torch.Tensor, tokens: torch.Tensor) -> float:
    return float(lm_cross_entropy(logits.to(torch.float64), tokens))


@dataclass
class TermImportance:
    """Next-token loss (nats) of the path expansion truncated at each order.

    `losses[k]`: loss of the terms of order ≤ k (k = 0: direct paths only); `n_terms[k]`: number of terms of
    order exactly k; `model_loss`: the model's own loss (equal to `losses[-1]` up to rounding); `per_term`:
    optional name → loss increase when that one term is removed from the full expansion."""

    losses: tuple[float, ...]
    n_terms: tuple[int, ...]
    model_loss: float
    per_term: dict[str, float] | None = None

    @property
    def gains(self) -> tuple[float, ...]:
        """Loss reduction from adding the terms of each order k ≥ 1 (`losses[k-1] − losses[k]`)."""
        return tuple(a - b for a, b in zip(self.losses, self.losses[1:]))

    def __str__(self) -> str:
        lines = ["order       terms   loss (nats)   reduction", "-" * 44]
        for k, (loss, n) in enumerate(zip(self.losses, self.n_terms)):
            label = "0 (direct)" if k == 0 else f"≤ {k}"
            gain = f"{self.losses[k - 1] - loss:+11.4f}" if k else " " * 11
            lines.append(f"{label:<10} {n:>6}   {loss:11.4f}   {gain}")
        lines.append(f"{'model':<10} {'':>6}   {self.model_loss:11.4f}")
        if self.per_term:
            lines.append("largest single terms (loss increase when removed):")
            top = sorted(self.per_term.items(), key=lambda kv: -kv[1])[:10]
            lines += [f"  {name:<24} {v:+.4f}" for name, v in top]
        return "\n".join(lines)


def term_importance(model, tokens, per_term: bool = False) -> TermImportance:
    """Loss with the direct path only, then adding all first-order (single-head) terms, then second-order
    (virtual-head) terms, …, with the attention patterns of the real forward pass frozen (Elhage et al. 2021,
    Framework, §"Two-layer attention-only transformers / path expansion", term-importance figure: ≈ 5.2 nats
    from the individual head terms and ≈ 0.3 from all virtual heads in their 2-layer model).

    Uses `path_expansion(model, tokens)`; with `per_term=True` also the loss increase from removing each
    single term of order ≥ 1 from the full expansion (one extra unembedding per term)."""
    exp = path_expansion(model, tokens)
    tokens = as_tokens(model, tokens)
    orders = range(exp.max_order + 1)
    losses = tuple(_loss(exp.total(max_order=k), tokens) for k in orders)
    n_terms = tuple(len(exp.names(order=k)) for k in orders)
    extra = None
    if per_term:
        full_logits, full = exp.total(), losses[-1]
        extra = {n: _loss(full_logits - exp.terms[n], tokens) - full for n in exp.streams if exp.orders[n] >= 1}
    return TermImportance(losses, n_terms, _loss(exp.logits, tokens), extra)

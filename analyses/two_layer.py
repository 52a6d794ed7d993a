"""Two layers: composition scores, the induction circuit, virtual heads and term importance by order.

Framework (Elhage et al. 2021), "Two-layer attention-only transformers": the logits expand into a direct
term, one term per head and one "virtual head" term per (layer-0 head, layer-1 head) pair; in their model the
individual-head terms carry ≈ 5.2 nats of loss reduction and all virtual heads together ≈ 0.3, layer-1 heads
matter far more than layer-0 heads, and only K-composition (with one previous-token head) matters.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from circuits.checks import as_tokens
from circuits.composition import composition_baseline, composition_scores
from circuits.importance import term_importance
from circuits.paths import path_expansion
from models.arch.model import head_label, lm_cross_entropy

from .detect import DetectionResult, detect_induction_heads, detect_previous_token_heads
from .util import markdown_table, weight_view

#: Framework numbers for its 2-layer model (term importance, nats).
PAPER_TERM_IMPORTANCE = {"individual heads": 5.2, "virtual heads": 0.3}


@dataclass
class CompositionStudy:
    """Q/K/V composition scores `[l1, h1, l2, h2]` (earlier head h1, later head h2; zero unless l1 < l2) and the
    expected score of random heads of the same shapes (`circuits.composition_baseline`)."""

    scores: dict[str, torch.Tensor]
    baselines: dict[str, float]

    def excess(self, kind: str) -> torch.Tensor:
        """Scores minus the random baseline, on the l1 < l2 entries (0 elsewhere)."""
        s = self.scores[kind]
        L = s.shape[0]
        mask = (torch.arange(L)[:, None, None, None] < torch.arange(L)[None, None, :, None]).expand_as(s)
        return torch.where(mask, s - self.baselines[kind], torch.zeros_like(s))

    def top(self, kind: str, n: int = 5) -> list[tuple[str, str, float]]:
        """The `n` largest (earlier head, later head, score − baseline) of one kind."""
        e = self.excess(kind)
        L, H = e.shape[:2]
        valid = (torch.arange(L)[:, None, None, None] < torch.arange(L)[None, None, :, None]).expand_as(e)
        e = e.masked_fill(~valid, float("-inf"))
        flat = torch.topk(e.reshape(-1), min(n, int(valid.sum())))
        out = []
        for v, i in zip(flat.values.tolist(), flat.indices.tolist()):
            l1, h1, l2, h2 = (i // (H * L * H), (i // (L * H)) % H, (i // H) % L, i % H)
            if l1 < l2:
                out.append((head_label(l1, h1), head_label(l2, h2), v))
        return out

    def markdown(self, n: int = 5) -> str:
        rows = [[k.upper(), a, b, v + self.baselines[k], v] for k in ("q", "k", "v") for a, b, v in self.top(k, n)]
        return markdown_table(["kind", "earlier head", "later head", "score", "score − baseline"], rows)

    def __str__(self) -> str:
        base = ", ".join(f"{k.upper()} {v:.3f}" for k, v in self.baselines.items())
        return f"CompositionStudy (random baselines: {base})\n{self.markdown()}"


def _need_two_layers(model, what: str) -> None:
    L = model.cfg.n_layers
    if L < 2:
        raise ValueError(f"{what} needs a model with at least 2 layers (heads that compose); this one has {L}")


@torch.no_grad()
def composition_study(model) -> CompositionStudy:
    """Q-, K- and V-composition scores of every head pair (`circuits.composition_scores`, norms folded) with the
    random baselines of the model's shapes. `ValueError` for models with fewer than 2 layers."""
    _need_two_layers(model, "composition_study")
    m = weight_view(model)
    scores = {k: composition_scores(m, k).float().cpu() for k in ("q", "k", "v")}
    base = {k: float(composition_baseline(m.cfg.d_model, m.cfg.d_head, k)) for k in ("q", "k", "v")}
    return CompositionStudy(scores, base)


@dataclass
class InductionCircuit:
    """The induction circuit found automatically: (previous-token head, induction head) pairs, with the
    detection tables behind them and, for every head in layer ≥ 1, its (QK positivity, OV positivity) point —
    QK positivity: Σλ/Σ|λ| of its K-composition circuit with its partner (same-matching); OV positivity:
    Σλ/Σ|λ| of its full OV circuit (copying). Induction heads sit in the (1, 1) corner."""

    pairs: list[tuple[tuple[int, int], tuple[int, int], float]]  # (previous-token head, induction head, K-comp)
    induction: DetectionResult
    previous: DetectionResult
    positivity: dict[tuple[int, int], tuple[float, float]] = field(default_factory=dict)

    def markdown(self) -> str:
        rows = [[head_label(*p), head_label(*i), k, *self.positivity.get(i, (None, None))] for p, i, k in self.pairs]
        return markdown_table(["previous-token head", "induction head", "K-composition − baseline",
                               "QK positivity", "OV positivity"], rows)

    def __str__(self) -> str:
        return f"InductionCircuit ({len(self.pairs)} pairs)\n{self.markdown()}"


@torch.no_grad()
def find_induction_circuit(model, prev_tokens=None, tokens_from=None, seed: int = 0,
                           detections: tuple[DetectionResult, DetectionResult] | None = None) -> InductionCircuit:
    """Detect induction heads (`detect_induction_heads`) and previous-token heads, and pair each induction head
    with the previous-token head it K-composes with most. Needs ≥ 2 layers for pairs. `detections`: the
    (induction, previous-token) results when already computed with the same arguments. `ValueError` for models
    with fewer than 2 layers."""
    _need_two_layers(model, "find_induction_circuit")
    if detections is None:
        ind = detect_induction_heads(model, seed=seed, tokens_from=tokens_from, prev_tokens=prev_tokens)
        prev = detect_previous_token_heads(model, prev_tokens, seed=seed)
    else:
        ind, prev = detections
    pairs, pos = [], {}
    for r in ind.table:
        if r.layer >= 1 and r.qk_same_matching is not None:
            pos[(r.layer, r.head)] = (r.qk_same_matching, r.ov_copying)
        if r.positive and r.partner is not None and r.partner in prev.heads:
            pairs.append((r.partner, (r.layer, r.head), r.k_composition))
    return InductionCircuit(pairs, ind, prev, pos)


@dataclass
class OrderImportance:
    """Term importance by order (patterns frozen; `circuits.term_importance`), in nats, beside the paper's.

    `losses[k]`: loss with the terms of order ≤ k; `individual` = losses[0] − losses[1] (what all single-head
    terms add to the direct path); `virtual` = losses[1] − losses[2] (all virtual heads); `by_layer[l]`: loss
    increase when the single-head terms of layer l are removed from the full expansion."""

    losses: tuple[float, ...]
    model_loss: float
    individual: float | None
    virtual: float | None
    by_layer: dict[int, float]
    paper: dict[str, float] = field(default_factory=lambda: dict(PAPER_TERM_IMPORTANCE))

    def markdown(self) -> str:
        rows = [["direct path only (order 0)", self.losses[0], None, None]]
        if self.individual is not None:
            rows.append(["+ individual heads (order 1)", self.losses[1], self.individual,
                         self.paper["individual heads"]])
        if self.virtual is not None:
            rows.append(["+ virtual heads (order 2)", self.losses[2], self.virtual, self.paper["virtual heads"]])
        rows.append(["model (all terms)", self.model_loss, None, None])
        return markdown_table(["terms kept", "loss (nats)", "reduction (nats)", "Framework's reduction"], rows)

    def __str__(self) -> str:
        layers = ", ".join(f"layer {l}: {v:.3f}" for l, v in self.by_layer.items())
        return f"OrderImportance (removing a layer's head terms costs {layers})\n{self.markdown()}"


def _loss(logits: torch.Tensor, tokens: torch.Tensor) -> float:
    return float(lm_cross_entropy(logits.double(), tokens))


@torch.no_grad()
def term_importance_by_order(model, tokens) -> OrderImportance:
    """`circuits.term_importance` on `tokens` (validation text) plus the per-layer breakdown from
    `circuits.path_expansion`. Attention-only models. `tokens`: `[batch, pos]` or one sequence `[pos]`."""
    t = as_tokens(model, tokens)
    imp = term_importance(model, t)
    exp = path_expansion(model, t)
    full = _loss(exp.total(), t)
    by_layer = {}
    for l in range(model.cfg.n_layers):
        names = tuple(n for n in exp.names(order=1) if n.startswith(f"L{l}H"))
        by_layer[l] = _loss(exp.total(exclude=names), t) - full
    L = len(imp.losses)
    return OrderImportance(tuple(imp.losses), imp.model_loss, imp.losses[0] - imp.losses[1] if L > 1 else None,
                           imp.losses[1] - imp.losses[2] if L > 2 else None, by_layer)


@dataclass
class TermRanking:
    """Loss increase (nats) when one term is removed from the full path expansion, ranked."""

    virtual: list[tuple[str, float]]  # "L1H3∘L0H5" (later ∘ earlier) terms
    individual: list[tuple[str, float]]  # "L1H3" terms

    def markdown(self, n: int = 10) -> str:
        rows = [[a[0] if a else None, a[1] if a else None, b[0] if b else None, b[1] if b else None]
                for a, b in _zip_longest(self.individual[:n], self.virtual[:n])]
        return markdown_table(["individual head", "loss increase", "virtual head", "loss increase"], rows)

    def __str__(self) -> str:
        return "TermRanking\n" + self.markdown()


def _zip_longest(a, b):
    n = max(len(a), len(b))
    return [(a[i] if i < len(a) else None, b[i] if i < len(b) else None) for i in range(n)]


@torch.no_grad()
def virtual_head_importance(model, tokens) -> TermRanking:
    """Rank the virtual-head terms `(A^{h2} A^{h1}) ⊗ W_E W_OV^{h1} W_OV^{h2} W_U` (and, beside them, the
    individual head terms) by the loss increase when each alone is removed from the full expansion
    (`circuits.path_expansion`, patterns frozen), token-embedding source only. `ValueError` for models with fewer
    than 2 layers (no virtual heads)."""
    _need_two_layers(model, "virtual_head_importance")
    t = as_tokens(model, tokens)
    exp = path_expansion(model, t, max_order=2)
    full_logits = exp.total()
    full = _loss(full_logits, t)

    def rank(order):
        out = [(n, _loss(full_logits - exp.terms[n], t) - full) for n in exp.names(order=order, source="tok")]
        return sorted(out, key=lambda kv: -kv[1])

    return TermRanking(rank(2), rank(1))

"""Find induction heads and previous-token heads, with behavioural and mechanistic evidence side by side.

Behavioural evidence is what a head does on probe sequences (`analyses.scores`); mechanistic evidence is read
off the weights (`circuits`): for an induction head (Framework, "Two-layer attention-only transformers";
Olsson et al. 2022) K-composition with an earlier previous-token head, a "same-matching" K-composition
circuit `W_E W_QK^{h} (W_OV^{prev})ᵀ W_Eᵀ` (positive eigenvalues) and a copying OV circuit. The verdict uses the
behavioural scores with ARENA's threshold 0.4; the mechanistic columns say whether the weights agree.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformer_lens import FactoredMatrix

from circuits.composition import composition_baseline, composition_scores
from circuits.diagonal import diagonal_rank_stats
from circuits.eigen import copying_score, copying_scores, positive_eigenvalue_fraction
from circuits.factored import full_ov_circuit, k_composition_circuit
from models.arch.model import head_label

from .one_layer import positional_r2
from .scores import (
    arena_induction_scores,
    copying_scores_behavioural,
    current_token_scores,
    first_token_scores,
    induction_scores,
    prefix_matching_scores,
    previous_token_scores,
)
from .sequences import bos_token_id, random_tokens, token_pool
from .util import check_threshold, markdown_table, weight_view

#: ARENA 1.2: a head is called induction / previous-token above 0.4 (its induction heads score > 0.6).
ARENA_THRESHOLD = 0.4


@dataclass
class HeadEvidence:
    """One head's evidence. Behavioural: `induction` (`analyses.induction_scores`: second copy of [BOS] + R + R
    → the token after the first occurrence, R drawn from the probe pool: the ids seen in training when the
    detector is given them), `induction_arena` (`analyses.arena_induction_scores`: ARENA 1.2's literal stripe
    mean, two first-copy entries included, R uniform over every non-special id), `prefix_matching` (Olsson),
    `copying` (Olsson's behavioural copying score), `previous` / `current` / `first` token scores.
    Mechanistic: `partner` (the earlier head it K-composes with most, previous-token heads first),
    `k_composition` (that composition score minus the random baseline), `qk_same_matching` (Σλ/Σ|λ| of the
    K-composition circuit) and `qk_positive_fraction`, `ov_copying` (Σλ/Σ|λ| of W_E W_OV W_U), `ov_top1` /
    `ov_top5` (top-1 / top-5 diagonal accuracy of W_E W_OV W_U over the probe's ids, ARENA's measure),
    `positional_r2` (layer 0: share of QK score variance from positions)."""

    layer: int
    head: int
    positive: bool
    induction: float | None = None
    induction_arena: float | None = None
    prefix_matching: float | None = None
    copying: float | None = None
    previous: float | None = None
    current: float | None = None
    first: float | None = None
    partner: tuple[int, int] | None = None
    k_composition: float | None = None
    qk_same_matching: float | None = None
    qk_positive_fraction: float | None = None
    ov_copying: float | None = None
    ov_top1: float | None = None
    ov_top5: float | None = None
    positional_r2: float | None = None
    mechanism: bool | None = None  # do the weights show the mechanism? None when not measurable

    @property
    def label(self) -> str:
        return head_label(self.layer, self.head)


@dataclass
class DetectionResult:
    """`heads`: the (layer, head) pairs judged positive; `table`: one `HeadEvidence` per head; `thresholds`:
    the cut-offs used, by score name."""

    kind: str
    heads: list[tuple[int, int]]
    table: list[HeadEvidence]
    thresholds: dict[str, float] = field(default_factory=dict)

    def row(self, layer: int, head: int) -> HeadEvidence:
        return next(r for r in self.table if (r.layer, r.head) == (layer, head))

    def markdown(self, only_positive: bool = False) -> str:
        rows = [r for r in self.table if r.positive or not only_positive]
        if self.kind == "induction":
            headers = ["head", "induction (2nd copy, seen ids)", "ARENA stripe (all ids)", "prefix matching",
                       "copying (behav.)", "K-comp partner", "K-comp − baseline", "QK same-matching", "QK positive λ",
                       "OV copying", "OV top-1", "OV top-5", "mechanism", "verdict"]
            cells = [[r.label, r.induction, r.induction_arena, r.prefix_matching, r.copying,
                      head_label(*r.partner) if r.partner else None, r.k_composition, r.qk_same_matching,
                      r.qk_positive_fraction, r.ov_copying, r.ov_top1, r.ov_top5, r.mechanism,
                      "induction" if r.positive else "—"]
                     for r in rows]
        else:
            headers = ["head", "previous-token", "current-token", "first-token", "positional R²", "verdict"]
            cells = [[r.label, r.previous, r.current, r.first, r.positional_r2,
                      "previous-token" if r.positive else "—"] for r in rows]
        return markdown_table(headers, cells)

    def __str__(self) -> str:
        names = ", ".join(head_label(l, h) for l, h in self.heads) or "none"
        cut = ", ".join(f"{k} ≥ {v}" for k, v in self.thresholds.items())
        return f"{self.kind} heads: {names}  (criteria: {cut})\n{self.markdown()}"


@torch.no_grad()
def detect_previous_token_heads(model, tokens=None, threshold: float = ARENA_THRESHOLD, seed: int = 0
                                ) -> DetectionResult:
    """Heads whose mean attention from i to i−1 is ≥ `threshold` (ARENA 0.4) on `tokens` (natural text, as the
    definition asks; default: seeded random tokens). Reports current- and first-token scores beside it and, for
    layer 0 of attention-only models with a positional table, the share of the QK score variance that the
    position-position term explains (ARENA's previous-token head 0.7 has a positional QK pattern)."""
    threshold = check_threshold(threshold)
    L, H = model.cfg.n_layers, model.cfg.n_heads
    prev = previous_token_scores(model, tokens, seed)
    cur = current_token_scores(model, tokens, seed)
    first = first_token_scores(model, tokens, seed)
    n = min(64, model.cfg.n_ctx) - 1 if L else 1
    probe = torch.cat([torch.full((2, 1), bos_token_id(model)), random_tokens(model, n, 2, seed)], 1)
    r2 = positional_r2(weight_view(model), probe) if L else None
    table = [HeadEvidence(l, h, bool(prev[l, h] >= threshold), previous=float(prev[l, h]), current=float(cur[l, h]),
                          first=float(first[l, h]),
                          positional_r2=None if r2 is None or l > 0 else float(r2[l, h]))
             for l in range(L) for h in range(H)]
    heads = [(r.layer, r.head) for r in table if r.positive]
    return DetectionResult("previous-token", heads, table, {"previous-token score": threshold})


@torch.no_grad()
def detect_induction_heads(model, seq_len: int = 50, batch: int = 10, seed: int = 0, tokens_from=None,
                           threshold: float = ARENA_THRESHOLD, prefix_threshold: float = ARENA_THRESHOLD,
                           prev_tokens=None, mechanistic: bool = True) -> DetectionResult:
    """Induction heads: the induction score (`analyses.induction_scores`: second copy of `[BOS] + R + R` → the
    token after the first occurrence, |R| = `seq_len`) ≥ `threshold` **and**
    Olsson's prefix-matching score on 25 random tokens × 4 ≥ `prefix_threshold`. Requiring both periods (50 and
    25) guards against a positional shortcut ("attend `seq_len` − 1 back"), which scores on one period only.
    Where n_ctx is too short, |R| shrinks to (n_ctx − 1) // 2 and the prefix-matching block to (n_ctx − 1) // 4
    (the thresholds dict names the lengths used).

    `induction_arena` is ARENA's score beside it (`analyses.arena_induction_scores`: ARENA 1.2's literal stripe
    mean, two first-copy entries included) with R uniform over every non-special id (`tokens_from=None`), which
    for a vocabulary with never-trained ids reads lower than the seen-ids probe.

    Mechanistic evidence (attention-only reading of the weights, norms folded): every head's OV copying score,
    and for each head in layer ≥ 1, its
    K-composition partner (the earlier previous-token head — `detect_previous_token_heads` on `prev_tokens` —
    with the largest K-composition score, or the earlier head with the largest score when there is none), that
    score minus `circuits.composition_baseline`, the same-matching of the K-composition circuit
    (`circuits.copying_score` / `positive_eigenvalue_fraction` of `circuits.k_composition_circuit`), and the OV
    copying score. `mechanism` is True when all three are positive and the partner is a previous-token head."""
    threshold, prefix_threshold = check_threshold(threshold), check_threshold(prefix_threshold, "prefix_threshold")
    L, H = model.cfg.n_layers, model.cfg.n_heads
    table: list[HeadEvidence] = []
    if L == 0:
        return DetectionResult("induction", [], table, {})
    seq_len = min(seq_len, (model.cfg.n_ctx - 1) // 2)  # short contexts: the longest R + R that fits
    pl = min(25, (model.cfg.n_ctx - 1) // 4)
    ind = induction_scores(model, seq_len, batch, seed, tokens_from)
    arena = arena_induction_scores(model, seq_len, batch, seed, None)
    pm = prefix_matching_scores(model, pl, 4, batch, seed, tokens_from)
    cop = copying_scores_behavioural(model, pl, 4, min(batch, 4), seed, tokens_from)
    mech = _mechanistic(model, prev_tokens, seed, tokens_from) if mechanistic else None
    for l in range(L):
        for h in range(H):
            r = HeadEvidence(l, h, bool(ind[l, h] >= threshold and pm[l, h] >= prefix_threshold),
                             induction=float(ind[l, h]), induction_arena=float(arena[l, h]),
                             prefix_matching=float(pm[l, h]), copying=float(cop[l, h]))
            if mech is not None:
                r.ov_copying = float(mech["ov"][l, h])
                r.ov_top1, r.ov_top5 = float(mech["top1"][l, h]), float(mech["top5"][l, h])
                if l >= 1:
                    r.partner, r.k_composition, r.qk_same_matching, r.qk_positive_fraction, is_prev = mech[(l, h)]
                    r.mechanism = bool(is_prev and r.k_composition > 0 and r.qk_same_matching > 0 and r.ov_copying > 0)
            table.append(r)
    heads = [(r.layer, r.head) for r in table if r.positive]
    pool = "all non-special ids" if tokens_from is None else "the given ids"
    cut = {f"induction score (|R| = {seq_len}, R from {pool})": threshold,
           f"prefix-matching score (Olsson, {pl} tokens × 4)": prefix_threshold}
    return DetectionResult("induction", heads, table, cut)


def _mechanistic(model, prev_tokens, seed: int, tokens_from=None) -> dict:
    """OV copying scores and top-1 / top-5 diagonal accuracies (over the probe pool's ids) of every head and, per
    head in layer ≥ 1, (partner, K-comp − baseline, QK same-matching, QK positive fraction, partner is a
    previous-token head)."""
    m = weight_view(model)
    L, H = m.cfg.n_layers, m.cfg.n_heads
    out = {"ov": copying_scores(m).float().cpu(), "top1": torch.zeros(L, H), "top5": torch.zeros(L, H)}
    S = token_pool(m, tokens_from).to(m.W_E.device)
    for l in range(L):
        fm = full_ov_circuit(m, l)
        stats = diagonal_rank_stats(FactoredMatrix(fm.A[:, S], fm.B[:, :, S]), k=(1, 5))
        out["top1"][l], out["top5"][l] = stats[1].float().cpu(), stats[5].float().cpu()
    if L < 2:
        return out
    kcomp = composition_scores(m, "k").float().cpu()  # [l1, h1, l2, h2]
    base = composition_baseline(m.cfg.d_model, m.cfg.d_head, "k")
    prev_heads = set(detect_previous_token_heads(model, prev_tokens, seed=seed).heads)
    for l in range(1, L):
        for h in range(H):
            cands = [(l1, h1) for l1 in range(l) for h1 in range(H)]
            prevs = [c for c in cands if c in prev_heads]
            pool = prevs or cands
            partner = max(pool, key=lambda c: float(kcomp[c[0], c[1], l, h]))
            fm = k_composition_circuit(m, (l, h), partner)
            same = float(copying_score(fm))
            posf = float(positive_eigenvalue_fraction(fm))
            out[(l, h)] = (partner, float(kcomp[partner[0], partner[1], l, h]) - base, same, posf, bool(prevs))
    return out

"""Faithfulness: how much of the clean−corrupted difference a subgraph recovers on its own, and how much its
complement (the graph without it) keeps.

For a subgraph C of the edge graph, run the model with every edge outside C removed (`EdgePatcher`) and read the
task metric m; faithfulness is the normalised metric (Wang et al. 2022, IOI, §4 "faithfulness"; Conmy et al.
2023, ACDC; Hanna et al. 2024 report the same ratio for EAP-IG circuits):

    F(C) = (m(C) − m(∅)) / (m(G) − m(∅))

with G the whole graph (the clean run) and ∅ the empty graph (every edge removed: the corrupted run under
corrupted ablation, the mean run under mean ablation). 1: C alone does everything the model does; 0: nothing.
The complement's F(G ∖ C) says whether the behaviour survives without C (near 0: C is necessary).
"""

from __future__ import annotations

import torch

from ..patching.metrics import normalized


def normalized_recovery(value: float, full: float, empty: float) -> float:
    """`analyses.patching.normalized` (Wang et al. 2022) with the whole graph as "clean" and the empty graph as
    "corrupted"; NaN when the two agree (nothing to recover)."""
    return normalized(value, full, empty) if full != empty else float("nan")


def set_values(patcher, task, removed: torch.Tensor) -> torch.Tensor:
    """The task metric (mean over prompts) for each edge set of `removed` (bool `[n_sets, n_edges]`), `[n_sets]`
    float64."""
    logits = patcher.run(removed)
    return torch.stack([task.value(lg) for lg in logits]).double()


def top_k_masks(order: list[int], ks: list[int], n_edges: int) -> torch.Tensor:
    """`[len(ks), n_edges]` bool: row i keeps the first `ks[i]` edges of `order` (True = kept)."""
    keep = torch.zeros(len(ks), n_edges, dtype=torch.bool)
    for i, k in enumerate(ks):
        keep[i, order[:k]] = True
    return keep


def curve_ks(n_edges: int, points: int = 256) -> list[int]:
    """Every k from 0 to n_edges when there are few edges, else about `points` k spaced evenly."""
    if n_edges + 1 <= points:
        return list(range(n_edges + 1))
    return sorted({round(i * n_edges / (points - 1)) for i in range(points)})


def faithfulness_curve(patcher, task, order: list[int], ks: list[int] | None = None) -> dict:
    """For each k of `ks`: the metric of the top-k edges of `order` run alone, and of the graph without them, both
    as values and normalised (`normalized_recovery`). One batched run of 2·len(ks) edge sets (chunked)."""
    n = len(patcher.graph)
    ks = curve_ks(n) if ks is None else ks
    keep = top_k_masks(order, ks, n)
    values = set_values(patcher, task, torch.cat([~keep, keep]))
    circuit, complement = values[:len(ks)], values[len(ks):]
    full, empty = float(circuit[ks.index(n)]) if n in ks else None, float(circuit[ks.index(0)]) if 0 in ks else None
    if full is None or empty is None:
        ends = set_values(patcher, task, torch.tensor([[False] * n, [True] * n]))
        full, empty = float(ends[0]), float(ends[1])
    return {"k": ks, "circuit": [float(v) for v in circuit], "complement": [float(v) for v in complement],
            "circuit_faithfulness": [normalized_recovery(float(v), full, empty) for v in circuit],
            "complement_faithfulness": [normalized_recovery(float(v), full, empty) for v in complement],
            "full": full, "empty": empty}


def single_edge_effects(patcher, task) -> torch.Tensor:
    """m(G ∖ e) − m(G) for every edge e alone, by exact edge patching (the quantity EAP estimates to first order),
    `[n_edges]` float64: one batched run of n_edges + 1 edge sets."""
    n = len(patcher.graph)
    v = set_values(patcher, task, torch.cat([torch.zeros(1, n, dtype=torch.bool), torch.eye(n, dtype=torch.bool)]))
    return v[1:] - v[0]


def subgraph_faithfulness(patcher, task, kept: torch.Tensor, full: float, empty: float) -> tuple[float, float]:
    """`(F(C), F(G ∖ C))` of the subgraph `kept` (bool `[n_edges]`)."""
    v = set_values(patcher, task, torch.stack([~kept, kept]))
    return normalized_recovery(float(v[0]), full, empty), normalized_recovery(float(v[1]), full, empty)


__all__ = ["curve_ks", "faithfulness_curve", "normalized_recovery", "set_values", "single_edge_effects",
           "subgraph_faithfulness",
           "top_k_masks"]

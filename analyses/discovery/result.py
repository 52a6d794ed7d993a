"""The one result type of circuit discovery, whatever the method."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class DiscoveryResult:
    """What a discovery method found.

    `scores`: (sender, receiver) → score, in the method's units (EAP / EAP-IG: the estimated change of the task
    metric when the edge is removed; ACDC: the growth of its distance when it was tried); `circuit`: the chosen
    edges, the highest |score| first; `faithfulness` / `complement`: the normalised metric of the circuit run alone
    and of the graph without it (`analyses.discovery.faithfulness`); `curve`: the same for the top-k edges by |score|
    as k grows; `passes`: forward and backward passes the method spent (and the prompt rows they ran), the curve's
    excluded; `values`: the task metric of the whole model (clean), the empty graph and the circuit."""

    model: str
    task: dict
    method: str
    settings: dict
    edges: list[tuple[str, str]]
    scores: dict[tuple[str, str], float]
    circuit: list[tuple[str, str]]
    faithfulness: float
    complement: float
    curve: dict
    passes: dict
    values: dict = field(default_factory=dict)

    def ranked(self) -> list[tuple[str, str]]:
        """Every edge, the largest |score| first (ties in graph order)."""
        return sorted(self.edges, key=lambda e: -abs(self.scores[e]))

    def to_json(self) -> dict:
        """A JSON-able dict (edges as "sender->receiver" keys and [sender, receiver] pairs; NaN as null)."""
        def num(x):
            return None if isinstance(x, float) and not math.isfinite(x) else x

        return {"model": self.model, "task": self.task, "method": self.method, "settings": self.settings,
                "n_edges": len(self.edges), "circuit": [list(e) for e in self.circuit],
                "faithfulness": num(self.faithfulness), "complement_faithfulness": num(self.complement),
                "values": {k: num(v) for k, v in self.values.items()}, "passes": self.passes,
                "scores": {f"{s}->{r}": num(self.scores[(s, r)]) for s, r in self.edges},
                "curve": {k: [num(x) for x in v] if isinstance(v, list) else num(v) for k, v in self.curve.items()}}

    def table(self, k: int | None = None) -> list[list]:
        """Rows [sender, receiver, score, in circuit] of the top `k` edges by |score| (all with None)."""
        chosen = set(self.circuit)
        return [[s, r, self.scores[(s, r)], (s, r) in chosen] for s, r in self.ranked()[:k]]


__all__ = ["DiscoveryResult"]

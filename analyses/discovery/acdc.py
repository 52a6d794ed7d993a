"""ACDC (Conmy, Mavor-Parker, Lynch, Heimersheim & Garriga-Alonso 2023, "Towards Automated Circuit Discovery for
Mechanistic Interpretability", Algorithm 1): start from the whole graph and visit receivers from the logits back to
the embeddings (reverse topological order); at each receiver try removing each incoming edge, latest sender
first, and remove it for good when the distance from the clean model grows by less than τ:

    remove (s, r)  ⇔  d(G ∖ {(s, r)}) − d(G) < τ

with d the KL divergence of the circuit's next-token distribution from the clean model's at the task's answer
positions (`kl_divergence`, the paper's default) or the task metric's loss of behaviour (`task_damage`). A
receiver whose own node (a head, an MLP) no longer reaches the logits is skipped and its inputs removed, as the
paper removes nodes cut off from the output: nothing it reads can change the output.

Batching (written here; the decisions are exactly the sequential algorithm's): at a receiver with untried edges
e₁ … e_k, one batched run evaluates the hypotheses "e₁ … e_j removed" for j = 1 … B; the decisions are read off in
order until the first kept edge, whose later hypotheses assumed it removed and are evaluated again. A receiver
costs one pass plus one per kept edge (or per B edges tried).
"""

from __future__ import annotations

import torch

from .faithfulness import set_values

ACDC_METRICS = ("kl", "task")


def kl_divergence(clean_log_probs: torch.Tensor, log_probs: torch.Tensor) -> torch.Tensor:
    """KL(p_clean ‖ p_circuit) = Σ_v p_clean(v) (log p_clean(v) − log p_circuit(v)), averaged over the prompts and
    their answer positions (Conmy et al. 2023, §3: ACDC's default distance from the clean model). Inputs
    `[batch, n, d_vocab]` log-probabilities → a scalar."""
    p = clean_log_probs.exp()
    return (p * (clean_log_probs - log_probs)).sum(-1).mean()


def task_damage(value: torch.Tensor, clean: float, sign: int) -> torch.Tensor:
    """The behaviour lost by a circuit in task-metric units: sign · (m(clean) − m(circuit)), positive when the
    circuit does worse (`sign` +1 for a metric where larger is better, −1 for the loss); ACDC's task-metric variant
    (Conmy et al. 2023, §3: logit difference on IOI)."""
    return sign * (clean - value)


class Distance:
    """d(circuit) for a batch of edge sets (bool `[n_sets, n_edges]`, True = removed) → `[n_sets]` float64."""

    def __init__(self, patcher, task, metric: str):
        self.patcher, self.task, self.metric = patcher, task, metric
        n = len(patcher.graph)
        full = torch.zeros(1, n, dtype=torch.bool)
        if metric == "kl":
            self.clean_lp = task.answers.log_probs(patcher.run(full)[0]).double()
        else:
            self.clean = float(set_values(patcher, task, full)[0])

    def __call__(self, removed: torch.Tensor) -> torch.Tensor:
        logits = self.patcher.run(removed)
        if self.metric == "kl":
            return torch.stack([kl_divergence(self.clean_lp, self.task.answers.log_probs(lg).double())
                                for lg in logits])
        values = torch.stack([self.task.value(lg) for lg in logits]).double()
        return task_damage(values, self.clean, self.task.sign)


def _owner(receiver) -> str | None:
    """The sender node whose input `receiver` is (a head's q/k/v input: the head; a cross-attention head's
    xq/xk/xv input: that head, `dec.L{l}XH{h}`; an MLP's input: the MLP)."""
    p = f"{receiver.stack}." if receiver.stack else ""
    if receiver.part in ("q", "k", "v"):
        return f"{p}L{receiver.layer}H{receiver.head}"
    if receiver.part in ("xq", "xk", "xv"):
        return f"{p}L{receiver.layer}XH{receiver.head}"
    if receiver.part == "mlp":
        return receiver.name
    return None


def acdc(patcher, task, tau: float, metric: str = "kl", batch: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """ACDC (module docstring) with threshold `tau` and distance `metric` ("kl" or "task"), trying up to `batch`
    removals per pass. Returns `(kept [n_edges] bool, scores [n_edges] float64)`: the score of an edge is
    d(G ∖ e) − d(G) when it was tried (0 for the inputs of cut-off nodes)."""
    graph = patcher.graph
    n = len(graph)
    distance = Distance(patcher, task, metric)
    removed = torch.zeros(n, dtype=torch.bool)
    scores = torch.zeros(n, dtype=torch.float64)
    d_now = float(distance(removed[None])[0])
    out_edges = {}
    for i, (s, _) in enumerate(graph.edges):
        out_edges.setdefault(s, []).append(i)
    order = sorted(graph.receivers, key=lambda r: r.stage)[::-1]
    for r in order:
        owner = _owner(r)
        incoming = graph.incoming(r.name)[::-1]  # latest sender first
        if owner is not None and bool(removed[out_edges.get(owner, [])].all()):
            removed[incoming] = True  # the node no longer reaches the logits
            continue
        todo = [i for i in incoming if not removed[i]]
        while todo:
            chunk = todo[:batch]
            hyp = removed.repeat(len(chunk), 1)
            for j in range(len(chunk)):
                hyp[j:, chunk[j]] = True  # row j: chunk[0 … j] removed
            d = distance(hyp)
            used = 0
            for j, i in enumerate(chunk):
                used = j + 1
                scores[i] = float(d[j]) - d_now
                if float(d[j]) - d_now < tau:
                    removed[i] = True
                    d_now = float(d[j])
                else:
                    break
            todo = todo[used:]
    return ~removed, scores


__all__ = ["ACDC_METRICS", "Distance", "acdc", "kl_divergence", "task_damage"]

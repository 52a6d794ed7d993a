"""Circuit discovery: the edges of a model's graph (`circuits.graph`) that carry a behaviour, found automatically.

- edge patching (`EdgePatcher`, `patch_edges`, `run_subgraph`): many edge sets removed in one batched pass;
- tasks (`DiscoveryTask`, `discovery_task`, `user_task`): clean/corrupted prompt pairs, answers and a metric;
- methods (`discover(model, task, method="eap" | "eap-ig" | "acdc")`): edge attribution patching (Syed et al. 2023),
  EAP with integrated gradients (Hanna et al. 2024) and ACDC (Conmy et al. 2023), all returning a
  `DiscoveryResult` (scores, the circuit, its faithfulness and a faithfulness curve, the passes spent);
- figures (`plot_circuit`, `plot_faithfulness`).

Written here rather than taken from AutoCircuit (`auto-circuit` 1.0.1) or ACDC's repository: both need
TransformerLens' `HookedTransformer` (gone from TransformerLens 4.x, which this toolkit builds on) and AutoCircuit
pins an older torch; the edge patching is its mask-on-the-batch-axis idea in plain hooks on our model.
"""

from .acdc import ACDC_METRICS, acdc, kl_divergence, task_damage
from .attribution import eap_score, edge_scores, integrated_gradient_points
from .faithfulness import faithfulness_curve, normalized_recovery, single_edge_effects, subgraph_faithfulness
from .methods import DEFAULT_TARGET, DEFAULT_TAU, METHODS, discover
from .patching import ABLATIONS, EdgePatcher, patch_edges, run_subgraph
from .result import DiscoveryResult
from .tasks import TASKS, DiscoveryTask, discovery_task, induction_task, user_task

__all__ = [
    "ACDC_METRICS", "acdc", "kl_divergence", "task_damage", "eap_score", "edge_scores", "integrated_gradient_points",
    "faithfulness_curve", "normalized_recovery", "single_edge_effects", "subgraph_faithfulness",
    "DEFAULT_TARGET", "DEFAULT_TAU", "METHODS",
    "discover", "ABLATIONS", "EdgePatcher", "patch_edges", "run_subgraph", "DiscoveryResult", "TASKS",
    "DiscoveryTask", "discovery_task", "induction_task", "user_task",
]

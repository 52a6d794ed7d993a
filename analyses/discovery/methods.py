"""`discover`: one entry for the three methods, one result type."""

from __future__ import annotations

import math

import torch

from ..patching.inputs import PatchingError
from .acdc import ACDC_METRICS, acdc
from .attribution import edge_scores
from .faithfulness import faithfulness_curve, subgraph_faithfulness
from .patching import ABLATIONS, EdgePatcher
from .result import DiscoveryResult
from .tasks import DiscoveryTask, discovery_task

METHODS = ("eap", "eap-ig", "acdc")
#: ACDC's default τ for each distance (KL in nats; the task metric in its own units)
DEFAULT_TAU = {"kl": 0.01, "task": 0.01}
#: with no threshold, EAP and EAP-IG keep the fewest top edges whose subgraph recovers this much of the behaviour
DEFAULT_TARGET = 0.9


def _check(method, threshold, steps, metric, ablation, batch, target):
    if method not in METHODS:
        raise PatchingError(f"unknown method {method!r}; methods: {', '.join(METHODS)}")
    if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, (int, float))
                                  or not math.isfinite(threshold) or threshold < 0):
        raise PatchingError(f"threshold must be a finite number >= 0 (ACDC's τ, or EAP's smallest |score| kept), "
                            f"got {threshold!r}")
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= 1000:
        raise PatchingError(f"steps must be an int in 1..1000, got {steps!r}")
    if metric not in ACDC_METRICS:
        raise PatchingError(f"unknown ACDC metric {metric!r}; allowed: {', '.join(ACDC_METRICS)}")
    if ablation not in ABLATIONS:
        raise PatchingError(f"unknown ablation {ablation!r}; allowed: {', '.join(ABLATIONS)}")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise PatchingError(f"batch must be a positive int, got {batch!r}")
    if not (isinstance(target, (int, float)) and 0 < target <= 1):
        raise PatchingError(f"target must lie in (0, 1], got {target!r}")


def discover(model, task, method: str = "eap", threshold: float | None = None, *, steps: int = 5,
             metric: str = "kl", ablation: str = "corrupt", batch: int = 32, target: float = DEFAULT_TARGET,
             n_prompts: int = 20, seed: int = 0, ks: list[int] | None = None) -> DiscoveryResult:
    """The circuit of `task` (a `DiscoveryTask`, or a shipped task's name made with `n_prompts` and `seed`) in
    `model`'s edge graph by `method`:

    - "eap": edge attribution patching (`attribution.eap_score`), one clean and one corrupted forward pass and one
      backward pass; "eap-ig": the same with the gradient integrated over `steps` interpolation points (one
      batched forward and backward). The circuit: edges with |score| ≥ `threshold`, or with no threshold the
      fewest top edges whose subgraph recovers `target` of the behaviour (read off the faithfulness curve);
    - "acdc": `acdc.acdc` with τ = `threshold` (default `DEFAULT_TAU[metric]`), distance `metric` ("kl" or
      "task"), `batch` removals tried per pass.

    `ablation`: a removed edge carries the sender's output on the corrupted prompt ("corrupt") or its mean over
    the clean prompts ("mean"). `ks`: the top-k sizes of the faithfulness curve (default every k, or about 256 of
    them; `faithfulness.curve_ks`). Returns a `DiscoveryResult`."""
    _check(method, threshold, steps, metric, ablation, batch, target)
    if isinstance(task, str):
        task = discovery_task(model, task, n_prompts=n_prompts, seed=seed)
    if not isinstance(task, DiscoveryTask):
        raise PatchingError(f"task must be a DiscoveryTask or a task name, got {type(task).__name__}")
    patcher = EdgePatcher(model, task.clean, task.corrupt, ablation, target=task.target)
    graph = patcher.graph
    settings = {"ablation": ablation}
    if method in ("eap", "eap-ig"):
        settings["steps"] = steps if method == "eap-ig" else None
        scores = edge_scores(patcher, task, steps if method == "eap-ig" else None)
        kept = None if threshold is None else scores.abs() >= threshold
    else:
        tau = DEFAULT_TAU[metric] if threshold is None else float(threshold)
        settings.update(metric=metric, tau=tau, batch=batch)
        kept, scores = acdc(patcher, task, tau, metric, batch)
    passes = {"forward": patcher.forwards, "backward": patcher.backwards, "rows": patcher.rows}
    order = sorted(range(len(graph)), key=lambda i: (-abs(float(scores[i])), i))
    curve = faithfulness_curve(patcher, task, order, None if ks is None else list(ks))
    if kept is None:  # the fewest top edges reaching the target
        reach = [k for k, f in zip(curve["k"], curve["circuit_faithfulness"]) if f >= target]
        k = min(reach) if reach else len(graph)
        kept = torch.zeros(len(graph), dtype=torch.bool)
        kept[order[:k]] = True
        settings["target"] = target
    settings["threshold"] = threshold
    k = int(kept.sum())
    if k in curve["k"] and bool(kept[order[:k]].all()):  # the top k: a point the curve measured already
        i = curve["k"].index(k)
        f, fc = curve["circuit_faithfulness"][i], curve["complement_faithfulness"][i]
    else:
        f, fc = subgraph_faithfulness(patcher, task, kept, curve["full"], curve["empty"])
    circuit = [graph.edges[i] for i in order if kept[i]]
    return DiscoveryResult(
        getattr(model.cfg, "model_name", "") or "", task.to_json(), method, settings, list(graph.edges),
        {e: float(scores[i]) for i, e in enumerate(graph.edges)}, circuit, f, fc, curve, passes,
        {"clean": curve["full"], "empty": curve["empty"]})


__all__ = ["DEFAULT_TARGET", "DEFAULT_TAU", "METHODS", "discover"]

"""Path patching (Wang et al. 2022, "Interpretability in the Wild", §3.1; Goldowsky-Dill et al. 2023, "Localizing
Model Behavior with Path Patching"): the effect of sender heads on the output through receiver heads' query, key
or value inputs only.

Two runs per path, on the base prompt (the clean one when noising, as in Wang et al.; the corrupted one when
denoising):

1. the senders' outputs (`hook_z`) take their values from the other prompt while every other head's output (and,
   with `freeze_mlps`, every MLP's output) is frozen to the base run; the receivers' inputs `hook_q`/`hook_k`/`hook_v`
   are recorded. They then differ from the base run only by what reached them directly from the senders.
2. the base prompt again, with only the receivers' recorded inputs patched in; everything downstream is recomputed,
   and the metric is read.

Both runs use only what the base run already computed before the first layer they change: step 2 starts at the
first receiver's layer from the base run's cached `hook_resid_pre` (`analyses.resume`), and step 1 stops before the
unembedding (`stop_at_layer`), on the models of this project, whose forward takes both; the values are bitwise those
of whole runs (tests/analyses/test_patching_paths.py). `path_baselines` runs both prompts once for many paths.

Written here: TransformerLens 4.3's `get_act_patch_direct_path` computes the same edge (denoising, one receiver at a
time) but needs split Q/K/V input hooks, which neither our model nor TransformerLens' native bridge has; this works
from `hook_z` and `hook_q/k/v`, which every model has (tests check the two agree on a bridge that has both).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch

from ..resume import resumable, resume_name, run_from_layer
from .activation import baseline_runs, token_strings
from .inputs import (
    EMBEDDINGS,
    Embedding,
    PatchingError,
    all_heads,
    as_head,
    as_sender,
    check_choice,
    check_direction,
    grouped_kv,
    has_mlps,
    prepare,
    token_pair,
)
from .metrics import evaluate, metric_name
from .result import PatchResult

COMPONENTS = ("q", "k", "v")


def _by_hook(heads, name: str) -> dict[str, list[int]]:
    out = defaultdict(list)
    for h in heads:
        out[h.hook(name)].append(h.head)
    return out


def _receiver_inputs(model, base, base_cache, source_cache, senders, components, freeze_mlps):
    """Step 1: the base run with the senders' `hook_z` (an embedding sender: its `hook_embed` / `hook_pos_embed`)
    from the source run and every other head's (and MLP's) output frozen to the base run; returns every later
    head's recorded `hook_{q,k,v}` (one tensor per hook)."""
    sent = _by_hook([s for s in senders if not isinstance(s, Embedding)], "z")
    # hook functions are bound to the names they were registered under: a bridge reports its own names in `hook`
    def freeze(z, hook, name):
        out = base_cache[name].to(z.dtype).clone()
        hs = sent.get(name)
        if hs:
            out[:, :, hs] = source_cache[name][:, :, hs].to(z.dtype)
        return out

    hooks = [(n, lambda z, hook, n=n: freeze(z, hook, n)) for n in sorted({h.hook("z") for h in all_heads(model)})]
    hooks += [(n, lambda x, hook, n=n: source_cache[n].to(x.dtype))
              for n in sorted({e.hook() for e in senders if isinstance(e, Embedding)})]
    if freeze_mlps and has_mlps(model):
        hooks += [(n, lambda x, hook, n=n: base_cache[n].to(x.dtype))
                  for n in (f"blocks.{l}.hook_mlp_out" for l in range(model.cfg.n_layers))]
    first = min(s.layer for s in senders) + 1
    recorded = {}

    def record(x, name):
        recorded[name] = x.detach().clone()

    later = all_heads(model, range(first, model.cfg.n_layers))
    names = sorted({h.hook(c) for c in components for h in later})
    hooks += [(n, lambda x, hook, n=n: record(x, n)) for n in names]
    if resumable(model):  # nothing after the last block is recorded
        model.run_with_hooks(base, fwd_hooks=hooks, stop_at_layer=model.cfg.n_layers)
    else:
        model.run_with_hooks(base, fwd_hooks=hooks)
    return recorded


def _patched_metric(model, base, recorded, receivers, component, metric, base_cache=None) -> torch.Tensor:
    """Step 2: the base run with only the receivers' `hook_{component}` replaced by the recorded values; started at
    the first receiver's layer from the base run's `hook_resid_pre` when `base_cache` holds it (`analyses.resume`)."""
    def patch(x, name, hs):
        x = x.clone()
        x[:, :, hs] = recorded[name][:, :, hs].to(x.dtype)
        return x

    hooks = [(n, lambda x, hook, n=n, hs=hs: patch(x, n, hs)) for n, hs in _by_hook(receivers, component).items()]
    start = min(r.layer for r in receivers)
    return evaluate(metric, run_from_layer(model, base, base_cache, start, hooks), base.shape[0])


@dataclass(frozen=True)
class PathBaselines:
    """The two runs every path of one `(clean, corrupt, metric, direction)` reads (`path_baselines`): the prompts,
    the base run's cache (the clean prompt when noising, the corrupted one when denoising), the source run's cache
    and the metric of each prompt `[batch]`."""

    clean: torch.Tensor
    corrupt: torch.Tensor
    metric: object
    direction: str
    base_cache: object
    source_cache: object
    m_clean: torch.Tensor
    m_corrupt: torch.Tensor


@torch.no_grad()
def path_baselines(model, clean, corrupt, metric, direction: str = "noising") -> PathBaselines:
    """Run both prompts once, caching what path patching reads (every head's `hook_z`, the MLP outputs, the
    embeddings and each block's input): pass the result as `baselines=` to `path_patching` and
    `path_patching_matrix` calls on the same prompts, metric and direction, which then skip their own two runs."""
    prepare(model)
    check_direction(direction)
    clean, corrupt = token_pair(model, clean, corrupt)
    L = model.cfg.n_layers
    names = {h.hook("z") for h in all_heads(model)} | {f"blocks.{l}.hook_mlp_out" for l in range(L)}
    names |= {f"hook_{e}" for e in EMBEDDINGS}
    if resumable(model):
        names |= {resume_name(l) for l in range(L)}
    cc, cx, m_clean, m_corrupt = baseline_runs(model, clean, corrupt, metric, names)
    base, source = (cc, cx) if direction == "noising" else (cx, cc)
    return PathBaselines(clean, corrupt, metric, direction, base, source, m_clean, m_corrupt)


def _setup(model, clean, corrupt, metric, direction, components, baselines):
    prepare(model)
    check_direction(direction)
    for c in components:
        check_choice(c, COMPONENTS, "component")
        if c in ("k", "v") and grouped_kv(model):
            raise PatchingError(f"component {c!r}: this model uses grouped-query attention, so one key/value head "
                                "serves several query heads and a per-head path through it is undefined; use 'q'")
    if baselines is None:
        return path_baselines(model, clean, corrupt, metric, direction)
    clean, corrupt = token_pair(model, clean, corrupt)
    b = baselines
    if not (b.metric is metric and b.direction == direction and b.clean.shape == clean.shape
            and b.corrupt.shape == corrupt.shape and torch.equal(b.clean, clean) and torch.equal(b.corrupt, corrupt)):
        raise PatchingError("baselines= were run on other prompts, another metric or another direction than this "
                            "call's; make them with path_baselines on the same ones")
    return b


def _result(model, clean, metric, direction, per_prompt, m_clean, m_corrupt, components, senders, receivers):
    return PatchResult("path", direction, metric_name(metric), ("component", "sender", "receiver"),
                       (tuple(components), tuple(senders), tuple(receivers)), per_prompt,
                       m_clean.double().cpu(), m_corrupt.double().cpu(), token_strings(model, clean))


@torch.no_grad()
def path_patching(model, clean, corrupt, metric, senders, receivers, component: str = "k",
                  direction: str = "noising", freeze_mlps: bool = True,
                  baselines: PathBaselines | None = None) -> PatchResult:
    """The metric when the `senders` (heads: `(layer, head)`, "L0H1" or `Head`; or the embeddings "embed" and
    "pos_embed", which reach every head) reach the `receivers` through the receivers' `component` input ("q", "k"
    or "v") only — patched together, as one path.

    `direction`: "noising" (default; Wang et al.) runs the clean prompt with the senders' corrupted outputs;
    "denoising" the corrupted prompt with the senders' clean outputs. `freeze_mlps`: MLP outputs are frozen with the
    other heads (the direct edge only); False lets paths through MLPs count, as Wang et al. did. Every receiver
    must sit in a later layer than every sender. Returns a `PatchResult` with one cell; `.share()` is the part of
    the clean–corrupted difference that the path carries. `baselines`: `path_baselines` of the same prompts, metric
    and direction, shared between calls (default: run here)."""
    senders = [as_sender(model, s, "sender") for s in ([senders] if isinstance(senders, str) else senders)]
    receivers = [as_head(model, r, "receiver") for r in ([receivers] if isinstance(receivers, str) else receivers)]
    if not senders or not receivers:
        raise PatchingError("path patching needs at least one sender and one receiver head")
    late = [r for r in receivers if r.layer <= max(s.layer for s in senders)]
    if late:
        raise PatchingError(f"receiver {late[0]} does not read the senders: every receiver must be in a later layer "
                            f"than every sender (latest sender layer {max(s.layer for s in senders)})")
    b = _setup(model, clean, corrupt, metric, direction, [component], baselines)
    base = b.clean if direction == "noising" else b.corrupt
    recorded = _receiver_inputs(model, base, b.base_cache, b.source_cache, senders, [component], freeze_mlps)
    value = _patched_metric(model, base, recorded, receivers, component, metric, b.base_cache)
    return _result(model, b.clean, metric, direction, value.double().cpu()[None, None, None], b.m_clean, b.m_corrupt,
                   [component], ["+".join(map(str, senders))], ["+".join(map(str, receivers))])


@torch.no_grad()
def path_patching_matrix(model, clean, corrupt, metric, senders=None, receivers=None, components=COMPONENTS,
                         direction: str = "noising", freeze_mlps: bool = True, progress: bool = True,
                         baselines: PathBaselines | None = None) -> PatchResult:
    """`path_patching` from each sender alone to each receiver alone through each component: a `PatchResult` with
    axes (component, sender, receiver); NaN where the receiver is not in a later layer than the sender. Default
    senders: every head but the last layer's (add "embed" / "pos_embed" to a `senders` list to see the routes from
    the embeddings, e.g. the values' direct route); receivers: every head from layer 1 on. One step-1 run per sender,
    one step-2 run per (component, receiver); `baselines` as in `path_patching`."""
    from tqdm.auto import tqdm

    L = model.cfg.n_layers
    senders = all_heads(model, range(L - 1)) if senders is None else [as_sender(model, s, "sender") for s in senders]
    receivers = (all_heads(model, range(1, L)) if receivers is None else
                 [as_head(model, r, "receiver") for r in receivers])
    components = list(components)
    if not senders or not receivers or not components:
        raise PatchingError("path patching needs senders and receivers (a model with at least two layers) and at "
                            "least one component")
    b = _setup(model, clean, corrupt, metric, direction, components, baselines)
    clean, base = b.clean, (b.clean if direction == "noising" else b.corrupt)
    out = torch.full((len(components), len(senders), len(receivers), clean.shape[0]), float("nan"), dtype=torch.float64)
    pairs = [(j, r) for r in receivers for j, s in enumerate(senders) if r.layer > s.layer]
    bar = tqdm(total=len(senders) + len(pairs) * len(components), desc="path patching", disable=not progress,
               leave=False)
    for j, s in enumerate(senders):
        recorded = _receiver_inputs(model, base, b.base_cache, b.source_cache, [s], components, freeze_mlps)
        bar.update()
        for k, r in enumerate(receivers):
            if r.layer <= s.layer:
                continue
            for i, c in enumerate(components):
                out[i, j, k] = _patched_metric(model, base, recorded, [r], c, metric, b.base_cache).double().cpu()
                bar.update()
    bar.close()
    return _result(model, clean, metric, direction, out, b.m_clean, b.m_corrupt, components, map(str, senders),
                   map(str, receivers))


__all__ = ["path_patching", "path_patching_matrix", "path_baselines", "PathBaselines", "COMPONENTS"]

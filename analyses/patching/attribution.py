"""Attribution patching (Nanda 2023, "Attribution Patching: Activation Patching At Industrial Scale"; Syed et al.
2023): the first-order Taylor estimate of every activation patch from one forward and one backward pass.

Gradients are captured with TransformerLens 4.3's `cache_activation_and_gradient` (which also handles a bridge's
converted hooks). Written here: the estimate in the layouts of `activation_patching` (every kind, by position or
not, both directions) and the comparison with exact activation patching; TransformerLens' own `attribution_patch`
scores only its node set (embeddings, head outputs and MLP outputs per position) in the denoising direction.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from ..util import markdown_table
from .activation import KINDS, activation_patching, axis_labels, check_kind, token_strings
from .inputs import PatchingError, check_direction, prepare, token_pair
from .metrics import Metric, evaluate, metric_name
from .result import PatchResult


def linear_estimate(base: torch.Tensor, source: torch.Tensor, grad: torch.Tensor, dims: tuple[int, ...]
                    ) -> torch.Tensor:
    """Nanda 2023's attribution: metric(patched) − metric(base) ≈ (a_source − a_base) · ∂metric/∂a |_base, the
    activation difference times the metric's gradient on the base run, summed over `dims` (the features of one
    patched cell, and the positions when the cell spans all of them). Exact when the metric is linear in `a`."""
    return ((source - base) * grad).sum(dims)


def _cell_dims(kind: str, by_pos: bool) -> tuple[int, ...]:
    """The axes of one layer's activation that a cell sums over (activations are `[batch, pos, (head,) d]`,
    patterns `[batch, head, q, k]`), leaving `[batch, *cell axes]`."""
    if kind == "pattern":
        return (-1,) if by_pos else (-2, -1)
    if kind in ("z", "q", "k", "v"):
        return (-1,) if by_pos else (1, -1)
    return (-1,)


@dataclass
class AttributionResult:
    """`estimate`: the patched metric that attribution patching predicts (base metric + linear estimate), in the
    layout of `activation_patching`; `exact`: activation patching of the same cells (None unless compared);
    `correlation`: Pearson's r between the estimated and the exact effects over the cells (batch means);
    `max_error`: the largest |estimate − exact| over cells."""

    estimate: PatchResult
    exact: PatchResult | None = None
    correlation: float | None = None
    max_error: float | None = None

    def errors(self) -> list[tuple[str, float, float, str]]:
        """Per cell (needs `exact`): `(label, estimated effect, exact effect, where the linear estimate fails)`,
        effects = patched metric − the base run's, largest |error| first. The linear estimate is a first-order
        Taylor step from the base run; it fails where the metric is far from linear along the patch (an attention
        pattern that flips, a softmax that saturates): 'wrong sign' when the two effects disagree in sign (both
        above 1 % of the largest exact effect), 'off by N×' when the estimate is under half or over twice the exact
        effect, '' when it is within that."""
        if self.exact is None:
            raise ValueError("errors() needs the exact activation patching: call attribution_patching(compare=True)")
        base = self.estimate.corrupt if self.estimate.direction == "denoising" else self.estimate.clean
        est = (self.estimate.values - base.mean()).reshape(-1)
        ex = (self.exact.values - base.mean()).reshape(-1)
        tiny = 0.01 * float(ex.abs().max()) if ex.numel() else 0.0
        cells = list(itertools.product(*(range(n) for n in self.estimate.values.shape)))
        out = []
        for i, idx in enumerate(cells):
            a, b = float(est[i]), float(ex[i])
            if abs(a) > tiny and abs(b) > tiny and a * b < 0:
                note = "wrong sign"
            elif abs(b) > tiny and not 0.5 <= a / b <= 2:
                note = f"off by {a / b:.2f}×"
            else:
                note = ""
            out.append((self.estimate.label(idx), a, b, note))
        return sorted(out, key=lambda r: -abs(r[1] - r[2]))

    def error_table(self, k: int = 10) -> str:
        """Markdown: the `k` cells with the largest |estimate − exact| (`errors`)."""
        rows = [[lab, a, b, a - b, note or "—"] for lab, a, b, note in self.errors()[:k]]
        return markdown_table(["cell", "estimated effect", "exact effect", "error", "linear estimate"], rows)

    def __str__(self) -> str:
        cmp = "" if self.exact is None else (f"; vs exact activation patching: r = {self.correlation:.4f}, max "
                                             f"|error| {self.max_error:.3g}")
        text = f"AttributionResult({self.estimate.kind}, {self.estimate.direction}{cmp})\n{self.estimate.markdown()}"
        if self.exact is not None:
            text += "\nper cell against exact activation patching (largest errors first):\n" + self.error_table()
        return text


def attribution_patching(model, clean, corrupt, metric, kind: str = "z", by_pos: bool | None = None,
                         direction: str = "denoising", compare: bool = True, progress: bool = True
                         ) -> AttributionResult:
    """Estimate `activation_patching(model, clean, corrupt, metric, kind, by_pos, direction)` for every cell from one
    forward and backward pass on the base prompt (the corrupted one when denoising, the clean one when noising) and
    one forward pass on the other. With `compare` (default), also run the exact activation patching and report
    their correlation. Puts the model in eval mode."""
    from models.arch.tl_compat import analysis_tool, utilities

    cache_activation_and_gradient = analysis_tool("attribution_patching").cache_activation_and_gradient
    get_act_name = utilities().get_act_name

    prepare(model)
    check_direction(direction)
    by_pos, axes = check_kind(model, kind, by_pos)
    clean, corrupt = token_pair(model, clean, corrupt)
    if isinstance(metric, Metric):
        metric.answers.check(clean.shape[1], clean.shape[0])
    act = KINDS[kind][0]
    names = [get_act_name(act, l) for l in range(model.cfg.n_layers)]
    base_t, source_t = (corrupt, clean) if direction == "denoising" else (clean, corrupt)
    batch = clean.shape[0]
    seen = {}

    def summed(logits):  # prompts are independent, so each prompt's gradient is its own metric's
        per = evaluate(metric, logits, batch)
        seen["base"] = per.detach()
        return per.sum()

    try:
        with torch.enable_grad():  # hook_embed drives the backward through every layer: with only a bridge's
            # converted hooks (hook_z, hook_q/k/v) requested, TransformerLens' backward hooks there do not fire
            g = cache_activation_and_gradient(model, base_t, summed, names_filter=names + ["hook_embed"])
    except RuntimeError as e:  # e.g. a hook of the caller's replaces the activation with a constant
        raise PatchingError(f"attribution patching needs the metric's gradient at every {act} activation: {e}"
                            ) from None
    with torch.no_grad():
        logits, source = model.run_with_cache(source_t, names_filter=lambda n: n in names)
    dims = _cell_dims(kind, by_pos)
    missing = [n for n in names if g.gradients.get(n) is None]
    if missing:
        raise PatchingError(f"attribution patching: no gradient reached {missing[0]} on this model")
    est = torch.stack([linear_estimate(g.activations[n], source[n].to(g.activations[n].dtype), g.gradients[n], dims)
                       for n in names])  # [layer, batch, *cell]
    est = est.movedim(1, -1).double().cpu()  # [layer, *cell, batch]
    m_base = seen["base"].double().cpu()
    m_source = evaluate(metric, logits, batch).double().cpu()
    m_clean, m_corrupt = (m_source, m_base) if direction == "denoising" else (m_base, m_source)
    toks = token_strings(model, clean)
    n_kv = est.shape[axes.index("head")] if "head" in axes else None
    estimate = PatchResult(kind, direction, metric_name(metric), axes,
                           axis_labels(model, axes, clean.shape[1], toks, n_kv), est + m_base, m_clean, m_corrupt,
                           toks)
    if not compare:
        return AttributionResult(estimate)
    exact = activation_patching(model, clean, corrupt, metric, kind, by_pos, direction, progress)
    a = (estimate.values - m_base.mean()).reshape(-1)
    b = (exact.values - m_base.mean()).reshape(-1)
    r = float(torch.corrcoef(torch.stack([a, b]))[0, 1]) if a.numel() > 1 else float("nan")
    return AttributionResult(estimate, exact, r, float((a - b).abs().max()))


"""Ablations: replace heads' outputs (`hook_z`, at every position or chosen ones) and measure a metric.

Methods (Heimersheim & Nanda 2024, §"Ablation"; resampling as in Chan et al. 2022, "Causal Scrubbing"):
- zero: the output is set to 0 (b_O is kept);
- mean: the output's mean over a reference batch, at each position;
- resample: the output on another prompt of a reference batch (drawn per prompt, seeded).
With `preserve_patterns`, every attention pattern is frozen to its value on the prompt itself (Olsson et al. 2022's
pattern-preserving ablation): the hooks come from `analyses.one_layer`, whose `head_ablation_losses` is the zero
ablation of one head at a time with the loss as metric.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .inputs import PatchingError, as_head, check_choice, prepare, prompt_tokens
from .metrics import Metric, evaluate, metric_name

METHODS = ("zero", "mean", "resample")


def next_token_loss(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Each prompt's mean next-token cross-entropy (nats) `[batch]` (`models.lm_cross_entropy`)."""
    from models import lm_cross_entropy

    return lm_cross_entropy(logits, tokens, per_token=True).mean(-1)


@dataclass
class Ablation:
    """`per_prompt [layer, head, batch]` (one head ablated at a time; NaN for heads not asked) or `[1, 1, batch]`
    (all `heads` together, labelled by `together`); `clean [batch]` the unablated metric."""

    method: str
    metric: str
    preserve_patterns: bool
    per_prompt: torch.Tensor
    clean: torch.Tensor
    together: str | None = None

    @property
    def delta(self) -> torch.Tensor:
        """Ablated minus clean metric, averaged over prompts: `[layer, head]` (or `[1, 1]` together)."""
        return (self.per_prompt - self.clean).mean(-1)

    def markdown(self) -> str:
        from models.arch.model import head_label

        from ..util import markdown_table

        d = self.delta
        rows = ([[self.together, float(d[0, 0])]] if self.together else
                sorted(([head_label(l, h), float(d[l, h])] for l in range(d.shape[0]) for h in range(d.shape[1])
                        if not torch.isnan(d[l, h])), key=lambda r: -abs(r[1])))
        return markdown_table(["ablated", f"change in {self.metric}"], rows)

    def __str__(self) -> str:
        return (f"Ablation({self.method}{', patterns preserved' if self.preserve_patterns else ''}; clean "
                f"{self.metric} {float(self.clean.mean()):.4f})\n{self.markdown()}")


def _replacement(model, tokens, method, reference, seed, names):
    """The per-layer `hook_z` values that ablated heads take: `{hook name: [batch, pos, head, d_head]}` (zero
    ablation: None)."""
    if method == "zero":
        return None
    if reference is None:
        raise PatchingError(f"{method} ablation needs a reference batch of prompts (reference=...)")
    ref = prompt_tokens(model, reference, "reference")
    B, P = tokens.shape
    if ref.shape[1] < P:
        raise PatchingError(f"the reference prompts ({ref.shape[1]} tokens) must be at least as long as the prompts "
                            f"({P} tokens): a position's mean or resample comes from the same position")
    with torch.no_grad():
        _, cache = model.run_with_cache(ref[:, :P], names_filter=lambda n: n in names)
    if method == "mean":
        return {n: cache[n].mean(0, keepdim=True).expand(B, *cache[n].shape[1:]) for n in names}
    pick = torch.randint(0, ref.shape[0], (B,), generator=torch.Generator().manual_seed(seed))
    return {n: cache[n][pick.to(cache[n].device)] for n in names}


@torch.no_grad()
def ablate_heads(model, tokens, heads=None, method: str = "zero", reference=None, positions=None,
                 preserve_patterns: bool = False, metric=None, together: bool = False, seed: int = 0) -> Ablation:
    """Ablate each of `heads` (default: every head) alone — or all of them at once with `together` — and measure
    `metric` (a `patching.Metric` or a function logits → `[batch]`; default each prompt's mean next-token loss).
    `method`: zero, mean or resample (see the module docstring; mean and resample draw from `reference`, prompts at
    least as long as `tokens`). `positions`: the positions whose output is replaced (default all).
    `preserve_patterns`: freeze every attention pattern to its unablated value. Puts the model in eval mode."""
    from ..one_layer import _ablation_hooks, _pattern_names

    prepare(model)
    check_choice(method, METHODS, "ablation method")
    tokens = prompt_tokens(model, tokens)
    B, P = tokens.shape
    heads = ([as_head(model, (l, h)) for l in range(model.cfg.n_layers) for h in range(model.cfg.n_heads)]
             if heads is None else [as_head(model, h) for h in heads])
    if not heads:
        raise PatchingError("give at least one head to ablate")
    pos = list(range(P)) if positions is None else [int(p) for p in positions]
    if not pos or min(pos) < -P or max(pos) >= P:
        raise PatchingError(f"positions must lie in {-P}..{P - 1} for prompts of {P} tokens")
    if isinstance(metric, Metric):
        metric.answers.check(P, B)
    fn = (lambda logits: next_token_loss(logits, tokens)) if metric is None else metric
    z_names = sorted({h.hook("z") for h in heads})
    patterns = _pattern_names(model) if preserve_patterns else []
    logits, cache = model.run_with_cache(tokens, names_filter=lambda n: n in patterns)
    clean = evaluate(fn, logits, B).double().cpu()
    frozen = _ablation_hooks({n: cache[n] for n in patterns}, []) if preserve_patterns else []
    repl = _replacement(model, tokens, method, reference, seed, z_names)

    def run(group) -> torch.Tensor:
        def ablate(z, name, hs):  # `name` as registered: a bridge reports its own names in `hook`
            z = z.clone()
            idx = (slice(None), torch.tensor(pos)[:, None], torch.tensor(hs)[None, :])  # positions × heads
            z[idx] = 0 if repl is None else repl[name][idx].to(z.dtype)
            return z

        by_name = {}
        for h in group:
            by_name.setdefault(h.hook("z"), []).append(h.head)
        hooks = frozen + [(n, lambda z, hook, n=n, hs=hs: ablate(z, n, hs)) for n, hs in by_name.items()]
        return evaluate(fn, model.run_with_hooks(tokens, fwd_hooks=hooks), B).double().cpu()

    name = metric_name(fn) if metric is not None else "loss"
    if together:
        return Ablation(method, name, preserve_patterns, run(heads)[None, None], clean,
                        "+".join(str(h) for h in heads))
    out = torch.full((model.cfg.n_layers, model.cfg.n_heads, B), float("nan"), dtype=torch.float64)
    for h in heads:
        out[h.layer, h.head] = run([h])
    return Ablation(method, name, preserve_patterns, out, clean)

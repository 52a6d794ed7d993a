"""Gradient scores for every edge at once: edge attribution patching (EAP) and EAP with integrated gradients.

Both estimate, to first order, the change of the task metric m when edge (s, r) is removed — r reads s's ablated
output `z'_s` instead of its clean output `z_s` — from the gradient of m with respect to r's input `x_r`
(`EdgePatcher`'s receiver hooks: per-head q/k/v inputs before the norm, MLP inputs, the final residual stream).
Summed over prompts' positions and averaged over prompts.
"""

from __future__ import annotations

import torch

from .patching import EdgePatcher, split_inputs


def eap_score(diff: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """Edge attribution patching (Syed, Rager & Conmy 2023, "Attribution Patching Outperforms Automated Circuit
    Discovery", eq. 2): score(s → r) = (z'_s − z_s) · ∂m/∂x_r, the sender's ablated-minus-clean output against the
    gradient of the metric at the receiver's input, summed over positions and rows. `diff [rows, pos, S, d_model]`,
    `grad [rows, pos, R, d_model]` → `[S, R]`."""
    return torch.einsum("bpsd,bprd->sr", diff, grad)


def integrated_gradient_points(steps: int) -> torch.Tensor:
    """The interpolation points α_k = k / m, k = 1 … m, of EAP-IG (Hanna, Pezzelle & Belinkov 2024, "Have Faith in
    Faithfulness: Going Beyond Circuit Overlap When Finding Model Mechanisms", §3, following Sundararajan et al.
    2017's Riemann sum): the input embedding at α is z' + α (z − z'), corrupted at 0 and clean at 1; the EAP-IG
    score is `eap_score` with the gradient averaged over the m points."""
    return torch.arange(1, steps + 1, dtype=torch.float64) / steps


def _gradients(patcher: EdgePatcher, task, alphas: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """∂(task metric)/∂(receiver input) for every receiver hook on the clean prompts (alphas None) or on the
    embeddings interpolated at each α (the rows of all α in one batch, the metric averaged over all of them), one
    forward and one backward pass. Returns hook name → gradient `[rows, pos, width, d_model]`."""
    model, clean = patcher.model, patcher.clean
    n = 1 if alphas is None else alphas.numel()
    inputs = {}

    def keep(x, hook):
        inputs[hook.name] = x
        return x

    hooks = [(name, keep) for name in patcher.hooks]
    if alphas is not None:  # every token embedding interpolated (an encoder–decoder's target: the same in both)
        a = alphas.repeat_interleave(clean.shape[0])[:, None, None]
        def interpolate(base):
            return lambda x, hook: base.to(x.dtype) + a.to(x.dtype) * (x - base.to(x.dtype))

        for hook, sender in patcher.embed_hooks:
            hooks.insert(0, (hook, interpolate(patcher.ablated[sender].repeat(n, 1, 1))))
    with torch.enable_grad(), split_inputs(model):
        logits = model.run_with_hooks(*patcher.inputs(clean, n), fwd_hooks=hooks)
        # the metric of every row, averaged over prompts and interpolation points
        value = torch.stack([task.value(lg) for lg in logits.reshape(n, clean.shape[0], *logits.shape[1:])]).mean()
        names = list(inputs)
        grads = torch.autograd.grad(value, [inputs[k] for k in names])
    patcher.forwards += 1
    patcher.backwards += 1
    patcher.rows += n * clean.shape[0]
    out = {}
    for k, g in zip(names, grads):
        out[k] = (g if g.ndim == 4 else g[:, :, None]).detach()
    return out


def edge_scores(patcher: EdgePatcher, task, steps: int | None = None) -> torch.Tensor:
    """EAP (`steps` None) or EAP-IG (`steps` interpolation points) scores for every edge of `patcher.graph`,
    `[n_edges]` float64, in metric units (an estimate of m(without the edge) − m(clean)). Two forward passes for the
    senders' clean and ablated outputs (the ablated ones are the patcher's), one forward and one backward for the
    gradients."""
    with torch.no_grad():
        clean = patcher.sender_outputs(patcher.clean)
    alphas = None if steps is None else integrated_gradient_points(steps)
    grads = _gradients(patcher, task, alphas)
    n = 1 if alphas is None else alphas.numel()
    scores = torch.zeros(len(patcher.graph), dtype=torch.float64)
    for hook, (senders, index) in patcher.hooks.items():
        if not senders:
            continue
        names = [patcher.sender_names[s] for s in senders]
        diff = torch.stack([patcher.ablated[s] - clean[s] for s in names], 2).repeat(n, 1, 1, 1)
        s = eap_score(diff.double(), grads[hook].double()).cpu()  # [S, width]
        ok = index >= 0
        scores[index[ok]] = s[ok]
    return scores


__all__ = ["eap_score", "edge_scores", "integrated_gradient_points"]

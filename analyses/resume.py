"""Runs that start at a layer: an intervention that changes nothing before layer l leaves the residual stream entering
block l as in the clean run, so the run can start there from the clean run's cached `blocks.{l}.hook_resid_pre`
(TransformerLens 2.x's `start_at_layer`) instead of recomputing the blocks before it. Every block then sees bitwise
the inputs of a whole run, so the outputs are bitwise those of a whole run (tests/analyses/test_patching_paths.py and
tests/analyses/test_one_layer.py compare them)."""

from __future__ import annotations

#: the arguments of TransformerLens 2.x's `HookedTransformer.forward` a run from a layer passes
RESUME_ARGUMENTS = ("start_at_layer", "stop_at_layer", "tokens", "shortformer_pos_embed", "attention_mask")


def resumable(model) -> bool:
    """Whether `model` runs from a layer as TransformerLens 2.x's `HookedTransformer` does: an `input_to_embed` and a
    forward that names every one of `RESUME_ARGUMENTS` (this project's decoder-only models; not its encoders and
    encoder–decoders, nor TransformerLens 4's bridges, whose forward takes other arguments), so a caller falls back
    to whole runs on any other model."""
    import inspect

    forward = getattr(model, "forward", None)
    if not (callable(forward) and callable(getattr(model, "input_to_embed", None))):
        return False
    params = inspect.signature(forward).parameters
    return all(a in params for a in RESUME_ARGUMENTS)


def resume_name(layer: int) -> str:
    """The hook whose cached value a run starting at `layer` starts from."""
    return f"blocks.{layer}.hook_resid_pre"


def run_from_layer(model, tokens, cache, layer: int, fwd_hooks, **forward_kw):
    """`model.run_with_hooks(tokens, fwd_hooks=fwd_hooks, **forward_kw)` started at block `layer` from
    `cache[resume_name(layer)]` (a run of `tokens` in which nothing before block `layer` differs from this one);
    `forward_kw` as `forward`'s (`return_type`, `loss_per_token`, ...). The whole run when the model is not
    `resumable`, `layer` is 0 or `cache` (None allowed) lacks that input. The positions' side inputs come from
    `input_to_embed(tokens)`, which runs no hook."""
    name = resume_name(layer)
    if layer == 0 or cache is None or name not in cache or not resumable(model):
        return model.run_with_hooks(tokens, fwd_hooks=fwd_hooks, **forward_kw)
    _, _, pos_qk, mask = model.input_to_embed(tokens)
    return model.run_with_hooks(cache[name], fwd_hooks=fwd_hooks, start_at_layer=layer, tokens=tokens,
                                shortformer_pos_embed=pos_qk, attention_mask=mask, **forward_kw)


__all__ = ["resumable", "resume_name", "run_from_layer", "RESUME_ARGUMENTS"]

"""Whether anything watches a model's activations, which decides between its fully hooked path and its fast one.

The layers have a fast path that skips some hook points (`F.scaled_dot_product_attention` forms no attention
pattern, `F.layer_norm` no scale, the fused output projection no per-head result). It may run only when nothing at
all could observe an activation: a hook point skipped while a tool waits on it silently breaks that tool (a plain
PyTorch forward hook never fires; nnsight waits for a value that never comes). So a model is *watched*, and runs every
hook point with the values `run_with_cache` records, when any of these holds:

- a TransformerLens hook, or any PyTorch forward, forward-pre or backward hook, on any module of the model (hook
  points and their parents alike: TransformerLens' `add_hook` registers PyTorch hooks too);
- a global module hook (`torch.nn.modules.module.register_module_forward_hook` and its siblings);
- a module whose `forward` was replaced on the instance (tracing tools such as nnsight install their controller so).

The decision is taken once per forward pass for the whole model and handed to every layer with its inputs
(`BlockInputs.hooked`, the `hooked=` argument of the layers), so every layer takes the same path; `run_with_cache`
always takes the hooked path, so a cache filtered to a few names (or to none) holds bitwise the values, and returns
the logits, of the full cache. A layer called on its own decides from its own sub-modules (`hooked_path`). The
decision is plain Python over module attributes, no global or context-local state, so `torch.compile` traces it.
"""

from __future__ import annotations

import contextlib

from torch import nn
from torch.nn.modules import module as _module

_GLOBAL_HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
                 "_global_backward_pre_hooks")


def _global_hooks() -> bool:
    # torch keeps its global module hooks in these dicts of `torch.nn.modules.module` and offers no public getter;
    # a torch without them is treated as watched (the hooked path is always correct).
    return any(getattr(_module, name, True) for name in _GLOBAL_HOOKS)


def watched(root: nn.Module) -> bool:
    """True when anything may observe an activation of `root` or its sub-modules (module docstring)."""
    if _global_hooks():
        return True
    # a `HookedRootModule` lists the modules it held at `setup()` in `mod_dict`: a flat dict, several times cheaper to
    # walk than `modules()` (it runs once per decoding step)
    listed = getattr(root, "mod_dict", None)
    for m in ((root, *listed.values()) if listed else root.modules()):
        if (m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks
                or "forward" in m.__dict__):
            return True
    return False


@contextlib.contextmanager
def forced(model: nn.Module):
    """Inside, `model`'s forward passes take the hooked path whatever watches (`run_with_cache` uses it, so that a
    cache of any names holds the same values): a flag on the model
    itself, read by its forward. Nested uses keep the outer one's setting."""
    before = getattr(model, "_in_run_with_cache", False)
    model._in_run_with_cache = True
    try:
        yield
    finally:
        model._in_run_with_cache = before


def decide(model: nn.Module) -> bool:
    """The decision for one forward pass of `model`: the hooked path inside `forced` (`run_with_cache`) or when
    anything watches it."""
    return model._in_run_with_cache or watched(model)


def hooked_path(decided: bool | None, layer: nn.Module) -> bool:
    """Whether `layer` runs its fully hooked path: `decided` (the enclosing model's decision for this forward pass,
    passed down with the layer's inputs), or, for a layer called on its own (None), whether anything watches it."""
    return watched(layer) if decided is None else decided

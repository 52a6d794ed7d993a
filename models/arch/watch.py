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

The decision is taken once per forward pass for the whole model (`watching`), so every layer takes the same path, and
`run_with_cache` always takes the hooked path (`hooked_path`), so a cache filtered to a few names (or to none) holds
bitwise the values, and returns the logits, of the full cache. A
layer called on its own, outside a model's forward, decides from its own sub-modules (`explicit`).
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar

from torch import nn
from torch.nn.modules import module as _module

_GLOBAL_HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
                 "_global_backward_pre_hooks")
_decision: ContextVar[bool | None] = ContextVar("toy_circuits_watched", default=None)


def _global_hooks() -> bool:
    # torch keeps its global module hooks in these dicts of `torch.nn.modules.module` and offers no public getter;
    # a torch without them is treated as watched (the hooked path is always correct).
    return any(getattr(_module, name, True) for name in _GLOBAL_HOOKS)


def watched(root: nn.Module) -> bool:
    """True when anything may observe an activation of `root` or its sub-modules (module docstring)."""
    if _global_hooks():
        return True
    for m in root.modules():
        if (m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks
                or "forward" in m.__dict__):
            return True
    return False


@contextlib.contextmanager
def watching(root: nn.Module):
    """Decide once for `root`'s forward pass whether its layers run their hooked path (`explicit` inside reads it);
    inside `hooked_path` (or another watched forward) the answer is yes."""
    token = _decision.set(_decision.get() is True or watched(root))
    try:
        yield
    finally:
        _decision.reset(token)


@contextlib.contextmanager
def hooked_path():
    """Every forward inside runs its hooked path, watched or not: `run_with_cache` records the same values (and
    returns the same logits) whichever names it is asked for, none included."""
    token = _decision.set(True)
    try:
        yield
    finally:
        _decision.reset(token)


def explicit(layer: nn.Module) -> bool:
    """Whether `layer` runs its fully hooked path: the decision of the enclosing model's forward (`watching`), or,
    called outside one, whether anything watches `layer` itself."""
    decided = _decision.get()
    return watched(layer) if decided is None else decided

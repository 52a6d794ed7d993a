"""TransformerLens' pieces from where the installed version keeps them: the one module that imports `transformer_lens`.

Supported: transformer-lens 3.9 to 4.x (pyproject.toml). 3.9 is the release SAELens 6.x installs (it requires
`transformer-lens<4`) and the first with the attribution-patching tool `analyses.patching.attribution` uses
(`tools.analysis.attribution_patching`, new in 3.9.0); the classes we build on are in both:

- `HookPoint` (`transformer_lens.hook_points`), `HookedRootModule`, `ActivationCache`, `FactoredMatrix` (top level);
- `utilities()` (TransformerLens 2.x called it `utils`), `patching()`, `head_detector()`: the modules, imported on
  first use (TransformerLens 4.3's `utilities` package imports Hugging Face `transformers`); `patching_sweep`: a
  `get_act_patch_*` sweep with per-prompt values on both (3.x's sweeps have no `reduce`);
- `analysis_tool(name)`: a module of `transformer_lens.tools.analysis`, or `UnsupportedByTransformerLens` naming the
  installed version and the first that has it (`logit_lens` is 4.x only);
- `transformer_bridge()`: the `TransformerBridge` class with the 4.x conversion that `models.to_transformer_lens`
  uses (top level and `utilities.tl_checkpoint_conversion` in 4.x; 3.x keeps the class in `model_bridge` and has no
  such conversion), else `UnsupportedByTransformerLens` naming the version.
"""

from __future__ import annotations

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from types import ModuleType

from transformer_lens import ActivationCache, FactoredMatrix, HookedRootModule, hook_points
from transformer_lens.utilities.initialization_utils import (  # 2.18's init formulas, in 3.x and 4.x alike
    calc_fan_in_and_fan_out,
    init_kaiming_normal_,
    init_kaiming_uniform_,
    init_xavier_normal_,
    init_xavier_uniform_,
)

from ..errors import UnsupportedByTransformerLens

HookPoint = hook_points.HookPoint

__all__ = ["ActivationCache", "FactoredMatrix", "HookPoint", "HookedRootModule", "TL_VERSION", "analysis_tool",
           "calc_fan_in_and_fan_out", "init_kaiming_normal_", "init_kaiming_uniform_", "init_xavier_normal_",
           "init_xavier_uniform_",
           "head_detector", "evals", "patching", "patching_sweep", "transformer_bridge", "utilities", "version_tuple"]


def version_tuple(text: str) -> tuple[int, int]:
    """`(major, minor)` of a version string ("4.3.0" → (4, 3)); (0, 0) when it does not start with two numbers."""
    parts = text.split(".")
    try:
        return int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or "0")
    except (ValueError, IndexError):
        return 0, 0


try:
    TL_VERSION = version("transformer-lens")
except PackageNotFoundError:  # a source checkout on sys.path: no distribution metadata
    TL_VERSION = "0"

#: The first version with each `tools.analysis` module this toolkit calls (read off the released wheels).
ANALYSIS_TOOLS = {"attribution_patching": (3, 9), "direct_logit_attribution": (3, 6), "logit_lens": (4, 0)}


def _needs(feature: str, since: tuple[int, int]) -> UnsupportedByTransformerLens:
    return UnsupportedByTransformerLens(
        f"{feature} needs transformer-lens>={since[0]}.{since[1]}; this environment has {TL_VERSION} (SAELens 6.x "
        f"pins transformer-lens<4): pip install 'transformer-lens>={since[0]}.{since[1]},<5' in an environment "
        "without sae-lens")


def utilities() -> ModuleType:
    """`transformer_lens.utilities` (`get_act_name`, `composition_scores`, `slice.Slice`, ...)."""
    return import_module("transformer_lens.utilities")


def evals() -> ModuleType:
    """`transformer_lens.evals` (`induction_loss`, `evaluate`; it imports `datasets`)."""
    return import_module("transformer_lens.evals")


def patching() -> ModuleType:
    """`transformer_lens.patching`: the `get_act_patch_*` sweeps."""
    return import_module("transformer_lens.patching")


def patching_sweep(name: str, model, tokens, cache, metric):
    """TransformerLens' sweep `patching.<name>` with one value per prompt: `[cell axes..., batch]`. 4.x keeps them
    (`reduce="none"`); 3.x's sweeps store one scalar per cell (the metric's `.item()`), so there the sweep runs once
    per prompt, its metric the prompt's entry of `metric`'s `[batch]` output (same patches, same forward passes per
    cell, times the batch size)."""
    import inspect

    import torch

    sweep = getattr(patching(), name)
    if "reduce" in inspect.signature(sweep).parameters:
        return sweep(model, tokens, cache, metric, reduce="none").values
    return torch.stack([sweep(model, tokens, cache, lambda logits, b=b: metric(logits)[b])
                        for b in range(tokens.shape[0])], -1)


def head_detector() -> ModuleType:
    """`transformer_lens.head_detector` (`detect_head`)."""
    return import_module("transformer_lens.head_detector")


def analysis_tool(name: str) -> ModuleType:
    """`transformer_lens.tools.analysis.<name>`, or `UnsupportedByTransformerLens` when the installed version has
    no such module."""
    try:
        return import_module(f"transformer_lens.tools.analysis.{name}")
    except ModuleNotFoundError as e:
        if not (e.name or "").startswith("transformer_lens.tools"):
            raise
        raise _needs(f"TransformerLens' {name}", ANALYSIS_TOOLS.get(name, (4, 0))) from None


def transformer_bridge():
    """`(TransformerBridge, TransformerBridgeConfig, convert_tl_checkpoint)` of TransformerLens 4.x."""
    if version_tuple(TL_VERSION) < (4, 0) and TL_VERSION != "0":
        raise _needs("the TransformerLens bridge (to_transformer_lens)", (4, 0))
    from transformer_lens import TransformerBridge
    from transformer_lens.config import TransformerBridgeConfig
    from transformer_lens.utilities.tl_checkpoint_conversion import convert_tl_checkpoint

    return TransformerBridge, TransformerBridgeConfig, convert_tl_checkpoint

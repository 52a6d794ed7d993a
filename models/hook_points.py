"""`models.hook_points`: TransformerLens' hook-point classes (`HookPoint`, `HookedRootModule`), the ones our models are
built from, under the path TransformerLens 2.x code imports them by (`from transformer_lens.hook_points import
HookPoint, HookedRootModule` becomes `from models.hook_points import …`; 4.x keeps `HookedRootModule` at its top level
only, `models.arch.tl_compat` finds it)."""

from models.arch.tl_compat import HookedRootModule, HookPoint  # noqa: F401

"""`models.hook_points`: TransformerLens' hook-point classes (`HookPoint`, `HookedRootModule`, `LensHandle`), the ones
our models are built from, under the path TransformerLens 2.x code imports them by (`from transformer_lens.hook_points
import HookPoint, HookedRootModule` becomes `from models.hook_points import …`). TransformerLens 4.x keeps
`HookedRootModule` at its top level only; 3.x in `transformer_lens.hook_points`."""

from transformer_lens.hook_points import HookPoint, LensHandle  # noqa: F401

try:
    from transformer_lens import HookedRootModule  # 4.x
except ImportError:  # 3.x
    from transformer_lens.hook_points import HookedRootModule  # noqa: F401

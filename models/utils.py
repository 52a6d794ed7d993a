"""`models.utils`: TransformerLens 2.x's `transformer_lens.utils` (`get_act_name`, `to_numpy`, `test_prompt`,
`lm_cross_entropy_loss`, `tokenize_and_concatenate`, …), so that `import transformer_lens.utils as utils` becomes
`import models.utils as utils`. The names are TransformerLens' own, read on first use from where the installed version
keeps them (`models.arch.tl_compat.utilities`: `transformer_lens.utilities`, which 2.x called `utils`).
Importing this module imports nothing heavy; the first name asked for imports TransformerLens' module."""

from __future__ import annotations

from models.arch.tl_compat import utilities as _source


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    value = getattr(_source(), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | {n for n in dir(_source()) if not n.startswith("_")})

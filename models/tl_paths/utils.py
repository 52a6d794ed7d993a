"""`models.utils`: TransformerLens 2.x's `transformer_lens.utils` (`get_act_name`, `to_numpy`, `test_prompt`,
`lm_cross_entropy_loss`, `tokenize_and_concatenate`, …), so that `import transformer_lens.utils as utils` becomes
`import models.utils as utils`. The names are TransformerLens' own, read on first use from where the installed version
keeps them: `transformer_lens.utilities` (4.x, which renamed the module) or `transformer_lens.utils` (3.x).
Importing this module imports nothing heavy; the first name asked for imports TransformerLens' module."""

from __future__ import annotations

from importlib import import_module

SOURCES = ("transformer_lens.utilities", "transformer_lens.utils")


def _source():
    for name in SOURCES:
        try:
            return import_module(name)
        except ModuleNotFoundError as e:
            if e.name not in (name, name.rpartition(".")[0]):
                raise
    raise ModuleNotFoundError(f"neither of {SOURCES} is importable: is transformer-lens installed?")


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    value = getattr(_source(), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | {n for n in dir(_source()) if not n.startswith("_")})

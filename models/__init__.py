"""Hookable toy transformers: config, model, tokenizers, data, training, checkpoints and the model zoo.

Attributes are imported lazily so that `circuits --help` answers without importing torch.
"""

from importlib import import_module

_EXPORTS = {
    "HookedTransformerConfig": "config",
    "ConfigError": "config",
    "HookedTransformer": "model",
    "lm_cross_entropy": "model",
    "load": "checkpoint",
    "save": "checkpoint",
    "CheckpointError": "checkpoint",
    "from_transformer_lens_state_dict": "checkpoint",
    "to_transformer_lens": "interop",
    "UnsupportedByTransformerLens": "interop",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module 'models' has no attribute {name!r}")

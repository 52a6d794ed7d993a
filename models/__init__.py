"""Hookable toy transformers: config, model, tokenizers, data, training, checkpoints and the model zoo.

Attributes are imported lazily so that `circuits --help` answers without importing torch.
"""

from importlib import import_module

_EXPORTS = {
    "ToyCircuitsError": "errors",
    "ConfigError": "errors",
    "CheckpointError": "errors",
    "TokenizerError": "errors",
    "CorpusError": "errors",
    "TrainConfigError": "errors",
    "UnsupportedByTransformerLens": "errors",
    "HookedTransformerConfig": "config",
    "HookedTransformer": "model",
    "lm_cross_entropy": "model",
    "load": "checkpoint",
    "save": "checkpoint",
    "from_transformer_lens_state_dict": "interop",
    "to_transformer_lens": "interop",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module 'models' has no attribute {name!r}")

"""The model types: each `model_type` of a config.json names a config class and a model class, and loading, saving
and training dispatch on this one table (CONTRIBUTING.md, "Model type")."""

from __future__ import annotations

from ..arch.config import HookedTransformerConfig, config_json_dict
from ..arch.encoder import EncoderConfig, HookedEncoder
from ..arch.encoder_decoder import HookedEncoderDecoder
from ..arch.encoder_decoder_config import EncoderDecoderConfig
from ..arch.model import HookedTransformer
from ..errors import ConfigError


def model_types() -> dict:
    """`model_type` in config.json → (config class, model class); a config without the field is a decoder-only
    `HookedTransformerConfig` (every folder written before the field existed)."""
    return {"decoder": (HookedTransformerConfig, HookedTransformer),
            EncoderDecoderConfig.model_type: (EncoderDecoderConfig, HookedEncoderDecoder),
            EncoderConfig.model_type: (EncoderConfig, HookedEncoder)}


def model_class(cfg) -> type:
    """The model class of a config object (`HookedTransformer`, `HookedEncoderDecoder`, `HookedEncoder`)."""
    for cfg_cls, cls in model_types().values():
        if type(cfg) is cfg_cls:
            return cls
    raise ConfigError(f"{type(cfg).__name__} is not a model config; allowed: "
                      f"{', '.join(c.__name__ for c, _ in model_types().values())}")


def config_from_json(text: str):
    """The config object of a config.json's text, by its `model_type` (`model_types`), read as
    `HookedTransformerConfig.from_json` reads it (duplicated keys refused, a stored `device` ignored)."""
    return config_from_dict(config_json_dict(text))


def config_from_dict(d: dict):
    """The config object of a config dict, by its `model_type` (`model_types`)."""
    kind = d.get("model_type", "decoder") if isinstance(d, dict) else "decoder"
    types = model_types()
    if kind not in types:
        raise ConfigError(f"model_type={kind!r} is not supported; allowed: {', '.join(map(repr, types))}")
    return types[kind][0].from_dict(d)

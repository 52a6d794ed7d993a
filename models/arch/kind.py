"""A model's kind, the one test of it: decoder-only, encoder-only (masked LM) or encoder–decoder.

Every place that serves some kinds and not others (weight processing, the circuits, the report's sections, the
command line's commands) asks `model_kind`, never the model's class or attributes, so a new kind is one entry here.
"""

from __future__ import annotations

from ..errors import ConfigError

DECODER, ENCODER, ENCODER_DECODER = "decoder", "encoder", "encoder_decoder"
#: every kind, in the order help texts list them; the values are config.json's `model_type`
KINDS = (DECODER, ENCODER, ENCODER_DECODER)
#: how messages name each kind
KIND_NAMES = {DECODER: "decoder-only", ENCODER: "encoder-only (masked LM)", ENCODER_DECODER: "encoder–decoder"}


def model_kind(model) -> str:
    """`"decoder"`, `"encoder"` or `"encoder_decoder"` (`KINDS`) of `model`, or of a model config (before a model is
    built: `circuits train` picks its task by it).

    Our models declare it in their config (`model_type`, the class constant config.json records). A TransformerLens
    bridge, or any other object with a `cfg`, is read from its weights and config: cross-attention weights
    (`cross_W_Q` and a source embedding `W_E_src`) make an encoder–decoder, bidirectional attention an encoder, and
    anything else with `W_E` a decoder. Raises `ConfigError` for an object that is none of these."""
    if getattr(type(model), "model_type", None) in KINDS:  # a config
        return type(model).model_type
    cfg = getattr(model, "cfg", None)
    declared = getattr(type(cfg), "model_type", None)
    if declared in KINDS:
        return declared
    if cfg is None:
        raise ConfigError(f"{type(model).__name__} is not a model (it has no cfg)")
    if hasattr(model, "cross_W_Q") and hasattr(model, "W_E_src"):
        return ENCODER_DECODER
    if getattr(cfg, "attention_dir", "causal") == "bidirectional":
        return ENCODER
    if hasattr(model, "W_E"):
        return DECODER
    raise ConfigError(f"{type(model).__name__} is not a model this toolkit reads (no W_E, no cross-attention weights)")

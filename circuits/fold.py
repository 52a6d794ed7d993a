"""Fold norm weights into the weights that read them, so the weight-space circuits see the effective weights."""

from __future__ import annotations

import copy

from models.arch.config import HookedTransformerConfig


def fold_layer_norm(model, center_writing_weights: bool = True, center_unembed: bool = False):
    """A copy of `model` with every LayerNorm/RMSNorm weight and bias folded into the weights that read it:
    TransformerLens 2.18's `process_weights_(fold_ln=True, center_writing_weights, center_unembed,
    fold_value_biases=False)` on a copy (`models.arch.weight_processing`, which states each step and its source).

    For a pre-norm `ln(x) = centre(x)/scale · w + b` read by `W` (with bias `b_W`):
    `ln(x) W + b_W = (centre(x)/scale) (diag(w) W) + (b W + b_W)`, so `W ← diag(w) W`, `b_W ← b_W + b W` and the
    norm keeps only its centring and scaling (LN → "LNPre", RMS → "RMSPre", as TransformerLens). Folded: `ln1` into
    W_Q, W_K, W_V, `ln2` into W_in and a gated MLP's W_gate (RMS only: LN's bias has no place there), a SoLU-LN MLP's
    norm into W_out, `ln_final` into W_U; with LayerNorm the readers are centred over d_model. Shortformer models with
    norms are refused (positions join after ln1).

    With LayerNorm and `center_writing_weights` (default), every weight that writes to the residual stream
    (W_E, W_pos, W_O, b_O, W_out, b_out) is centred over d_model: each reader subtracts the mean anyway, so
    this is exact, and it removes a direction no circuit uses (not with `final_rms`, whose RMSNorm keeps the mean).
    `center_unembed` centres W_U and b_U over the vocabulary (logits shift by a per-position constant; log-probs
    unchanged). The model's log-probs are unchanged (up to rounding); the copy is marked
    `cfg.extra["layer_norm_folded"] = True`. For our `HookedTransformer` (fold it before converting with
    `models.to_transformer_lens`). Raises `TypeError` for anything but our models and `models.WeightProcessingError` (a
    ValueError) for what cannot be folded (`process_weights_` serves the decoder-only kind, `models.model_kind`)."""
    if not isinstance(getattr(model, "cfg", None), HookedTransformerConfig):  # one of our models (its kind: below)
        raise TypeError(f"fold_layer_norm needs a models.HookedTransformer, got {type(model).__name__}")
    kind = model.cfg.normalization_type
    new = copy.deepcopy(model)  # its own cfg too (shared by its modules), which processing switches to LNPre / RMSPre
    # only the steps that apply to this norm kind: `models.arch.weight_processing.check` would warn and skip the others
    new.process_weights_(fold_ln=kind in ("LN", "RMS"),
                         center_writing_weights=center_writing_weights and kind in ("LN", "LNPre")
                         and not model.cfg.final_rms,
                         center_unembed=center_unembed, fold_value_biases=False)
    new.cfg.extra = {**new.cfg.extra, "layer_norm_folded": True}
    return new

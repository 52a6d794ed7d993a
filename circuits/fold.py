"""Fold norm weights into the weights that read them, so the weight-space circuits see the effective weights."""

from __future__ import annotations

import copy

import torch

from .interface import positional_scheme


def _fold_into(norm, readers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Fold `norm.w` / `norm.b` into each `(W [..., d_model, d_out], b [..., d_out])` that reads it."""
    w = norm.w.detach().clone()
    b = norm.b.detach().clone() if hasattr(norm, "b") else None
    for W, bias in readers:
        if b is not None and bias is not None:
            bias.add_(torch.einsum("d,...de->...e", b, W))
        W.mul_(w[:, None])
    norm.w.fill_(1.0)
    if b is not None:
        norm.b.zero_()


def _centre(t: torch.Tensor) -> None:
    t.sub_(t.mean(-1, keepdim=True))


def fold_layer_norm(model, center_writing_weights: bool = True, center_unembed: bool = False):
    """A copy of `model` with every LayerNorm/RMSNorm weight and bias folded into the weights that read it.

    For a pre-norm `ln(x) = centre(x)/scale · w + b` read by `W` (with bias `b_W`):
    `ln(x) W + b_W = (centre(x)/scale) (diag(w) W) + (b W + b_W)`, so `W ← diag(w) W`, `b_W ← b_W + b W` and the
    norm keeps only its centring and scaling (`w = 1`, `b = 0`; TransformerLens' "LNPre"). Folded: `ln1` into
    W_Q, W_K, W_V (b_Q, b_K, b_V), `ln2` into W_in (b_in) and a gated MLP's W_gate (RMS only: LN's bias has no
    place there), `ln_final` into W_U (b_U). Shortformer models with norms are refused (positions join after ln1).

    With LayerNorm and `center_writing_weights` (default), every weight that writes to the residual stream
    (W_E, W_pos, W_O, b_O, W_out, b_out) is centred over d_model: each reader subtracts the mean anyway, so
    this is exact, and it removes a direction no circuit uses. `center_unembed` centres W_U and b_U over the
    vocabulary (logits shift by a per-position constant; log-probs unchanged). RMSNorm does not centre, so
    its writing weights are left as they are. The model's log-probs are unchanged (up to rounding); the copy is
    marked `cfg.extra["layer_norm_folded"] = True`. For our `HookedTransformer` (fold it before converting
    with `models.to_transformer_lens`)."""
    if not hasattr(model, "blocks") or not hasattr(model, "ln_final"):
        raise TypeError(f"fold_layer_norm needs a models.HookedTransformer, got {type(model).__name__}")
    kind = model.cfg.normalization_type
    if kind is not None and positional_scheme(model).adds_to == "query_key":
        raise ValueError("fold_layer_norm cannot fold ln1 of a shortformer model: its positions are added after ln1 "
                         "(ln1(x) + pos, as TransformerLens), so ln1's weight cannot move into W_Q / W_K exactly")
    gated = getattr(model.cfg, "gated_mlp", False)
    if kind == "LN" and gated:
        raise ValueError("fold_layer_norm cannot fold ln2's bias into a gated MLP: x W_gate has no bias to take it "
                         "and b_in is added after the gate")
    if getattr(model.cfg, "final_rms", False):  # an RMSNorm at the end does not centre: centring would change it
        center_writing_weights = False
    new = copy.deepcopy(model)
    with torch.no_grad():
        if kind is not None:
            for block in new.blocks:
                a = block.attn
                _fold_into(block.ln1, [(a.W_Q, a.b_Q), (a.W_K, a.b_K), (a.W_V, a.b_V)])
                if not new.cfg.attn_only:
                    m = block.mlp  # a gated MLP's W_gate reads ln2 too (RMS: no bias to place)
                    _fold_into(block.ln2, [(m.W_in, m.b_in)] + ([(m.W_gate, None)] if gated else []))
            _fold_into(new.ln_final, [(new.unembed.W_U, new.unembed.b_U)])
        if kind == "LN" and center_writing_weights:
            writers = [new.embed.W_E]
            if hasattr(new, "pos_embed"):
                writers.append(new.pos_embed.W_pos)
            for block in new.blocks:
                writers += [block.attn.W_O, block.attn.b_O]
                if not new.cfg.attn_only:
                    writers += [block.mlp.W_out, block.mlp.b_out]
            for t in writers:
                _centre(t)
        if center_unembed:
            new.unembed.W_U.sub_(new.unembed.W_U.mean(-1, keepdim=True))
            new.unembed.b_U.sub_(new.unembed.b_U.mean())
    new.cfg.extra = {**new.cfg.extra, "layer_norm_folded": True}  # the copy's own cfg (deepcopied)
    return new

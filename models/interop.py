"""Our models as TransformerLens 4.x `TransformerBridge`s (`boot_native`), for side-by-side checks.

TransformerLens' native model has learned ("standard") or adjacent-pair rotary positions, pre-norm
LN / RMS / none, and always-present biases. What maps exactly:
- standard positions; sinusoidal (its fixed table becomes the learned table) and none (a zero table),
  for contexts up to n_ctx;
- rotary with adjacent pairs; rotary with half-split pairs (seed 000) by permuting each head's query/key
  features so that pair (i, i + d/2) becomes (2i, 2i+1): scores, patterns and outputs are identical,
  but the bridge's `hook_q` / `hook_k` hold the permuted features;
- grouped-query attention, causal and bidirectional attention, every activation we support.
What does not: shortformer positions (removed in TransformerLens 4.0) and ALiBi.

Two hook names mean something else on the 4.3 bridge than on the former `HookedTransformer` and here:
`attn.hook_attn_scores` fires with the post-softmax weights (ours: pre-softmax scores, −inf where masked),
and `ln*.hook_normalized` is x / scale before the norm's weight and bias (ours: the norm's output).
tests/test_model_parity_tl.py checks both relations.
"""

from __future__ import annotations

import torch


class UnsupportedByTransformerLens(NotImplementedError):
    """The configuration has no exact TransformerLens 4.x counterpart."""


def _half_to_adjacent(rotary_dim: int, d_head: int) -> torch.Tensor:
    """Index map: new feature 2i ← old i, 2i+1 ← old i + rotary_dim/2; features past rotary_dim unchanged."""
    half = rotary_dim // 2
    perm = torch.arange(d_head)
    perm[0:rotary_dim:2] = torch.arange(half)
    perm[1:rotary_dim:2] = torch.arange(half, rotary_dim)
    return perm


def to_transformer_lens(model):
    """A `TransformerBridge.boot_native(...)` carrying `model`'s weights (same logits, same hook names)."""
    from transformer_lens import TransformerBridge
    from transformer_lens.config import TransformerBridgeConfig
    from transformer_lens.utilities.tl_checkpoint_conversion import convert_tl_checkpoint

    cfg = model.cfg
    positions, kind = cfg.positions, cfg.positional_embedding_type
    tl_kind = positions.transformer_lens_type  # "standard", "rotary" or None (models.positions)
    if tl_kind is None:
        raise UnsupportedByTransformerLens(
            f"positional_embedding_type={kind!r} has no TransformerLens 4.x equivalent (its native model "
            "supports 'standard' and 'rotary'; shortformer was removed in 4.0); analyse it with this toolkit"
        )
    tl_cfg = TransformerBridgeConfig(
        d_model=cfg.d_model, d_head=cfg.d_head, n_layers=cfg.n_layers, n_ctx=cfg.n_ctx, n_heads=cfg.n_heads,
        d_vocab=cfg.d_vocab, d_mlp=cfg.d_mlp, act_fn=cfg.act_fn, attn_only=cfg.attn_only, eps=cfg.eps,
        normalization_type=cfg.normalization_type, attention_dir=cfg.attention_dir,
        positional_embedding_type=tl_kind, rotary_dim=cfg.rotary_dim if tl_kind == "rotary" else None,
        rotary_base=cfg.rotary_base, rotary_adjacent_pairs=True,
        n_key_value_heads=cfg.n_key_value_heads if cfg.n_key_value_heads != cfg.n_heads else None, seed=0,
        dtype=cfg.torch_dtype, model_name=cfg.model_name,
    )
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if tl_kind == "standard" and positions.table != "learned":  # a fixed table, or none: TL's learned W_pos holds it
        table = model.W_pos if positions.table else torch.zeros(cfg.n_ctx, cfg.d_model, dtype=cfg.torch_dtype)
        state["pos_embed.W_pos"] = table.detach().clone()
    if tl_kind == "rotary" and not cfg.rotary_adjacent_pairs:
        perm = _half_to_adjacent(cfg.rotary_dim, cfg.d_head)
        for l in range(cfg.n_layers):
            for name in ("W_Q", "W_K"):
                state[f"blocks.{l}.attn.{name}"] = state[f"blocks.{l}.attn.{name}"][..., perm]
            for name in ("b_Q", "b_K"):
                state[f"blocks.{l}.attn.{name}"] = state[f"blocks.{l}.attn.{name}"][..., perm]
    bridge = TransformerBridge.boot_native(tl_cfg, dtype=cfg.torch_dtype, device=model.W_E.device)
    converted = convert_tl_checkpoint(state, bridge.cfg)
    if "unembed.bias" not in converted:
        converted["unembed.bias"] = torch.zeros(cfg.d_vocab, dtype=cfg.torch_dtype)
    result = bridge.load_state_dict(converted, strict=True)
    if result.missing_keys or result.unexpected_keys:
        raise RuntimeError(f"weight transfer to TransformerLens failed: {result}")
    return bridge

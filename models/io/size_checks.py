"""What a config implies before anything is built: a lower bound on its weights, checked against the checkpoint it
claims to describe (a corrupt or hostile config.json must not allocate terabytes or build 20 000 layers)."""

from __future__ import annotations

import torch

from ..errors import CheckpointError


def implied_weights(cfg) -> int:
    """A lower bound on the weights a model of `cfg` holds, from the config alone: W_E, W_U, a learned W_pos, W_Q,
    W_K, W_V, W_O (grouped key/value heads counted as such) and the MLP matrices; encoder–decoder and encoder configs
    give their own (`weights_lower_bound`)."""
    if hasattr(cfg, "weights_lower_bound"):
        return cfg.weights_lower_bound()
    kv = cfg.n_key_value_heads or cfg.n_heads
    need = 2 * cfg.d_vocab * cfg.d_model + cfg.n_layers * (cfg.n_heads + kv) * 2 * cfg.d_head * cfg.d_model
    if cfg.positions.table == "learned":
        need += cfg.n_ctx * cfg.d_model
    if cfg.d_mlp and not cfg.attn_only:
        need += 2 * cfg.n_layers * cfg.d_model * cfg.d_mlp
    return need


def check_size(cfg, held, source: str) -> None:
    """Refuse a config that needs more weights than the file holds (`held`: a count, or the state dict) before
    building anything (a corrupt or hostile config.json could otherwise ask for terabytes, or spend minutes building
    20 000 layers). The bound is `implied_weights`; mismatches under a million weights are left to `load_state_dict`,
    whose message names the tensor."""
    if isinstance(held, dict):
        held = sum(t.numel() for t in held.values() if isinstance(t, torch.Tensor))
    table = getattr(getattr(cfg, "positions", None), "table", None)
    if table == "fixed" and cfg.n_ctx * cfg.d_model > max(held, 2**26):  # a sinusoidal table is built, never saved
        raise CheckpointError(f"{source}: n_ctx={cfg.n_ctx:,} would build a fixed positional table of "
                              f"{cfg.n_ctx * cfg.d_model:,} values for a checkpoint of {held:,} weights; does the "
                              "config match the checkpoint?")
    need = implied_weights(cfg)
    if need > held + 2**20:
        raise CheckpointError(f"{source}: the config describes at least {need:,} weights but the checkpoint holds "
                              f"{held:,}; does the config match the checkpoint?")

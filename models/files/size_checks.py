"""What a config implies before anything is built: a lower bound on its weights, checked against the checkpoint it
claims to describe (a corrupt or hostile config.json must not allocate terabytes or build 20 000 layers)."""

from __future__ import annotations

import math

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


def layer_stacks(cfg) -> dict[str, int]:
    """`{prefix: layers}` of the numbered stacks a model of `cfg` holds (`blocks.0.…` to `blocks.{n-1}.…`;
    a config with several stacks declares them, as an encoder–decoder's `layer_stacks()`: `encoder.…`, `decoder.…`)."""
    own = getattr(cfg, "layer_stacks", None)
    return own() if own is not None else {"blocks": cfg.n_layers}


def held_layers(names, prefix: str) -> int:
    """How many layers of stack `prefix` a checkpoint holds: the distinct `prefix.N.` indices among its names."""
    start = prefix + "."
    return len({k[len(start):].split(".", 1)[0] for k in names
                if isinstance(k, str) and k.startswith(start) and k[len(start):].split(".", 1)[0].isdigit()})


def check_size(cfg, held, source: str) -> None:
    """Refuse a config that needs more weights or more layers than the file holds before building anything (a
    corrupt or hostile config.json could otherwise ask for terabytes, or spend minutes and hundreds of MB building
    6 000 layers of a few weights each). `held`: a weight count; or the state dict, or the safetensors header's
    table `{name: shape}`, whose names also give the layers each stack holds (`layer_stacks`). The weight bound is
    `implied_weights`; mismatches under a million weights are left to `load_state_dict`, whose message names the
    tensor; layers are compared exactly."""
    names = None
    if isinstance(held, dict):
        names = [k for k in held if k != "__metadata__"]
        held = sum(v.numel() if isinstance(v, torch.Tensor) else math.prod(v) for k, v in held.items()
                   if isinstance(v, torch.Tensor) or (isinstance(v, (list, tuple)) and k != "__metadata__"))
    table = getattr(getattr(cfg, "positions", None), "table", None)
    if table == "fixed" and cfg.n_ctx * cfg.d_model > max(held, 2**26):  # a sinusoidal table is built, never saved
        raise CheckpointError(f"{source}: n_ctx={cfg.n_ctx:,} would build a fixed positional table of "
                              f"{cfg.n_ctx * cfg.d_model:,} values for a checkpoint of {held:,} weights; does the "
                              "config match the checkpoint?")
    need = implied_weights(cfg)
    if need > held + 2**20:
        raise CheckpointError(f"{source}: the config describes at least {need:,} weights but the checkpoint holds "
                              f"{held:,}; does the config match the checkpoint?")
    if names is not None:
        for prefix, n in layer_stacks(cfg).items():
            have = held_layers(names, prefix)
            if n > have:
                raise CheckpointError(f"{source}: the config describes {n:,} layers ({prefix}) but the checkpoint "
                                      f"holds weights for {have:,}; does the config match the checkpoint?")


def memory_limit() -> int:
    """The most memory one size option may imply: half of this machine's memory (8 GiB where it cannot be read)."""
    import os

    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def check_memory(option: str, value: int, per_unit: int, error: type[Exception], limit: int | None = None) -> None:
    """Refuse `option`=`value` with `error` when `value * per_unit` bytes (the memory it implies) exceed `limit`
    (default `memory_limit()`), naming the largest value allowed. The one size bound of the command line and the
    Python API (`--windows`, `seq_len`, `batch_size`, the model's weights, `beams`)."""
    limit = memory_limit() if limit is None else limit
    if value * per_unit > limit:
        raise error(f"{option} {value} needs about {value * per_unit / 2**30:.1f} GiB, more than the "
                    f"{limit / 2**30:.1f} GiB allowed here (half the memory); use {option} <= "
                    f"{max(limit // per_unit, 1)}")


MAX_SEQ_LEN = 1 << 20


def check_train_sizes(model_cfg, cfg, error: type[Exception], models: int = 1) -> None:
    """Refuse a training run whose weights (with gradients and Adam's two moments: 16 bytes each) or whose
    activations for `seq_len` / `batch_size` (float32, kept for the backward pass: per token the logits and, per
    layer, ~16 residual-width vectors and a row of each head's pattern) exceed `memory_limit()`; with `models` > 1
    (a seed sweep trains that many at once), also their sum over the models. `train()` and `train_sweep()` call this
    before building anything, so the command line and the Python API share it."""
    if cfg.seq_len is not None and cfg.seq_len > MAX_SEQ_LEN:
        raise error(f"seq_len {cfg.seq_len} is more than the {MAX_SEQ_LEN} allowed")
    check_memory("the model's weights (d_vocab, d_model, n_layers, d_mlp)", implied_weights(model_cfg), 16, error)
    # Encoder-decoder configs: the longer context, the larger vocabulary, both stacks' layers.
    n_ctx = getattr(model_cfg, "n_ctx", None) or max(model_cfg.n_ctx_src, model_cfg.n_ctx_tgt)
    d_vocab = getattr(model_cfg, "d_vocab", None) or max(model_cfg.d_vocab_src, model_cfg.d_vocab_tgt)
    n_layers = getattr(model_cfg, "n_layers", None)
    if n_layers is None:
        n_layers = model_cfg.n_encoder_layers + 2 * model_cfg.n_decoder_layers  # self- and cross-attention
    seq = cfg.seq_len or n_ctx
    per_token = 4 * (3 * d_vocab + max(n_layers, 1) * (16 * model_cfg.d_model + 3 * model_cfg.n_heads * seq))
    check_memory("seq_len", seq, per_token, error)  # one sequence
    check_memory("batch_size (--batch-size)", cfg.batch_size, seq * per_token, error)
    if models > 1:
        check_memory("the models trained at once (--seeds)", models,
                     16 * implied_weights(model_cfg) + cfg.batch_size * seq * per_token, error)

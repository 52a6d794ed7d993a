"""TransformerLens in and out: legacy `HookedTransformer` state dicts loaded as our models, and our models as
TransformerLens 4.x `TransformerBridge`s (`boot_native`), for side-by-side checks.

Legacy state dicts (`from_transformer_lens_state_dict`): TransformerLens 2.x's former `HookedTransformer` layout is
ours, so its keys load as they are; `.pth` files are read with `torch.load(weights_only=True)`, never unpickling code.

To TransformerLens 4.x (`to_transformer_lens`): its native model has learned ("standard") or adjacent-pair rotary
positions, pre-norm LN / RMS / none, and always-present biases. What maps exactly (each positional scheme names its
counterpart, `transformer_lens_type`):
- standard positions; sinusoidal (its fixed table becomes the learned table) and none (a zero table),
  for contexts up to n_ctx;
- rotary with adjacent pairs; rotary with half-split pairs (GPT-NeoX's layout) by permuting each head's query/key
  features so that pair (i, i + d/2) becomes (2i, 2i+1): scores, patterns and outputs are identical,
  but the bridge's `hook_q` / `hook_k` hold the permuted features;
- grouped-query attention, causal and bidirectional attention, every activation we support.
What does not: shortformer positions (removed in TransformerLens 4.0) and ALiBi.

Two hook names mean something else on the 4.3 bridge than on the former `HookedTransformer` and here:
`attn.hook_attn_scores` fires with the post-softmax weights (ours: pre-softmax scores, −inf where masked),
and `ln*.hook_normalized` is x / scale before the norm's weight and bias (ours: the norm's output).
tests/models/test_model_parity_tl.py checks both relations.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import torch

from .checkpoint import check_size, load_state_dict, read_safetensors
from .config import HookedTransformerConfig
from .errors import CheckpointError, ConfigError, UnsupportedByTransformerLens
from .model import HookedTransformer


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
    if cfg.normalization_position != "pre":
        raise UnsupportedByTransformerLens(f"normalization_position={cfg.normalization_position!r}: TransformerLens' "
                                           "native model normalises before each sublayer ('pre') only")
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


# --- legacy TransformerLens state dicts in --------------------------------------------------------------
_DROPPED_SUFFIXES = (".mask", ".IGNORE", ".rotary_sin", ".rotary_cos")
#: TransformerLens config flags that change the computation in ways this model does not implement.
_UNSUPPORTED_TL_FLAGS = ("gated_mlp", "parallel_attn_mlp", "final_rms", "use_local_attn", "use_qk_norm")


def config_from_transformer_lens(d: dict) -> HookedTransformerConfig:
    """Our config from a TransformerLens `HookedTransformerConfig` dict (its JSON / `.to_dict()`).

    Parameter-free norms `LNPre` / `RMSPre` become `LN` / `RMS` with unit weights (the same function).
    Flags we do not implement raise `ConfigError` naming them; other TransformerLens-only fields are kept
    in `extra["transformer_lens"]`."""
    d = dict(d)
    bad = [k for k in _UNSUPPORTED_TL_FLAGS if d.get(k)]
    if bad:
        raise ConfigError(f"TransformerLens config uses {bad}, which this toolkit does not implement")
    if d.get("shortformer_pos"):
        d["positional_embedding_type"] = "shortformer"
    norm = d.get("normalization_type")
    if norm in ("LNPre", "RMSPre"):
        d["normalization_type"] = norm[: -len("Pre")]

    names = {f.name for f in dataclasses.fields(HookedTransformerConfig)}
    ours = {k: v for k, v in d.items() if k in names and k not in ("dtype", "device", "seed", "extra")}
    if not isinstance(ours.get("n_key_value_heads"), int):
        ours.pop("n_key_value_heads", None)
    if ours.get("act_fn") is None:  # TransformerLens writes act_fn=None for attention-only models
        ours.pop("act_fn", None)
    ours["extra"] = {"transformer_lens": {k: str(v) for k, v in d.items() if k not in names}}
    return HookedTransformerConfig.from_dict(ours)  # ConfigError (not TypeError) for missing fields


def from_transformer_lens_state_dict(state_dict_or_path, cfg) -> HookedTransformer:
    """Build our model from a state dict in TransformerLens' former `HookedTransformer` layout.

    `state_dict_or_path`: a dict of tensors, or a `.pth`/`.pt` file (read with `weights_only=True`, never
    unpickling code) or a `.safetensors` file. `cfg`: our config (object or dict) or a TransformerLens
    config dict. Missing norm weights of `LNPre` models are filled with ones/zeros; missing zero biases
    of bias-free checkpoints are filled with zeros. Raises `CheckpointError` for unreadable or mismatched
    weights, `ConfigError` for an invalid config and `TypeError` when `cfg` is neither a config nor a dict."""
    if not isinstance(cfg, (HookedTransformerConfig, dict)):
        raise TypeError(f"cfg must be a HookedTransformerConfig or a config dict, got {type(cfg).__name__}")
    source = "state dict"
    if isinstance(state_dict_or_path, (str, os.PathLike)):
        path = Path(state_dict_or_path)
        source = str(path)
        if path.is_dir() or not path.exists():
            raise CheckpointError(f"{path}: not a state-dict file")
        if path.suffix == ".safetensors":
            state = read_safetensors(path)
        else:
            try:
                state = torch.load(path, map_location="cpu", weights_only=True)
            except Exception as e:  # UnpicklingError for code-carrying pickles, EOFError / RuntimeError for truncation
                first = (str(e).splitlines() or [""])[0][:200]
                raise CheckpointError(
                    f"{path}: refused or unreadable ({type(e).__name__}: {first}); "
                    "only plain tensors are loaded, never pickled code"
                ) from None
    else:
        state = state_dict_or_path
    if not isinstance(state, dict):
        raise CheckpointError(f"{source}: expected a dict of tensors, got {type(state).__name__}")
    if isinstance(cfg, dict):
        try:
            cfg = HookedTransformerConfig.from_dict(cfg)
        except (ConfigError, TypeError):
            cfg = config_from_transformer_lens(cfg)
    check_size(cfg, state, source)
    model = HookedTransformer(cfg)
    expected = model.state_dict()
    fixed = {}
    bad_keys = [k for k in state if not isinstance(k, str)]
    if bad_keys:
        raise CheckpointError(f"{source}: tensor names must be strings, got {bad_keys[:4]!r}")
    for k, v in state.items():
        if k.endswith(_DROPPED_SUFFIXES):
            continue
        k = k.replace("attn._W_K", "attn.W_K").replace("attn._W_V", "attn.W_V")
        k = k.replace("attn._b_K", "attn.b_K").replace("attn._b_V", "attn.b_V")
        fixed[k] = v
    for name, target in expected.items():
        if name not in fixed and (name.endswith((".b", ".b_U", ".b_O", ".b_Q", ".b_K", ".b_V", ".b_in", ".b_out"))):
            fixed[name] = torch.zeros_like(target)
        elif name not in fixed and name.endswith(".w"):
            fixed[name] = torch.ones_like(target)
    load_state_dict(model, fixed, source=source)
    return model

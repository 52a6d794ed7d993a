"""TransformerLens in and out: legacy `HookedTransformer` state dicts loaded as our models, and our models as
TransformerLens 4.x `TransformerBridge`s (`boot_native`), for side-by-side checks.

Legacy state dicts (`from_transformer_lens_state_dict`): TransformerLens 2.x's former `HookedTransformer` layout is
ours, so its keys load as they are; `.pth` files are read with `torch.load(weights_only=True)`, never unpickling code.
The `pos_embed.W_pos` TransformerLens 2.x keeps, unused, in ALiBi models is accepted and dropped. A TransformerLens
config dict is translated field by field (`config_from_transformer_lens`): every field of its 2.18
`HookedTransformerConfig` is computed the same way, kept as metadata, or refused by name; ALiBi from such a config
gives keys after the query a zero bias in bidirectional models, as TransformerLens does.

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
and `ln*.hook_normalized` is x / scale before the norm's weight and bias (ours: LayerNorm's output, and RMSNorm's
x / scale, as TransformerLens 2.x).
tests/models/test_model_parity_tl.py checks both relations.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import torch

from ..arch.config import HookedTransformerConfig
from ..arch.initialization import rng_kept
from ..arch.model import HookedTransformer
from ..arch.state_dict import load_state_dict, tl_state_to_ours  # noqa: F401  (tl_state_to_ours: re-exported)
from ..arch.weight_processing import process_loaded
from ..errors import CheckpointError, ConfigError, UnsupportedByTransformerLens
from .checkpoint import check_size
from .readers import read_pth, read_safetensors


def _half_to_adjacent(rotary_dim: int, d_head: int) -> torch.Tensor:
    """Index map: new feature 2i ← old i, 2i+1 ← old i + rotary_dim/2; features past rotary_dim unchanged."""
    half = rotary_dim // 2
    perm = torch.arange(d_head)
    perm[0:rotary_dim:2] = torch.arange(half)
    perm[1:rotary_dim:2] = torch.arange(half, rotary_dim)
    return perm


#: settings the native model of TransformerLens 4.x does not read: only their defaults convert
_NATIVE_DEFAULTS = {"gated_mlp": False, "parallel_attn_mlp": False, "final_rms": False, "use_attn_scale": True,
                    "attn_scale": None, "scale_attn_by_inverse_layer_idx": False, "attn_scores_soft_cap": None,
                    "output_logits_soft_cap": None}
#: activations it names differently: GELU's tanh approximation (gelu_fast's constant 0.7978845608 is √(2/π) to 1e-11)
_NATIVE_ACT = {"gelu_pytorch_tanh": "gelu_new", "gelu_fast": "gelu_new"}


def to_transformer_lens(model):
    """A `TransformerBridge.boot_native(...)` carrying `model`'s weights (same logits, same hook names) and its
    tokenizer (the same ids from `to_tokens`)."""
    from ..arch.tl_compat import transformer_bridge

    cfg = model.cfg
    positions, kind = cfg.positions, cfg.positional_embedding_type
    tl_kind = positions.transformer_lens_type  # "standard", "rotary" or None (models.arch.positions)
    if tl_kind is None:
        raise UnsupportedByTransformerLens(
            f"positional_embedding_type={kind!r} has no TransformerLens 4.x equivalent (its native model "
            "supports 'standard' and 'rotary'; shortformer was removed in 4.0); analyse it with this toolkit"
        )
    if cfg.normalization_position != "pre":
        raise UnsupportedByTransformerLens(f"normalization_position={cfg.normalization_position!r}: TransformerLens' "
                                           "native model normalises before each sublayer ('pre') only")
    unmapped = [name for name, default in _NATIVE_DEFAULTS.items() if getattr(cfg, name) != default
                and not (name == "final_rms" and cfg.normalization_type not in ("LN", "LNPre"))]  # RMS / no norm: same
    if cfg.d_vocab_out != cfg.d_vocab:
        unmapped.append("d_vocab_out")
    if unmapped:
        raise UnsupportedByTransformerLens(f"{unmapped} have no counterpart in TransformerLens 4.x's native model "
                                           "(it would compute something else); analyse this model with this toolkit")
    TransformerBridge, TransformerBridgeConfig, convert_tl_checkpoint = transformer_bridge()  # 4.x, else refused
    tl_cfg = TransformerBridgeConfig(
        d_model=cfg.d_model, d_head=cfg.d_head, n_layers=cfg.n_layers, n_ctx=cfg.n_ctx, n_heads=cfg.n_heads,
        d_vocab=cfg.d_vocab, d_mlp=cfg.d_mlp, act_fn=_NATIVE_ACT.get(cfg.act_fn, cfg.act_fn),
        attn_only=cfg.attn_only, eps=cfg.eps,
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
    if model.tokenizer is not None:  # the same tokenizer, as the Hugging Face object the bridge reads
        from ..arch.tokens import HFTokenizer

        bridge.tokenizer = model.tokenizer.hf
        if not isinstance(model.tokenizer, HFTokenizer):
            bridge.cfg.tokenizer_prepends_bos = False  # ours never add BOS: to_tokens prepends it by `prepend_bos`
        bridge.cfg.default_prepend_bos = cfg.default_prepend_bos
    return bridge


# --- legacy TransformerLens state dicts in --------------------------------------------------------------

#: Every field of TransformerLens 2.18's `HookedTransformerConfig`, by how `config_from_transformer_lens` treats it
#: (tests/models/test_interop_config.py checks the union against the real class). Same meaning, same name here:
TL_SAME = ("n_layers", "d_model", "n_ctx", "d_head", "model_name", "n_heads", "d_mlp", "act_fn", "d_vocab", "eps",
           "use_attn_result", "use_attn_scale", "use_split_qkv_input", "use_hook_mlp_in", "use_attn_in",
           "ungroup_grouped_query_attention", "original_architecture", "tokenizer_name", "attention_dir",
           "attn_only", "scale_attn_by_inverse_layer_idx", "positional_embedding_type", "final_rms",
           "parallel_attn_mlp", "rotary_dim", "use_hook_tokens", "gated_mlp", "default_prepend_bos",
           "n_key_value_heads", "rotary_base", "rotary_adjacent_pairs")
#: converted: TransformerLens' −1 / None sentinels become our None, initializer_range becomes init_range, dtype its name
#: (normalization_type: the same five values, a default of "LN" when absent)
TL_CONVERTED = ("normalization_type", "attn_scale", "d_vocab_out", "attn_scores_soft_cap", "output_logits_soft_cap",
                "initializer_range", "dtype")
#: kept in `extra["transformer_lens"]`, computing nothing: the device and seed of the run that made it (weights come
#: from the state dict), how a fresh model was initialised (init_mode and init_weights also fill our fields of those
#: names, `models.arch.initialization`), checkpoint and hub metadata, n_params (derived), and
#: tie_word_embeddings and decoder_start_token_id, which TransformerLens 2.18's HookedTransformer does not read either
TL_METADATA = ("device", "seed", "init_mode", "init_weights", "from_checkpoint", "checkpoint_index",
               "checkpoint_label_type", "checkpoint_value", "n_params", "tokenizer_prepends_bos", "trust_remote_code",
               "tie_word_embeddings", "decoder_start_token_id")
#: not implemented: a value other than this default raises ConfigError naming the field
TL_REFUSED = {"use_qk_norm": False, "use_local_attn": False, "window_size": None, "attn_types": None,
              "n_devices": 1, "post_embedding_ln": False, "rotary_base_local": None, "load_in_4bit": False,
              "num_experts": None, "experts_per_token": None, "relative_attention_max_distance": None,
              "relative_attention_num_buckets": None, "use_normalization_before_and_after": False,
              "use_NTK_by_parts_rope": False, "NTK_by_parts_low_freq_factor": 1.0,
              "NTK_by_parts_high_freq_factor": 4.0, "NTK_by_parts_factor": 8.0, "NTK_original_ctx_len": 8192}


def _off(v):
    """TransformerLens' "unset" values (−1, −1.0, None, and any value ≤ 0 for the soft caps) → None."""
    return None if v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and v <= 0) else v


def config_from_transformer_lens(d: dict) -> HookedTransformerConfig:
    """Our config from a TransformerLens 2.x `HookedTransformerConfig` dict (its JSON / `.to_dict()`).

    Every field is either computed the same way (`TL_SAME`, `TL_CONVERTED`), kept as metadata in
    `extra["transformer_lens"]` (`TL_METADATA`), or refused with `ConfigError` naming it when it is set to anything
    but its default (`TL_REFUSED`); unknown fields are refused too. Parameter-free norms `LNPre` / `RMSPre` stay
    parameter-free (as TransformerLens, a SoLU-LN MLP's norm is then LNPre too). Bidirectional ALiBi gives future
    keys a zero bias, as TransformerLens (`alibi_symmetric=False`)."""
    d = dict(d)
    if d.pop("shortformer_pos", False):  # TransformerLens < 1.0
        d["positional_embedding_type"] = "shortformer"
    bad = sorted(k for k, default in TL_REFUSED.items() if k in d and d[k] != default)
    own = {f.name for f in dataclasses.fields(HookedTransformerConfig)} - {"dtype", "device", "seed", "extra"}
    unknown = sorted(set(d) - set(TL_SAME) - set(TL_CONVERTED) - set(TL_METADATA) - set(TL_REFUSED) - own - {"extra"})
    if bad or unknown:
        raise ConfigError(f"TransformerLens config sets {bad + unknown}, which this toolkit does not implement "
                          f"(fields it refuses unless at their default: {sorted(TL_REFUSED)})")
    for name in ("d_vocab", "n_heads"):
        if d.get(name, 1) == -1:
            raise ConfigError(f"TransformerLens config has {name}=-1 (inferred from a hub tokenizer or model); "
                              f"set {name} explicitly")
    ours = {k: d[k] for k in own if k in d}  # TL_SAME, and our own fields where a dict mixes both
    ours["normalization_type"] = d.get("normalization_type", "LN")
    d_head = d.get("d_head")
    scale = _off(d.get("attn_scale"))
    if scale is not None and isinstance(d_head, int) and abs(scale - d_head ** 0.5) <= 1e-12 * scale:
        scale = None  # TransformerLens writes its default √d_head out
    ours["attn_scale"] = scale
    for name in ("d_vocab_out", "attn_scores_soft_cap", "output_logits_soft_cap"):
        ours[name] = _off(d.get(name))
    if _off(d.get("initializer_range")) is not None:
        ours["init_range"] = d["initializer_range"]
    if isinstance(d.get("dtype"), (str, torch.dtype)):
        ours["dtype"] = str(d["dtype"]).replace("torch.", "")
    if not isinstance(ours.get("n_key_value_heads"), int):
        ours.pop("n_key_value_heads", None)
    if ours.get("act_fn") is None:  # TransformerLens writes act_fn=None for attention-only models
        ours.pop("act_fn", None)
    ours.setdefault("alibi_symmetric", False)
    extra = d.get("extra") if isinstance(d.get("extra"), dict) else {}
    ours["extra"] = {**extra, "transformer_lens": {k: str(v) for k, v in d.items() if k in TL_METADATA}}
    return HookedTransformerConfig.from_dict(ours)  # ConfigError (not TypeError) for missing fields


def from_transformer_lens_state_dict(state_dict_or_path, cfg, **processing) -> HookedTransformer:
    """Build our model from a state dict in TransformerLens' former `HookedTransformer` layout.

    `state_dict_or_path`: a dict of tensors, or a `.pth`/`.pt` file (read with `weights_only=True`, never
    unpickling code) or a `.safetensors` file. `cfg`: our config (object or dict) or a TransformerLens
    config dict. Missing unit norm weights are filled with ones/zeros; missing zero biases
    of bias-free checkpoints are filled with zeros. TransformerLens 2.x keeps a `pos_embed.W_pos` in every
    non-rotary model, ALiBi included, where nothing reads it: a model without a positional table drops it.
    `processing`: TransformerLens 2.18's flags (`fold_ln`, `center_writing_weights`, `center_unembed`,
    `fold_value_biases`, `refactor_factored_attn_matrices`): none given, no processing (its
    `from_pretrained_no_processing`); any given, the rest default and apply as in its `from_pretrained`
    (`models.arch.weight_processing.process_loaded`).
    Raises `CheckpointError` for unreadable or mismatched weights, `ConfigError` for an invalid config,
    `WeightProcessingError` for processing that cannot be done and `TypeError` when `cfg` is neither a config nor a
    dict."""
    if not isinstance(cfg, (HookedTransformerConfig, dict)):
        raise TypeError(f"cfg must be a HookedTransformerConfig or a config dict, got {type(cfg).__name__}")
    source = "state dict"
    if isinstance(state_dict_or_path, (str, os.PathLike)):
        path = Path(state_dict_or_path)
        source = str(path)
        if path.is_dir() or not os.path.lexists(path):
            raise CheckpointError(f"{path}: not a state-dict file")
        state = read_safetensors(path, contained=False) if path.suffix == ".safetensors" else read_pth(path)
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
    with rng_kept():  # the initial draws are overwritten: leave the process's generators as they were
        model = HookedTransformer(cfg)
    load_state_dict(model, tl_state_to_ours(state, model, source), source=source)
    return process_loaded(model, processing)



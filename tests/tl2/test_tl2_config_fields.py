"""Every field of TransformerLens 2.18's `HookedTransformerConfig` (issue 14 bug 6: nothing ignored silently).

`models.io.interop.config_from_transformer_lens` sorts each field into: computed the same way (`TL_SAME`,
`TL_CONVERTED`; each has a case of the legacy parity grid, `PARITY`), metadata that computes nothing (`TL_METADATA`),
or refused with a `ConfigError` naming it when set to anything but its default (`TL_REFUSED`). The field list is
hard-coded here (fast suite); the slow test checks it against the real class's list, written by make_references.py.
"""

from __future__ import annotations

import json

import pytest
import torch
from make_references import BASE, grid

from models import ConfigError
from models.io.interop import TL_CONVERTED, TL_METADATA, TL_REFUSED, TL_SAME, config_from_transformer_lens

#: TransformerLens 2.18.0's HookedTransformerConfig fields, in its order.
TL_FIELDS = (
    "n_layers", "d_model", "n_ctx", "d_head", "model_name", "n_heads", "d_mlp", "act_fn", "d_vocab", "eps",
    "use_attn_result", "use_attn_scale", "attn_scale", "use_split_qkv_input", "use_hook_mlp_in", "use_attn_in",
    "use_qk_norm", "use_local_attn", "ungroup_grouped_query_attention", "original_architecture", "from_checkpoint",
    "checkpoint_index", "checkpoint_label_type", "checkpoint_value", "tokenizer_name", "window_size", "attn_types",
    "init_mode", "normalization_type", "device", "n_devices", "attention_dir", "attn_only", "seed",
    "initializer_range", "init_weights", "scale_attn_by_inverse_layer_idx", "positional_embedding_type", "final_rms",
    "d_vocab_out", "parallel_attn_mlp", "rotary_dim", "n_params", "use_hook_tokens", "gated_mlp",
    "default_prepend_bos", "dtype", "tokenizer_prepends_bos", "n_key_value_heads", "post_embedding_ln",
    "rotary_base", "rotary_base_local", "trust_remote_code", "rotary_adjacent_pairs", "load_in_4bit", "num_experts",
    "experts_per_token", "relative_attention_max_distance", "relative_attention_num_buckets",
    "decoder_start_token_id", "tie_word_embeddings", "use_normalization_before_and_after", "attn_scores_soft_cap",
    "output_logits_soft_cap", "use_NTK_by_parts_rope", "NTK_by_parts_low_freq_factor",
    "NTK_by_parts_high_freq_factor", "NTK_by_parts_factor", "NTK_original_ctx_len",
)

#: field -> a parity case (make_references.grid()) with a non-default value of it; "*" = set in every case, or
#: exercised by every case's checks (cache_split: use_attn_result, use_split_qkv_input, use_hook_mlp_in;
#: cache_attn_in: use_attn_in); None = stored only (metadata the model never reads), tested below.
PARITY = {
    "n_layers": "one-layer-hook-tokens", "d_model": "*", "n_ctx": "*", "d_head": "d-head-6", "n_heads": "d-head-6",
    "d_mlp": "*", "act_fn": "solu-ln", "d_vocab": "*", "eps": "*", "model_name": None, "use_attn_result": "*",
    "use_attn_scale": "no-attn-scale", "attn_scale": "attn-scale", "use_split_qkv_input": "*",
    "use_hook_mlp_in": "*", "use_attn_in": "*", "ungroup_grouped_query_attention": "gqa-ungrouped",
    "original_architecture": None, "tokenizer_name": None, "normalization_type": "standard-LNPre-gated",
    "attention_dir": "bidir-standard-LN-gelu", "attn_only": "standard-none-attn",
    "scale_attn_by_inverse_layer_idx": "inverse-layer-idx", "positional_embedding_type": "alibi-LN-attn",
    "final_rms": "final-rms", "d_vocab_out": "d-vocab-out", "parallel_attn_mlp": "standard-RMS-parallel",
    "rotary_dim": "rotary-dim-2", "use_hook_tokens": "one-layer-hook-tokens", "gated_mlp": "standard-LNPre-gated",
    "default_prepend_bos": "*", "n_key_value_heads": "gqa-standard-LN-gelu", "rotary_base": "rotary-base-500",
    "rotary_adjacent_pairs": "rotary-adjacent", "attn_scores_soft_cap": "scores-soft-cap",
    "output_logits_soft_cap": "logits-soft-cap", "initializer_range": "*", "dtype": "*",
}

SMALL = dict(n_layers=1, d_model=8, n_ctx=4, d_head=4, n_heads=2, d_vocab=5, attn_only=True, act_fn=None)


def test_every_field_is_sorted_once():
    groups = [set(TL_SAME), set(TL_CONVERTED), set(TL_METADATA), set(TL_REFUSED)]
    assert sum(len(g) for g in groups) == len(set().union(*groups)), "a field is in two groups"
    assert set().union(*groups) == set(TL_FIELDS)


def test_every_computed_field_has_a_parity_case():
    assert set(PARITY) == set(TL_SAME) | set(TL_CONVERTED)
    cases = grid()
    for field, case in PARITY.items():
        if case not in ("*", None):
            cfg = {**BASE, **cases[case]}
            assert field in cfg, f"{field}: case {case} does not set it"


@pytest.mark.parametrize("field", sorted(TL_REFUSED))
def test_refused_fields_name_themselves(field):
    default = TL_REFUSED[field]
    value = {bool: True, int: 2, float: 2.5}.get(type(default), "local")
    with pytest.raises(ConfigError, match=field):
        config_from_transformer_lens({**SMALL, field: value})
    config_from_transformer_lens({**SMALL, field: default})  # the default is fine


def test_unknown_fields_are_refused_and_metadata_is_kept():
    with pytest.raises(ConfigError, match="no_such_field"):
        config_from_transformer_lens({**SMALL, "no_such_field": 1})
    cfg = config_from_transformer_lens({**SMALL, "original_architecture": "GPT2LMHeadModel", "tokenizer_name": "gpt2",
                                        "from_checkpoint": True, "checkpoint_index": 3, "init_mode": "xavier_normal",
                                        "model_name": "toy"})
    assert (cfg.original_architecture, cfg.tokenizer_name, cfg.model_name) == ("GPT2LMHeadModel", "gpt2", "toy")
    assert cfg.extra["transformer_lens"] == {"from_checkpoint": "True", "checkpoint_index": "3",
                                             "init_mode": "xavier_normal"}


def test_converted_sentinels():
    cfg = config_from_transformer_lens({**SMALL, "attn_scale": 2.0, "d_vocab_out": -1, "attn_scores_soft_cap": -1.0,
                                        "output_logits_soft_cap": 0.0, "normalization_type": "RMSPre",
                                        "initializer_range": 0.05, "dtype": "torch.float64"})
    assert (cfg.attn_scale, cfg.d_vocab_out, cfg.attn_scores_soft_cap, cfg.output_logits_soft_cap) == (
        None, 5, None, None)  # attn_scale 2.0 = TL's written-out default √d_head
    assert (cfg.normalization_type, cfg.init_range, cfg.dtype) == ("RMSPre", 0.05, torch.float64)
    assert config_from_transformer_lens({**SMALL, "attn_scale": 3.0}).attn_scale == 3.0


@pytest.mark.slow
def test_field_list_matches_transformer_lens_2_18():
    """The hard-coded list against the real class (make_references.py writes its fields with their defaults)."""
    from tl2_legacy import references_or_skip

    folder = references_or_skip()
    real = json.loads((folder / "fields.json").read_text())
    assert tuple(real) == TL_FIELDS
    for field, default in TL_REFUSED.items():
        assert real[field] == default, field


def test_load_in_4bit_field():
    """`HookedTransformerConfig(load_in_4bit=False)` as TransformerLens (its test_attention.py passes it); True, which
    needs bitsandbytes and CUDA, is refused by name."""
    from models import HookedTransformerConfig

    own = {k: v for k, v in SMALL.items() if k != "act_fn"}
    assert HookedTransformerConfig(**own, load_in_4bit=False).load_in_4bit is False
    with pytest.raises(ConfigError, match="load_in_4bit"):
        HookedTransformerConfig(**own, load_in_4bit=True)

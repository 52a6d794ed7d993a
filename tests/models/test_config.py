"""`HookedTransformerConfig`: every invalid field raises `ConfigError` naming it; valid configs round-trip
through JSON and build a model."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from models import ConfigError, HookedTransformer, HookedTransformerConfig
from models.arch.config import ACT_FNS, DTYPES, NORMALIZATION_TYPES
from models.arch.positions import SCHEMES
from models.arch.score_bias import MASKS

BASE = dict(n_layers=1, d_model=16, n_ctx=8, d_vocab=20, n_heads=4)


def cfg(**changes):
    return HookedTransformerConfig(**{**BASE, **changes})


@pytest.mark.parametrize("field,value,also", [
    ("act_fn", "tanh", "gelu"),
    ("normalization_type", "LayerNorm", "'RMS'"),
    ("normalization_type", "LNpre", "'LNPre'"),
    ("positional_embedding_type", "learned", "'shortformer'"),
    ("attention_dir", "forward", "'causal'"),
    ("dtype", "float8", "float32"),
    ("dtype", torch.int64, "bfloat16"),
])
def test_bad_choice_names_field_and_allowed_values(field, value, also):
    with pytest.raises(ConfigError, match=field) as info:
        cfg(**{field: value})
    assert "allowed" in str(info.value) and also in str(info.value)


@pytest.mark.parametrize("changes,field", [
    (dict(n_key_value_heads=3), "n_key_value_heads"),
    (dict(n_key_value_heads=0), "n_key_value_heads"),
    (dict(n_key_value_heads=8), "n_key_value_heads"),
    (dict(n_key_value_heads=True), "n_key_value_heads"),  # a bool is not a head count (found by hypothesis)
    (dict(device="gpu"), "device"),
    (dict(device=True), "device"),
    (dict(d_model=18), "d_head"),  # 18 % 4 != 0 with d_head unset
    (dict(positional_embedding_type="rotary", rotary_dim=3), "rotary_dim"),
    (dict(positional_embedding_type="rotary", rotary_dim=6), "rotary_dim"),  # > d_head = 4
    (dict(positional_embedding_type="rotary", rotary_dim=0), "rotary_dim"),
    (dict(positional_embedding_type="rotary", rotary_dim=2.0), "rotary_dim"),
    (dict(positional_embedding_type="rotary", d_model=12, n_heads=4), "rotary_dim"),  # d_head 3: odd default
    (dict(positional_embedding_type="sinusoidal", d_model=15, n_heads=3), "d_model"),
    (dict(n_layers=-1), "n_layers"),
    (dict(d_model=0), "d_model"),
    (dict(d_model=-16), "d_model"),
    (dict(n_ctx=0), "n_ctx"),
    (dict(d_vocab=-1), "d_vocab"),
    (dict(n_heads=0), "n_heads"),
    (dict(d_head=0), "d_head"),
    (dict(d_head=-4), "d_head"),
    (dict(d_head=2.5), "d_head"),
    (dict(d_mlp=0), "d_mlp"),
    (dict(d_mlp=-64), "d_mlp"),
    (dict(d_mlp=True), "d_mlp"),
    (dict(n_layers=2.0), "n_layers"),
    (dict(n_layers="2"), "n_layers"),
    (dict(d_vocab=True), "d_vocab"),
    (dict(eps=0.0), "eps"),
    (dict(eps=-1e-5), "eps"),
    (dict(eps=math.nan), "eps"),
    (dict(eps="1e-5"), "eps"),
    (dict(init_range=0), "init_range"),
    (dict(rotary_base=-10.0), "rotary_base"),
    (dict(use_bias="false"), "use_bias"),
    (dict(attn_only=1), "attn_only"),
    (dict(rotary_adjacent_pairs="yes"), "rotary_adjacent_pairs"),
    (dict(use_attn_result=None), "use_attn_result"),
    (dict(default_prepend_bos=0), "default_prepend_bos"),
    (dict(seed="0"), "seed"),
    (dict(extra=[1]), "extra"),
])
def test_bad_value_names_field(changes, field):
    with pytest.raises(ConfigError, match=field):
        cfg(**changes)


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


def test_from_dict_unknown_and_missing_fields():
    with pytest.raises(ConfigError, match="unknown config field") as info:
        HookedTransformerConfig.from_dict({**BASE, "n_layer": 2})
    assert "n_layer" in str(info.value) and "n_layers" in str(info.value)  # lists the allowed names
    with pytest.raises(ConfigError, match="missing required field") as info:
        HookedTransformerConfig.from_dict({k: v for k, v in BASE.items() if k != "d_vocab"})
    assert "d_vocab" in str(info.value)
    with pytest.raises(ConfigError, match="JSON object"):
        HookedTransformerConfig.from_dict([1, 2])
    with pytest.raises(ConfigError, match="not valid JSON"):
        HookedTransformerConfig.from_json("{n_layers: 1")
    with pytest.raises(ConfigError, match="JSON object"):
        HookedTransformerConfig.from_json("[]")
    with pytest.raises(ConfigError, match="eps"):  # a wrong type in JSON is a ConfigError, not a TypeError
        HookedTransformerConfig.from_json(json.dumps({**BASE, "eps": "small"}))


def test_defaults_are_filled_in():
    c = cfg()
    assert c.d_head == 4 and c.n_key_value_heads == 4 and c.rotary_dim == 4
    assert c.attn_only and c.d_mlp is None
    assert cfg(d_mlp=32, attn_only=True).d_mlp is None  # attn_only wins
    assert cfg(dtype="float64").dtype == torch.float64 and cfg(dtype=torch.float64).torch_dtype == torch.float64


def test_json_round_trip_is_exact():
    c = cfg(d_mlp=64, normalization_type="RMS", positional_embedding_type="rotary", rotary_dim=2,
            rotary_adjacent_pairs=True, n_key_value_heads=2, dtype=torch.float64, seed=3, eps=1e-6,
            extra={"note": "x", "nested": {"a": [1, 2]}})
    text = c.to_json()
    assert json.loads(text)["dtype"] == "float64"
    back = HookedTransformerConfig.from_json(text)
    assert back == c and back.to_json() == text
    assert HookedTransformerConfig.from_dict(c.to_dict()) == c


# --- hypothesis: random valid configs --------------------------------------------------------------
@st.composite
def valid_configs(draw):
    kind = draw(st.sampled_from(tuple(SCHEMES)))
    n_heads = draw(st.integers(1, 6))
    kv = draw(st.sampled_from([d for d in range(1, n_heads + 1) if n_heads % d == 0]))
    # rotary needs an even rotary_dim <= d_head (default d_head); sinusoidal needs an even d_model
    d_head = 2 * draw(st.integers(1, 3)) if kind in ("rotary", "sinusoidal") else draw(st.integers(1, 6))
    explicit_d_head = draw(st.booleans())
    d_model = n_heads * d_head
    if explicit_d_head:
        d_model = draw(st.integers(1, 12).map(lambda k: 2 * k) if kind == "sinusoidal" else st.integers(1, 24))
    rotary_dim = None
    if kind == "rotary":
        rotary_dim = draw(st.sampled_from([None] + list(range(2, d_head + 1, 2))))
    return HookedTransformerConfig(
        n_layers=draw(st.integers(0, 3)), d_model=d_model, n_ctx=draw(st.integers(1, 16)),
        d_vocab=draw(st.integers(1, 40)), n_heads=n_heads, d_head=d_head if explicit_d_head else None,
        d_mlp=draw(st.one_of(st.none(), st.integers(1, 32))), act_fn=draw(st.sampled_from(ACT_FNS)),
        normalization_type=draw(st.sampled_from(NORMALIZATION_TYPES)),
        eps=draw(st.floats(1e-9, 1e-1)), positional_embedding_type=kind, rotary_dim=rotary_dim,
        rotary_base=draw(st.floats(1.0, 1e6)), rotary_adjacent_pairs=draw(st.booleans()),
        attention_dir=draw(st.sampled_from(tuple(MASKS))), n_key_value_heads=kv,
        use_bias=draw(st.booleans()), use_attn_result=draw(st.booleans()),
        init_range=draw(st.floats(1e-4, 1.0)), seed=draw(st.one_of(st.none(), st.integers(0, 2**31))),
        dtype=draw(st.sampled_from(DTYPES)), model_name=draw(st.text(max_size=10)),
        default_prepend_bos=draw(st.booleans()),
        extra=draw(st.dictionaries(st.text(max_size=5), st.one_of(st.integers(), st.text(max_size=5)), max_size=3)),
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_configs())
def test_random_valid_configs_round_trip(c):
    back = HookedTransformerConfig.from_json(c.to_json())
    assert back == c
    assert back.to_dict() == c.to_dict()
    assert dataclasses.replace(back) == c  # re-validating a validated config is a no-op


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_configs())
def test_random_valid_configs_build_and_run(c):
    c = c.replace(dtype="float32")  # half precision matmuls are not all available on CPU
    model = HookedTransformer(c)
    tokens = torch.randint(0, c.d_vocab, (1, min(c.n_ctx, 5)))
    logits = model(tokens)
    assert logits.shape == (1, tokens.shape[1], c.d_vocab)
    assert torch.isfinite(logits).all()

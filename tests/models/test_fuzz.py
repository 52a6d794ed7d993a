"""Property-based fuzzing: only the documented exceptions ever escape the forward pass and the loaders."""

import json

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from models import CheckpointError, ConfigError, HookedTransformer, HookedTransformerConfig
from models.io.checkpoint import read_config

VALUES = st.one_of(st.none(), st.booleans(), st.integers(-3, 70), st.floats(allow_nan=True), st.text(max_size=8),
                   st.sampled_from(["LN", "RMS", "gelu", "relu", "rotary", "alibi", "shortformer", "causal"]))
FIELDS = ["n_layers", "d_model", "n_ctx", "d_vocab", "n_heads", "d_head", "d_mlp", "act_fn", "normalization_type",
          "positional_embedding_type", "attention_dir", "n_key_value_heads", "rotary_dim", "dtype", "device", "bogus"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(FIELDS), VALUES, max_size=10))
def test_config_fuzz_only_config_errors(d):
    base = {"n_layers": 1, "d_model": 8, "n_ctx": 8, "d_vocab": 11, "n_heads": 2}
    base.update(d)
    try:
        cfg = HookedTransformerConfig.from_dict(base)
    except ConfigError:
        return
    # A config that validates must build, run and round-trip.
    model = HookedTransformer(cfg)
    n = min(3, cfg.n_ctx)
    logits = model(torch.zeros(1, n, dtype=torch.long))
    assert logits.shape == (1, n, cfg.d_vocab)
    assert HookedTransformerConfig.from_json(cfg.to_json()) == cfg


_MODEL = HookedTransformer(HookedTransformerConfig(n_layers=1, d_model=8, n_ctx=8, d_vocab=11, n_heads=2, seed=0,
                                                   positional_embedding_type="standard"))
TOKENS = st.one_of(
    st.lists(st.integers(-5, 20), max_size=12),
    st.lists(st.lists(st.integers(-2, 14), min_size=0, max_size=10), max_size=3),
    st.builds(lambda n, m, k: torch.randint(-1, 13, (n, m)).to(k), st.integers(0, 3), st.integers(0, 10),
              st.sampled_from([torch.long, torch.int32, torch.float32, torch.bool, torch.uint8])),
    st.text(max_size=5),
)


@settings(max_examples=200, deadline=None)
@given(TOKENS)
def test_forward_fuzz_only_value_errors(tokens):
    try:
        logits = _MODEL(tokens)
    except ValueError as e:
        assert str(e)  # a message, always
        return
    assert torch.isfinite(logits).all()


@settings(max_examples=100, deadline=None)
@given(st.one_of(st.binary(max_size=64), st.text(max_size=64).map(str.encode),
                 st.dictionaries(st.sampled_from(FIELDS), VALUES).map(lambda d: json.dumps(d).encode())))
def test_config_file_fuzz_only_checkpoint_errors(tmp_path_factory, blob):
    path = tmp_path_factory.mktemp("cfg") / "config.json"
    path.write_bytes(blob)
    try:
        read_config(path)
    except CheckpointError as e:
        assert "config.json" in str(e)

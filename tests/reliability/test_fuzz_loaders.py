"""Property-based fuzzing: random bytes as safetensors / .pth / config / tokenizer files, mutated real files, random
state dicts, and random token inputs against models of random valid configs. Only the documented exceptions
(CheckpointError, ConfigError, TokenizerError — all ValueErrors) ever escape; whatever loads, runs."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import models
from models import CheckpointError, ConfigError, HookedTransformer, HookedTransformerConfig
from models.data.tokenizer import ByteTokenizer, TokenizerError, load_tokenizer

CFG = HookedTransformerConfig(n_layers=1, d_model=8, n_ctx=8, d_vocab=20, n_heads=2, seed=0)
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                       HealthCheck.too_slow])


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz") / "m"
    m = HookedTransformer(CFG, tokenizer=None)
    models.save(m, d)
    return d


def _load_folder_with(good, tmp_path, name, blob):
    folder = tmp_path / "m"
    if folder.exists():
        shutil.rmtree(folder)
    shutil.copytree(good, folder)
    (folder / name).write_bytes(blob)
    try:
        model = models.load(folder)
    except (CheckpointError, TokenizerError) as e:  # TokenizerError only for tokenizer.json
        assert str(folder) in str(e)
        return None
    return model


@FAST
@given(st.binary(max_size=256))
def test_random_bytes_as_safetensors(good, tmp_path, blob):
    assert _load_folder_with(good, tmp_path, "model.safetensors", blob) is None


@FAST
@given(st.data())
def test_mutated_safetensors(good, tmp_path, data):
    """Flip, drop or insert bytes of a real file: refused, or (data bytes hit) loaded and runnable."""
    raw = bytearray((good / "model.safetensors").read_bytes())
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(raw) - 1))
        op = data.draw(st.sampled_from(["flip", "truncate", "insert"]))
        if op == "flip":
            raw[i] ^= data.draw(st.integers(1, 255))
        elif op == "truncate":
            raw = raw[:i]
            if not raw:
                break
        else:
            raw[i:i] = data.draw(st.binary(min_size=1, max_size=8))
    model = _load_folder_with(good, tmp_path, "model.safetensors", bytes(raw))
    if model is not None:
        assert model(torch.tensor([[1, 2, 3]])).shape == (1, 3, 20)


@FAST
@given(st.one_of(st.binary(max_size=128), st.dictionaries(st.text(max_size=6), st.one_of(
    st.none(), st.integers(), st.text(max_size=6), st.lists(st.integers(), max_size=3)), max_size=5).map(
    lambda d: json.dumps(d).encode())))
def test_random_tokenizer_files(tmp_path, blob):
    (tmp_path / "tokenizer.json").write_bytes(blob)
    try:
        tok = load_tokenizer(tmp_path / "tokenizer.json")
    except TokenizerError as e:
        assert "tokenizer.json" in str(e)
        return
    assert isinstance(tok.encode("abc"), list)


@FAST
@given(st.binary(max_size=256))
def test_random_tokenizer_json_inside_a_model_folder(good, tmp_path, blob):
    _load_folder_with(good, tmp_path, "tokenizer.json", blob)


@FAST
@given(st.binary(max_size=256))
def test_random_bytes_as_pth(tmp_path, blob):
    (tmp_path / "x.pth").write_bytes(blob)
    with pytest.raises(CheckpointError, match="x.pth"):
        models.from_transformer_lens_state_dict(tmp_path / "x.pth", CFG)


_EXPECTED = {k: tuple(v.shape) for k, v in HookedTransformer(CFG).state_dict().items()}
_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int8, torch.bool,
           torch.complex64, torch.uint8]


@st.composite
def state_dicts(draw):
    """A real state dict with random tensors renamed, dropped, reshaped, retyped or added."""
    sd = {k: torch.zeros(s) for k, s in _EXPECTED.items()}
    keys = list(sd)
    for _ in range(draw(st.integers(0, 4))):
        k = draw(st.sampled_from(keys))
        op = draw(st.sampled_from(["drop", "reshape", "dtype", "rename", "add", "value", "scalar"]))
        if k not in sd:
            continue
        if op == "drop":
            sd.pop(k)
        elif op == "reshape":
            sd[k] = torch.zeros(draw(st.lists(st.integers(0, 9), max_size=3)))
        elif op == "dtype" and isinstance(sd[k], torch.Tensor):
            sd[k] = sd[k].to(draw(st.sampled_from(_DTYPES)))
        elif op == "rename":
            sd[k + draw(st.text(min_size=1, max_size=3))] = sd.pop(k)
        elif op == "add":
            sd[draw(st.text(max_size=12))] = torch.zeros(draw(st.lists(st.integers(0, 4), max_size=2)))
        elif op == "value":
            sd[k] = draw(st.one_of(st.none(), st.integers(), st.text(max_size=4), st.just([1.0])))
        else:
            sd[draw(st.one_of(st.integers(), st.none(), st.tuples(st.integers())))] = torch.zeros(1)
    return sd


@settings(max_examples=150, deadline=None)
@given(state_dicts())
def test_random_state_dicts(sd):
    try:
        model = models.from_transformer_lens_state_dict(sd, CFG)
    except (CheckpointError, ConfigError) as e:
        assert str(e)
        return
    assert torch.isfinite(model(torch.tensor([[1, 2]]))).all()


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.sampled_from(["n_layers", "d_model", "n_ctx", "d_vocab", "n_heads", "d_head", "d_mlp",
                                        "shortformer_pos", "normalization_type", "act_fn", "gated_mlp",
                                        "positional_embedding_type", "attn_only", "tokenizer_name"]),
                       st.one_of(st.none(), st.booleans(), st.integers(-2, 40), st.text(max_size=5),
                                 st.sampled_from(["LN", "LNPre", "RMSPre", "gelu", "standard"])), max_size=8))
def test_random_transformer_lens_configs(d):
    sd = {k: torch.zeros(s) for k, s in _EXPECTED.items()}
    try:
        models.from_transformer_lens_state_dict(sd, dict(CFG.to_dict(), **d))
    except (CheckpointError, ConfigError):
        pass


# --- forward pass: random valid configs × random token inputs -----------------------------------------------
@st.composite
def configs(draw):
    n_heads = draw(st.sampled_from([1, 2, 4]))
    return HookedTransformerConfig(
        n_layers=draw(st.integers(0, 2)), d_model=4 * n_heads * draw(st.integers(1, 2)), n_ctx=draw(st.integers(1, 12)),
        d_vocab=draw(st.integers(1, 40)), n_heads=n_heads, d_mlp=draw(st.sampled_from([None, 8])),
        normalization_type=draw(st.sampled_from([None, "LN", "RMS"])),
        positional_embedding_type=draw(st.sampled_from(["standard", "shortformer", "rotary", "alibi", "none",
                                                        "sinusoidal"])),
        attention_dir=draw(st.sampled_from(["causal", "bidirectional"])), seed=0,
        dtype=draw(st.sampled_from(["float32", "float64", "bfloat16"])))


TOKENS = st.one_of(
    st.lists(st.integers(-3, 45), max_size=16),
    st.lists(st.lists(st.integers(-1, 42), min_size=1, max_size=14), min_size=1, max_size=3),
    st.tuples(st.integers(0, 3), st.integers(0, 16), st.sampled_from(["int64", "int32", "uint16", "float32", "bool"]))
    .map(lambda t: np.random.default_rng(0).integers(0, 41, (t[0], t[1])).astype(t[2])),
    st.tuples(st.integers(0, 2), st.integers(0, 16), st.sampled_from([torch.long, torch.int16, torch.float16]))
    .map(lambda t: torch.randint(-1, 42, (t[0], t[1])).to(t[2])),
)


@settings(max_examples=120, deadline=None)
@given(configs(), TOKENS)
def test_forward_fuzz_random_models_and_tokens(cfg, tokens):
    model = HookedTransformer(cfg)
    try:
        logits = model(tokens)
    except ValueError as e:
        assert str(e)
        return
    t = model.validate_tokens(tokens)
    assert logits.shape == (*t.shape, cfg.d_vocab)
    assert torch.isfinite(logits).all()


@settings(max_examples=40, deadline=None)
@given(configs())
def test_every_valid_config_round_trips_through_a_folder(tmp_path_factory, cfg):
    path = tmp_path_factory.mktemp("rt") / "m"
    model = HookedTransformer(cfg, tokenizer=ByteTokenizer() if cfg.d_vocab >= 259 else None)
    models.save(model, path)
    back = models.load(path)
    assert back.cfg == model.cfg
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), back.state_dict().values()))

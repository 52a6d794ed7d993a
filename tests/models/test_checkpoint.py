"""Checkpoints: bit-exact round trips, atomic overwrite, every corrupt-folder case raises `CheckpointError`
naming the file (and tensor), zoo-name errors, and legacy TransformerLens state dicts (never unpickled)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch
from helpers import randomize
from safetensors.torch import load_file, save_file

import models
from models import CheckpointError, HookedTransformer, HookedTransformerConfig
from models.data.tokenizer import ByteTokenizer
from models.io import checkpoint as ckpt

CONFIGS = {
    "shortformer-attn-only": dict(n_layers=2, d_model=16, n_ctx=8, d_vocab=20, n_heads=4, d_mlp=None,
                                  normalization_type=None, positional_embedding_type="shortformer", use_bias=False),
    "ln-mlp-standard": dict(n_layers=1, d_model=16, n_ctx=8, d_vocab=20, n_heads=2, d_mlp=32),
    "rotary-gqa-rms-f64": dict(n_layers=2, d_model=16, n_ctx=8, d_vocab=20, n_heads=4, n_key_value_heads=2,
                               d_mlp=24, normalization_type="RMS", positional_embedding_type="rotary", dtype="float64"),
    "alibi-bidirectional": dict(n_layers=1, d_model=8, n_ctx=4, d_vocab=20, n_heads=2, d_mlp=16,
                                positional_embedding_type="alibi", attention_dir="bidirectional"),
    "sinusoidal-f64-bytes": dict(n_layers=1, d_model=16, n_ctx=8, d_vocab=259, n_heads=2, d_mlp=None,
                                 positional_embedding_type="sinusoidal", dtype="float64"),
}


def make(name="ln-mlp-standard", tokenizer=None):
    return randomize(HookedTransformer(HookedTransformerConfig(**CONFIGS[name], seed=0), tokenizer=tokenizer), 0.3)


@pytest.fixture
def saved(tmp_path):
    model = make()
    path = tmp_path / "m"
    models.save(model, path)
    return model, path


# --- round trips ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_round_trip_is_bit_exact(tmp_path, name):
    tok = ByteTokenizer() if name.endswith("bytes") else None
    model = make(name, tok)
    model.save(tmp_path / name)
    back = models.load(tmp_path / name)
    assert back.cfg == model.cfg
    a, b = model.state_dict(), back.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
    tokens = torch.randint(0, 20, (2, 6), generator=torch.Generator().manual_seed(0))
    assert torch.equal(model(tokens), back(tokens))
    assert back.W_E.dtype == model.cfg.torch_dtype
    assert sorted(p.name for p in (tmp_path / name).iterdir()) == sorted(
        ["config.json", "model.safetensors"] + (["tokenizer.json"] if tok else []))
    if tok is not None:
        assert isinstance(back.tokenizer, ByteTokenizer)
        assert torch.equal(back.to_tokens("héllo"), model.to_tokens("héllo"))
        assert torch.equal(back("héllo"), model("héllo"))


def test_safetensors_keys_are_transformer_lens_layout(saved):
    _, path = saved
    keys = set(load_file(str(path / "model.safetensors")))
    assert {"embed.W_E", "pos_embed.W_pos", "blocks.0.attn.W_Q", "blocks.0.ln1.w", "blocks.0.mlp.W_in",
            "unembed.W_U", "ln_final.b"} <= keys


def test_load_with_dtype(saved):
    model, path = saved
    back = models.load(path, dtype=torch.float64)
    assert back.W_E.dtype == torch.float64 and back.cfg.dtype == torch.float64
    assert torch.equal(back.W_E, model.W_E.double())


# --- atomic overwrite ------------------------------------------------------------------------------------
def test_saving_over_an_existing_folder_replaces_it(tmp_path):
    path = tmp_path / "m"
    first, second = make("ln-mlp-standard"), make("rotary-gqa-rms-f64")
    models.save(first, path)
    (path / "stale.txt").write_text("from an older save")
    models.save(second, path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # no .m.tmp-* / .m.old-* left over
    assert not (path / "stale.txt").exists()
    back = models.load(path)
    assert back.cfg == second.cfg and torch.equal(back.W_E, second.W_E)


def test_a_failing_save_leaves_the_previous_folder(tmp_path, monkeypatch):
    path = tmp_path / "m"
    first = make()
    models.save(first, path)

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr("safetensors.torch.save_file", broken)
    with pytest.raises(OSError, match="disk full"):
        models.save(make("rotary-gqa-rms-f64"), path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]
    assert torch.equal(models.load(path).W_E, first.W_E)


# --- corrupt folders ------------------------------------------------------------------------------------
def _rewrite_weights(path: Path, edit):
    state = load_file(str(path / "model.safetensors"))
    edit(state)
    save_file(state, str(path / "model.safetensors"))


@pytest.mark.parametrize("case,expect", [
    ("truncated", "not a readable safetensors file"),
    ("empty", "not a readable safetensors file"),
    ("garbage", "not a readable safetensors file"),
    ("missing_file", "missing"),
])
def test_unreadable_weights(saved, case, expect):
    _, path = saved
    f = path / "model.safetensors"
    data = f.read_bytes()
    if case == "truncated":
        f.write_bytes(data[: len(data) // 2])
    elif case == "empty":
        f.write_bytes(b"")
    elif case == "garbage":
        f.write_bytes(b"\xff" * 64)
    else:
        f.unlink()
    with pytest.raises(CheckpointError, match=expect) as info:
        models.load(path)
    assert str(f) in str(info.value)


@pytest.mark.parametrize("edit,expect,tensor", [
    (lambda s: s.pop("blocks.0.attn.W_K"), "missing tensor", "blocks.0.attn.W_K"),
    (lambda s: s.update({"blocks.0.attn.W_X": torch.zeros(2)}), "unexpected tensor", "blocks.0.attn.W_X"),
    (lambda s: s.update({"blocks.0.mlp.W_in": torch.zeros(16, 31)}), "shape", "blocks.0.mlp.W_in"),
    (lambda s: s.update({"embed.W_E": torch.zeros(20, 16, dtype=torch.long)}), "dtype", "embed.W_E"),
])
def test_bad_tensors_are_named(saved, edit, expect, tensor):
    _, path = saved
    _rewrite_weights(path, edit)
    with pytest.raises(CheckpointError, match=expect) as info:
        models.load(path)
    assert "model.safetensors" in str(info.value) and tensor in str(info.value)


def test_nonzero_bias_for_a_bias_free_config(tmp_path):
    model = make("shortformer-attn-only")
    models.save(model, tmp_path / "m")
    _rewrite_weights(tmp_path / "m", lambda s: s["blocks.0.attn.b_Q"].fill_(1.0))
    with pytest.raises(CheckpointError, match="use_bias") as info:
        models.load(tmp_path / "m")
    assert "blocks.0.attn.b_Q" in str(info.value)


@pytest.mark.parametrize("text,expect", [
    ("{not json", "invalid config"),
    ("", "invalid config"),
    (json.dumps({"n_layers": 1}), "missing required field"),
    (json.dumps({"n_layers": 1, "d_model": 16, "n_ctx": 8, "d_vocab": 20, "n_heads": 3}), "d_head"),
    (json.dumps({"n_layers": 1, "d_model": 16, "n_ctx": 8, "d_vocab": 20, "act_fn": "tanh"}), "act_fn"),
    (json.dumps({"n_layers": 1, "d_model": 16, "n_ctx": 8, "d_vocab": 20, "bogus": 1}), "unknown config field"),
    (json.dumps({"n_layers": 1, "d_model": 16, "n_ctx": 8, "d_vocab": 20, "eps": "x"}), "eps"),
    (json.dumps([1, 2]), "JSON object"),
])
def test_bad_config_json(saved, text, expect):
    _, path = saved
    (path / "config.json").write_text(text)
    with pytest.raises(CheckpointError, match=expect) as info:
        models.load(path)
    assert str(path / "config.json") in str(info.value)


def test_missing_or_binary_config(saved):
    _, path = saved
    (path / "config.json").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(CheckpointError, match="config.json"):
        models.load(path)
    (path / "config.json").unlink()
    with pytest.raises(CheckpointError, match="missing") as info:
        models.load(path)
    assert "config.json" in str(info.value)


def test_config_that_disagrees_with_the_weights(saved):
    _, path = saved
    d = json.loads((path / "config.json").read_text())
    d["d_mlp"] = 64
    (path / "config.json").write_text(json.dumps(d))
    with pytest.raises(CheckpointError, match="shape") as info:
        models.load(path)
    assert "blocks.0.mlp.W_in" in str(info.value)


def test_tokenizer_larger_than_vocab(tmp_path):
    model = make("ln-mlp-standard", ByteTokenizer())  # d_vocab 20 < 259 byte ids
    models.save(model, tmp_path / "m")
    with pytest.raises(CheckpointError, match="d_vocab") as info:
        models.load(tmp_path / "m")
    assert "tokenizer.json" in str(info.value)


# --- names -----------------------------------------------------------------------------------------------
def test_unknown_name_lists_the_zoo(tmp_path, monkeypatch):
    zoo = tmp_path / "zoo"
    for name in ("attn-only-1l", "attn-only-2l"):
        models.save(make("shortformer-attn-only"), zoo / name)
    (zoo / "not-a-model").mkdir()
    monkeypatch.setattr(ckpt, "ZOO_DIR", zoo)
    assert ckpt.zoo_names() == ["attn-only-1l", "attn-only-2l"]
    with pytest.raises(CheckpointError, match="unknown model 'attn-only-3l'") as info:
        models.load("attn-only-3l")
    assert "attn-only-1l, attn-only-2l" in str(info.value)
    assert models.load("attn-only-2l").cfg.positional_embedding_type == "shortformer"


def test_unknown_name_with_the_real_zoo():
    with pytest.raises(CheckpointError, match="zoo models") as info:
        models.load("no-such-model-xyz")
    for name in ckpt.zoo_names():
        assert name in str(info.value)


def test_a_file_is_not_a_model_folder(tmp_path):
    f = tmp_path / "weights.pth"
    f.write_bytes(b"x")
    with pytest.raises(CheckpointError, match="from_transformer_lens_state_dict"):
        models.load(f)


# --- legacy TransformerLens state dicts -----------------------------------------------------------------
def legacy_state_dict(model, gqa_private_names=False, drop_ln=False):
    """Our weights in the former HookedTransformer layout, built by hand, with its buffers."""
    cfg = model.cfg
    sd = {}
    sd["embed.W_E"] = model.W_E.detach().clone()
    if cfg.positional_embedding_type in ("standard", "shortformer"):  # learned tables are saved
        sd["pos_embed.W_pos"] = model.W_pos.detach().clone()
    for l, block in enumerate(model.blocks):
        p = f"blocks.{l}."
        a = block.attn
        if cfg.normalization_type and not drop_ln:
            sd[p + "ln1.w"] = block.ln1.w.detach().clone()
            if cfg.normalization_type == "LN":
                sd[p + "ln1.b"] = block.ln1.b.detach().clone()
        k = "_" if gqa_private_names else ""
        sd[p + "attn.W_Q"], sd[p + "attn.b_Q"] = a.W_Q.detach().clone(), a.b_Q.detach().clone()
        sd[p + f"attn.{k}W_K"], sd[p + f"attn.{k}b_K"] = a.W_K.detach().clone(), a.b_K.detach().clone()
        sd[p + f"attn.{k}W_V"], sd[p + f"attn.{k}b_V"] = a.W_V.detach().clone(), a.b_V.detach().clone()
        sd[p + "attn.W_O"], sd[p + "attn.b_O"] = a.W_O.detach().clone(), a.b_O.detach().clone()
        sd[p + "attn.mask"] = torch.tril(torch.ones(cfg.n_ctx, cfg.n_ctx, dtype=torch.bool))
        sd[p + "attn.IGNORE"] = torch.tensor(-1e5)
        if not cfg.attn_only:
            if cfg.normalization_type and not drop_ln:
                sd[p + "ln2.w"] = block.ln2.w.detach().clone()
                if cfg.normalization_type == "LN":
                    sd[p + "ln2.b"] = block.ln2.b.detach().clone()
            for n in ("W_in", "b_in", "W_out", "b_out"):
                sd[p + "mlp." + n] = getattr(block.mlp, n).detach().clone()
    if cfg.normalization_type and not drop_ln:
        sd["ln_final.w"] = model.ln_final.w.detach().clone()
        if cfg.normalization_type == "LN":
            sd["ln_final.b"] = model.ln_final.b.detach().clone()
    sd["unembed.W_U"], sd["unembed.b_U"] = model.W_U.detach().clone(), model.b_U.detach().clone()
    return sd


def tl_config_dict(cfg, **changes):
    """A TransformerLens HookedTransformerConfig-style dict (with TL-only fields we must ignore)."""
    d = dict(n_layers=cfg.n_layers, d_model=cfg.d_model, n_ctx=cfg.n_ctx, d_vocab=cfg.d_vocab,
             n_heads=cfg.n_heads, d_head=cfg.d_head, d_mlp=cfg.d_mlp, act_fn=cfg.act_fn,
             normalization_type=cfg.normalization_type, attn_only=cfg.attn_only,
             positional_embedding_type="standard" if cfg.positional_embedding_type == "shortformer"
             else cfg.positional_embedding_type,
             shortformer_pos=cfg.positional_embedding_type == "shortformer",
             n_key_value_heads=cfg.n_key_value_heads if cfg.n_key_value_heads != cfg.n_heads else None,
             d_vocab_out=cfg.d_vocab, tokenizer_name=None, original_architecture=None, use_split_qkv_input=False,
             attn_types=None, window_size=None, final_rms=False, gated_mlp=False)
    d.update(changes)
    return d


def check_same(a, b):
    tokens = torch.randint(0, a.cfg.d_vocab, (2, 6), generator=torch.Generator().manual_seed(1))
    for k, v in a.state_dict().items():
        assert torch.equal(v, b.state_dict()[k]), k
    assert torch.equal(a(tokens), b(tokens))


@pytest.mark.parametrize("name", ["shortformer-attn-only", "ln-mlp-standard", "rotary-gqa-rms-f64"])
def test_legacy_state_dict_from_dict(name):
    model = make(name)
    sd = legacy_state_dict(model, gqa_private_names=model.cfg.n_key_value_heads != model.cfg.n_heads)
    check_same(model, models.from_transformer_lens_state_dict(sd, model.cfg))
    check_same(model, models.from_transformer_lens_state_dict(sd, model.cfg.to_dict()))  # our config as a dict
    back = models.from_transformer_lens_state_dict(sd, tl_config_dict(model.cfg, dtype=str(model.cfg.dtype)))
    assert back.cfg.positional_embedding_type == model.cfg.positional_embedding_type
    if back.cfg.dtype == model.cfg.dtype:
        check_same(model, back)


def test_legacy_state_dict_from_pth_file(tmp_path):
    model = make("rotary-gqa-rms-f64")
    sd = legacy_state_dict(model, gqa_private_names=True)
    torch.save(sd, tmp_path / "model.pth")
    check_same(model, models.from_transformer_lens_state_dict(tmp_path / "model.pth", model.cfg))
    check_same(model, models.from_transformer_lens_state_dict(str(tmp_path / "model.pth"), model.cfg))


def test_legacy_lnpre_state_dict_without_norm_weights():
    """LNPre models have no ln weights; they load as LNPre, TransformerLens' parameter-free LayerNorm."""
    model = make("ln-mlp-standard")
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith(".w"):
                p.fill_(1.0)
            elif n.endswith(".b") and ("ln" in n):
                p.zero_()
    sd = legacy_state_dict(model, drop_ln=True)
    assert not any(k.endswith((".w", "ln1.b", "ln2.b", "ln_final.b")) for k in sd)
    back = models.from_transformer_lens_state_dict(sd, tl_config_dict(model.cfg, normalization_type="LNPre"))
    assert back.cfg.normalization_type == "LNPre" and not any(".ln" in k or "ln_final" in k for k in back.state_dict())
    tokens = torch.randint(0, model.cfg.d_vocab, (2, 6), generator=torch.Generator().manual_seed(1))
    assert torch.allclose(model(tokens), back(tokens), atol=1e-5, rtol=0)  # unit-weight LN: the same function


def test_legacy_state_dict_errors(tmp_path):
    model = make("ln-mlp-standard")
    sd = legacy_state_dict(model)
    sd.pop("blocks.0.attn.W_Q")
    with pytest.raises(CheckpointError, match="missing tensor.*blocks.0.attn.W_Q"):
        models.from_transformer_lens_state_dict(sd, model.cfg)
    sd = legacy_state_dict(model)
    sd["blocks.0.attn.W_O"] = sd["blocks.0.attn.W_O"][:1]
    with pytest.raises(CheckpointError, match="blocks.0.attn.W_O"):
        models.from_transformer_lens_state_dict(sd, model.cfg)
    with pytest.raises(models.ConfigError, match="use_qk_norm"):
        models.from_transformer_lens_state_dict(legacy_state_dict(model), tl_config_dict(model.cfg, use_qk_norm=True))
    with pytest.raises(CheckpointError, match="not a state-dict file"):
        models.from_transformer_lens_state_dict(tmp_path / "nope.pth", model.cfg)
    (tmp_path / "trunc.pth").write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(CheckpointError, match="trunc.pth"):
        models.from_transformer_lens_state_dict(tmp_path / "trunc.pth", model.cfg)
    torch.save([1, 2, 3], tmp_path / "list.pth")
    with pytest.raises(CheckpointError, match="dict of tensors"):
        models.from_transformer_lens_state_dict(tmp_path / "list.pth", model.cfg)


class _Evil:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (Path.write_text, (Path(self.marker), "pwned"))


@pytest.mark.parametrize("via", ["torch.save", "pickle"])
def test_malicious_pth_is_refused(tmp_path, via):
    marker = tmp_path / "MARKER"
    model = make("ln-mlp-standard")
    payload = {**legacy_state_dict(model), "evil": _Evil(marker)}
    path = tmp_path / "evil.pth"
    if via == "torch.save":
        torch.save(payload, path)
    else:
        path.write_bytes(pickle.dumps(payload))
    assert not marker.exists()
    with pytest.raises(CheckpointError, match="refused") as info:
        models.from_transformer_lens_state_dict(path, model.cfg)
    assert "evil.pth" in str(info.value)
    assert not marker.exists()


# --- float64 end to end ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["rotary-gqa-rms-f64", "sinusoidal-f64-bytes"])
def test_float64_end_to_end(tmp_path, name):
    model = make(name)
    assert model.cfg.dtype == torch.float64
    assert all(t.dtype == torch.float64 for t in model.state_dict().values())
    tokens = torch.randint(0, 20, (2, 6), generator=torch.Generator().manual_seed(0))
    logits = model(tokens)
    assert logits.dtype == torch.float64
    loss = model(tokens, return_type="loss")
    assert loss.dtype == torch.float64
    cached_logits, cache = model.run_with_cache(tokens)
    assert all(v.dtype == torch.float64 for v in cache.values())
    # float64 precision: the explicit and fused paths agree far below float32 rounding
    assert float((cached_logits - logits).abs().max()) < 1e-12
    model.save(tmp_path / "m")
    back = models.load(tmp_path / "m")
    assert back.cfg.dtype == torch.float64 and back.W_E.dtype == torch.float64
    assert load_file(str(tmp_path / "m" / "model.safetensors"))["embed.W_E"].dtype == torch.float64
    assert torch.equal(back(tokens), logits)
    _, back_cache = back.run_with_cache(tokens)
    for k in cache.keys():
        assert torch.equal(cache[k], back_cache[k]), k
    assert back.generate(tokens, max_new_tokens=2, temperature=0).shape == (2, 8)

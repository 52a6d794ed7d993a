"""A fresh model's weights (`models.arch.initialization`, issue 41.5). TransformerLens 2.18's `init_mode`s are held to
2.18 itself, bitwise, in the slow job (tests/tl2/test_legacy_init.py); here: the distributions against their
formulas, seeding, `init_weights=False`, the former scheme ("gpt2_scaled") against a frozen copy of it, the presets,
and `models.components` against float64 references."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from models import ConfigError, HookedTransformer, HookedTransformerConfig
from models.arch.encoder import EncoderConfig, HookedEncoder
from models.arch.initialization import TL_INIT_MODES, calc_fan_in_and_fan_out, transformer_lens_weight_order

BIG = dict(n_layers=2, d_model=64, d_head=16, n_heads=4, n_ctx=32, d_vocab=200, d_mlp=256, act_fn="relu")


def weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def former_gpt2_scaled(model, init_range: float, n_layers: int, seed: int | None) -> dict[str, torch.Tensor]:
    """The toolkit's initialisation before init_mode existed (models/arch/model.py `init_weights` at 9f169db), copied:
    N(0, init_range) float64 draws from `Generator(seed)` in parameter order, ×1/√(2·n_layers) on W_O and W_out."""
    gen = torch.Generator().manual_seed(seed)
    scale = (2 * max(n_layers, 1)) ** -0.5
    out = {}
    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if leaf.startswith("W_"):
            std = init_range * (scale if leaf in ("W_O", "W_out") else 1.0)
            out[name] = (torch.randn(p.shape, generator=gen, dtype=torch.float64) * std).to(p.dtype)
        else:
            out[name] = torch.ones_like(p) if leaf == "w" else torch.zeros_like(p)
    return out


def test_transformer_lens_config_arguments_are_accepted():
    """TransformerLens' Grokking demo's config cell (init_weights=True, seed) and its No-Position demo's
    (init_weights=False) build; every init_mode of 2.18 builds; an unknown one is a ConfigError naming the allowed."""
    grok = HookedTransformerConfig(n_layers=1, n_heads=4, d_model=128, d_head=32, d_mlp=512, act_fn="relu",
                                   normalization_type=None, d_vocab=114, d_vocab_out=113, n_ctx=3, init_weights=True,
                                   device="cpu", seed=999)
    assert (grok.init_weights, grok.init_mode, grok.init_range) == (True, "gpt2", 0.8 / math.sqrt(128))
    assert HookedTransformerConfig(**BIG, init_weights=False).init_weights is False
    for mode in TL_INIT_MODES:
        cfg = HookedTransformerConfig(**BIG, init_mode=mode)
        assert cfg.init_range == (0.8 / 8 if mode == "gpt2" else 1.0)  # 2.18's initializer_range defaults
        assert HookedTransformerConfig.from_json(cfg.to_json()) == cfg
    with pytest.raises(ConfigError, match="init_mode.*'gpt2'"):
        HookedTransformerConfig(**BIG, init_mode="orthogonal")
    with pytest.raises(ConfigError, match="init_weights"):
        HookedTransformerConfig(**BIG, init_weights="yes")


def test_initializer_range_is_init_range_under_transformer_lens_name():
    cfg = HookedTransformerConfig(**BIG, initializer_range=0.05)
    assert cfg.init_range == cfg.initializer_range == 0.05
    assert "initializer_range" not in cfg.to_dict()  # one field on disk
    assert HookedTransformerConfig(**BIG, initializer_range=-1.0).init_range == 0.1  # 2.18's "unset"
    cfg.initializer_range = 0.3
    assert cfg.init_range == 0.3 and cfg.replace(seed=1).init_range == 0.3
    default = HookedTransformerConfig(**BIG)
    assert default.replace(init_mode="xavier_normal").init_range == 1.0  # a default follows the mode
    assert default.replace(d_model=16, d_head=4).init_range == 0.2
    assert cfg.replace(init_mode="xavier_normal").init_range == 0.3  # a value given stays


@pytest.mark.parametrize("mode", TL_INIT_MODES)
def test_each_mode_draws_its_distribution(mode):
    """Every weight matrix from 2.18's formula (fan-in/out in TransformerLens' layout); biases 0; norm weights 1."""
    cfg = HookedTransformerConfig(**BIG, init_mode=mode, initializer_range=None if mode == "gpt2" else 0.7, seed=3)
    model = HookedTransformer(cfg)
    for name, p in model.named_parameters():
        p = p.detach().double()
        if "W_" not in name:
            assert torch.equal(p, torch.ones_like(p) if name.endswith(".w") else torch.zeros_like(p)), name
            continue
        fan_in, fan_out = calc_fan_in_and_fan_out(p)
        bound = {"xavier_uniform": 0.7 * math.sqrt(6 / (fan_in + fan_out)),
                 "kaiming_uniform": 0.7 * math.sqrt(2) * math.sqrt(3 / fan_in)}.get(mode)
        std = {"gpt2": 0.1, "xavier_normal": 0.7 * math.sqrt(2 / (fan_in + fan_out)),
               "kaiming_normal": 0.7 * math.sqrt(2 / fan_in),
               "muP": 1.0 if "embed" in name else fan_in ** -0.5}.get(mode)
        if bound is not None:
            assert p.abs().max() <= bound and p.abs().max() > 0.95 * bound, name
            std = bound / math.sqrt(3)
        assert abs(float(p.std()) / std - 1) < 0.1, (name, float(p.std()), std)
        assert abs(float(p.mean())) < 0.1 * std, name


def test_transformer_lens_parameter_order():
    """2.18's order: W_E, W_pos (drawn even where ours has none: ALiBi), per block W_Q, W_O, W_K, W_V then W_in,
    W_out, W_gate, then W_U; rotary models have no W_pos."""
    cfg = HookedTransformerConfig(**{**BIG, "n_layers": 1}, positional_embedding_type="alibi", gated_mlp=True)
    order = transformer_lens_weight_order(HookedTransformer(cfg))
    assert [n for n, _ in order] == ["embed.W_E", "pos_embed.W_pos"] + [f"blocks.0.attn.{w}" for w in (
        "W_Q", "W_O", "W_K", "W_V")] + [f"blocks.0.mlp.{w}" for w in ("W_in", "W_out", "W_gate")] + ["unembed.W_U"]
    assert order[1][1] is None  # ALiBi holds no table: its draws are made and dropped
    rotary = transformer_lens_weight_order(HookedTransformer(cfg.replace(positional_embedding_type="rotary")))
    assert "pos_embed.W_pos" not in [n for n, _ in rotary]


def test_a_dropped_table_still_consumes_its_draws():
    """With W_pos drawn and dropped, an ALiBi model's later weights equal a standard model's of the same seed."""
    std = HookedTransformer(HookedTransformerConfig(**BIG, seed=5))
    alibi = HookedTransformer(HookedTransformerConfig(**BIG, seed=5, positional_embedding_type="alibi"))
    for name, p in alibi.named_parameters():
        assert torch.equal(p, std.get_parameter(name)), name


def test_seeding_as_transformer_lens_2_18():
    """A TransformerLens mode with a seed reseeds torch, numpy and random (2.18's config does; here the model, so
    building a config never does), then draws from torch's: the same seed, the same weights, whatever the state
    before. Without a seed the draws come from torch's generator as it stands. "gpt2_scaled" touches none of them."""
    cfg = HookedTransformerConfig(**BIG, seed=11)
    torch.manual_seed(0)
    a = weights(HookedTransformer(cfg))
    after = (torch.rand(3), np.random.rand(3), random.random())
    torch.manual_seed(1)
    b = weights(HookedTransformer(cfg))
    assert all(torch.equal(v, b[k]) for k, v in a.items())
    np.random.seed(11)
    random.seed(11)
    assert np.array_equal(np.random.rand(3), after[1]) and random.random() == after[2]
    torch.manual_seed(11)
    c = weights(HookedTransformer(cfg.replace(seed=None)))
    assert all(torch.equal(v, c[k]) for k, v in a.items())
    assert torch.equal(torch.rand(3), after[0])
    HookedTransformerConfig(**BIG, seed=4)  # a config alone seeds nothing
    state = torch.get_rng_state()
    HookedTransformer(HookedTransformerConfig(**BIG, seed=4, init_mode="gpt2_scaled"))
    assert torch.equal(torch.get_rng_state(), state)


def test_init_weights_false_leaves_zeros():
    model = HookedTransformer(HookedTransformerConfig(**BIG, init_weights=False, seed=1))
    for name, p in model.named_parameters():
        assert torch.equal(p, torch.ones_like(p) if name.endswith(".w") else torch.zeros_like(p)), name
    model.init_weights()  # 2.18's method: draws them now
    assert float(model.W_E.detach().std()) > 0.05


@pytest.mark.parametrize("preset", ["attn-only-0l", "attn-only-1l", "attn-only-2l", "gelu-2l"])
def test_presets_keep_the_former_initialisation(preset):
    """The zoo presets name "gpt2_scaled", so their initial weights are those of the toolkit before init_mode existed
    (a frozen copy of that function), bit for bit."""
    from models.training.presets import get_preset

    cfg = get_preset(preset)[0].replace(seed=0)
    assert cfg.init_mode == "gpt2_scaled"
    model = HookedTransformer(cfg)
    ref = former_gpt2_scaled(model, cfg.init_range, cfg.n_layers, 0)
    assert all(torch.equal(p, ref[n]) for n, p in model.named_parameters())


def test_encoder_keeps_the_former_initialisation():
    cfg = EncoderConfig(n_layers=1, d_model=16, n_heads=2, n_ctx=8, d_vocab=11, d_mlp=32, seed=2)
    assert (cfg.init_mode, cfg.init_range) == ("gpt2_scaled", 0.02)
    model = HookedEncoder(cfg)
    ref = former_gpt2_scaled(model, 0.02, 1, 2)
    body = {n: p for n, p in model.named_parameters() if not n.startswith("mlm_head.")}
    body_ref = former_gpt2_scaled(HookedTransformer(HookedTransformerConfig(
        n_layers=1, d_model=16, n_heads=2, n_ctx=8, d_vocab=11, d_mlp=32, attention_dir="bidirectional",
        init_mode="gpt2_scaled")), 0.02, 1, 2)
    assert all(torch.equal(p, body_ref[n]) for n, p in body.items())
    assert set(body) < set(ref)


def test_loading_leaves_the_process_generators_alone(tmp_path):
    import models

    model = HookedTransformer(HookedTransformerConfig(**BIG, seed=9))
    models.save(model, tmp_path / "m")
    torch.manual_seed(123)
    np.random.seed(123)
    expect = (torch.get_rng_state(), np.random.get_state()[1].copy())
    loaded = models.load(tmp_path / "m")
    assert torch.equal(torch.get_rng_state(), expect[0]) and np.array_equal(np.random.get_state()[1], expect[1])
    assert all(torch.equal(p, model.get_parameter(n)) for n, p in loaded.named_parameters())


# --- models.components ------------------------------------------------------------------------------------------------
def _f64(layer, x):
    layer = layer.double()
    return layer(x.double() if x.is_floating_point() else x)


def test_components_have_transformer_lens_names_and_constructors():
    """`from models.components import LayerNorm` (ARENA's bracket classifier) and the rest of 2.x's names, with 2.x's
    constructors, computing their formulas (float64 references)."""
    from models.arch.components import Norm
    from models.components import (
        MLP,
        Attention,
        Embed,
        GatedMLP,
        GroupedQueryAttention,
        LayerNorm,
        LayerNormPre,
        PosEmbed,
        RMSNorm,
        RMSNormPre,
        TransformerBlock,
        Unembed,
    )

    cfg = HookedTransformerConfig(n_layers=2, d_model=8, n_heads=2, n_ctx=6, d_vocab=13, d_mlp=16, act_fn="relu",
                                  eps=1e-5, dtype="float64")
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, 8, generator=gen, dtype=torch.float64)
    ln = LayerNorm(cfg.to_dict(), 8)  # a config dict, as 2.x's constructors take
    with torch.no_grad():
        ln.w.copy_(torch.randn(8, generator=gen, dtype=torch.float64))
        ln.b.copy_(torch.randn(8, generator=gen, dtype=torch.float64))
    centred = x - x.mean(-1, keepdim=True)
    normed = centred / (centred.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt()
    torch.testing.assert_close(ln(x), normed * ln.w + ln.b, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(LayerNormPre(cfg)(x), normed, rtol=1e-12, atol=1e-12)
    rms = x / (x.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt()
    torch.testing.assert_close(RMSNormPre(cfg)(x), rms, rtol=1e-12, atol=1e-12)
    r = RMSNorm(cfg, length=8)
    assert isinstance(r, Norm) and [n for n, _ in r.named_parameters()] == ["w"]
    torch.testing.assert_close(r(x), rms, rtol=1e-12, atol=1e-12)
    assert LayerNorm(cfg, 5).w.shape == (5,) and not list(LayerNormPre(cfg).parameters())
    model = HookedTransformer(cfg.replace(seed=1))
    tokens = torch.randint(0, 13, (2, 5), generator=gen)
    embed, unembed, pos = Embed(cfg), Unembed(cfg), PosEmbed(cfg)
    embed.load_state_dict(model.embed.state_dict())
    unembed.load_state_dict(model.unembed.state_dict())
    pos.load_state_dict(model.pos_embed.state_dict())
    torch.testing.assert_close(embed(tokens), model.W_E[tokens])
    torch.testing.assert_close(pos(tokens), model.W_pos[:5].expand(2, 5, 8))
    torch.testing.assert_close(unembed(x), x @ model.W_U + model.b_U)
    mlp = MLP(cfg)
    mlp.load_state_dict(model.blocks[0].mlp.state_dict())
    torch.testing.assert_close(mlp(x), F.relu(x @ mlp.W_in + mlp.b_in) @ mlp.W_out + mlp.b_out)
    gated = GatedMLP(cfg)  # gated whatever cfg.gated_mlp says, as 2.x's class
    with torch.no_grad():
        for p in gated.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64))
    torch.testing.assert_close(gated(x), (F.relu(x @ gated.W_gate) * (x @ gated.W_in) + gated.b_in) @ gated.W_out
                               + gated.b_out)
    assert GroupedQueryAttention is Attention
    assert isinstance(TransformerBlock(cfg, 1).attn, Attention)
    for kind, cls in (("LN", LayerNorm), ("LNPre", LayerNormPre), ("RMS", RMSNorm), ("RMSPre", RMSNormPre)):
        built = HookedTransformer(cfg.replace(normalization_type=kind))  # 2.x's classes inside the model too
        assert all(type(n) is cls for n in (built.ln_final, built.blocks[0].ln1, built.blocks[1].ln2))

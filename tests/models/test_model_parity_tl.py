"""Parity with TransformerLens 4.x: `models.to_transformer_lens(model)` (a `TransformerBridge.boot_native`)
carries our weights; logits and every activation cached under a common hook name must agree.

Two hook names mean something else on TransformerLens 4.3's bridge than on the former `HookedTransformer`
(whose conventions we keep):
- `blocks.{l}.attn.hook_attn_scores`: the bridge fires it with the post-softmax weights (its
  `AttentionBridge` hooks the wrapped module's returned attention weights); ours holds the pre-softmax
  scores with masked entries at −inf. We check softmax(ours) == theirs, i.e. the finite entries agree
  up to the per-row constant softmax removes, and the masked entries are exactly where we put −inf.
- `*.ln*.hook_normalized`: the bridge hooks x / scale (before the affine weight and bias); the former
  `HookedTransformer` and ours hook the norm's output x / scale · w + b. We apply w, b to theirs.
"""

from __future__ import annotations

import itertools
import warnings

import pytest
import torch
from helpers import randomize

import models
from models import HookedTransformer, HookedTransformerConfig, UnsupportedByTransformerLens

POS = ["standard", "sinusoidal", "none", "rotary-half", "rotary-adjacent"]


def make(pos, norm="LN", mlp=True, attention_dir="causal", gqa=False, seed=0):
    kind = "rotary" if pos.startswith("rotary") else pos
    cfg = HookedTransformerConfig(
        n_layers=2, d_model=16, n_ctx=8, d_vocab=13, n_heads=4, n_key_value_heads=2 if gqa else None,
        d_mlp=32 if mlp else None, normalization_type=norm, positional_embedding_type=kind,
        rotary_adjacent_pairs=pos == "rotary-adjacent", attention_dir=attention_dir, seed=seed,
    )
    return randomize(HookedTransformer(cfg), scale=0.3, seed=seed + 1)


def bridge_of(model):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return models.to_transformer_lens(model)


def rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def assert_parity(model, n_pos=7):
    bridge = bridge_of(model)
    tokens = torch.randint(0, model.cfg.d_vocab, (2, n_pos), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        ours_logits, ours = model.run_with_cache(tokens)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tl_logits, tl = bridge.run_with_cache(tokens)
        plain_ours, plain_tl = model(tokens), bridge(tokens)
    assert rel(ours_logits, tl_logits) < 1e-5
    assert rel(plain_ours, plain_tl) < 1e-5

    common = sorted(set(ours.keys()) & set(tl.keys()))
    expected_common = {"hook_embed", "blocks.0.hook_resid_pre", "blocks.1.hook_resid_post", "blocks.0.attn.hook_z",
                       "blocks.0.attn.hook_pattern", "blocks.0.attn.hook_attn_scores", "blocks.0.hook_attn_out"}
    if not model.cfg.attn_only:
        expected_common |= {"blocks.0.mlp.hook_pre", "blocks.0.mlp.hook_post", "blocks.1.hook_mlp_out"}
    if model.cfg.normalization_type:
        expected_common |= {"blocks.0.ln1.hook_normalized", "blocks.0.ln1.hook_scale", "ln_final.hook_scale"}
    assert expected_common <= set(common), sorted(expected_common - set(common))

    half_rotary = model.cfg.positional_embedding_type == "rotary" and not model.cfg.rotary_adjacent_pairs
    compared = 0
    for name in common:
        a, b = ours[name], tl[name]
        if a.shape != b.shape:
            continue
        leaf = name.rsplit(".", 1)[-1]
        if half_rotary and leaf in ("hook_q", "hook_k"):
            continue  # the bridge holds the features permuted to adjacent pairs (interop.py)
        if leaf == "hook_attn_scores":
            finite = torch.isfinite(a)
            if model.cfg.attention_dir == "causal":
                assert torch.equal(~finite[0, 0], torch.ones_like(finite[0, 0]).triu(1))
            else:
                assert finite.all()
            a = a.softmax(-1)
        elif leaf == "hook_normalized" and model.cfg.normalization_type == "LN":  # ours: LN's output; RMS: x/scale
            norm = model.get_submodule(name.rsplit(".", 1)[0])
            b = b * norm.w + norm.b
        assert rel(a, b) < 1e-5, name
        compared += 1
    assert compared >= len(expected_common)


GRID = list(itertools.product(POS, [None, "LN", "RMS"], [False, True]))


@pytest.mark.tl4
@pytest.mark.parametrize("pos,norm,mlp", GRID)
def test_parity(pos, norm, mlp):
    assert_parity(make(pos, norm, mlp))


@pytest.mark.tl4
@pytest.mark.parametrize("pos", POS)
def test_parity_gqa(pos):
    model = make(pos, "RMS", True, gqa=True)
    assert model.cfg.n_key_value_heads == 2
    assert_parity(model)


@pytest.mark.tl4
@pytest.mark.parametrize("pos", POS)
def test_parity_bidirectional(pos):
    assert_parity(make(pos, "LN", False, attention_dir="bidirectional"))


@pytest.mark.tl4
def test_parity_bidirectional_gqa_attn_only():
    assert_parity(make("rotary-adjacent", None, False, attention_dir="bidirectional", gqa=True))


@pytest.mark.tl4
def test_parity_detects_a_difference():
    """The check can fail: a bridge built from a perturbed copy disagrees."""
    model = make("standard")
    other = make("standard")
    with torch.no_grad():
        other.blocks[1].mlp.W_in[0, 0] += 0.5
    tokens = torch.arange(6)[None]
    with torch.no_grad():
        assert rel(model(tokens), bridge_of(other)(tokens)) > 1e-5


@pytest.mark.parametrize("kind", ["shortformer", "alibi"])
def test_unsupported_positions_raise(kind):
    cfg = HookedTransformerConfig(n_layers=1, d_model=16, n_ctx=8, d_vocab=13, n_heads=4,
                                  positional_embedding_type=kind)
    with pytest.raises(UnsupportedByTransformerLens, match=kind) as info:
        models.to_transformer_lens(HookedTransformer(cfg))
    assert "TransformerLens" in str(info.value)
    assert isinstance(info.value, NotImplementedError)

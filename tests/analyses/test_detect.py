"""Induction / previous-token head detection: exact heads on the hand-built model, none on random models,
and the zoo's attn-only-2l."""

import pytest
import torch

from analyses import detect_induction_heads, detect_previous_token_heads
from circuits.testing import build_induction_model, random_model
from models import HookedTransformer, HookedTransformerConfig


def zoo_model(name):
    import models

    return models.load(name)  # a missing zoo model fails here, naming the shipped ones


@pytest.mark.parametrize("positional,noise", [("shortformer", 0.0), ("standard", 0.0), ("shortformer", 0.02)])
def test_hand_built_model_exact_heads(positional, noise):
    model, info = build_induction_model(d_vocab=40, n_ctx=64, positional=positional, noise=noise)
    ind = detect_induction_heads(model)
    prev = detect_previous_token_heads(model)
    assert ind.heads == list(info.induction_heads)
    assert prev.heads == list(info.previous_token_heads)
    row = ind.row(*info.induction_heads[0])
    assert row.induction > 0.8 and row.prefix_matching > 0.95
    assert row.partner == info.previous_token_heads[0]
    assert row.k_composition > 0 and row.qk_same_matching > 0.9 and row.ov_copying > 0.9
    assert row.mechanism is True
    anti = ind.row(*info.anti_copying_heads[0])
    assert not anti.positive and anti.mechanism is False and anti.ov_copying < -0.9
    assert prev.row(0, 0).positional_r2 > 0.9  # layer 0: QK scores come from positions only
    assert "induction heads: L1H0" in str(ind) and "previous-token heads: L0H0" in str(prev)


def test_short_context_shrinks_the_probe():
    model, info = build_induction_model()  # n_ctx 32: |R| = 15, prefix block 7 x 4
    res = detect_induction_heads(model)
    assert res.heads == [(1, 0)]
    assert any("|R| = 15" in k for k in res.thresholds)


@pytest.mark.parametrize("seed", [0, 1])
def test_random_models_have_no_heads(seed):
    m = random_model(n_layers=2, n_heads=4, d_model=32, d_head=8, d_vocab=64, n_ctx=128, scale=0.3, seed=seed)
    assert detect_induction_heads(m).heads == []
    assert detect_previous_token_heads(m).heads == []
    cfg = HookedTransformerConfig(n_layers=2, d_model=32, n_ctx=128, d_vocab=64, n_heads=4, seed=seed)
    fresh = HookedTransformer(cfg)  # default init, LayerNorm and MLPs
    assert detect_induction_heads(fresh).heads == [] and detect_previous_token_heads(fresh).heads == []


def test_one_layer_model_has_no_mechanistic_columns():
    m = random_model(n_layers=1, n_heads=2, d_model=16, d_head=8, d_vocab=40, n_ctx=64, seed=3)
    res = detect_induction_heads(m)
    assert res.heads == [] and all(r.partner is None for r in res.table)
    assert detect_induction_heads(random_model(n_layers=0, d_vocab=40, n_ctx=64)).table == []


@pytest.mark.tl4
def test_on_transformer_lens_bridge():
    from models import to_transformer_lens

    model, info = build_induction_model(d_vocab=40, n_ctx=64, positional="standard", dtype="float32")
    bridge = to_transformer_lens(model)
    assert detect_induction_heads(bridge, mechanistic=False).heads == list(info.induction_heads)
    assert detect_previous_token_heads(bridge).heads == list(info.previous_token_heads)


def test_zoo_attn_only_2l_has_induction_heads():
    m = zoo_model("attn-only-2l")
    res = detect_induction_heads(m)
    assert res.heads, f"no induction heads found:\n{res}"
    assert all(l == 1 for l, _ in res.heads)
    prev = detect_previous_token_heads(m)
    assert any(l == 0 for l, _ in prev.heads)
    assert any(res.row(*h).partner in prev.heads for h in res.heads)


def test_zoo_attn_only_1l_heads_pass_the_eigenvalue_score_and_raise_their_own_token_above_chance():
    from analyses.one_layer import copying_heads_table

    m = zoo_model("attn-only-1l")
    t = copying_heads_table(m, behavioural=False)
    passing = t.heads + t.ov_positive
    assert len(passing) >= m.cfg.n_heads // 2, str(t)
    assert all(float(t.top1[h]) < t.diagonal for h in t.ov_positive)
    assert all(float(t.top5[h]) > 5 / t.n_ids for h in passing)  # own logit in the top 5 above chance
    assert torch.all(t.copying_score <= 1.0)

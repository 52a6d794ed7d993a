"""Ports of TransformerLens 2.18's hub-free model tests to our model: attention masks, ALiBi, grouped-query
attention, split QKV input, use_attn_result, d_vocab_out, the config object, MLP variants and attention weights.
Component-level upstream tests (`Attention(cfg)`, `MLP(cfg)`, `GatedMLP(cfg)`) are ported through the model's
`blocks[l].attn` / `blocks[l].mlp`, whose names and weight layouts are TransformerLens'."""

from __future__ import annotations

import copy

import pytest
import torch
from tl2_port import tl_model

from models import HookedTransformer, HookedTransformerConfig
from models.io.interop import config_from_transformer_lens


# --- tests/integration/test_attention_mask.py --------------------------------------------------------------------
def test_attention_mask():
    """test_attention_mask.py::test_attention_mask: masked scores are -inf and get zero attention, even when the
    allowed scores are tiny."""
    model = tl_model(d_head=1, d_model=12, d_vocab=2, n_ctx=5, n_layers=1, attn_only=True, attention_dir="causal")
    tokens = torch.ones((1, 5), dtype=torch.int64)
    masked = torch.triu(torch.ones(5, 5), diagonal=1).bool()

    def scores_hook(scores, hook):
        assert torch.all(scores[:, :, masked] == float("-inf"))
        scores[:, :, ~masked] = 1e-6
        return scores

    def pattern_hook(pattern, hook):
        assert torch.all(pattern[:, :, masked] == 0)
        return pattern

    model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.attn.hook_attn_scores", scores_hook),
                                            ("blocks.0.attn.hook_pattern", pattern_hook)])


# --- tests/unit/components/test_abstract_attention.py (through a model whose Q·K is zero) -------------------------
def _alibi_scores(attention_dir, n_heads=2, n_ctx=6):
    """A model built from a TransformerLens config (`config_from_transformer_lens`, the documented way to load one:
    bidirectional ALiBi then leaves future keys unbiased, as TransformerLens; our own configs default to the
    symmetric bias, docs/coming-from-transformerlens.md), with zero queries, so its scores are the ALiBi bias."""
    torch.manual_seed(0)
    cfg = config_from_transformer_lens(dict(n_layers=1, d_model=8, n_heads=n_heads, d_head=4, n_ctx=n_ctx,
                                            d_vocab=5, attn_only=True, positional_embedding_type="alibi",
                                            attention_dir=attention_dir))
    model = HookedTransformer(cfg)
    with torch.no_grad():
        model.blocks[0].attn.W_Q.zero_()
    _, cache = model.run_with_cache(torch.zeros((1, n_ctx), dtype=torch.long))
    return cache["blocks.0.attn.hook_attn_scores"][0]  # [head, pos, key]


def test_create_alibi_slope():
    """test_abstract_attention.py::test_create_alibi_slope: the bias is slope · min(key − query, 0) (ported: the
    first head's causal scores of a model whose queries are zero, over TransformerLens' slope 2^(-8/n_heads))."""
    scores = _alibi_scores("causal", n_heads=2)
    expected = torch.tensor([[float(min(c - r, 0)) for c in range(6)] for r in range(6)])
    lower = ~torch.triu(torch.ones(6, 6, dtype=torch.bool), 1)
    torch.testing.assert_close(scores[0][lower] / 2.0 ** (-8 / 2), expected[lower])


def test_create_alibi_bias():
    """test_abstract_attention.py::test_create_alibi_bias: per head, zeros on and above the diagonal, -slope·(i-j)
    below (ported: bidirectional scores of a model loaded from a TransformerLens config whose queries are zero, so no
    mask hides the upper triangle; upstream calls AbstractAttention.create_alibi_bias directly)."""
    for matrix in _alibi_scores("bidirectional", n_heads=2, n_ctx=4):
        slope = -matrix[1, 0]
        assert torch.equal(torch.triu(matrix), torch.zeros_like(matrix))
        i, j = torch.tril_indices(4, 4, -1)
        torch.testing.assert_close(matrix[i, j], -slope * (i - j).to(matrix.dtype))


# --- tests/integration/test_grouped_query_attention.py (model level) ---------------------------------------------
GQA = dict(d_model=64, d_head=8, n_heads=8, n_ctx=16, n_key_value_heads=2, n_layers=1, act_fn="silu", d_vocab=10,
           attn_only=True)


def test_grouped_query_attention_output_is_correct():
    """test_grouped_query_attention.py::test_grouped_query_attention_output_is_correct: GQA equals attention with
    each K/V head repeated n_heads / n_key_value_heads times, also with use_split_qkv_input."""
    gqa = tl_model(**GQA)
    full = tl_model(**{**GQA, "n_key_value_heads": None})
    with torch.no_grad():
        for name, p in full.named_parameters():  # embedding, unembedding (and norms): shared
            if ".attn." not in name:
                dict(gqa.named_parameters())[name].copy_(p)
        a, b = gqa.blocks[0].attn, full.blocks[0].attn
        for name in ("W_Q", "b_Q", "W_O", "b_O"):
            getattr(b, name).copy_(torch.rand_like(getattr(a, name)))
            getattr(a, name).copy_(getattr(b, name))
        for name in ("W_K", "b_K", "W_V", "b_V"):
            getattr(a, name).copy_(torch.rand_like(getattr(a, name)))
            getattr(b, name).copy_(getattr(a, name).repeat_interleave(4, dim=0))
    x = torch.randint(0, 10, (1, 5))
    regular = full(x)  # TransformerLens 2.18's initial weights (logits of order 1): float32 rounding ~1e-6
    torch.testing.assert_close(gqa(x), regular, rtol=1e-5, atol=1e-5)
    gqa.set_use_split_qkv_input(True)
    torch.testing.assert_close(gqa(x), regular, rtol=1e-5, atol=1e-5)


def test_ungroup_grouped_query_attention_flag_produces_same_result():
    """test_grouped_query_attention.py::test_ungroup_grouped_query_attention_flag_produces_same_result"""
    off = tl_model(**GQA, ungroup_grouped_query_attention=False)
    on = copy.deepcopy(off)
    on.set_ungroup_grouped_query_attention(True)
    x = torch.randint(0, 10, (1, 5))
    torch.testing.assert_close(off(x), on(x), rtol=0, atol=0)


def test_ungroup_grouped_query_attention_flag_changes_k_v_hooks_shape():
    """test_grouped_query_attention.py::test_ungroup_grouped_query_attention_flag_changes_k_v_hooks_shape"""
    model = tl_model(**GQA, use_split_qkv_input=True, ungroup_grouped_query_attention=False)
    names = ["blocks.0.attn.hook_k", "blocks.0.attn.hook_v", "blocks.0.hook_k_input", "blocks.0.hook_v_input"]
    x = torch.arange(1, 9).unsqueeze(0)
    out_off, off = model.run_with_cache(x, names_filter=names)
    model.set_ungroup_grouped_query_attention(True)
    out_on, on = model.run_with_cache(x, names_filter=names)
    for name in names:
        assert on[name].shape[2] == off[name].shape[2] * (8 // 2)
    assert torch.equal(out_off, out_on)


# --- tests/unit/test_split_qkv.py, tests/unit/test_use_attn_result.py --------------------------------------------
ONE_LAYER = dict(d_model=128, d_head=8, n_heads=16, n_ctx=128, n_layers=1, attn_only=True, d_vocab=10)


@pytest.mark.parametrize("kv_heads", [None, 2], ids=["normal", "grouped"])
def test_split_qkv_correct(kv_heads):
    """test_split_qkv.py::test_split_qkv_normal_attn_correct and ::test_split_qkv_grouped_query_attn_correct"""
    model = tl_model(**ONE_LAYER, n_key_value_heads=kv_heads)
    assert model.cfg.use_split_qkv_input is False
    x = torch.arange(1, 9).unsqueeze(0)
    normal = model(x)
    model.set_use_split_qkv_input(True)
    assert model.cfg.use_split_qkv_input is True
    torch.testing.assert_close(model(x), normal, rtol=0, atol=1e-6)


@pytest.mark.parametrize("kv_heads", [None, 2], ids=["normal", "grouped"])
def test_attn_result_correct(kv_heads):
    """test_use_attn_result.py::test_atten_result_normal_attn_correct and
    ::test_atten_result_grouped_query_attn_correct"""
    model = tl_model(**ONE_LAYER, n_key_value_heads=kv_heads)
    assert model.cfg.use_split_qkv_input is False
    x = torch.arange(1, 9).unsqueeze(0)
    normal = model(x)
    model.set_use_attn_result(True)
    assert model.cfg.use_attn_result is True
    torch.testing.assert_close(model(x), normal, rtol=0, atol=1e-6)


# --- tests/integration/test_d_vocab.py ---------------------------------------------------------------------------
def test_d_vocab_out_set():
    """test_d_vocab.py::test_d_vocab_out_set"""
    model = tl_model(n_layers=1, d_mlp=10, d_model=10, d_head=5, n_heads=2, n_ctx=20, act_fn="relu", d_vocab=100,
                     d_vocab_out=90)
    assert model.cfg.d_vocab == 100 and model.cfg.d_vocab_out == 90


# --- tests/unit/test_hooked_transformer_config.py ----------------------------------------------------------------
SMALL = {"n_layers": 2, "d_vocab": 100, "d_model": 6, "n_ctx": 5, "d_head": 2, "attn_only": True}


def test_hooked_transformer_config_object():
    """test_hooked_transformer_config.py::test_hooked_transformer_config_object"""
    cfg = HookedTransformerConfig(**SMALL)
    assert HookedTransformerConfig.unwrap(cfg) is cfg


def test_hooked_transformer_config_dict():
    """test_hooked_transformer_config.py::test_hooked_transformer_config_dict"""
    assert isinstance(HookedTransformerConfig.unwrap(dict(SMALL)), HookedTransformerConfig)


def test_is_layer_norm_activation_passes():
    """test_hooked_transformer_config.py::test_is_layer_norm_activation_passes"""
    assert HookedTransformerConfig.unwrap({**SMALL, "act_fn": "solu_ln"}).is_layer_norm_activation()


def test_is_layer_norm_activation_fails():
    """test_hooked_transformer_config.py::test_is_layer_norm_activation_fails"""
    assert not HookedTransformerConfig.unwrap({**SMALL, "act_fn": "relu"}).is_layer_norm_activation()


# --- tests/unit/components/test_attention.py ---------------------------------------------------------------------
def test_attention_hooked_transformer_config():
    """test_attention.py::test_attention_hooked_transformer_config (2 layers instead of 12; d_vocab and d_mlp set,
    which TransformerLens infers): config fields as given, K/V weights [n_heads, d_model, d_head] parameters, zero K/V
    biases at initialisation."""
    cfg = HookedTransformerConfig(n_layers=2, d_model=512, n_ctx=1024, d_head=64, n_heads=8, d_vocab=10,
                                  load_in_4bit=False, dtype=torch.float32, act_fn="relu", d_mlp=2048)
    attn = HookedTransformer(cfg).blocks[0].attn
    assert attn.cfg == cfg
    assert (attn.cfg.n_layers, attn.cfg.d_model, attn.cfg.n_ctx, attn.cfg.d_head, attn.cfg.n_heads) == (
        2, 512, 1024, 64, 8)
    assert attn.cfg.load_in_4bit is False and attn.cfg.dtype == torch.float32 and attn.cfg.act_fn == "relu"
    for name in ("W_K", "W_V"):
        assert isinstance(getattr(attn, name), torch.nn.Parameter)
        assert getattr(attn, name).shape == (8, 512, 64)
    assert attn.b_K.shape == attn.b_V.shape == (8, 64)
    assert torch.all(attn.b_K == 0) and torch.all(attn.b_V == 0)


# --- tests/unit/components/mlps/test_mlp.py, test_gated_mlp.py (through blocks[0].mlp) ---------------------------
MLP_CFG = dict(n_layers=1, n_ctx=1024, d_head=64, d_model=128, d_mlp=256, d_vocab=10, dtype=torch.float32,
               act_fn="solu_ln", normalization_type="LN")
SOLU_LN = "issue 14 bug 6: act_fn='solu_ln' / 'solu' unsupported (SoLU MLP with its LayerNorm, hook_mid)"
GATED = "issue 14 bug 6: gated_mlp unsupported (W_gate)"


def test_mlp_initialization():
    """test_mlp.py::test_initialization"""
    tl_model(**MLP_CFG)


def test_mlp_forward_without_layer_norm():
    """test_mlp.py::test_forward_without_layer_norm (act_fn='solu')"""
    mlp = tl_model(**{**MLP_CFG, "act_fn": "solu"}).blocks[0].mlp
    assert mlp(torch.full((1, 1, 128), 0.085)).shape == (1, 1, 128)


def test_mlp_forward_with_layer_norm():
    """test_mlp.py::test_forward_with_layer_norm: a SoLU-LN MLP has hook_mid and its own LayerNorm `ln`."""
    from transformer_lens.hook_points import HookPoint

    mlp = tl_model(**MLP_CFG).blocks[0].mlp
    assert isinstance(mlp.hook_mid, HookPoint)
    assert hasattr(mlp.ln, "w") and hasattr(mlp.ln, "b")
    assert mlp(torch.full((1, 1, 128), 0.85)).shape == (1, 1, 128)


def test_gated_mlp_initialization():
    """test_gated_mlp.py::test_initialization: W_in, W_gate, W_out, b_in, b_out parameters, an `ln`."""
    mlp = tl_model(**MLP_CFG, gated_mlp=True).blocks[0].mlp
    for name in ("W_in", "W_gate", "W_out", "b_in", "b_out"):
        assert isinstance(getattr(mlp, name), torch.nn.Parameter)
    assert hasattr(mlp, "ln")


def test_gated_mlp_forward():
    """test_gated_mlp.py::test_forward"""
    mlp = tl_model(**MLP_CFG, gated_mlp=True).blocks[0].mlp
    assert mlp(torch.randn(2, 10, 128)).shape == (2, 10, 128)


LOSS_TEXT = "Hello world! This is a test of the loss of a processed model."


def test_process_weights_inplace():
    """acceptance/test_hooked_transformer.py::test_process_weights_inplace (adapted: the zoo's gelu-2l, unprocessed as
    models.load gives it, for gpt2-small from from_pretrained_no_processing; its loss before processing stands in for
    upstream's stored value)."""
    from tl2_port import text_model

    model = text_model()
    ref = model(LOSS_TEXT, return_type="loss").item()
    model.process_weights_()
    assert abs(model(LOSS_TEXT, return_type="loss").item() - ref) < 4e-5
    assert model.ln_final.kind == "LNPre"  # upstream: isinstance(model.ln_final, LayerNormPre)


def test_from_pretrained_no_processing():
    """acceptance/test_hooked_transformer.py::test_from_pretrained_no_processing (adapted: models.load(name) is
    from_pretrained_no_processing, models.load(name, **flags) from_pretrained with those flags; gelu-2l for the hub
    models): the flags switched off give the unprocessed config, switched on the processed one, and the same loss."""
    from tl2_port import TEXT_MODEL

    import models

    plain = models.load(TEXT_MODEL)
    ref = plain(LOSS_TEXT, return_type="loss").item()
    off = models.load(TEXT_MODEL, fold_ln=False, center_writing_weights=False, center_unembed=False,
                      refactor_factored_attn_matrices=False)
    assert off.cfg == plain.cfg
    on = models.load(TEXT_MODEL, fold_ln=True, center_writing_weights=True, center_unembed=True,
                     refactor_factored_attn_matrices=False)
    assert on.cfg == plain.process_weights_().cfg and on.cfg.normalization_type == "LNPre"
    for m in (off, on):
        assert abs(m(LOSS_TEXT, return_type="loss").item() - ref) < 4e-5

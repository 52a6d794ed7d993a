"""Ports of TransformerLens 2.18's tests/integration/test_start_at_layer.py and test_stop_at_layer.py to our model:
partial runs over a slice of the blocks, with residual-stream input and output."""

from __future__ import annotations

import pytest
import torch
from tl2_port import tl_model

CFG = dict(n_layers=3, d_mlp=8, d_model=10, d_head=5, n_heads=2, n_ctx=20, d_vocab=50, act_fn="relu")


def _counter():
    calls = []

    def hook(activation, hook):
        calls.append(hook.name)

    return calls, hook


@pytest.fixture
def setup():
    model = tl_model(**CFG)
    tokens = torch.randint(0, 20, (2, 10))
    return model, tokens


def _embed(model, tokens):
    residual, _, _, _ = model.input_to_embed(tokens)
    return residual


def _has(cache, present=(), absent=()):
    keys = set(cache.keys())
    assert set(present) <= keys, sorted(set(present) - keys)
    assert not set(absent) & keys, sorted(set(absent) & keys)


# --- test_start_at_layer.py --------------------------------------------------------------------------------------
def test_start_at_layer_1(setup):
    """test_start_at_layer.py::test_start_at_layer_1"""
    model, tokens = setup
    output, cache = model.run_with_cache(_embed(model, tokens), start_at_layer=1)
    assert output is not None
    _has(cache, ["blocks.1.hook_resid_pre", "ln_final.hook_normalized"],
         ["hook_embed", "hook_pos_embed", "blocks.0.hook_resid_pre"])


def test_start_run_with_hooks(setup):
    """test_start_at_layer.py::test_run_with_hooks: hooks before start_at_layer do not fire."""
    model, tokens = setup
    calls, hook = _counter()
    names = ["hook_embed", "blocks.0.attn.hook_k", "blocks.1.mlp.hook_pre", "blocks.2.attn.hook_k",
             "blocks.2.mlp.hook_pre"]
    output = model.run_with_hooks(_embed(model, tokens), start_at_layer=1, fwd_hooks=[(n, hook) for n in names])
    assert output is not None
    assert len(calls) == 3


def test_start_manual_hooks(setup):
    """test_start_at_layer.py::test_manual_hooks: start_at_layer=-2 runs the last two blocks."""
    model, tokens = setup
    embed = _embed(model, tokens)  # upstream's random embedding: made before the hooks, so hook_embed stays quiet
    calls, hook = _counter()
    model.hook_embed.add_hook(hook)
    model.blocks[0].hook_mlp_out.add_hook(hook)
    model.blocks[1].hook_resid_mid.add_hook(hook)
    model.blocks[2].attn.hook_z.add_hook(hook)
    assert model(embed, start_at_layer=-2) is not None
    assert len(calls) == 2


def test_start_at_final(setup):
    """test_start_at_layer.py::test_start_at_final"""
    model, tokens = setup
    output, cache = model.run_with_cache(_embed(model, tokens), start_at_layer=-1)
    assert output is not None
    _has(cache, ["blocks.2.hook_resid_pre", "blocks.2.hook_resid_post", "ln_final.hook_normalized"],
         ["hook_embed", "hook_pos_embed", "blocks.0.hook_resid_pre", "blocks.0.hook_resid_post",
          "blocks.1.hook_resid_pre", "blocks.1.hook_resid_post", "blocks.3.hook_resid_pre"])


ALL_BLOCKS = ["hook_embed", "hook_pos_embed", "blocks.0.hook_resid_pre", "blocks.0.hook_resid_post",
              "blocks.1.hook_resid_pre", "blocks.1.hook_resid_post", "blocks.2.hook_resid_pre",
              "blocks.2.hook_resid_post", "ln_final.hook_normalized"]


def test_no_start_logit_output(setup):
    """test_start_at_layer.py::test_no_start_logit_output: start_at_layer=None is a full run."""
    model, tokens = setup
    output, cache = model.run_with_cache(tokens, start_at_layer=None)
    assert isinstance(output, torch.Tensor) and output.shape == (2, 10, 50)
    _has(cache, ALL_BLOCKS)


def test_no_start_none_output(setup):
    """test_start_at_layer.py::test_no_start_none_output"""
    model, tokens = setup
    output, cache = model.run_with_cache(tokens, start_at_layer=None, return_type=None)
    assert output is None
    _has(cache, ALL_BLOCKS)


def test_start_and_stop(setup):
    """test_start_at_layer.py::test_start_and_stop: only block 1 runs; its output is the residual stream."""
    model, tokens = setup
    output, cache = model.run_with_cache(_embed(model, tokens), start_at_layer=1, stop_at_layer=2)
    torch.testing.assert_close(output, cache["blocks.1.hook_resid_post"])
    _has(cache, ["blocks.1.hook_resid_pre", "blocks.1.hook_resid_post"],
         ["hook_embed", "hook_pos_embed", "blocks.0.hook_resid_pre", "blocks.0.hook_resid_post",
          "blocks.2.hook_resid_pre", "blocks.2.hook_resid_post", "ln_final.hook_normalized"])


def test_start_at_layer_kwargs():
    """test_start_at_layer.py::test_start_at_layer_kwargs (upstream: gpt2 tokenizer from the hub; here token ids):
    input_to_embed's (residual, tokens, shortformer_pos_embed, attention_mask) passed back with start_at_layer=0
    give the same loss as a full run."""
    model = tl_model(**{**CFG, "positional_embedding_type": "shortformer"})
    tokens = torch.randint(0, 50, (1, 12))
    # upstream sets model.tokenizer.padding_side = "left", which makes input_to_embed return a mask
    residual, toks, shortformer_pos_embed, attention_mask = model.input_to_embed(tokens, padding_side="left")
    assert toks is not None and shortformer_pos_embed is not None and attention_mask is not None
    out = model(residual, tokens=toks, shortformer_pos_embed=shortformer_pos_embed, attention_mask=attention_mask,
                start_at_layer=0, return_type="loss")
    torch.testing.assert_close(out, model(tokens, return_type="loss"))


# --- test_stop_at_layer.py ---------------------------------------------------------------------------------------
def test_stop_at_embed(setup):
    """test_stop_at_layer.py::test_stop_at_embed: stop_at_layer=0 returns the embedded residual stream."""
    model, tokens = setup
    _, normal = model.run_with_cache(tokens)
    output, cache = model.run_with_cache(tokens, stop_at_layer=0)
    torch.testing.assert_close(output, normal["blocks.0.hook_resid_pre"])
    _has(cache, ["hook_embed", "hook_pos_embed"], ["blocks.0.hook_resid_pre", "ln_final.hook_normalized"])


def test_stop_run_with_hooks(setup):
    """test_stop_at_layer.py::test_run_with_hooks"""
    model, tokens = setup
    calls, hook = _counter()
    names = ["hook_embed", "blocks.0.attn.hook_k", "blocks.1.mlp.hook_pre"]
    output = model.run_with_hooks(tokens, stop_at_layer=1, fwd_hooks=[(n, hook) for n in names])
    _, normal = model.run_with_cache(tokens, stop_at_layer=1)
    torch.testing.assert_close(output, normal["blocks.0.hook_resid_post"])
    assert len(calls) == 2


def test_stop_manual_hooks(setup):
    """test_stop_at_layer.py::test_manual_hooks: stop_at_layer=-1 skips the last block."""
    model, tokens = setup
    _, normal = model.run_with_cache(tokens)
    calls, hook = _counter()
    model.hook_embed.add_hook(hook)
    model.blocks[0].hook_mlp_out.add_hook(hook)
    model.blocks[1].hook_resid_mid.add_hook(hook)
    model.blocks[2].attn.hook_z.add_hook(hook)
    torch.testing.assert_close(model(tokens, stop_at_layer=-1), normal["blocks.1.hook_resid_post"])
    assert len(calls) == 3


def test_stop_at_layer_1(setup):
    """test_stop_at_layer.py::test_stop_at_layer_1: only block 0's hooks (and the embeddings') fire."""
    model, tokens = setup
    _, normal = model.run_with_cache(tokens)
    output, cache = model.run_with_cache(tokens, stop_at_layer=1)
    torch.testing.assert_close(output, normal["blocks.0.hook_resid_post"])
    _has(cache, ["hook_embed", "hook_pos_embed", "blocks.0.hook_resid_pre", "blocks.0.hook_resid_post"],
         ["blocks.1.hook_resid_pre", "ln_final.hook_normalized"])
    stray = [k for k in cache.keys() if not k.startswith("blocks.0") and k not in ("hook_embed", "hook_pos_embed")]
    assert not stray, stray


def test_stop_at_final():
    """test_stop_at_layer.py::test_stop_at_final (4 layers: stop_at_layer=-1 runs blocks 0-2)"""
    model = tl_model(**{**CFG, "n_layers": 4})
    tokens = torch.randint(0, 20, (2, 10))
    _, normal = model.run_with_cache(tokens)
    output, cache = model.run_with_cache(tokens, stop_at_layer=-1)
    torch.testing.assert_close(output, normal["blocks.2.hook_resid_post"])
    _has(cache, ALL_BLOCKS[:-1], ["blocks.3.hook_resid_pre", "ln_final.hook_normalized"])


def test_no_stop_logit_output(setup):
    """test_stop_at_layer.py::test_no_stop_logit_output"""
    model, tokens = setup
    output, cache = model.run_with_cache(tokens, stop_at_layer=None)
    torch.testing.assert_close(output, model(tokens))
    assert output.shape == (2, 10, 50)
    _has(cache, ALL_BLOCKS)


def test_no_stop_no_output(setup):
    """test_stop_at_layer.py::test_no_stop_no_output"""
    model, tokens = setup
    output, cache = model.run_with_cache(tokens, stop_at_layer=None, return_type=None)
    assert output is None
    _has(cache, ALL_BLOCKS)

"""Ports of TransformerLens 2.18's tests/acceptance/test_activation_cache.py (the residual-decomposition and
neuron-result half; test_tl2_cache.py has the rest, and its module docstring the adaptations), and of
tests/integration/test_cache_hook_names.py and test_cache_pos_slice.py."""

from __future__ import annotations

import torch
from tl2_port import ioi_cache_run as run
from tl2_port import ioi_tokens_and_answer_tokens, text_model, tl_model
from transformer_lens.utilities import Slice


@torch.no_grad()
def test_get_full_resid_decomposition():
    model, cache, _, _ = run()
    n = model.cfg.n_layers
    ref_head_stack, ref_head_labels = cache.stack_head_results(layer=n, pos_slice=Slice(-1), apply_ln=True,
                                                               return_labels=True)
    ref_mlp_stack, ref_mlp_labels = cache.decompose_resid(layer=n, mlp_input=False, pos_slice=Slice(-1),
                                                          incl_embeds=False, mode="mlp", apply_ln=True,
                                                          return_labels=True)
    ref_embed = cache.apply_ln_to_stack(cache["embed"][None, :, -1], pos_slice=Slice(-1), mlp_input=False)
    ref_pos_embed = cache.apply_ln_to_stack(cache["pos_embed"][None, :, -1], pos_slice=Slice(-1), mlp_input=False)
    ref_bias = model.accumulated_bias(n, mlp_input=False, include_mlp_biases=False)
    ref_bias = ref_bias.expand((1,) + ref_head_stack.shape[1:])
    ref_bias = cache.apply_ln_to_stack(ref_bias, pos_slice=Slice(-1), mlp_input=False)
    h, m = ref_head_stack.size(0), ref_mlp_stack.size(0)

    stack, labels = cache.get_full_resid_decomposition(layer=-1, pos_slice=-1, apply_ln=True, expand_neurons=False,
                                                       return_labels=True)
    assert torch.isclose(ref_head_stack, stack[:h], atol=1e-7).all()
    assert ref_head_labels == labels[:h]
    assert torch.isclose(ref_mlp_stack, stack[h:h + m], atol=1e-7).all()
    assert ref_mlp_labels == labels[h:h + m]
    assert torch.isclose(ref_embed, stack[h + m:h + m + 1], atol=1e-7).all()
    assert labels[h + m] == "embed"
    assert torch.isclose(ref_pos_embed, stack[h + m + 1:h + m + 2], atol=1e-7).all()
    assert labels[h + m + 1] == "pos_embed"
    assert torch.isclose(ref_bias, stack[h + m + 2:h + m + 3], atol=1e-7).all()
    assert labels[h + m + 2] == "bias"


@torch.no_grad()
def test_get_full_resid_decomposition_with_neurons_expanded():
    _, cache, _, _ = run()
    ref_head_stack = cache.stack_head_results(layer=1, pos_slice=Slice(-1), apply_ln=True)
    ref_neuron_stack, ref_neuron_labels = cache.stack_neuron_results(1, pos_slice=Slice(-1), return_labels=True)
    ref_neuron_stack = cache.apply_ln_to_stack(ref_neuron_stack, layer=1, pos_slice=Slice(-1))
    h, m = ref_head_stack.size(0), ref_neuron_stack.size(0)
    stack, labels = cache.get_full_resid_decomposition(layer=1, pos_slice=Slice(-1), apply_ln=True,
                                                       expand_neurons=True, return_labels=True)
    assert torch.isclose(ref_neuron_stack, stack[h:h + m], atol=1e-7).all()
    assert ref_neuron_labels == labels[h:h + m]


@torch.no_grad()
def test_get_full_resid_decomposition_without_applying_ln():
    _, cache, _, _ = run()
    ref_head_stack = cache.stack_head_results(layer=1, pos_slice=Slice(-1), apply_ln=True, return_labels=False)
    ref_neuron_stack = cache.stack_neuron_results(1, pos_slice=Slice(-1), return_labels=False)
    h, m = ref_head_stack.size(0), ref_neuron_stack.size(0)
    stack = cache.get_full_resid_decomposition(layer=1, pos_slice=Slice(-1), apply_ln=False, expand_neurons=True,
                                               return_labels=False)
    assert torch.isclose(ref_neuron_stack, stack[h:h + m], atol=1e-7).all()


@torch.no_grad()
def test_get_full_resid_decomposition_attn_only_model():
    _, cache, _, _ = run("attn-only-2l")
    ref_head_stack = cache.stack_head_results(layer=1, pos_slice=Slice(-1), apply_ln=False, return_labels=False)
    stack = cache.get_full_resid_decomposition(layer=1, pos_slice=Slice(-1), apply_ln=False, expand_neurons=False,
                                               return_labels=False)
    assert torch.isclose(ref_head_stack, stack[:ref_head_stack.size(0)], atol=1e-7).all()


@torch.no_grad()
def test_compute_test_head_results_does_not_compute_results_twice():
    """(adapted: the zoo's config.json files predate the opt-in switch and set use_attn_result=True, so the port
    switches it off first, as TransformerLens' default)"""
    import models

    model = models.load("attn-only-2l").eval()
    model.set_use_attn_result(False)
    tokens, _ = ioi_tokens_and_answer_tokens(model)
    _, cache = model.run_with_cache(tokens)
    assert "blocks.0.attn.hook_result" not in cache.cache_dict
    cache.compute_head_results()
    assert "blocks.0.attn.hook_result" in cache.cache_dict
    assert cache.cache_dict["blocks.0.attn.hook_result"][0, 0, 0, 0] != float("inf")
    cache.cache_dict["blocks.0.attn.hook_result"][0, 0, 0, 0] = float("inf")
    cache.compute_head_results()
    assert cache.cache_dict["blocks.0.attn.hook_result"][0, 0, 0, 0] == float("inf")


@torch.no_grad()
def test_get_neuron_results():
    model, cache, _, _ = run()
    layer = 1
    ref = cache[f"blocks.{layer}.mlp.hook_post"][:, -1, :2, None] * model.blocks[layer].mlp.W_out[:2]
    assert torch.isclose(ref, cache.get_neuron_results(layer, neuron_slice=[0, 1], pos_slice=-1)).all()


@torch.no_grad()
def test_get_neuron_results_without_slice():
    model, cache, _, _ = run()
    layer = 1
    ref = cache[f"blocks.{layer}.mlp.hook_post"][..., None] * model.blocks[layer].mlp.W_out
    assert torch.isclose(ref, cache.get_neuron_results(layer, neuron_slice=None, pos_slice=None)).all()


# --- tests/integration/test_cache_hook_names.py --------------------------------------------------------------------
def test_cache_hook_names():
    """test_cache_hook_names.py::test_cache_hook_names on solu-1l (1 layer, LN, SoLU MLP whose `mlp.ln` is hooked):
    ported on a random model of that architecture (TransformerLens' SoLU models are act_fn="solu_ln")."""
    model = tl_model(n_layers=1, d_model=16, n_heads=2, d_head=8, d_mlp=32, n_ctx=16, d_vocab=50, act_fn="solu_ln")
    _, cache = model.run_with_cache(torch.tensor([[1, 2, 3, 4]]))
    assert list(cache.keys()) == [
        "hook_embed", "hook_pos_embed", "blocks.0.hook_resid_pre", "blocks.0.ln1.hook_scale",
        "blocks.0.ln1.hook_normalized", "blocks.0.attn.hook_q", "blocks.0.attn.hook_k", "blocks.0.attn.hook_v",
        "blocks.0.attn.hook_attn_scores", "blocks.0.attn.hook_pattern", "blocks.0.attn.hook_z",
        "blocks.0.hook_attn_out", "blocks.0.hook_resid_mid", "blocks.0.ln2.hook_scale", "blocks.0.ln2.hook_normalized",
        "blocks.0.mlp.hook_pre", "blocks.0.mlp.hook_mid", "blocks.0.mlp.ln.hook_scale",
        "blocks.0.mlp.ln.hook_normalized", "blocks.0.mlp.hook_post", "blocks.0.hook_mlp_out",
        "blocks.0.hook_resid_post", "ln_final.hook_scale", "ln_final.hook_normalized"]


# --- tests/integration/test_cache_pos_slice.py ---------------------------------------------------------------------
#: upstream's prompt, cut to fit the zoo model's 128 positions (byte tokens; upstream's tiny-stories-1M has BPE)
LOREM = ("Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore et "
         "dolore magna aliqua.")
SLICED = [(name, None) for name in ("embed", "pos_embed", "resid_pre", "resid_post", "resid_mid", "q", "k", "v", "z",
                                    "attn_out", "pre", "post", "mlp_out", "attn_scores", "pattern")] + [
    (name, ln) for name in ("scale", "normalized") for ln in ("ln1", "ln2")]


def _check_pos_slice(remove_batch_dim):
    """The body of both pos_slice tests: every position i (−1 included) alone equals position i of the full cache
    (`attn_scores` / `pattern`: the query axis), shapes [1, 1, ...] (or [1, ...] without the batch dimension)."""
    model = text_model()
    cfg = model.cfg
    _, full = model.run_with_cache(LOREM, return_type=None, remove_batch_dim=remove_batch_dim)
    num_tokens = len(model.tokenizer.encode(LOREM))
    lead = () if remove_batch_dim else (0,)
    for i in range(-1, num_tokens + 1):
        _, sliced = model.run_with_cache(LOREM, return_type=None, remove_batch_dim=remove_batch_dim, pos_slice=i)
        assert sliced["embed"].shape == torch.Size([1] * len(lead) + [1, cfg.d_model])
        assert sliced["q", 0].shape == torch.Size([1] * len(lead) + [1, cfg.n_heads, cfg.d_head])
        for name, kind in SLICED:
            for layer in [None] if name in ("embed", "pos_embed") else range(cfg.n_layers):
                key = name if layer is None else (name, layer, kind) if kind else (name, layer)
                if name in ("attn_scores", "pattern"):  # [batch, head, query, key]
                    assert torch.equal(full[key][lead + (slice(None), i)], sliced[key][lead + (slice(None), 0)])
                else:
                    assert torch.equal(full[key][lead + (i,)], sliced[key][lead + (0,)])


def test_run_with_cache_pos_slice_keep_batch():
    """test_cache_pos_slice.py::test_run_with_cache_pos_slice_keep_batch (zoo model, shorter prompt)"""
    _check_pos_slice(remove_batch_dim=False)


def test_run_with_cache_pos_slice_remove_batch():
    """test_cache_pos_slice.py::test_run_with_cache_pos_slice_remove_batch (zoo model, shorter prompt)"""
    _check_pos_slice(remove_batch_dim=True)

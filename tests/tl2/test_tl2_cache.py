"""Ports of TransformerLens 2.18's tests/acceptance/test_activation_cache.py to our model (TransformerLens'
`ActivationCache`, which `run_with_cache` returns, over our `HookedTransformer`).

Adaptations (tests/tl2/README.md): upstream loads solu-2l / attn-only-2l from the hub with `fold_ln`,
`center_writing_weights`, `center_unembed` and `refactor_factored_attn_matrices`; the port runs the zoo models
`gelu-2l` / `attn-only-2l` unprocessed (every assertion compares one cache method with another, or with the cached
activations, so it holds for any weights). Our tokenizer is byte-level, so the IOI names are not single tokens: the
answers are the names' first letters (`answer_tokens`), and the prompts have different lengths (right-padded, as
upstream's `to_tokens` pads).
"""

from __future__ import annotations

import pytest
import torch
from fancy_einsum import einsum
from tl2_port import ioi_cache_run as run
from transformer_lens.utilities import Slice, get_act_name


@torch.no_grad()
def test_logit_attrs_matches_reference_code():
    model, cache, tokens, answer_tokens = run()
    accumulated_residual = cache.accumulated_resid(layer=-1, incl_mid=True, pos_slice=-1)
    answer_residual_directions = model.tokens_to_residual_directions(answer_tokens)
    logit_diff_directions = answer_residual_directions[:, 0] - answer_residual_directions[:, 1]
    scaled_residual_stack = cache.apply_ln_to_stack(accumulated_residual, layer=-1, pos_slice=-1)
    ref_ave_logit_diffs = einsum("... batch d_model, batch d_model -> ...", scaled_residual_stack,
                                 logit_diff_directions) / len(tokens)
    logit_diffs = cache.logit_attrs(accumulated_residual, pos_slice=-1, tokens=answer_tokens[:, 0],
                                    incorrect_tokens=answer_tokens[:, 1])
    assert torch.isclose(ref_ave_logit_diffs, logit_diffs.mean(dim=-1), atol=1.1e-7).all()


@torch.no_grad()
def test_logit_accumulated_resid_on_last_layer_variants():
    model, cache, _, _ = run()
    accumulated_resid = cache.accumulated_resid(layer=-1, incl_mid=True, pos_slice=-1)
    assert torch.equal(accumulated_resid,
                       cache.accumulated_resid(layer=model.cfg.n_layers, incl_mid=True, pos_slice=-1))
    assert torch.equal(accumulated_resid, cache.accumulated_resid(layer=None, incl_mid=True, pos_slice=-1))


@torch.no_grad()
def test_logit_accumulated_resid_without_mid():
    _, cache, _, _ = run()
    accumulated_resid, labels = cache.accumulated_resid(layer=-1, incl_mid=False, pos_slice=-1, return_labels=True)
    assert len(labels) == accumulated_resid.size(0)
    assert all("mid" not in label for label in labels)


@torch.no_grad()
def test_logit_attrs_works_for_all_input_shapes():
    model, cache, _, answer_tokens = run()
    accumulated_residual = cache.accumulated_resid(layer=-1, incl_mid=True, pos_slice=-1, return_labels=False)
    answer_residual_directions = model.tokens_to_residual_directions(answer_tokens)
    logit_diff_directions = answer_residual_directions[:, 0] - answer_residual_directions[:, 1]
    scaled_residual_stack = cache.apply_ln_to_stack(accumulated_residual, layer=-1, pos_slice=-1)
    ref = einsum("... d_model, ... d_model -> ...", scaled_residual_stack, logit_diff_directions)

    def attrs(stack=accumulated_residual, **kw):
        return cache.logit_attrs(stack, **kw)

    assert torch.isclose(ref, attrs(pos_slice=-1, tokens=answer_tokens[:, 0], incorrect_tokens=answer_tokens[:, 1]),
                         atol=1.1e-7).all()
    b = -1  # single token, as a tensor, an int, a str; a residual stack without its batch dimension
    assert torch.isclose(ref[:, b], attrs(batch_slice=b, pos_slice=Slice(-1), tokens=answer_tokens[b, 0],
                                          incorrect_tokens=answer_tokens[b, 1])).all()
    assert torch.isclose(ref[:, b], attrs(batch_slice=Slice(b), pos_slice=-1, tokens=int(answer_tokens[b, 0]),
                                          incorrect_tokens=int(answer_tokens[b, 1]))).all()
    assert torch.isclose(ref[:, b], attrs(batch_slice=b, pos_slice=-1, tokens=model.to_string(answer_tokens[b, 0]),
                                          incorrect_tokens=model.to_string(answer_tokens[b, 1]))).all()
    assert torch.isclose(ref[:, b], attrs(accumulated_residual[:, b, :], has_batch_dim=False, batch_slice=b,
                                          pos_slice=-1, tokens=answer_tokens[b, 0],
                                          incorrect_tokens=answer_tokens[b, 1])).all()
    batch = [2, 5, 7]  # an array slice of tokens
    assert torch.isclose(ref[:, batch], attrs(batch_slice=batch, pos_slice=-1, tokens=answer_tokens[batch, 0],
                                              incorrect_tokens=answer_tokens[batch, 1])).all()
    with pytest.raises(ValueError):  # different shapes for tokens and incorrect_tokens
        attrs(accumulated_residual[:, batch, :], has_batch_dim=False, batch_slice=batch, pos_slice=-1,
              tokens=answer_tokens[batch, 0], incorrect_tokens=answer_tokens[batch, 0:1])
    ref = einsum("... d_model, ... d_model -> ...", scaled_residual_stack, answer_residual_directions[:, 0])
    assert torch.isclose(ref, attrs(pos_slice=-1, tokens=answer_tokens[:, 0], incorrect_tokens=None)).all()


@torch.no_grad()
def test_accumulated_resid_with_apply_ln():
    model, cache, _, _ = run()
    accumulated_residual = cache.accumulated_resid(layer=-1, incl_mid=True, pos_slice=-1)
    ref = cache.apply_ln_to_stack(accumulated_residual, layer=-1, pos_slice=-1, recompute_ln=True)
    scaled = cache.accumulated_resid(layer=-1, incl_mid=True, pos_slice=-1, apply_ln=True)
    assert torch.isclose(ref, scaled, atol=1e-7).all()
    scaled, labels = cache.accumulated_resid(layer=None, incl_mid=True, pos_slice=Slice(-1), apply_ln=True,
                                             return_labels=True)
    assert torch.isclose(ref, scaled, atol=1e-7).all()
    expected = [f"{l}_{kind}" for l in range(model.cfg.n_layers) for kind in ("pre", "mid")] + ["final_post"]
    assert labels == expected


@torch.no_grad()
def test_apply_ln_recompute_ln_differs_from_cached():
    _, cache, _, _ = run()
    accumulated = cache.accumulated_resid(layer=-1, incl_mid=True, pos_slice=-1)
    with_recompute = cache.apply_ln_to_stack(accumulated, layer=-1, pos_slice=-1, recompute_ln=True)
    with_cached = cache.apply_ln_to_stack(accumulated, layer=-1, pos_slice=-1, recompute_ln=False)
    assert with_recompute.shape == with_cached.shape
    assert not torch.isclose(with_recompute, with_cached, atol=1e-7).all()


@torch.no_grad()
def test_decompose_resid_with_apply_ln():
    _, cache, _, _ = run()
    per_layer_residual = cache.decompose_resid(layer=-1, pos_slice=-1)
    ref = cache.apply_ln_to_stack(per_layer_residual, layer=-1, pos_slice=-1)
    scaled = cache.decompose_resid(layer=None, pos_slice=Slice(-1), apply_ln=True)
    assert torch.isclose(ref, scaled, atol=1e-7).all()


@torch.no_grad()
def test_decompose_resid_including_attention():
    model, cache, _, _ = run()
    ref = torch.stack([cache["attn_out", l][:, -1] for l in range(model.cfg.n_layers)])
    residual_stack = cache.decompose_resid(layer=1, pos_slice=Slice(-1), mlp_input=True, apply_ln=False,
                                           incl_embeds=False, mode="attn")
    assert torch.isclose(ref, residual_stack, atol=1e-7).all()


@torch.no_grad()
def test_stack_head_results_with_apply_ln():
    _, cache, _, _ = run()
    per_head_residual = cache.stack_head_results(layer=-1, pos_slice=-1)
    ref = cache.apply_ln_to_stack(per_head_residual, layer=None, pos_slice=Slice(-1))
    scaled = cache.stack_head_results(layer=-1, pos_slice=-1, apply_ln=True)
    assert torch.isclose(ref, scaled, atol=1e-7).all()


@pytest.mark.parametrize("unit", ["head", "neuron"])
@torch.no_grad()
def test_stack_results_including_remainder(unit):
    """test_stack_head_results_including_remainder and test_stack_neuron_results_including_remainder (one body;
    upstream's neuron test passes pos_slice=Slice(-1) in its first call and -1 in the others: -1 throughout here)."""
    model, cache, _, _ = run()
    stack_fn = cache.stack_head_results if unit == "head" else cache.stack_neuron_results
    n = model.cfg.n_heads if unit == "head" else model.cfg.d_mlp
    ref_resid_post = cache["resid_post", 0][None, :, -1]
    stack, labels = stack_fn(layer=1, pos_slice=-1, incl_remainder=True, return_labels=True)
    remainder = ref_resid_post - stack[:-1].sum(dim=0)
    assert torch.isclose(remainder, stack[-1]).all()
    assert labels[:-1] == [f"L0{unit[0].upper()}{i}" for i in range(n)] and labels[-1] == "remainder"
    ref_resid_post = cache["resid_post", -1][None, :, -1]
    stack, labels = stack_fn(layer=0, pos_slice=-1, incl_remainder=True, return_labels=True)
    assert torch.isclose(ref_resid_post, stack, atol=1e-7).all()
    assert len(labels) == 1 and labels[-1] == "remainder"
    stack, labels = stack_fn(layer=0, pos_slice=-1, incl_remainder=False, return_labels=True)
    assert torch.isclose(stack, torch.zeros_like(stack)).all()
    assert len(labels) == 0


@torch.no_grad()
def test_stack_neuron_results_with_apply_ln():
    _, cache, _, _ = run()
    neuron_result_stack = cache.stack_neuron_results(layer=-1, pos_slice=-1)
    ref = cache.apply_ln_to_stack(neuron_result_stack, layer=-1, pos_slice=-1)
    scaled = cache.stack_neuron_results(layer=-1, pos_slice=Slice(-1), apply_ln=True)
    assert torch.isclose(ref, scaled, atol=1e-7).all()


@torch.no_grad()
def test_stack_neuron_results_using_neuron_slice():
    _, cache, _, _ = run()
    _, labels = cache.stack_neuron_results(layer=1, pos_slice=Slice(-1), neuron_slice=Slice([0, 1, 2]),
                                           return_labels=True)
    assert labels == [f"L0N{i}" for i in range(3)]


@torch.no_grad()
def test_remove_batch_dim():
    _, cache, _, _ = run(batch=slice(0, 1))
    assert cache.has_batch_dim
    shapes_before_removal = {key: cache.cache_dict[key].shape for key in cache.cache_dict}
    for _ in range(2):  # removing it again changes nothing
        cache.remove_batch_dim()
        assert not cache.has_batch_dim
        assert all(shapes_before_removal[key][1:] == cache.cache_dict[key].shape for key in shapes_before_removal)


@torch.no_grad()
def test_remove_batch_dim_fails_if_batch_gt_1():
    _, cache, _, _ = run()
    assert cache.has_batch_dim
    with pytest.raises(AssertionError):
        cache.remove_batch_dim()


@torch.no_grad()
def test_retrieve_activations():
    model, cache, _, _ = run()
    key = ("scale", 1, "ln1")
    assert torch.equal(cache[key], cache[get_act_name(*key)])
    assert torch.equal(cache[("scale", -1, "ln1")], cache[f"scale{model.cfg.n_layers - 1}ln1"])
    assert torch.equal(cache[("k", -1, None)], cache[f"blocks.{model.cfg.n_layers - 1}.attn.hook_k"])
    assert torch.equal(cache["embed"], cache[get_act_name("embed")])
    assert torch.equal(cache[("embed", None)], cache[get_act_name("embed", None)])


@torch.no_grad()
def test_get_items():
    _, cache, _, _ = run()
    assert all(k == k2 and torch.equal(v, v2) for (k, v), (k2, v2) in zip(cache.items(), cache.cache_dict.items()))


@torch.no_grad()
def test_get_values():
    _, cache, _, _ = run()
    assert all(torch.equal(v, v2) for v, v2 in zip(cache.values(), cache.cache_dict.values()))


@torch.no_grad()
def test_get_keys():
    _, cache, _, _ = run()
    assert all(k == k2 for k, k2 in zip(cache.keys(), cache.cache_dict.keys()))


@torch.no_grad()
def test_apply_slice_to_batch_dim():
    _, cache, _, _ = run()
    assert cache.has_batch_dim
    new_cache = cache.apply_slice_to_batch_dim(Slice((2, 4)))
    assert new_cache.has_batch_dim
    assert all(torch.equal(cache[key][2:4], new_cache[key]) for key in cache.cache_dict)
    new_cache = cache.apply_slice_to_batch_dim(2)
    assert not new_cache.has_batch_dim
    assert all(torch.equal(cache[key][2], new_cache[key]) for key in cache.cache_dict)


@torch.no_grad()
def test_toggle_autodiff():
    _, cache, _, _ = run()
    assert not torch.is_grad_enabled()
    cache.toggle_autodiff(mode=True)
    assert torch.is_grad_enabled()


@torch.no_grad()
def test_stack_activation():
    model, cache, _, _ = run()
    stack = cache.stack_activation("scale", -1, "ln1")
    assert all(torch.equal(cache[("scale", layer, "ln1")], stack[layer]) for layer in range(model.cfg.n_layers))
    stack = cache.stack_activation("scale", 1, "ln1")
    assert all(torch.equal(cache[("scale", layer, "ln1")], stack[layer]) for layer in range(1))

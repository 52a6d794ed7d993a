"""ActivationCache methods that call back into the model: logit attribution and full residual decomposition."""

import torch
from helpers import randomize

from models import HookedTransformer, HookedTransformerConfig


def _model():
    cfg = HookedTransformerConfig(n_layers=2, d_model=16, n_ctx=8, d_vocab=13, n_heads=2, d_mlp=32,
                                  normalization_type=None, seed=1, dtype="float64")
    return randomize(HookedTransformer(cfg), scale=0.2)


def test_full_resid_decomposition_sums_to_final_residual():
    model = _model()
    tokens = torch.randint(0, 13, (2, 6), generator=torch.Generator().manual_seed(0))
    _, cache = model.run_with_cache(tokens)
    parts = cache.get_full_resid_decomposition(expand_neurons=False)  # [component, batch, pos, d_model]
    torch.testing.assert_close(parts.sum(0), cache["blocks.1.hook_resid_post"], rtol=1e-10, atol=1e-10)


def test_logit_attrs_match_direct_projection():
    model = _model()
    tokens = torch.randint(0, 13, (1, 6), generator=torch.Generator().manual_seed(1))
    _, cache = model.run_with_cache(tokens)
    stack = cache.stack_head_results(layer=-1)  # [head, batch, pos, d_model]
    attrs = cache.logit_attrs(stack, tokens=torch.tensor(3), has_batch_dim=True)
    expected = stack @ model.W_U[:, 3]
    torch.testing.assert_close(attrs, expected)


def test_accumulated_bias_matches_sum_of_biases():
    model = _model()
    expected = model.blocks[0].attn.b_O + model.blocks[0].mlp.b_out + model.blocks[1].attn.b_O
    torch.testing.assert_close(model.accumulated_bias(1, mlp_input=True), expected)
    torch.testing.assert_close(model.accumulated_bias(0), torch.zeros(16, dtype=torch.float64))

"""Per-head and full circuits against their dense definitions; LayerNorm folding."""

import warnings

import pytest
import torch

import circuits
from circuits.testing import random_model
from models import lm_cross_entropy


@pytest.fixture(scope="module")
def model():
    return random_model(n_layers=2, n_heads=3, positional="shortformer", seed=3)


def test_qk_ov_circuits_match_dense(model):
    for l in range(2):
        for h in range(3):
            assert torch.allclose(circuits.qk_circuit(model, l, h).AB, model.W_Q[l, h] @ model.W_K[l, h].T)
            assert torch.allclose(circuits.ov_circuit(model, l, h).AB, model.W_V[l, h] @ model.W_O[l, h])
    assert circuits.qk_circuit(model).shape == (2, 3, 16, 16)
    assert circuits.ov_circuit(model, 1).shape == (3, 16, 16)
    assert torch.allclose(circuits.ov_circuit(model, 1).AB[2], circuits.ov_circuit(model, 1, 2).AB)


def test_full_circuits_match_dense(model):
    W_E, W_U = model.W_E, model.W_U
    l, h = 1, 2
    qk = model.W_Q[l, h] @ model.W_K[l, h].T
    ov = model.W_V[l, h] @ model.W_O[l, h]
    full_qk = circuits.full_qk_circuit(model, l, h)
    assert full_qk.shape == (23, 23) and full_qk.mdim == 6
    assert torch.allclose(full_qk.AB, W_E @ qk @ W_E.T)
    full_ov = circuits.full_ov_circuit(model, l, h)
    assert full_ov.mdim == 6 and torch.allclose(full_ov.AB, W_E @ ov @ W_U)
    assert torch.allclose(circuits.full_ov_circuit(model).AB[l, h], full_ov.AB)


def test_positional_full_qk_parts_sum_to_scores(model):
    """Shortformer: the query/key inputs of layer 0 are W_E[t] + W_pos[i]; the four parts sum to the scores."""
    parts = circuits.full_qk_circuit(model, 0, 1, positional=True)
    tokens = torch.tensor([[3, 7, 7, 1, 22, 0]])
    _, cache = model.run_with_cache(tokens, names_filter="blocks.0.attn.hook_attn_scores")
    scores = cache["blocks.0.attn.hook_attn_scores"][0, 1]  # includes b_Q, b_K: compare without them
    x = model.W_E[tokens[0]] + model.W_pos[:6]
    q, k = x @ model.W_Q[0, 1], x @ model.W_K[0, 1]
    dense = q @ k.T
    assert torch.allclose(parts.total(tokens[0], tokens[0]), dense)
    with_bias = (q + model.b_Q[0, 1]) @ (k + model.b_K[0, 1]).T / 6**0.5
    mask = torch.ones(6, 6, dtype=torch.bool).tril()
    assert torch.allclose(with_bias[mask], scores[mask])
    assert parts.tok_pos.shape == (23, 12) and parts.pos_pos.shape == (12, 12)


def test_positional_full_qk_needs_a_table():
    m = random_model(n_layers=1, positional="rotary")
    with pytest.raises(ValueError, match="positional table"):
        circuits.full_qk_circuit(m, 0, 0, positional=True)


def test_k_composition_circuit_matches_dense(model):
    W_E = model.W_E
    qk2 = model.W_Q[1, 0] @ model.W_K[1, 0].T
    ov1 = model.W_V[0, 2] @ model.W_O[0, 2]
    fm = circuits.k_composition_circuit(model, (1, 0), (0, 2))
    assert fm.mdim == 6
    assert torch.allclose(fm.AB, W_E @ qk2 @ ov1.T @ W_E.T)
    with pytest.raises(ValueError, match="strictly before"):
        circuits.k_composition_circuit(model, (0, 0), (1, 0))


@pytest.mark.parametrize("norm,kw", [("RMS", dict(gated_mlp=True, act_fn="silu")), ("LN", dict(parallel_attn_mlp=True)),
                                     ("LN", dict(final_rms=True)), ("LN", dict(act_fn="solu_ln"))])
def test_fold_layer_norm_keeps_log_probs_of_tl2_blocks(norm, kw):
    """Gated (W_gate reads ln2), parallel, final RMSNorm after LN blocks (no centring then) and SoLU-LN MLPs."""
    m = random_model(n_layers=2, normalization=norm, attn_only=False, seed=5)
    m = type(m)(m.cfg.replace(**kw))
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(2), dtype=p.dtype) * 0.3)
    tokens = torch.randint(0, 23, (3, 12), generator=torch.Generator().manual_seed(0))
    folded = circuits.fold_layer_norm(m)
    assert torch.allclose(m(tokens).log_softmax(-1), folded(tokens).log_softmax(-1), atol=1e-10, rtol=0)
    with pytest.raises(ValueError, match="gated"):
        circuits.fold_layer_norm(type(m)(m.cfg.replace(normalization_type="LN", gated_mlp=True)))


@pytest.mark.parametrize("norm", ["LN", "RMS"])
@pytest.mark.parametrize("positional", ["standard", "shortformer"])
@pytest.mark.parametrize("attn_only", [True, False])
def test_fold_layer_norm_keeps_log_probs(norm, positional, attn_only):
    m = random_model(n_layers=2, positional=positional, normalization=norm, attn_only=attn_only, seed=5)
    if positional == "shortformer":  # positions join after ln1: its weight cannot be folded into W_Q / W_K
        with pytest.raises(ValueError, match="shortformer"):
            circuits.fold_layer_norm(m)
        return
    tokens = torch.randint(0, 23, (3, 12), generator=torch.Generator().manual_seed(0))
    folded = circuits.fold_layer_norm(m, center_unembed=True)
    lp, lp_f = m(tokens).log_softmax(-1), folded(tokens).log_softmax(-1)
    assert torch.allclose(lp, lp_f, atol=1e-10, rtol=0), (lp - lp_f).abs().max()
    assert folded.cfg.extra["layer_norm_folded"] and "layer_norm_folded" not in m.cfg.extra
    assert not hasattr(folded.blocks[0].ln1, "w") and folded.cfg.normalization_type == norm + "Pre"
    if norm == "LN":
        assert folded.W_E.mean(-1).abs().max() < 1e-12 and folded.W_O.mean(-1).abs().max() < 1e-12
        assert torch.allclose(lm_cross_entropy(m(tokens), tokens), lm_cross_entropy(folded(tokens), tokens))
    assert not torch.all(m.blocks[0].ln1.w == 1)  # the original is untouched


def test_unfolded_norm_warns_and_folded_does_not():
    m = random_model(n_layers=1, normalization="LN", seed=2)
    with pytest.warns(UserWarning, match="fold_layer_norm"):
        circuits.ov_circuit(m, 0, 0)
    folded = circuits.fold_layer_norm(m)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        circuits.ov_circuit(folded, 0, 0)
        circuits.copying_scores(folded)


def test_fold_layer_norm_rejects_foreign_objects():
    with pytest.raises(TypeError):
        circuits.fold_layer_norm(object())

"""The hand-built induction model: its circuits show the mechanism, and it behaves as built."""

import pytest
import torch

import circuits
from circuits.testing import build_induction_model, induction_tokens


@pytest.mark.parametrize("positional", ["shortformer", "standard"])
@pytest.mark.parametrize("noise", [0.0, 0.02])
def test_induction_pair_has_by_far_the_largest_k_composition(positional, noise):
    model, info = build_induction_model(positional=positional, noise=noise, seed=1)
    (pl, ph), = info.previous_token_heads
    (il, ih), = info.induction_heads
    k = circuits.composition_scores(model, "k")
    pair = float(k[pl, ph, il, ih])
    others = k.clone()
    others[pl, ph, il, ih] = 0
    assert pair == pytest.approx(0.25 if noise == 0 else pair)  # identity of rank d_vocab=16: 1/√16
    assert pair > 2.5 * float(others.max())
    for kind in ("q", "v"):  # no other composition of any kind rivals it
        assert pair > 2.5 * float(circuits.composition_scores(model, kind).max())
    kc = circuits.k_composition_circuit(model, (il, ih), (pl, ph))
    assert float(circuits.copying_score(kc)) > 0.9
    assert float(circuits.positive_eigenvalue_fraction(kc)) > 0.9


def test_head_roles_in_weights():
    model, info = build_induction_model()
    cs = circuits.copying_scores(model)
    for l, h in info.copying_heads:
        assert float(cs[l, h]) == pytest.approx(1.0)
    for l, h in info.anti_copying_heads:
        assert float(cs[l, h]) == pytest.approx(-1.0)
    for l, h in info.previous_token_heads + info.current_token_heads:
        assert float(cs[l, h]) == 0.0  # they write to subspaces the unembedding does not read
    (l, h), = info.copying_heads
    stats = circuits.diagonal_rank_stats(circuits.full_ov_circuit(model, l, h), k=(1, 5))
    assert float(stats[1]) == 1.0
    assert set(info.subspaces) == {"tok", "prev", "out", "scratch", "pos"}
    assert model.cfg.d_model == 4 * 16 + 32 and model.cfg.n_layers == 2 and model.cfg.attn_only


@pytest.mark.parametrize("positional", ["shortformer", "standard"])
def test_induction_model_behaves_as_built(positional):
    model, info = build_induction_model(positional=positional)
    tokens = induction_tokens(d_vocab=16, batch=3, seed=2)  # [BOS] + R + R, |R| = 15
    assert tokens.shape == (3, 31) and torch.all(tokens[:, 1:16] == tokens[:, 16:])
    logits, cache = model.run_with_cache(tokens)
    half = 15
    (pl, ph), = info.previous_token_heads
    prev = cache[f"blocks.{pl}.attn.hook_pattern"][:, ph]
    assert float(prev.diagonal(offset=-1, dim1=-2, dim2=-1).mean()) > 0.99
    (il, ih), = info.induction_heads
    ind = cache[f"blocks.{il}.attn.hook_pattern"][:, ih]
    # from each token of the second copy to the token after its first occurrence
    # (query i -> key i - 14; the first two such queries, at 14 and 15, are still in the first copy)
    assert float(ind.diagonal(offset=1 - half, dim1=-2, dim2=-1)[:, 2:].mean()) > 0.99
    (cl, ch), = info.current_token_heads
    assert float(cache[f"blocks.{cl}.attn.hook_pattern"][:, ch].diagonal(dim1=-2, dim2=-1).mean()) > 0.99
    (fl, fh), = info.first_token_heads
    assert float(cache[f"blocks.{fl}.attn.hook_pattern"][:, fh][..., 0].mean()) > 0.99
    pred = logits.argmax(-1)[:, half + 1:-1]
    assert torch.equal(pred, tokens[:, half + 2:])  # every second-half next token predicted


def test_induction_tokens_validation():
    with pytest.raises(ValueError):
        induction_tokens(d_vocab=8, half_len=8)
    t = induction_tokens(d_vocab=8, half_len=4, batch=2, bos=3)
    assert t.shape == (2, 9) and torch.all(t[:, 0] == 3) and not torch.any(t[:, 1:] == 3)

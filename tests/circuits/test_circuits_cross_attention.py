"""Cross-attention circuits and the encoder–decoder path expansion against float64 loop references and exact sums."""

import itertools
import math

import pytest
import torch
from helpers import randomize

from circuits.cross_attention import (
    cross_attention_map,
    cross_copying_scores,
    cross_diagonal_accuracy,
    cross_ov_circuit,
    cross_qk_circuit,
    full_cross_ov_circuit,
    full_cross_qk_circuit,
    stack_view,
)
from circuits.encdec_paths import encdec_path_expansion
from models import EncoderDecoderConfig, HookedEncoderDecoder
from models.errors import ConfigError

POS = ["standard", "sinusoidal", "shortformer", "rotary", "alibi", "none"]


def make(positional="standard", norm=None, bias=False, n_enc=1, n_dec=1, d_vocab_tgt=11, seed=0, **kw):
    cfg = EncoderDecoderConfig(d_model=12, d_vocab_src=11, d_vocab_tgt=d_vocab_tgt, n_ctx_src=7, n_ctx_tgt=6,
                               n_heads=2, d_head=4, n_encoder_layers=n_enc, n_decoder_layers=n_dec,
                               positional_embedding_type=positional, normalization_type=norm, use_bias=bias,
                               dtype="float64", seed=seed, **kw)
    return randomize(HookedEncoderDecoder(cfg), seed=seed).eval()


def batch(seed=0, B=2, S=7, T=6):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 11, (B, S), generator=g), torch.randint(3, 11, (B, T), generator=g)


def test_cross_qk_and_ov_match_loops():
    m = make()
    for l, h in itertools.product(range(1), range(2)):
        W_Q, W_K, W_V, W_O = (getattr(m.decoder[l].cross_attn, n)[h].detach() for n in ("W_Q", "W_K", "W_V", "W_O"))
        torch.testing.assert_close(cross_qk_circuit(m, l, h).AB, W_Q @ W_K.T, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(cross_ov_circuit(m, l, h).AB, W_V @ W_O, rtol=1e-12, atol=1e-12)
        full = full_cross_ov_circuit(m, l, h).AB.detach()
        assert full.shape == (11, 11)
        for s, o in [(0, 0), (3, 7), (10, 4)]:
            ref = sum(m.W_E_src[s, a] * W_V[a, e] * W_O[e, b] * m.W_U[b, o]
                      for a in range(12) for e in range(4) for b in range(12))
            assert abs(float(full[s, o] - ref)) < 1e-10


@pytest.mark.parametrize("positional", ["standard", "sinusoidal", "shortformer"])
def test_full_cross_qk_is_the_real_score_on_the_direct_path(positional):
    """With the encoder's and decoder self-attention's outputs zeroed, the decoder query input is
    W_E_tgt[t] + W_pos_tgt[i] and the key input W_E_src[s] + W_pos_src[j]: the PositionalQK parts must sum to the
    model's own cross-attention scores × √d_head."""
    m = make(positional)
    with torch.no_grad():
        m.encoder[0].attn.W_O.zero_()
        m.decoder[0].attn.W_O.zero_()
    src, tgt = batch()
    _, cache = m.run_with_cache(src, tgt)
    scores = cache["decoder.0.cross_attn.hook_attn_scores"]  # [batch, head, target, source]
    for h in range(2):
        parts = full_cross_qk_circuit(m, 0, h, positional=True)
        assert parts.tok_pos.shape == (11, 7) and parts.pos_tok.shape == (6, 11)
        for b in range(2):
            torch.testing.assert_close(parts.total(tgt[b], src[b]) / math.sqrt(4), scores[b, h], rtol=1e-9,
                                       atol=1e-9)
        tok = full_cross_qk_circuit(m, 0, h).AB
        torch.testing.assert_close(tok, parts.tok_tok.AB)


def test_positional_refused_without_table():
    with pytest.raises(ConfigError, match="positional table"):
        full_cross_qk_circuit(make("rotary"), 0, 0, positional=True)


def test_cross_copying_scores_match_dense_eigenvalues():
    m = make()
    cs = cross_copying_scores(m)
    assert cs.shape == (1, 2)
    for h in range(2):
        dense = (m.W_E_src @ m.cross_W_V[0, h] @ m.cross_W_O[0, h] @ m.W_U).detach()
        lam = torch.linalg.eigvals(dense)
        assert abs(float(cs[0, h]) - float(lam.sum().real / lam.abs().sum())) < 1e-9


def test_cross_diagonal_accuracy_matches_dense_ranks():
    m = make(n_dec=2, seed=3)
    ids = [3, 4, 6, 7, 8, 10]
    acc = cross_diagonal_accuracy(m, ids, k=(1, 5))
    assert acc[1].shape == (2, 2)
    for l, h in itertools.product(range(2), range(2)):
        dense = (m.W_E_src @ m.cross_W_V[l, h] @ m.cross_W_O[l, h] @ m.W_U).detach()[ids][:, ids]
        rank = (dense > dense.diagonal()[:, None]).sum(-1)  # entries above the row's own
        for k in (1, 5):
            assert float(acc[k][l, h]) == pytest.approx(float((rank < k).double().mean()), abs=1e-12)
    with pytest.raises(ConfigError, match="d_vocab_src=11, d_vocab_tgt=9"):
        cross_diagonal_accuracy(make(d_vocab_tgt=9))


def test_copying_refused_for_different_vocabularies():
    with pytest.raises(ConfigError, match="d_vocab_src=11, d_vocab_tgt=9"):
        cross_copying_scores(make(d_vocab_tgt=9))


def test_stack_view_names_and_refusals():
    m = make()
    v = stack_view(m, "cross")
    assert v.cfg.n_layers == 1 and v.W_E is m.W_E_src and torch.equal(v.W_V, m.cross_W_V)
    assert stack_view(m, "decoder").W_E is m.W_E_tgt
    with pytest.raises(ValueError, match="stack='mlp'"):
        stack_view(m, "mlp")
    with pytest.raises(TypeError, match="encoder-decoder"):
        stack_view(torch.nn.Linear(2, 2), "cross")


def test_cross_attention_map_is_the_head_output():
    """(A_cross ⊗ W_V W_O)·x_encoder equals the head's hook_result minus its b_V W_O (biases on)."""
    m = make(bias=True)
    src, tgt = batch()
    _, cache = m.run_with_cache(src, tgt)
    memory = cache["encoder.0.hook_resid_post"]  # no norms: the encoder's output
    A = cache["decoder.0.cross_attn.hook_pattern"]
    for h in range(2):
        out = cross_attention_map(A[:, h], cross_ov_circuit(m, 0, h)).apply(memory)
        result = cache["decoder.0.cross_attn.hook_result"][:, :, h]
        torch.testing.assert_close(out + m.cross_b_V[0, h] @ m.cross_W_O[0, h], result, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("positional,norm,bias,layers", [
    ("standard", None, False, (1, 1)), ("sinusoidal", "LN", True, (2, 2)), ("shortformer", "RMS", True, (1, 2)),
    ("rotary", "LN", False, (2, 1)), ("alibi", None, True, (2, 2)), ("none", "LN", True, (1, 1))])
def test_encdec_path_terms_sum_to_logits_float64(positional, norm, bias, layers):
    m = make(positional, norm, bias, *layers)
    src, tgt = batch()
    src_mask = torch.ones_like(src, dtype=torch.bool)
    src_mask[1, 5:] = False
    exp = encdec_path_expansion(m, src, tgt, src_mask=src_mask)
    assert exp.reconstruction_error < 1e-10
    Le, Ld = layers
    # every source path: 3^Le encoder paths into each of the 2*Ld cross heads, then 3^(Ld-1-l) decoder paths
    n_src = sum(3 ** Le * 2 * 3 ** (Ld - 1 - l) for l in range(Ld))
    assert len(exp.names(source="src")) == n_src
    assert len(exp.names(source="tok")) == 3 ** Ld
    assert ("direct[pos]" in exp.terms) == (positional in ("standard", "sinusoidal"))
    assert all(exp.orders[n] >= 1 for n in exp.names(source="src"))
    assert "C0H1[src]" in exp.terms and "direct" in exp.terms


def test_encdec_path_first_order_cross_term_is_a_loop():
    """C0H1[src] on a norm-free 1+1 model: Σ_j A[i, j] W_E_src[s_j] W_V W_O W_U, a loop over positions."""
    m = make()
    src, tgt = batch()
    exp = encdec_path_expansion(m, src, tgt, max_order=1)
    _, cache = m.run_with_cache(src, tgt)
    A = cache["decoder.0.cross_attn.hook_pattern"]
    full = full_cross_ov_circuit(m, 0, 1).AB
    term = exp.terms["C0H1[src]"]
    for b, i in [(0, 0), (1, 5)]:
        ref = sum(A[b, 1, i, j] * full[src[b, j]] for j in range(7))
        torch.testing.assert_close(term[b, i], ref, rtol=1e-10, atol=1e-10)
    assert max(exp.orders.values()) == 1


def test_encdec_path_refusals():
    with pytest.raises(ConfigError, match="attention-only"):
        encdec_path_expansion(make(d_mlp=8), *batch())
    with pytest.raises(ConfigError, match="pre-norm"):
        encdec_path_expansion(make(norm="LN", normalization_position="post"), *batch())


def test_path_expansion_refuses_a_masked_lm_head():
    from circuits import path_expansion
    from models.arch.encoder import EncoderConfig, HookedEncoder

    m = HookedEncoder(EncoderConfig(n_layers=1, d_model=16, n_ctx=8, d_vocab=20, n_heads=2, seed=0))
    with pytest.raises(ValueError, match="masked-LM head"):
        path_expansion(m, torch.randint(3, 20, (1, 8)))

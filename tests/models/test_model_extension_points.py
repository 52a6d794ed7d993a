"""The extension points of the model: positional schemes (`models.arch.positions`), attention-score biases
(`models.arch.score_bias`) and attention with separate query / key / value inputs.

A positional scheme defined here, in a test file, must work everywhere (model, generation, path expansion, score
decomposition, full QK circuits) without touching any other file: that is what makes a new type cost one module."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import circuits
from models import HookedTransformer, HookedTransformerConfig
from models.arch.components import Attention
from models.arch.positions import SCHEMES, ALiBiBias, PositionalScheme, Rotary, alibi_bias, sinusoidal_table
from models.arch.score_bias import Bidirectional, Causal, combine


@pytest.fixture
def new_schemes():
    """Two schemes no module defines: a fixed table on queries/keys only, and rotary plus ALiBi at once."""

    class FixedShortformer(PositionalScheme):
        name = "test-fixed-shortformer"
        table, adds_to = "fixed", "query_key"

        def fixed_table(self, n_pos, dtype=torch.float32, device=None):
            return sinusoidal_table(n_pos, self.cfg.d_model, dtype, device)

    class RotaryALiBi(Rotary):
        name = "test-rotary-alibi"
        biases_scores = True
        transformer_lens_type = None

        def score_bias(self):
            return ALiBiBias(self.cfg.n_heads)

    yield FixedShortformer, RotaryALiBi
    for cls in (FixedShortformer, RotaryALiBi):
        del SCHEMES[cls.name]


def _model(positions: str, seed: int = 0, **kw) -> HookedTransformer:
    cfg = HookedTransformerConfig(n_layers=2, d_model=16, n_ctx=12, d_vocab=23, n_heads=2, d_mlp=None,
                                  normalization_type=None, positional_embedding_type=positions, dtype="float64",
                                  seed=seed, **kw)
    model = HookedTransformer(cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.3)
    return model


def test_a_scheme_declared_in_one_place_works_everywhere(new_schemes):
    fixed_qk, _ = new_schemes
    model = _model(fixed_qk.name)
    assert "pos_embed.W_pos" not in model.state_dict()  # a fixed table is a buffer, not saved
    short = _model("shortformer")
    short.load_state_dict({**model.state_dict(), "pos_embed.W_pos": sinusoidal_table(12, 16, torch.float64)})
    tokens = torch.randint(0, 23, (3, 10), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(model(tokens), short(tokens), rtol=1e-12, atol=1e-12)
    _, cache = model.run_with_cache(tokens)
    assert not cache.has_pos_embed  # positions never enter the residual stream
    long = torch.randint(0, 23, (1, 20), generator=torch.Generator().manual_seed(2))  # past n_ctx: rows computed
    assert model(long).shape == (1, 20, 23)
    seq = long[:, :11]
    for _ in range(3):  # greedy by hand over the whole context: a fixed table has no n_ctx limit to truncate to
        seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(model.generate(long[:, :11], max_new_tokens=3, temperature=0), seq)
    pe = circuits.path_expansion(model, tokens)
    assert pe.reconstruction_error < 1e-10 and not pe.names(source="pos")
    dec = circuits.attention_score_decomposition(model, tokens, 1, 0)
    assert dec.reconstruction_error < 1e-10 and ("pos", "pos") in dec.terms
    parts = circuits.full_qk_circuit(model, 0, 1, positional=True)
    q, k = tokens[0, :6], tokens[0, :6]
    direct = (model.W_E[q] + model.W_pos[:6]) @ model.W_Q[0, 1] @ model.W_K[0, 1].T @ (model.W_E[k] + model.W_pos[:6]).T
    torch.testing.assert_close(parts.total(q, k), direct)


@pytest.mark.tl4
def test_a_scheme_with_rotation_and_score_bias(new_schemes):
    _, rot_alibi = new_schemes
    both, rotary = _model(rot_alibi.name), _model("rotary")
    rotary.load_state_dict(both.state_dict())
    tokens = torch.randint(0, 23, (2, 9), generator=torch.Generator().manual_seed(3))
    name = "blocks.0.attn.hook_attn_scores"
    s_both = both.run_with_cache(tokens, names_filter=name)[1][name]
    s_rot = rotary.run_with_cache(tokens, names_filter=name)[1][name]
    keep = torch.ones(9, 9, dtype=torch.bool).tril()
    alibi = alibi_bias(2, 9, 9, torch.float64)[None].expand(2, -1, -1, -1)  # [batch, head, q, k]
    torch.testing.assert_close((s_both - s_rot)[..., keep], alibi[..., keep])
    assert circuits.path_expansion(both, tokens).reconstruction_error < 1e-10
    dec = circuits.attention_score_decomposition(both, tokens, 1, 1)
    assert dec.alibi is not None and dec.reconstruction_error < 1e-10
    with pytest.raises(NotImplementedError, match="no TransformerLens"):
        from models import to_transformer_lens

        to_transformer_lens(both)


@pytest.mark.parametrize("bias", ["causal", "bidirectional", "alibi", "causal+alibi"])
@pytest.mark.parametrize("n_q", [5, 2])
def test_score_bias_explicit_and_fused_forms_agree(bias, n_q):
    """softmax(q·kᵀ/√d + dense) v == scaled_dot_product_attention(*sdpa_args), also with fewer queries than keys
    (queries are the last positions), against a loop over (query, key) written from the definitions."""
    H, n_k, d = 3, 5, 4
    parts = {"causal": [Causal()], "bidirectional": [Bidirectional()], "alibi": [ALiBiBias(H)],
             "causal+alibi": [Causal(), ALiBiBias(H)]}[bias]
    sb = combine(*parts)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, H, n, d, generator=g, dtype=torch.float64) for n in (n_q, n_k, n_k))
    expected = torch.zeros(2, H, n_q, d, dtype=torch.float64)
    slopes = [2.0 ** (-8.0 * (h + 1) / H) for h in range(H)]
    for h in range(H):
        for i in range(n_q):
            pos_i = n_k - n_q + i  # queries are the last n_q positions
            keys = [j for j in range(n_k) if "causal" not in bias or j <= pos_i]
            s = torch.stack([(q[:, h, i] * k[:, h, j]).sum(-1) / math.sqrt(d)
                             - ("alibi" in bias) * slopes[h] * abs(pos_i - j) for j in keys], -1)
            expected[:, h, i] = (s.softmax(-1)[..., None] * v[:, h, keys]).sum(-2)
    dense = sb.dense(n_q, n_k, torch.float64)
    scores = q @ k.transpose(-1, -2) / math.sqrt(d) + (0 if dense is None else dense)
    torch.testing.assert_close(scores.softmax(-1) @ v, expected)
    mask, is_causal = sb.sdpa_args(n_q, n_k, torch.float64)
    torch.testing.assert_close(F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal), expected)


@pytest.mark.parametrize("gqa", [1, 2])
def test_attention_with_separate_query_and_key_value_inputs(gqa):
    """Queries from one stream [batch, 3, d_model], keys and values from another [batch, 7, d_model] (the shape of
    cross-attention), against a float64 computation of the definition; and one fused QKV matmul equals three."""
    cfg = HookedTransformerConfig(n_layers=1, d_model=8, n_ctx=8, d_vocab=5, n_heads=2, n_key_value_heads=2 // gqa,
                                  dtype="float64", seed=0)
    attn = Attention(cfg)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in attn.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64))
    x_q, x_kv = (torch.randn(2, n, 8, generator=g, dtype=torch.float64) for n in (3, 7))
    out = attn(x_q, x_kv, x_kv, Bidirectional())
    expected = attn.b_O.expand(2, 3, 8).clone()
    for h in range(2):
        kv = h // gqa
        q = x_q @ attn.W_Q[h] + attn.b_Q[h]
        k, v = x_kv @ attn.W_K[kv] + attn.b_K[kv], x_kv @ attn.W_V[kv] + attn.b_V[kv]
        expected += ((q @ k.transpose(-1, -2) / 2).softmax(-1) @ v) @ attn.W_O[h]  # √d_head = 2
    torch.testing.assert_close(out, expected)
    x = torch.randn(2, 6, 8, generator=g, dtype=torch.float64)
    torch.testing.assert_close(attn(x, x, x, Causal()), attn(x.clone(), x.clone(), x.clone(), Causal()))

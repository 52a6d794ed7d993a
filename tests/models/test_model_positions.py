"""Positional schemes: rotary depends on relative position only, ALiBi slopes and bias, the sinusoidal table,
shortformer keeps positions out of the residual stream, and contexts beyond n_ctx where the scheme allows."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import randomize

from models import HookedTransformer, HookedTransformerConfig
from models.arch.positions import alibi_bias, alibi_slopes, apply_rotary, rotary_angles, sinusoidal_table


def make(kind, n_layers=1, attention_dir="causal", norm="LN", mlp=True, **kw):
    cfg = HookedTransformerConfig(n_layers=n_layers, d_model=16, n_ctx=8, d_vocab=20, n_heads=4,
                                  d_mlp=32 if mlp else None, normalization_type=norm, positional_embedding_type=kind,
                                  attention_dir=attention_dir, dtype="float64", seed=0, **kw)
    return randomize(HookedTransformer(cfg), scale=0.4, seed=1)


# --- rotary ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("adjacent", [False, True])
@pytest.mark.parametrize("rotary_dim", [8, 4])
def test_rotary_dot_product_depends_on_relative_position_only(adjacent, rotary_dim):
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 1, 1, 8, generator=g, dtype=torch.float64)  # [pos=1, head=1, d_head=8] each
    cos, sin = rotary_angles(40, rotary_dim, 10000.0, torch.float64)

    def score(m, n):  # rotate q as at position m, k as at position n
        qm = apply_rotary(q[None], cos[m : m + 1], sin[m : m + 1], adjacent)
        kn = apply_rotary(k[None], cos[n : n + 1], sin[n : n + 1], adjacent)
        return float((qm * kn).sum())

    for m, n in [(5, 2), (3, 3), (0, 7), (9, 1)]:
        for s in (1, 4, 17, 30):
            assert score(m + s, n + s) == pytest.approx(score(m, n), rel=1e-12, abs=1e-12)
    assert abs(score(5, 2) - score(5, 3)) > 1e-3  # it does depend on the offset


@pytest.mark.parametrize("adjacent", [False, True])
def test_rotary_is_a_rotation_in_the_documented_pairs(adjacent):
    """Position 1 rotates pair k by θ_k = base^(-2k/d): check with a one-hot input per feature."""
    d, base = 8, 100.0
    cos, sin = rotary_angles(2, d, base, torch.float64)
    for k in range(d // 2):
        theta = base ** (-2 * k / d)
        i, j = (2 * k, 2 * k + 1) if adjacent else (k, k + d // 2)
        x = torch.zeros(1, 1, 1, d, dtype=torch.float64)
        x[..., i] = 1.0
        out = apply_rotary(x, cos[1:2], sin[1:2], adjacent)[0, 0, 0]
        expected = torch.zeros(d, dtype=torch.float64)
        expected[i], expected[j] = math.cos(theta), math.sin(theta)
        torch.testing.assert_close(out, expected, rtol=0, atol=1e-15)


@pytest.mark.parametrize("adjacent", [False, True])
@pytest.mark.parametrize("shift", [1, 3])
def test_rotary_model_scores_are_shift_invariant(adjacent, shift):
    """Layer-0 queries and keys see only their own token, so the same tokens at positions shifted by s give
    the same attention scores."""
    model = make("rotary", rotary_adjacent_pairs=adjacent, rotary_dim=2)
    content = torch.tensor([[3, 7, 1, 7, 12, 5]])
    shifted = torch.cat([torch.tensor([[9] * shift]), content], dim=1)
    _, c0 = model.run_with_cache(content, names_filter="blocks.0.attn.hook_attn_scores")
    _, c1 = model.run_with_cache(shifted, names_filter="blocks.0.attn.hook_attn_scores")
    a, b = c0["blocks.0.attn.hook_attn_scores"], c1["blocks.0.attn.hook_attn_scores"][:, :, shift:, shift:]
    torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    # ... but the scores do depend on position: the two 7s score differently against the same query
    assert not torch.allclose(a[0, :, 3, 1], a[0, :, 3, 3])


# --- ALiBi ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n_heads", [1, 2, 4, 8, 12])
def test_alibi_slopes(n_heads):
    expected = torch.tensor([2 ** (-8 * i / n_heads) for i in range(1, n_heads + 1)], dtype=torch.float64)
    torch.testing.assert_close(alibi_slopes(n_heads), expected, rtol=0, atol=0)
    if n_heads == 8:  # Press et al.: 1/2, 1/4, ..., 1/256
        assert alibi_slopes(8).tolist() == [1 / 2**i for i in range(1, 9)]


@pytest.mark.parametrize("q_len,k_len", [(5, 5), (2, 6)])
def test_alibi_bias(q_len, k_len):
    n = 4
    bias = alibi_bias(n, q_len, k_len, torch.float64)
    assert bias.shape == (n, q_len, k_len)
    for h in range(n):
        m = 2 ** (-8 * (h + 1) / n)
        for a in range(q_len):
            i = k_len - q_len + a  # absolute query position
            for j in range(k_len):
                assert float(bias[h, a, j]) == pytest.approx(-m * abs(i - j), abs=1e-15)


@pytest.mark.parametrize("attention_dir", ["causal", "bidirectional"])
def test_alibi_scores_in_model_are_the_bias_when_qk_is_zero(attention_dir):
    model = make("alibi", attention_dir=attention_dir)
    with torch.no_grad():
        model.blocks[0].attn.W_Q.zero_()
        model.blocks[0].attn.b_Q.zero_()
    _, cache = model.run_with_cache(torch.tensor([[1, 2, 3, 4, 5]]))
    scores = cache["blocks.0.attn.hook_attn_scores"][0]  # [head, pos, key]
    for h in range(4):
        m = 2 ** (-8 * (h + 1) / 4)
        for i in range(5):
            for j in range(5):
                if attention_dir == "causal" and j > i:
                    assert scores[h, i, j] == float("-inf")
                else:
                    assert float(scores[h, i, j]) == pytest.approx(-m * abs(i - j), abs=1e-12)


# --- sinusoidal -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("n_ctx,d", [(7, 6), (50, 16)])
def test_sinusoidal_table(n_ctx, d):
    table = sinusoidal_table(n_ctx, d, torch.float64)
    for p in range(n_ctx):
        for j in range(d):
            x = p / 10000 ** ((j - j % 2) / d)
            assert float(table[p, j]) == pytest.approx(math.sin(x) if j % 2 == 0 else math.cos(x), abs=1e-14)


def test_sinusoidal_model_uses_the_fixed_table():
    model = make("sinusoidal")
    torch.testing.assert_close(model.W_pos, sinusoidal_table(8, 16, torch.float64), rtol=0, atol=0)
    assert "pos_embed.W_pos" not in model.state_dict()  # fixed: not a parameter, not saved
    assert not any("W_pos" in n for n, _ in model.named_parameters())
    tokens = torch.tensor([[1, 2, 3, 4, 5, 6]])
    _, cache = model.run_with_cache(tokens)
    torch.testing.assert_close(cache["hook_pos_embed"][0], sinusoidal_table(6, 16, torch.float64))
    torch.testing.assert_close(cache["blocks.0.hook_resid_pre"], cache["hook_embed"] + cache["hook_pos_embed"])


# --- shortformer ----------------------------------------------------------------------------------------
def test_shortformer_residual_carries_no_position():
    model = make("shortformer", n_layers=2)
    tokens = torch.tensor([[4, 4, 4, 9, 1]])
    _, cache = model.run_with_cache(tokens)
    assert torch.equal(cache["blocks.0.hook_resid_pre"], cache["hook_embed"])
    torch.testing.assert_close(cache["hook_pos_embed"][0], model.W_pos[:5], rtol=0, atol=0)
    # values see no position: hook_v = LN(embed) W_V + b_V; identical tokens get identical values
    ln = model.blocks[0].ln1
    x = torch.nn.functional.layer_norm(cache["hook_embed"], (16,), ln.w, ln.b, ln.eps)
    v = torch.einsum("bpd,hde->bphe", x, model.blocks[0].attn.W_V) + model.blocks[0].attn.b_V
    torch.testing.assert_close(cache["blocks.0.attn.hook_v"], v)
    torch.testing.assert_close(cache["blocks.0.attn.hook_v"][0, 0], cache["blocks.0.attn.hook_v"][0, 2])
    # queries and keys do see position: the three identical tokens get different queries
    assert not torch.allclose(cache["blocks.0.attn.hook_q"][0, 0], cache["blocks.0.attn.hook_q"][0, 1])


def test_shortformer_positions_change_attention_only():
    model = make("shortformer", mlp=False)
    tokens = torch.tensor([[4, 5, 6, 7]])
    _, before = model.run_with_cache(tokens)
    with torch.no_grad():
        model.pos_embed.W_pos.mul_(3.0)
    _, after = model.run_with_cache(tokens)
    assert torch.equal(before["blocks.0.hook_resid_pre"], after["blocks.0.hook_resid_pre"])
    assert torch.equal(before["blocks.0.attn.hook_v"], after["blocks.0.attn.hook_v"])
    assert not torch.allclose(before["blocks.0.attn.hook_pattern"], after["blocks.0.attn.hook_pattern"])


# --- contexts longer than n_ctx ---------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["sinusoidal", "rotary", "alibi", "none"])
def test_long_context_works_for_fixed_positions(kind):
    model = make(kind, n_layers=2)
    tokens = torch.randint(0, 20, (2, 13), generator=torch.Generator().manual_seed(0))
    logits = model(tokens)
    assert logits.shape == (2, 13, 20) and torch.isfinite(logits).all()
    # causal: the first n_ctx positions do not see the rest
    torch.testing.assert_close(logits[:, :8], model(tokens[:, :8]))
    explicit, _ = model.run_with_cache(tokens)
    torch.testing.assert_close(explicit, logits)


def test_sinusoidal_long_context_extends_the_same_table():
    model = make("sinusoidal")
    torch.testing.assert_close(model.pos_embed.rows(20)[:8], model.W_pos, rtol=0, atol=0)
    torch.testing.assert_close(model.pos_embed.rows(20), sinusoidal_table(20, 16, torch.float64))


@pytest.mark.parametrize("kind", ["standard", "shortformer"])
def test_long_context_raises_for_learned_positions(kind):
    model = make(kind)
    model(torch.zeros(1, 8, dtype=torch.long))  # exactly n_ctx is fine
    with pytest.raises(ValueError, match=r"longer than n_ctx=8") as info:
        model(torch.zeros(1, 9, dtype=torch.long))
    assert "9 tokens" in str(info.value) and kind in str(info.value)

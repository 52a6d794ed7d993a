"""The encoder–decoder forward and post-LN against a float64 reference written loop by loop from the formulas
(Vaswani et al. 2017: encoder self-attention, masked decoder self-attention, encoder–decoder attention, post-LN
"LayerNorm(x + Sublayer(x))"; Xiong et al. 2020: pre-LN). The reference reads only the parameter tensors; norms,
activations, the sinusoidal table and the RoPE matrices come from `test_model_reference`'s loop formulas."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import pairwise, randomize
from test_model_reference import ref_act, ref_norm, ref_rotation, ref_sinusoidal

from models import EncoderDecoderConfig, HookedEncoderDecoder, HookedTransformer, HookedTransformerConfig

RTOL = 1e-6
POS = ["standard", "sinusoidal", "shortformer", "rotary", "alibi", "none"]


def ref_attention(sd, p, x_q, x_k, x_v, H, dh, keep, add=None):
    """Σ_h softmax(q_h k_hᵀ/√d_head + add_h, masked by keep [batch, q, k]) v_h W_O^h + b_O, one head at a time."""
    out = sd[p + "b_O"].clone()
    for h in range(H):
        q = x_q[h] if isinstance(x_q, list) else x_q @ sd[p + "W_Q"][h] + sd[p + "b_Q"][h]
        k = x_k[h] if isinstance(x_k, list) else x_k @ sd[p + "W_K"][h] + sd[p + "b_K"][h]
        v = x_v @ sd[p + "W_V"][h] + sd[p + "b_V"][h]
        scores = q @ k.transpose(-1, -2) / math.sqrt(dh)  # [batch, query, key]
        if add is not None:
            scores = scores + add[h]
        scores = scores.masked_fill(~keep, float("-inf"))
        pattern = torch.exp(scores - scores.max(-1, keepdim=True).values)
        out = out + (pattern / pattern.sum(-1, keepdim=True)) @ v @ sd[p + "W_O"][h]
    return out


def reference(model: HookedEncoderDecoder, src, tgt, src_mask, tgt_mask) -> torch.Tensor:
    """Logits [batch, tgt_pos, d_vocab_tgt] in float64."""
    cfg = model.cfg
    sd = {k: v.detach().to(torch.float64) for k, v in model.state_dict().items()}
    kind, post, H, dh = cfg.positional_embedding_type, cfg.normalization_position == "post", cfg.n_heads, cfg.d_head
    S, T = src.shape[1], tgt.shape[1]

    def norm(x, name):
        return ref_norm(x, cfg.normalization_type, sd.get(name + ".w"), sd.get(name + ".b"), cfg.eps)

    def table(which, n):
        if kind in ("standard", "shortformer"):
            return sd[f"pos_embed_{which}.W_pos"][:n]
        return ref_sinusoidal(n, cfg.d_model) if kind == "sinusoidal" else torch.zeros(n, cfg.d_model)

    def rope(x, n):  # q_m <- R_m q_m (column vectors), pairs (i, i + d/2)
        R = torch.stack([ref_rotation(m, dh, cfg.rotary_dim, cfg.rotary_base, False) for m in range(n)])
        return torch.einsum("pij,bpj->bpi", R, x)

    def alibi(n):
        d = torch.tensor([[abs(i - j) for j in range(n)] for i in range(n)], dtype=torch.float64)
        return [-(2.0 ** (-8.0 * (h + 1) / H)) * d for h in range(H)] if kind == "alibi" else None

    def self_attn(p, resid, pos, keep, n):
        x = resid if post else norm(resid, p + "ln1")
        x_qk = x if kind != "shortformer" else x + pos  # positions added after the norm (TransformerLens)
        qs = [x_qk @ sd[p + "attn.W_Q"][h] + sd[p + "attn.b_Q"][h] for h in range(H)]
        ks = [x_qk @ sd[p + "attn.W_K"][h] + sd[p + "attn.b_K"][h] for h in range(H)]
        if kind == "rotary":
            qs, ks = [rope(q, n) for q in qs], [rope(k, n) for k in ks]
        return ref_attention(sd, p + "attn.", qs, ks, x, H, dh, keep, alibi(n))

    def residual(resid, out, name):
        return norm(resid + out, name) if post else resid + out

    def mlp(p, resid, name):
        x = resid if post else norm(resid, p + name)
        h = ref_act(x @ sd[p + "mlp.W_in"] + sd[p + "mlp.b_in"], cfg.act_fn)
        return residual(resid, h @ sd[p + "mlp.W_out"] + sd[p + "mlp.b_out"], p + name)

    src_keep = src_mask[:, None, :].expand(-1, S, -1)
    pos_s, pos_t = table("src", S), table("tgt", T)
    w_src = sd["embed_src.W_E"] if "embed_src.W_E" in sd else sd["embed_tgt.W_E"]
    resid = w_src[src] + (pos_s if kind in ("standard", "sinusoidal") else 0)
    for l in range(cfg.n_encoder_layers):
        p = f"encoder.{l}."
        resid = residual(resid, self_attn(p, resid, pos_s, src_keep, S), p + "ln1")
        if cfg.d_mlp:
            resid = mlp(p, resid, "ln2")
    memory = resid if post else norm(resid, "encoder_ln_final")

    causal = torch.tensor([[j <= i for j in range(T)] for i in range(T)])
    tgt_keep = causal[None] & tgt_mask[:, None, :]
    cross_keep = src_mask[:, None, :].expand(-1, T, -1)
    resid = sd["embed_tgt.W_E"][tgt] + (pos_t if kind in ("standard", "sinusoidal") else 0)
    for l in range(cfg.n_decoder_layers):
        p = f"decoder.{l}."
        resid = residual(resid, self_attn(p, resid, pos_t, tgt_keep, T), p + "ln1")
        x_q = resid if post else norm(resid, p + "ln2")
        x_k = memory
        if kind == "shortformer":  # cross-attention queries carry target positions, keys source positions
            x_q = x_q + pos_t
            x_k = memory + pos_s
        resid = residual(resid, ref_attention(sd, p + "cross_attn.", x_q, x_k, memory, H, dh, cross_keep), p + "ln2")
        if cfg.d_mlp:
            resid = mlp(p, resid, "ln3")
    final = resid if post else norm(resid, "decoder_ln_final")
    W_U = sd["embed_tgt.W_E"].T if cfg.tie_embeddings else sd["unembed.W_U"]
    return final @ W_U + sd["unembed.b_U"]


def make(pos="standard", norm="LN", position="pre", mlp=True, **kw) -> HookedEncoderDecoder:
    cfg = EncoderDecoderConfig(d_model=16, n_heads=2, d_mlp=24 if mlp else None, d_vocab_src=11, d_vocab_tgt=13,
                               n_ctx_src=9, n_ctx_tgt=8, n_encoder_layers=2, n_decoder_layers=2,
                               positional_embedding_type=pos, normalization_type=norm, normalization_position=position,
                               dtype="float64", seed=1, **kw)
    return randomize(HookedEncoderDecoder(cfg), scale=0.5, seed=2)


def rel_err(a, b) -> float:
    a, b = a.detach(), b.detach()
    return float((a - b).norm() / b.norm())


def inputs(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, model.cfg.d_vocab_src, (3, 9), generator=g)
    tgt = torch.randint(0, model.cfg.d_vocab_tgt, (3, 7), generator=g)
    src_mask = torch.ones(3, 9, dtype=torch.bool)
    src_mask[1, 6:] = False
    src_mask[2, 2:] = False
    tgt_mask = torch.ones(3, 7, dtype=torch.bool)
    tgt_mask[2, 4:] = False
    return src, tgt, src_mask, tgt_mask


# every pair of settings of two axes in some row (the axes act on separate parts of the model)
GRID = pairwise(POS, ["LN", "RMS", None], ["pre", "post"], [True, False])


@pytest.mark.parametrize("pos,norm,position,mlp", GRID)
def test_encoder_decoder_matches_reference(pos, norm, position, mlp):
    model = make(pos, norm, position, mlp)
    src, tgt, src_mask, tgt_mask = inputs(model)
    expected = reference(model, src, tgt, src_mask, tgt_mask)
    fused = model(src, tgt, src_mask, tgt_mask)
    explicit, cache = model.run_with_cache(src, tgt, src_mask, tgt_mask)
    assert "decoder.1.cross_attn.hook_pattern" in cache
    assert rel_err(fused, expected) < RTOL
    assert rel_err(explicit, expected) < RTOL


@pytest.mark.parametrize("tie,share", [(True, False), (False, True), (True, True)])
def test_tied_and_shared_embeddings_match_reference(tie, share):
    cfg = dict(d_model=16, n_heads=2, d_mlp=None, d_vocab_src=13, d_vocab_tgt=13, n_ctx_src=9, n_ctx_tgt=8,
               tie_embeddings=tie, share_embeddings=share, dtype="float64", seed=1)
    model = randomize(HookedEncoderDecoder(EncoderDecoderConfig(**cfg)), scale=0.5, seed=2)
    names = set(model.state_dict())
    assert ("unembed.W_U" in names) != tie and ("embed_src.W_E" in names) != share
    assert torch.equal(model.W_E_src, model.W_E_tgt) == share
    src, tgt, src_mask, tgt_mask = inputs(model)
    assert rel_err(model(src, tgt, src_mask, tgt_mask), reference(model, src, tgt, src_mask, tgt_mask)) < RTOL


def test_cross_attention_pattern_shape_and_padding():
    model = make()
    src, tgt, src_mask, tgt_mask = inputs(model)
    _, cache = model.run_with_cache(src, tgt, src_mask, tgt_mask)
    pattern = cache["decoder.0.cross_attn.hook_pattern"]
    assert pattern.shape == (3, 2, 7, 9)  # [batch, head, target, source]
    assert float(pattern[2, :, :, 2:].abs().max()) == 0.0  # padded source positions get no attention
    torch.testing.assert_close(pattern.sum(-1), torch.ones(3, 2, 7, dtype=torch.float64))


def test_padding_leaves_the_real_tokens_unchanged():
    """A padded batch gives the unpadded sequences' logits at the real target positions (independent runs)."""
    model = make("rotary", "LN", "pre")
    src, tgt, src_mask, tgt_mask = inputs(model)
    padded = model(src, tgt, src_mask, tgt_mask)
    alone = model(src[2:, :2], tgt[2:, :4])
    assert rel_err(padded[2:, :4], alone) < RTOL


def test_post_ln_decoder_only_matches_loop():
    """HookedTransformer with normalization_position="post": x ← LN(x + attn(x)), x ← LN(x + mlp(x)), no final norm."""
    cfg = HookedTransformerConfig(n_layers=2, d_model=16, n_ctx=8, d_vocab=11, n_heads=2, d_mlp=24,
                                  normalization_position="post", dtype="float64", seed=1)
    model = randomize(HookedTransformer(cfg), scale=0.5, seed=2)
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    tokens = torch.randint(0, 11, (2, 8), generator=torch.Generator().manual_seed(0))
    x = sd["embed.W_E"][tokens] + sd["pos_embed.W_pos"][:8]
    causal = torch.tensor([[j <= i for j in range(8)] for i in range(8)])[None]
    for l in range(2):
        p = f"blocks.{l}."
        x = ref_norm(x + ref_attention(sd, p + "attn.", x, x, x, 2, 8, causal), "LN", sd[p + "ln1.w"],
                     sd[p + "ln1.b"], cfg.eps)
        h = ref_act(x @ sd[p + "mlp.W_in"] + sd[p + "mlp.b_in"], "gelu") @ sd[p + "mlp.W_out"] + sd[p + "mlp.b_out"]
        x = ref_norm(x + h, "LN", sd[p + "ln2.w"], sd[p + "ln2.b"], cfg.eps)
    assert "ln_final.w" not in sd
    assert rel_err(model(tokens), x @ sd["unembed.W_U"] + sd["unembed.b_U"]) < RTOL

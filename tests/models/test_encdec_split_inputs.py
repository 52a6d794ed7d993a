"""The encoder–decoder's opt-in per-head inputs (`set_use_split_qkv_input`, `set_use_hook_mlp_in`): the decoder-only
model's switches (`models.arch.hook_switches`) acting on both stacks, the cross-attention's query, key and value
inputs one copy per head. Checked against the unswitched model (bitwise) and against the model's own residual
stream hooks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import models
from models.errors import HookSwitchError

PER_HEAD = ("hook_q_input", "hook_k_input", "hook_v_input", "hook_cross_q_input", "hook_cross_k_input",
            "hook_cross_v_input", "hook_mlp_in")


def _inputs(m, seed=0):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, m.cfg.d_vocab_src, (3, 7), generator=g)
    tgt = torch.randint(3, m.cfg.d_vocab_tgt, (3, 6), generator=g)
    tgt[:, 0] = m.cfg.bos_token_id
    return src, tgt


@pytest.fixture(scope="module", params=["enc-dec-reverse", "enc-dec-sort"])
def zoo(request):
    return request.param


def _switch(m, on: bool):
    m.set_use_split_qkv_input(on)
    if not m.cfg.attn_only:
        m.set_use_hook_mlp_in(on)


def test_switched_on_or_off_the_output_is_bitwise_the_unswitched_models(zoo):
    plain = models.load(zoo).eval()
    m = models.load(zoo).eval()
    src, tgt = _inputs(m)
    ref = plain(src, tgt)
    _, ref_cache = plain.run_with_cache(src, tgt)
    _switch(m, True)
    assert torch.equal(m(src, tgt), ref)  # nothing hooked: the fast path
    logits, cache = m.run_with_cache(src, tgt)  # every hook point watched: the hooked path
    assert torch.equal(logits, plain.run_with_cache(src, tgt)[0])
    assert set(cache) - set(ref_cache) == {k for k in cache if k.endswith(PER_HEAD)}
    _switch(m, False)
    assert torch.equal(m(src, tgt), ref)
    assert set(m.run_with_cache(src, tgt)[1]) == set(ref_cache)


def test_per_head_inputs_are_copies_of_the_streams_they_read(zoo):
    m = models.load(zoo).eval()
    _switch(m, True)
    src, tgt = _inputs(m)
    _, c = m.run_with_cache(src, tgt)
    H, last_enc = m.cfg.n_heads, f"encoder.{m.cfg.n_encoder_layers - 1}.hook_resid_post"
    for layer in range(m.cfg.n_decoder_layers):
        d = f"decoder.{layer}."
        for h in range(H):
            for name in ("hook_q_input", "hook_k_input", "hook_v_input"):
                assert torch.equal(c[d + name][:, :, h], c[d + "hook_resid_pre"])
            assert torch.equal(c[d + "hook_cross_q_input"][:, :, h], c[d + "hook_resid_mid"])
            for name in ("hook_cross_k_input", "hook_cross_v_input"):
                # the encoder's final residual stream before its final norm, which each head normalises itself
                assert torch.equal(c[d + name][:, :, h], c[last_enc])
        if not m.cfg.attn_only:
            assert torch.equal(c[d + "hook_mlp_in"], c[d + "hook_resid_mid_cross"])
    for layer in range(m.cfg.n_encoder_layers):
        assert torch.equal(c[f"encoder.{layer}.hook_k_input"][:, :, 1], c[f"encoder.{layer}.hook_resid_pre"])


def test_editing_one_heads_cross_key_input_changes_that_heads_keys_only(zoo):
    m = models.load(zoo).to(torch.float64).eval()
    _switch(m, True)
    src, tgt = _inputs(m)
    block = m.decoder[0]
    _, clean = m.run_with_cache(src, tgt, names_filter="decoder.0.cross_attn.hook_k")

    def edit(x, hook):
        x = x.clone()
        x[:, :, 1] = 0.5
        return x

    with m.hooks(fwd_hooks=[("decoder.0.hook_cross_k_input", edit)]):
        _, edited = m.run_with_cache(src, tgt, names_filter="decoder.0.cross_attn.hook_k")
    k0, k1 = clean["decoder.0.cross_attn.hook_k"], edited["decoder.0.cross_attn.hook_k"]
    assert torch.equal(k1[:, :, 0], k0[:, :, 0])
    x = torch.full((m.cfg.d_model,), 0.5, dtype=torch.float64)
    ln = m.encoder_ln_final
    if getattr(ln, "kind", None) == "LN":
        x = F.layer_norm(x, (m.cfg.d_model,), ln.w, ln.b, ln.eps)
    want = x @ block.cross_attn.W_K[1] + block.cross_attn.b_K[1]
    torch.testing.assert_close(k1[:, :, 1], want.expand_as(k1[:, :, 1]), atol=1e-12, rtol=0)
    assert not torch.allclose(k1[:, :, 1], k0[:, :, 1])


def test_switched_off_points_refuse_hooks_and_do_not_fire():
    m = models.load("enc-dec-reverse").eval()
    with pytest.raises(HookSwitchError, match="use_split_qkv_input"):
        m.add_hook("decoder.0.hook_cross_k_input", lambda x, hook: None)
    assert not [k for k in m.firing_hook_names() if k.endswith(PER_HEAD)]
    with pytest.raises(HookSwitchError):
        m.set_use_hook_mlp_in(True)  # attention-only
    with pytest.raises(HookSwitchError):
        m.set_use_attn_in(True)
    m.set_use_split_qkv_input(True)
    assert m.enc_cfg.use_split_qkv_input and m.dec_cfg.use_split_qkv_input
    assert "decoder.0.hook_cross_v_input" in m.firing_hook_names()


def test_decoding_from_a_memory_and_generating_with_per_head_inputs(zoo):
    """`decode` given a memory alone (and generation, which encodes once) copies the memory per head: the same
    logits as the forward pass, and the same greedy output as the unswitched model."""
    plain = models.load(zoo).eval()
    m = models.load(zoo).eval()
    _switch(m, True)
    src, tgt = _inputs(m)
    torch.testing.assert_close(m.decode(tgt, m.encode(src)), m(src, tgt), atol=1e-5, rtol=0)
    assert torch.equal(m.generate(src, 6), plain.generate(src, 6))

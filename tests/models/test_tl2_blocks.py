"""What a block computes and which hooks it has, as TransformerLens 2.x (issue 14 bugs 1-6 and the opt-in hooks).

Each test checks one behaviour against a by-hand formula or an equivalent model (float64); the comparison with the
real TransformerLens 2.18 is tests/tl2/test_legacy_parity.py (slow job), whose grid has a case for each of them.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from models import ConfigError, HookedTransformer, HookedTransformerConfig
from models.errors import HookSwitchError

TOKENS = torch.tensor([[1, 5, 2, 7, 3, 3, 0], [4, 4, 9, 1, 0, 8, 6]])


def make(**kw) -> HookedTransformer:
    base = dict(n_layers=2, d_model=16, n_ctx=8, d_vocab=10, n_heads=4, d_mlp=24, dtype="float64", seed=0)
    model = HookedTransformer(HookedTransformerConfig(**{**base, **kw}))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.3)
    return model.eval()


def close(a, b, tol=1e-10):
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


# --- bug 1: shortformer + norm ----------------------------------------------------------------------------------
@pytest.mark.parametrize("norm", ["LN", "RMS"])
def test_shortformer_adds_positions_after_ln1_which_runs_once(norm):
    model = make(positional_embedding_type="shortformer", normalization_type=norm, attn_only=True)
    calls = []
    model.run_with_hooks(TOKENS, fwd_hooks=[("blocks.0.ln1.hook_normalized", lambda t, hook: calls.append(t))])
    assert len(calls) == 1  # once per block (it fired twice before the fix)
    _, cache = model.run_with_cache(TOKENS)
    a = model.blocks[0].attn
    normed = cache["blocks.0.ln1.hook_normalized"]
    x = normed if norm == "LN" else normed * model.blocks[0].ln1.w  # RMS hooks x / scale, before the weight
    x_qk = x + model.W_pos[: TOKENS.shape[1]]
    close(cache["blocks.0.attn.hook_q"], torch.einsum("bpd,hde->bphe", x_qk, a.W_Q) + a.b_Q)
    close(cache["blocks.0.attn.hook_k"], torch.einsum("bpd,hde->bphe", x_qk, a.W_K) + a.b_K)
    close(cache["blocks.0.attn.hook_v"], torch.einsum("bpd,hde->bphe", x, a.W_V) + a.b_V)


# --- bug 2: ALiBi ------------------------------------------------------------------------------------------------
def test_alibi_state_dict_with_an_unused_W_pos_loads_and_drops_it():
    import models

    model = make(positional_embedding_type="alibi", attn_only=True)
    state = {**model.state_dict(), "pos_embed.W_pos": torch.randn(8, 16, dtype=torch.float64)}
    loaded = models.from_transformer_lens_state_dict(state, model.cfg)
    assert "pos_embed.W_pos" not in loaded.state_dict()
    close(loaded(TOKENS), model(TOKENS), 0)


@pytest.mark.parametrize("symmetric", [True, False])
def test_bidirectional_alibi_future_keys(symmetric):
    """Zero queries: the scores are the bias. −slope·|i−j| (ours by default), or TransformerLens 2.x's zero bias for
    keys after the query (`alibi_symmetric=False`, what a TransformerLens config loads as)."""
    model = make(positional_embedding_type="alibi", attention_dir="bidirectional", attn_only=True,
                 alibi_symmetric=symmetric)
    with torch.no_grad():
        model.blocks[0].attn.W_Q.zero_()
        model.blocks[0].attn.b_Q.zero_()
    _, cache = model.run_with_cache(TOKENS, names_filter="blocks.0.attn.hook_attn_scores")
    scores = cache["blocks.0.attn.hook_attn_scores"][0]  # [head, q, k]
    i, j = torch.arange(7)[:, None], torch.arange(7)[None]
    for h in range(4):
        slope = 2.0 ** (-8.0 * (h + 1) / 4)
        dist = (i - j).abs() if symmetric else (i - j).clamp(min=0)
        close(scores[h], -slope * dist.double())


def test_alibi_from_a_transformer_lens_config_is_not_symmetric():
    from models.io.interop import config_from_transformer_lens

    cfg = config_from_transformer_lens(dict(n_layers=1, d_model=8, n_ctx=4, d_head=4, n_heads=2, d_vocab=5,
                                            attn_only=True, positional_embedding_type="alibi"))
    assert cfg.alibi_symmetric is False


# --- bug 3: no hook sees a parameter -----------------------------------------------------------------------------
AUDITED = [dict(positional_embedding_type=p, normalization_type=n) for p in
           ("standard", "sinusoidal", "shortformer", "rotary", "alibi", "none") for n in (None, "LN", "RMS")]
AUDITED += [dict(use_bias=False, gated_mlp=True, act_fn="silu"), dict(act_fn="solu_ln", parallel_attn_mlp=True),
            dict(n_key_value_heads=2, use_split_qkv_input=True, use_hook_mlp_in=True, use_attn_result=True),
            dict(use_attn_in=True, use_hook_tokens=True, final_rms=True), dict(n_layers=0)]


@pytest.mark.parametrize("kw", AUDITED, ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()))
def test_no_hook_receives_a_tensor_sharing_storage_with_a_parameter(kw):
    """Every hook point that fires gets a tensor of its own: an in-place edit (x *= 0, batch 2, with and without
    grad) raises nothing and leaves every parameter and buffer as it was (issue 14 bug 3: hook_pos_embed)."""
    model = make(**kw)
    storages = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    before = {k: v.clone() for k, v in model.state_dict().items()}
    clean = model(TOKENS).detach()
    fired = []

    def check(x, hook):
        assert x.untyped_storage().data_ptr() not in storages, f"{hook.name} aliases a parameter"
        fired.append(hook.name)

    model.run_with_hooks(TOKENS, fwd_hooks=[(lambda n: True, check)])
    assert set(fired) == set(model.firing_hook_names())
    for name in model.firing_hook_names():
        if name == "hook_tokens":  # integer ids: the caller's own tensor, as in TransformerLens
            continue
        for grad in (False, True):
            with torch.set_grad_enabled(grad):
                model.run_with_hooks(TOKENS, fwd_hooks=[(name, lambda x, hook: x.mul_(0))])
        for k, v in model.state_dict().items():
            assert torch.equal(v, before[k]), f"an in-place edit at {name} changed {k}"
    close(model(TOKENS), clean, 0)


# --- bug 4: RMS hook_normalized ----------------------------------------------------------------------------------
def test_rms_hook_normalized_is_before_the_weight():
    model = make(normalization_type="RMS")
    _, cache = model.run_with_cache(TOKENS)
    x = cache["blocks.1.hook_resid_mid"]
    close(cache["blocks.1.ln2.hook_normalized"], x / (x.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt())
    close(cache["blocks.1.ln2.hook_scale"], (x.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt())


# --- bug 5: backward hooks alone ---------------------------------------------------------------------------------
def test_backward_hooks_fire_on_points_computed_only_when_hooked():
    model = make(normalization_type="LN", use_attn_result=True)
    names = ["blocks.0.attn.hook_pattern", "blocks.1.attn.hook_attn_scores", "blocks.0.attn.hook_result",
             "blocks.1.ln2.hook_scale", "ln_final.hook_normalized", "hook_pos_embed"]
    _, cache = model.run_with_cache(TOKENS, return_type="loss", incl_bwd=True, names_filter=names)
    seen = {}
    for name in names:
        model.add_hook(name, lambda g, hook: seen.__setitem__(hook.name, g.detach().clone()), dir="bwd")
    model(TOKENS, return_type="loss").backward()
    model.reset_hooks()
    assert set(seen) == set(names)
    for name in names:
        close(seen[name], cache[name + "_grad"])


# --- bug 6: the options of the attention scores and the logits -------------------------------------------------
def _scaled_copy(model, factors):
    """A copy whose layer-l W_Q, b_Q are multiplied by factors[l] (same scores as a different score scale)."""
    import copy

    other = copy.deepcopy(model)
    with torch.no_grad():
        for block, f in zip(other.blocks, factors):
            block.attn.W_Q.mul_(f)
            block.attn.b_Q.mul_(f)
    return other


@pytest.mark.parametrize("kw,factors", [
    (dict(use_attn_scale=False), [2.0, 2.0]),  # scores not divided by √d_head = 2
    (dict(attn_scale=2.5), [2 / 2.5, 2 / 2.5]),
    (dict(scale_attn_by_inverse_layer_idx=True), [1.0, 0.5]),  # layer l also divided by l + 1
    (dict(use_attn_scale=False, scale_attn_by_inverse_layer_idx=True), [2.0, 1.0]),
])
def test_attention_score_scale_options(kw, factors):
    model = make(**kw)
    plain = _scaled_copy(make(), factors)
    close(model(TOKENS), plain(TOKENS))  # fused path
    close(model.run_with_cache(TOKENS)[0], plain(TOKENS))  # explicit path


def test_attention_scores_soft_cap():
    """cap·tanh(q·k/√d_head / cap), then the mask; layer 0 against the uncapped model's scores, layer 1 (whose input
    differs) from its own cached q and k; the fused forward (explicit path forced) equals the cached run."""
    model, plain = make(attn_scores_soft_cap=0.5), make()
    _, ours = model.run_with_cache(TOKENS)
    _, ref = plain.run_with_cache(TOKENS)
    raw0 = ref["blocks.0.attn.hook_attn_scores"]
    close(ours["blocks.0.attn.hook_attn_scores"],
          (0.5 * torch.tanh(raw0 / 0.5)).masked_fill(torch.isinf(raw0), float("-inf")))
    q, k = ours["blocks.1.attn.hook_q"], ours["blocks.1.attn.hook_k"]
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) / 2
    expected = (0.5 * torch.tanh(s / 0.5)).masked_fill(torch.ones(7, 7, dtype=torch.bool).triu(1), float("-inf"))
    close(ours["blocks.1.attn.hook_attn_scores"], expected)
    close(model(TOKENS), ours["ln_final.hook_normalized"] @ model.W_U + model.b_U)


def test_output_logits_soft_cap():
    model, plain = make(output_logits_soft_cap=1.5), make()
    close(model(TOKENS), 1.5 * torch.tanh(plain(TOKENS) / 1.5))


# --- config features ---------------------------------------------------------------------------------------------
def test_parallel_attn_mlp_block():
    model = make(parallel_attn_mlp=True)
    _, cache = model.run_with_cache(TOKENS)
    assert "blocks.0.hook_resid_mid" not in cache
    for l in range(2):
        pre = cache[f"blocks.{l}.hook_resid_pre"]
        close(cache[f"blocks.{l}.hook_resid_post"],
              pre + cache[f"blocks.{l}.hook_attn_out"] + cache[f"blocks.{l}.hook_mlp_out"])
        b = model.blocks[l]
        close(cache[f"blocks.{l}.hook_mlp_out"], b.mlp(F.layer_norm(pre, (16,), b.ln2.w, b.ln2.b)))


def test_gated_mlp():
    model = make(gated_mlp=True, act_fn="silu")
    _, cache = model.run_with_cache(TOKENS)
    m, x = model.blocks[0].mlp, cache["blocks.0.ln2.hook_normalized"]
    close(cache["blocks.0.mlp.hook_pre"], x @ m.W_gate)
    close(cache["blocks.0.mlp.hook_pre_linear"], x @ m.W_in)
    close(cache["blocks.0.mlp.hook_post"], F.silu(x @ m.W_gate) * (x @ m.W_in) + m.b_in)
    close(cache["blocks.0.hook_mlp_out"], cache["blocks.0.mlp.hook_post"] @ m.W_out + m.b_out)


@pytest.mark.parametrize("act", ["solu", "solu_ln", "gelu_fast", "gelu_pytorch_tanh"])
def test_activations(act):
    model = make(act_fn=act)
    _, cache = model.run_with_cache(TOKENS)
    pre, post = cache["blocks.0.mlp.hook_pre"], cache["blocks.0.mlp.hook_post"]
    if act.startswith("solu"):
        mid = pre * pre.softmax(-1)
        if act == "solu_ln":
            close(cache["blocks.0.mlp.hook_mid"], mid)
            ln = model.blocks[0].mlp.ln
            mid = F.layer_norm(mid, (24,), ln.w, ln.b)
        close(post, mid)
    else:
        close(post, 0.5 * pre * (1 + torch.tanh(math.sqrt(2 / math.pi) * (pre + 0.044715 * pre**3))), 1e-9)


def test_d_vocab_out_and_final_rms():
    model = make(d_vocab_out=6, final_rms=True)
    assert model(TOKENS).shape == (2, 7, 6) and model.W_U.shape == (16, 6)
    _, cache = model.run_with_cache(TOKENS)
    x = cache["blocks.1.hook_resid_post"]
    close(cache["ln_final.hook_normalized"], x / (x.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt())
    assert not hasattr(model.ln_final, "b") and model.blocks[0].ln1.kind == "LN"


def test_metadata_fields_are_stored_not_fetched():
    cfg = HookedTransformerConfig(n_layers=1, d_model=8, n_ctx=4, d_vocab=5, original_architecture="GPT2LMHeadModel",
                                  tokenizer_name="gpt2")
    back = HookedTransformerConfig.from_json(cfg.to_json())
    assert (back.original_architecture, back.tokenizer_name) == ("GPT2LMHeadModel", "gpt2")
    assert HookedTransformer(back).tokenizer is None  # nothing fetched


# --- opt-in hooks ------------------------------------------------------------------------------------------------
def test_opt_in_hooks_are_off_by_default_and_switch_on():
    model = make(n_key_value_heads=2)
    _, cache = model.run_with_cache(TOKENS)
    opt_in = ("hook_result", "hook_q_input", "hook_k_input", "hook_v_input", "hook_attn_in", "hook_mlp_in")
    assert not [k for k in cache if k.endswith(opt_in)]
    assert not [k for k in model.firing_hook_names() if k.endswith(opt_in)]
    with pytest.raises(HookSwitchError, match="use_attn_result"):
        model.add_hook("blocks.0.attn.hook_result", lambda x, hook: None)
    with pytest.raises(AssertionError):  # TransformerLens raises AssertionError there
        model.set_use_attn_in(True)
    clean = model(TOKENS)
    model.set_use_attn_result(True)
    model.set_use_split_qkv_input(True)
    model.set_use_hook_mlp_in(True)
    logits, cache = model.run_with_cache(TOKENS)
    close(logits, clean)
    assert cache["blocks.0.attn.hook_result"].shape == (2, 7, 4, 16)
    assert cache["blocks.0.hook_q_input"].shape == (2, 7, 4, 16)
    assert cache["blocks.0.hook_k_input"].shape == cache["blocks.0.hook_v_input"].shape == (2, 7, 2, 16)
    close(cache["blocks.1.hook_mlp_in"], cache["blocks.1.hook_resid_mid"])
    close(cache["blocks.0.attn.hook_result"].sum(-2) + model.blocks[0].attn.b_O, cache["blocks.0.hook_attn_out"])
    assert set(cache) == set(model.firing_hook_names())


def test_split_qkv_input_patches_one_head_only():
    """Editing head 2's query input changes only head 2's queries (TransformerLens' reason for the switch)."""
    model = make(use_split_qkv_input=True)
    _, clean = model.run_with_cache(TOKENS)

    def edit(x, hook):
        x[:, :, 2] = 0.0

    with model.hooks(fwd_hooks=[("blocks.0.hook_q_input", edit)]):
        _, edited = model.run_with_cache(TOKENS, names_filter="blocks.0.attn.hook_q")
    q0, q1 = clean["blocks.0.attn.hook_q"], edited["blocks.0.attn.hook_q"]
    close(q1[:, :, [0, 1, 3]], q0[:, :, [0, 1, 3]])
    b = model.blocks[0]
    close(q1[:, :, 2], torch.zeros_like(q1[:, :, 2]) + F.layer_norm(torch.zeros(16, dtype=torch.float64), (16,),
                                                                     b.ln1.w, b.ln1.b) @ b.attn.W_Q[2] + b.attn.b_Q[2])


def test_hook_tokens_patches_tokens():
    model = make(use_hook_tokens=True)

    def edit(t, hook):
        t = t.clone()
        t[:, 0] = 3
        return t

    patched = TOKENS.clone()
    patched[:, 0] = 3
    same = [("hook_tokens", lambda t, hook: t)]  # a hook either way: both runs take the hooked path
    edited = model.run_with_hooks(TOKENS, fwd_hooks=[("hook_tokens", edit)])
    close(edited, model.run_with_hooks(patched, fwd_hooks=same), 0)


def test_switch_errors_are_config_errors():
    with pytest.raises(ConfigError, match="use_attn_in"):
        make(n_key_value_heads=2, use_attn_in=True)
    with pytest.raises(ConfigError, match="parallel_attn_mlp"):
        make(attn_only=True, parallel_attn_mlp=True)
    with pytest.raises(HookSwitchError, match="attention-only"):
        make(attn_only=True).set_use_hook_mlp_in(True)
    with pytest.raises(ConfigError, match="attn_scores_soft_cap"):
        make(attn_scores_soft_cap=-0.5)


def test_transformer_lens_sentinels_mean_off():
    """TransformerLens writes -1 for "unset" (d_vocab_out, attn_scale, the soft caps); so may code ported from it."""
    cfg = make(d_vocab_out=-1, attn_scale=-1.0, attn_scores_soft_cap=-1.0, output_logits_soft_cap=-1).cfg
    assert (cfg.d_vocab_out, cfg.attn_scale, cfg.attn_scores_soft_cap, cfg.output_logits_soft_cap) == (
        10, None, None, None)


# --- the TransformerLens 4.x bridge ------------------------------------------------------------------------------
@pytest.mark.parametrize("kw", [dict(gated_mlp=True), dict(parallel_attn_mlp=True), dict(final_rms=True),
                                dict(d_vocab_out=6), dict(use_attn_scale=False), dict(attn_scale=3.0),
                                dict(scale_attn_by_inverse_layer_idx=True), dict(attn_scores_soft_cap=0.5),
                                dict(output_logits_soft_cap=1.0)])
def test_bridge_refuses_what_its_native_model_cannot_compute(kw):
    from models import UnsupportedByTransformerLens, to_transformer_lens

    with pytest.raises(UnsupportedByTransformerLens, match=next(iter(kw))):
        to_transformer_lens(make(dtype="float32", **kw))


@pytest.mark.tl4
def test_bridge_takes_gelu_fast_as_its_tanh_gelu():
    from models import to_transformer_lens

    model = make(dtype="float32", act_fn="gelu_fast")
    torch.testing.assert_close(to_transformer_lens(model)(TOKENS), model(TOKENS), rtol=1e-5, atol=1e-5)

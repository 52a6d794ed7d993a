"""Hooks: ablations change the output exactly as computed by hand, filtered caches, no hook left behind after
an exception, and the TransformerLens `ActivationCache` helpers on our caches."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import randomize

from models import HookedTransformer, HookedTransformerConfig

TOKENS = torch.tensor([[3, 1, 4, 1, 5, 9, 2], [6, 5, 3, 5, 8, 9, 7]])


def make(kind="standard", mlp=False, norm="LN", n_layers=2, **kw):
    kw.setdefault("use_attn_result", True)  # these tests read the per-head hook_result (TransformerLens' opt-in)
    cfg = HookedTransformerConfig(n_layers=n_layers, d_model=16, n_ctx=8, d_vocab=10, n_heads=4,
                                  d_mlp=32 if mlp else None, normalization_type=norm, positional_embedding_type=kind,
                                  dtype="float64", seed=0, **kw)
    return randomize(HookedTransformer(cfg), scale=0.4, seed=1)


def layer_norm(x, w, b, eps=1e-5):  # by hand, not the model's Norm
    x = x - x.mean(-1, keepdim=True)
    return x / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt() * w + b


def assert_no_hooks_left(model):
    for name, hp in model.hook_dict.items():
        assert not hp.fwd_hooks and not hp.bwd_hooks, name
        assert not hp._forward_hooks and not hp._backward_hooks, name
    assert not model._forward_hooks


# --- ablations ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("head", [0, 3])
@pytest.mark.parametrize("hook", ["z", "result"])
def test_zero_ablating_a_last_layer_head(head, hook):
    """Zeroing head h of the last layer removes exactly z_h W_O^h from the final residual stream."""
    model = make("shortformer")
    clean, cache = model.run_with_cache(TOKENS)
    W_O, W_U, b_U = model.blocks[1].attn.W_O[head], model.W_U, model.b_U

    def ablate(t, hook):
        t = t.clone()
        t[:, :, head] = 0.0  # [batch, pos, head, ...]
        return t

    ablated = model.run_with_hooks(TOKENS, fwd_hooks=[(f"blocks.1.attn.hook_{hook}", ablate)])
    resid = cache["blocks.1.hook_resid_post"] - cache["blocks.1.attn.hook_z"][:, :, head] @ W_O
    expected = layer_norm(resid, model.ln_final.w, model.ln_final.b) @ W_U + b_U
    torch.testing.assert_close(ablated, expected, rtol=1e-10, atol=1e-10)
    assert (ablated - clean).abs().max() > 1e-3
    assert_no_hooks_left(model)


def test_zero_ablating_a_head_before_the_mlp():
    """One layer with an MLP: recompute MLP and unembedding by hand after removing head 2's output."""
    model = make("standard", mlp=True, n_layers=1)
    _, cache = model.run_with_cache(TOKENS)
    b = model.blocks[0]
    ablated = model.run_with_hooks(
        TOKENS, fwd_hooks=[("blocks.0.attn.hook_z", lambda z, hook: z * (torch.arange(4) != 2)[:, None])]
    )
    mid = cache["blocks.0.hook_resid_mid"] - cache["blocks.0.attn.hook_z"][:, :, 2] @ b.attn.W_O[2]
    pre = layer_norm(mid, b.ln2.w, b.ln2.b) @ b.mlp.W_in + b.mlp.b_in
    post = mid + 0.5 * pre * (1 + torch.erf(pre / 2**0.5)) @ b.mlp.W_out + b.mlp.b_out
    expected = layer_norm(post, model.ln_final.w, model.ln_final.b) @ model.W_U + model.b_U
    torch.testing.assert_close(ablated, expected, rtol=1e-10, atol=1e-10)


def test_pattern_hook_edit_propagates_through_fused_and_explicit_paths():
    """Replacing layer 1's pattern by uniform-over-prefix attention gives attn_out = mean of the values."""
    model = make("rotary", norm=None)
    P = TOKENS.shape[1]
    uniform = torch.tril(torch.ones(P, P, dtype=torch.float64))
    uniform = uniform / uniform.sum(-1, keepdim=True)
    out, cache = None, {}

    def save(t, hook):
        cache[hook.name] = t.detach()

    out = model.run_with_hooks(TOKENS, fwd_hooks=[("blocks.1.attn.hook_pattern", lambda t, hook: uniform.expand_as(t)),
                                                  ("blocks.1.attn.hook_v", save), ("blocks.1.hook_resid_pre", save)])
    v = cache["blocks.1.attn.hook_v"]  # [batch, pos, head, d_head]
    z = torch.einsum("qk,bkhd->bqhd", uniform, v)
    attn_out = torch.einsum("bqhd,hdm->bqm", z, model.blocks[1].attn.W_O) + model.blocks[1].attn.b_O
    expected = (cache["blocks.1.hook_resid_pre"] + attn_out) @ model.W_U + model.b_U
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)


def test_editing_hook_q_on_the_fused_path():
    """Only hook_q is hooked (fused attention): zero queries make layer-0 attention uniform over the prefix."""
    model = make("none", norm=None, n_layers=1)
    with torch.no_grad():
        model.blocks[0].attn.b_Q.zero_()
    out = model.run_with_hooks(TOKENS, fwd_hooks=[("blocks.0.attn.hook_q", lambda q, hook: torch.zeros_like(q))])
    _, cache = model.run_with_cache(TOKENS)
    v = cache["blocks.0.attn.hook_v"]
    z = v.cumsum(1) / torch.arange(1, 8, dtype=torch.float64)[None, :, None, None]
    resid = cache["hook_embed"] + torch.einsum("bqhd,hdm->bqm", z, model.blocks[0].attn.W_O) + model.blocks[0].attn.b_O
    torch.testing.assert_close(out, resid @ model.W_U + model.b_U, rtol=1e-10, atol=1e-10)


# --- caching --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("names_filter,expected", [
    ("blocks.0.attn.hook_pattern", {"blocks.0.attn.hook_pattern"}),
    (["hook_embed", "blocks.1.hook_resid_post"], {"hook_embed", "blocks.1.hook_resid_post"}),
    (lambda n: n.endswith("hook_pattern"), {"blocks.0.attn.hook_pattern", "blocks.1.attn.hook_pattern"}),
])
def test_names_filter_caches_only_those_names(names_filter, expected):
    model = make(mlp=True)
    logits, cache = model.run_with_cache(TOKENS, names_filter=names_filter)
    assert set(cache.keys()) == expected
    torch.testing.assert_close(logits, model(TOKENS))
    assert_no_hooks_left(model)


def test_full_cache_has_every_hook_name():
    model = make(mlp=True)
    _, cache = model.run_with_cache(TOKENS)
    for l in range(2):
        for leaf in ("hook_resid_pre", "hook_attn_out", "hook_resid_mid", "hook_mlp_out", "hook_resid_post",
                     "attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_z", "attn.hook_attn_scores",
                     "attn.hook_pattern", "attn.hook_result", "mlp.hook_pre", "mlp.hook_post",
                     "ln1.hook_scale", "ln1.hook_normalized", "ln2.hook_normalized"):
            assert f"blocks.{l}.{leaf}" in cache, leaf
    assert {"hook_embed", "hook_pos_embed", "ln_final.hook_normalized", "ln_final.hook_scale"} <= set(cache.keys())
    assert cache["blocks.0.attn.hook_result"].shape == (2, 7, 4, 16)


def test_remove_batch_dim():
    model = make()
    _, cache = model.run_with_cache(TOKENS[:1], remove_batch_dim=True)
    assert cache["pattern", 0].shape == (4, 7, 7)


# --- a hook that raises -------------------------------------------------------------------------------
class Boom(RuntimeError):
    pass


def boom(t, hook):
    raise Boom(hook.name)


@pytest.mark.parametrize("where", ["blocks.0.attn.hook_q", "blocks.1.attn.hook_pattern", "ln_final.hook_normalized"])
def test_raising_hook_leaves_no_hook_behind(where):
    model = make(mlp=True)
    clean = model(TOKENS)
    with pytest.raises(Boom):
        model.run_with_hooks(TOKENS, fwd_hooks=[(where, boom), ("blocks.0.hook_resid_pre", lambda t, hook: t)])
    assert_no_hooks_left(model)
    assert torch.equal(model(TOKENS), clean)
    with pytest.raises(Boom), model.hooks(fwd_hooks=[(where, boom)]):
        model.run_with_cache(TOKENS)
    assert_no_hooks_left(model)
    assert torch.equal(model(TOKENS), clean)
    logits, cache = model.run_with_cache(TOKENS)  # the explicit path: equal up to rounding
    torch.testing.assert_close(logits, clean, rtol=1e-12, atol=1e-12)
    assert where in cache


# --- ActivationCache helpers ------------------------------------------------------------------------
@pytest.mark.parametrize("kind,mlp,norm", [("standard", True, "LN"), ("shortformer", False, None),
                                           ("rotary", True, "RMS"), ("sinusoidal", False, "LN")])
def test_activation_cache_helpers(kind, mlp, norm):
    model = make(kind, mlp=mlp, norm=norm)
    logits, cache = model.run_with_cache(TOKENS)
    assert torch.equal(cache["pattern", 0], cache["blocks.0.attn.hook_pattern"])
    assert torch.equal(cache["z", 1], cache["blocks.1.attn.hook_z"])
    assert torch.equal(cache["resid_pre", 1], cache["blocks.1.hook_resid_pre"])

    final = cache["blocks.1.hook_resid_post"]
    parts, labels = cache.decompose_resid(return_labels=True)
    torch.testing.assert_close(parts.sum(0), final, rtol=1e-10, atol=1e-10)
    assert ("pos_embed" in labels) == (kind in ("standard", "sinusoidal"))
    assert labels[-1] == ("1_mlp_out" if mlp else "1_attn_out")

    heads, head_labels = cache.stack_head_results(layer=-1, return_labels=True)
    assert heads.shape == (8, 2, 7, 16) and head_labels[:2] == ["L0H0", "L0H1"] and head_labels[-1] == "L1H3"
    for l in range(2):
        torch.testing.assert_close(heads[4 * l : 4 * l + 4].sum(0) + model.blocks[l].attn.b_O,
                                   cache[f"blocks.{l}.hook_attn_out"], rtol=1e-10, atol=1e-10)
        # hook_result is z_h W_O^h, by hand
        by_hand = torch.einsum("bphd,hdm->bphm", cache["z", l], model.blocks[l].attn.W_O)
        torch.testing.assert_close(cache[f"blocks.{l}.attn.hook_result"], by_hand)

    acc, acc_labels = cache.accumulated_resid(return_labels=True)
    assert acc_labels == ["0_pre", "1_pre", "final_post"]
    torch.testing.assert_close(acc, torch.stack([cache["resid_pre", 0], cache["resid_pre", 1], final]))
    if norm is not None:  # TransformerLens' apply_ln_to_stack centres (LN) and divides by the cached scale
        normed = cache.apply_ln_to_stack(acc, layer=None)
        x = final - final.mean(-1, keepdim=True) if norm == "LN" else final
        torch.testing.assert_close(normed[-1], x / cache["ln_final.hook_scale"], rtol=1e-10, atol=1e-10)
        ln = model.ln_final
        out = normed[-1] * ln.w + (ln.b if norm == "LN" else 0)
        torch.testing.assert_close(out @ model.W_U + model.b_U, logits, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("use_attn_result", [True, False])
def test_hook_result_only_with_use_attn_result(use_attn_result):
    model = make(use_attn_result=use_attn_result)
    logits, cache = model.run_with_cache(TOKENS)
    assert ("blocks.0.attn.hook_result" in cache) == use_attn_result
    assert ("blocks.1.attn.hook_result" in cache) == use_attn_result
    assert "blocks.0.attn.hook_z" in cache
    torch.testing.assert_close(logits, model(TOKENS))
    seen = []
    model.run_with_hooks(TOKENS, fwd_hooks=[("blocks.0.attn.hook_result", lambda t, hook: seen.append(t))])
    assert bool(seen) == use_attn_result


@pytest.mark.parametrize("norm", ["LN", "RMS"])
def test_hooked_norm_path_matches_fused_norm(norm):
    """Hooking hook_scale switches Norm to its explicit formula; check it against F.layer_norm / F.rms_norm."""
    model = make(norm=norm, mlp=True)
    fused = model(TOKENS)
    scales = []
    hooked = model.run_with_hooks(TOKENS, fwd_hooks=[(lambda n: n.endswith("hook_scale"),
                                                      lambda t, hook: scales.append(t))])
    torch.testing.assert_close(hooked, fused, rtol=1e-12, atol=1e-12)
    assert len(scales) == 5 and scales[0].shape == (2, 7, 1)
    x = model.run_with_cache(TOKENS, names_filter="hook_embed")[1]["hook_embed"] + model.W_pos[:7]
    ln = model.blocks[0].ln1
    # LN hooks its output, RMS x / scale before the weight (both as TransformerLens 2.x)
    expected = F.layer_norm(x, (16,), ln.w, ln.b) if norm == "LN" else F.rms_norm(x, (16,), None, 1e-5)
    _, cache = model.run_with_cache(TOKENS, names_filter="blocks.0.ln1.hook_normalized")
    torch.testing.assert_close(cache["blocks.0.ln1.hook_normalized"], expected)


@pytest.mark.parametrize("kind", ["alibi", "rotary", "shortformer"])
def test_gradients_agree_between_fused_and_explicit_paths(kind):
    """The explicit path (in-place scale and mask of the scores) must backpropagate like the fused one."""
    model = make(kind, mlp=True, n_key_value_heads=2)

    def grads(**kw):
        model.zero_grad()
        model.run_with_hooks(TOKENS, return_type="loss", **kw).backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    fused = grads()
    explicit = grads(fwd_hooks=[(lambda n: n.endswith(("hook_pattern", "hook_result")), lambda t, hook: None)])
    for name, g in fused.items():
        torch.testing.assert_close(explicit[name], g, rtol=1e-9, atol=1e-12, msg=name)
    assert any(g.abs().sum() > 0 for n, g in fused.items() if "attn.W_Q" in n)

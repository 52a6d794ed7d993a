"""Every hook point fires for every hook mechanism (`models.arch.watch`): TransformerLens hooks, PyTorch forward,
pre- and backward hooks on a hook point or a parent, global module hooks and tracing tools (nnsight) all see the
values `run_with_cache` records; a filtered cache equals the full one bitwise; the fast path (nothing watching) agrees
with the hooked path and with a float64 loop of the formulas."""

from __future__ import annotations

import pytest
import torch
from helpers import randomize
from torch.nn.modules.module import register_module_forward_hook

from models import HookedTransformer, HookedTransformerConfig
from models.arch.positions import ALiBiBias
from models.arch.score_bias import Bidirectional, Causal, Padding, combine
from models.arch.tl_compat import HookPoint
from models.arch.watch import hooked_path, watched

CONFIGS = {
    "attn-only": dict(d_mlp=None, normalization_type=None),
    "gelu-ln": dict(d_mlp=64, act_fn="gelu", normalization_type="LN"),
    "rotary-gqa-rms": dict(d_mlp=64, act_fn="silu", normalization_type="RMS", positional_embedding_type="rotary",
                           n_key_value_heads=2, use_attn_result=True),
}


def make(kind="gelu-ln", dtype="float32", **kw):
    d = dict(n_layers=2, d_model=32, n_ctx=12, d_vocab=40, n_heads=4, positional_embedding_type="standard",
             dtype=dtype, seed=0)
    d.update(CONFIGS[kind], **kw)
    return randomize(HookedTransformer(HookedTransformerConfig(**d)), scale=0.4, seed=3)


def tokens(model, batch=3, pos=11, seed=0):
    return torch.randint(0, model.cfg.d_vocab, (batch, pos), generator=torch.Generator().manual_seed(seed))


def firing_points(model) -> list[str]:
    return list(model.firing_hook_names())


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_plain_pytorch_forward_hooks_see_every_cached_value(kind):
    """A `register_forward_hook` on each hook point fires for every name `run_with_cache` records, with its value."""
    model = make(kind)
    toks = tokens(model)
    seen, handles = {}, []
    for name, point in model.hook_dict.items():
        handles.append(point.register_forward_hook(lambda m, i, out, name=name: seen.__setitem__(name, out.detach())))
    with torch.no_grad():
        logits = model(toks)
    for h in handles:
        h.remove()
    with torch.no_grad():
        cached_logits, cache = model.run_with_cache(toks)
    assert set(cache.keys()) <= set(seen) and len(cache.keys()) >= 20
    for name in cache.keys():
        assert torch.equal(seen[name], cache[name]), name
    assert torch.equal(logits, cached_logits)


@pytest.mark.parametrize("mechanism", ["pre hook", "parent hook", "backward hook", "global hook", "patched forward"])
def test_any_watcher_turns_on_every_hook_point(mechanism):
    """One watcher anywhere (not on the attention pattern itself) and `hook_pattern` fires with the cached value."""
    model = make("attn-only")
    toks = tokens(model)
    got, handles = [], []
    target = model.blocks[1].attn.hook_pattern
    listener = target.register_forward_hook(lambda m, i, out: got.append(out.detach()))
    assert not watched(model.blocks[0])
    if mechanism == "pre hook":
        handles.append(model.blocks[0].hook_resid_pre.register_forward_pre_hook(lambda m, i: None))
    elif mechanism == "parent hook":
        handles.append(model.blocks[0].register_forward_hook(lambda m, i, o: None))
    elif mechanism == "backward hook":
        handles.append(model.blocks[0].hook_resid_pre.register_full_backward_hook(lambda m, gi, go: None))
    elif mechanism == "global hook":
        handles.append(register_module_forward_hook(lambda m, i, o: None))
    else:
        model.unembed.forward = model.unembed.forward  # what tracing tools do: a forward set on the instance
    listener.remove()  # the listener itself watches: take it off, so only the mechanism under test remains ...
    assert watched(model)
    target.register_forward_hook(lambda m, i, out: got.append(out.detach()))  # ... and put it back after the check
    with torch.no_grad():
        model(toks)
    for h in handles:
        h.remove()
    target._forward_hooks.clear()
    with torch.no_grad():
        _, cache = model.run_with_cache(toks, names_filter="blocks.1.attn.hook_pattern")
    assert len(got) == 1 and torch.equal(got[0], cache["blocks.1.attn.hook_pattern"])


def test_nothing_watching_takes_the_fast_path():
    """Without any hook no hook point of the attention pattern fires (the SDPA kernel forms none) and `watched` is
    False; one TransformerLens hook and it is True; removed, False again."""
    model = make("gelu-ln")
    assert not watched(model) and not hooked_path(None, model.blocks[0].attn)
    model.blocks[0].hook_resid_pre.add_hook(lambda t, hook: None)
    assert watched(model) and hooked_path(None, model.blocks[0])
    assert not hooked_path(None, model.blocks[1].ln1)  # a layer called alone decides from its own watchers
    model.reset_hooks()
    assert not watched(model)


@pytest.mark.parametrize("kind", list(CONFIGS))
@pytest.mark.parametrize("names", ["blocks.1.attn.hook_pattern", "blocks.0.hook_resid_post", "ln_final.hook_scale"])
def test_filtered_cache_equals_the_full_cache_bitwise(kind, names):
    model = make(kind)
    toks = tokens(model)
    with torch.no_grad():
        logits, full = model.run_with_cache(toks)
        flogits, filtered = model.run_with_cache(toks, names_filter=lambda n: n == names)
    keys = list(filtered.keys())
    assert keys == ([names] if names in full.keys() else [])
    for name in keys:
        assert torch.equal(filtered[name], full[name]), name
    assert torch.equal(flogits, logits)


@pytest.mark.parametrize("kind", list(CONFIGS))
@pytest.mark.parametrize("setting", ["causal", "bidirectional", "alibi", "left padding", "kv cache"])
def test_fast_path_agrees_with_the_hooked_path(kind, setting):
    """Logits of a plain forward (SDPA, fused norms) and of `run_with_cache` (written-out attention) agree to float32
    rounding, in every masking setting."""
    kw = {"alibi": dict(positional_embedding_type="alibi"), "bidirectional": dict(attention_dir="bidirectional")}
    if kind == "rotary-gqa-rms" and setting == "alibi":
        pytest.skip("rotary and ALiBi are one positional setting each")
    model = make(kind, **kw.get(setting, {}))
    toks = tokens(model)
    run = {}
    if setting == "left padding":
        run = dict(attention_mask=torch.tensor([[0, 0, 0] + [1] * 8, [1] * 11, [0] + [1] * 10]))
    with torch.no_grad():
        if setting == "kv cache":
            from models import HookedTransformerKeyValueCache

            outs = []
            for hooked in (False, True):
                kv = HookedTransformerKeyValueCache.init_cache(model.cfg, model.cfg.device, toks.shape[0])
                model(toks[:, :7], past_kv_cache=kv)
                outs.append(model.run_with_cache(toks[:, 7:], past_kv_cache=kv)[0] if hooked
                            else model(toks[:, 7:], past_kv_cache=kv))
            fast, hooked = outs
        else:
            fast = model(toks, **run)
            hooked, _ = model.run_with_cache(toks, **run)
    torch.testing.assert_close(fast, hooked, rtol=0, atol=2e-5 * float(hooked.abs().max()))


def test_hooked_path_matches_a_float64_loop():
    """Scores, pattern and z of each head from the cached float64 q, k, v, one query at a time."""
    model = make("attn-only", "float64")
    toks = tokens(model)
    with torch.no_grad():
        _, cache = model.run_with_cache(toks)
    for l in range(2):
        q, k, v = (cache[f"blocks.{l}.attn.{h}"] for h in ("hook_q", "hook_k", "hook_v"))  # [batch, pos, head, d]
        for i in range(toks.shape[1]):
            s = torch.einsum("bhd,bjhd->bhj", q[:, i], k[:, :i + 1]) / model.cfg.d_head ** 0.5
            p = s.softmax(-1)
            torch.testing.assert_close(cache[f"blocks.{l}.attn.hook_attn_scores"][:, :, i, :i + 1], s)
            assert torch.isneginf(cache[f"blocks.{l}.attn.hook_attn_scores"][:, :, i, i + 1:]).all()
            torch.testing.assert_close(cache[f"blocks.{l}.attn.hook_pattern"][:, :, i, :i + 1], p)
            assert (cache[f"blocks.{l}.attn.hook_pattern"][:, :, i, i + 1:] == 0).all()
            z = torch.einsum("bhj,bjhd->bhd", p, v[:, :i + 1])
            torch.testing.assert_close(cache[f"blocks.{l}.attn.hook_z"][:, i], z)


@pytest.mark.parametrize("where", ["hook_pattern", "hook_attn_scores"])
def test_in_place_edits_take_effect_beside_the_cache(where):
    """An in-place edit that lets layer 1 attend to every key (future ones too) changes z as computed by hand."""
    model = make("attn-only", "float64")
    toks = tokens(model)
    P = toks.shape[1]

    def edit(t, hook):  # uniform over all keys: scores all equal, or the pattern itself
        t.fill_(0.0 if where == "hook_attn_scores" else 1.0 / P)

    with torch.no_grad(), model.hooks(fwd_hooks=[(f"blocks.1.attn.{where}", edit)]):
        _, cache = model.run_with_cache(toks)
    v = cache["blocks.1.attn.hook_v"]
    torch.testing.assert_close(cache["blocks.1.attn.hook_z"], v.mean(1, keepdim=True).expand_as(v))
    torch.testing.assert_close(cache["blocks.1.attn.hook_pattern"],
                               torch.full_like(cache["blocks.1.attn.hook_pattern"], 1.0 / P))


def test_a_layer_called_alone_decides_from_its_own_hooks():
    """Outside a model's forward an attention layer takes the hooked path only when something watches it."""
    model = make("attn-only")
    attn = model.blocks[0].attn
    x = torch.randn(2, 5, 32)
    seen = []
    with torch.no_grad():
        attn(x, x, x, Causal())
        assert seen == []
        attn.hook_pattern.add_hook(lambda t, hook: seen.append(t.shape))
        attn(x, x, x, Causal())
    assert seen == [(2, 4, 5, 5)]


def test_backward_hooks_fire_on_the_pattern():
    model = make("attn-only")
    grads = []
    model.blocks[1].attn.hook_pattern.add_hook(lambda g, hook: grads.append(g), dir="bwd")
    model(tokens(model), return_type="loss").backward()
    assert len(grads) == 1 and grads[0].shape == (3, 4, 11, 11) and grads[0].abs().sum() > 0


def test_nnsight_reads_every_attention_pattern():
    """nnsight 0.8 wraps each module's forward: the pattern of block 1 comes out as `run_with_cache` records it."""
    nnsight = pytest.importorskip("nnsight")
    model = make("gelu-ln")
    toks = tokens(model)
    with torch.no_grad():
        _, cache = model.run_with_cache(toks)
    wrapped = nnsight.NNsight(model)
    with torch.no_grad(), wrapped.trace(toks):
        scale = wrapped.blocks[0].ln1.hook_scale.output.save()  # in the order the forward pass reaches them
        pattern = wrapped.blocks[1].attn.hook_pattern.output.save()
    assert torch.equal(pattern, cache["blocks.1.attn.hook_pattern"])
    assert torch.equal(scale, cache["blocks.0.ln1.hook_scale"])


def test_caching_hooks_skip_switched_off_points_and_permanent_hooks_stay():
    from models import InputError

    model = make("attn-only", n_layers=1)
    seen = []
    model.add_perma_hook("blocks.0.hook_resid_pre", lambda t, hook: seen.append(1))
    _, fwd, _ = model.get_caching_hooks()
    assert {name for name, _ in fwd} == set(model.firing_hook_names())
    assert "blocks.0.attn.hook_result" in model.hook_dict and "blocks.0.attn.hook_result" not in dict(fwd)
    with torch.no_grad():
        model.run_with_cache(tokens(model))
        model(tokens(model))
    assert len(seen) == 2 and len(model.blocks[0].hook_resid_pre.fwd_hooks) == 1
    model.reset_hooks(including_permanent=True)
    assert not model.blocks[0].hook_resid_pre.fwd_hooks
    with pytest.raises(InputError, match="direction"):
        model.remove_all_hook_fns("sideways")


def test_dense_is_built_once_per_shape():
    causal = Causal()
    d = causal.dense(4, 6, torch.float32)
    assert causal.dense(4, 6, torch.float32) is d and causal.dense(4, 5, torch.float32) is not d
    assert torch.isneginf(d).tolist() == [[j > i + 2 for j in range(6)] for i in range(4)]
    pad = Padding(torch.tensor([[0, 1, 1]]))
    assert combine(Causal(), pad).empty_rows and not Causal().empty_rows
    assert Bidirectional().dense(2, 2, torch.float32) is None
    assert ALiBiBias(4, True).dense(3, 3, torch.float32).shape == (4, 3, 3)


def test_hook_point_is_still_transformer_lens_own():
    assert isinstance(make("attn-only").blocks[0].attn.hook_pattern, HookPoint)


def test_an_in_place_edit_through_a_pytorch_hook_leaves_the_weights_alone():
    """The positional rows are a view of W_pos; a plain PyTorch hook that edits its input in place gets a copy."""
    model = make("attn-only")
    before = model.W_pos.detach().clone()
    handle = model.hook_pos_embed.register_forward_hook(lambda m, i, out: out.mul_(0))
    with torch.no_grad():
        model(tokens(model))
    handle.remove()
    assert torch.equal(model.W_pos, before)


@pytest.mark.slow  # compiling takes ~15 s
def test_torch_compile_traces_the_decision_without_a_graph_break():
    """The decision is plain Python over module attributes: a compiled loss is one graph and equals the eager one."""
    from torch._dynamo import explain  # torch's own tool for counting graph breaks; test-only

    model = make("gelu-ln")
    toks = tokens(model)
    report = explain(lambda t: model(t, return_type="loss"))(toks)
    assert report.graph_break_count == 0, report.break_reasons
    with torch.no_grad():
        eager = model(toks, return_type="loss")
        compiled = torch.compile(lambda t: model(t, return_type="loss"))(toks)
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)

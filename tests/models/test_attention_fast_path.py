"""The explicit attention path's inference-only fast path (`Attention._explicit` without autograd: `torch.baddbmm`
scores, the softmax in place of unhooked scores, `causal_pattern_v` when only `run_with_cache` watches) against the
plain path (the same forward with autograd on) and hand computations; hook edits still take effect; the caching hooks
(`CacheHook`, `only_caching`) and `ScoreBias.dense` / `masks_future`."""

from __future__ import annotations

import pytest
import torch
from helpers import randomize
from transformer_lens.hook_points import HookPoint

from models import HookedTransformer, HookedTransformerConfig, InputError
from models.arch.attention import causal_pattern_v, scaled_scores
from models.arch.hook_switches import CacheHook, only_caching
from models.arch.positions import ALiBiBias
from models.arch.score_bias import Bidirectional, Causal, Padding, combine

ATTN = ("hook_q", "hook_k", "hook_v", "hook_attn_scores", "hook_pattern", "hook_z")


def make(dtype="float32", **kw):
    d = dict(n_layers=2, d_model=32, n_ctx=12, d_vocab=40, n_heads=4, d_mlp=None, normalization_type=None,
             positional_embedding_type="standard", dtype=dtype, seed=0)
    d.update(kw)
    return randomize(HookedTransformer(HookedTransformerConfig(**d)), scale=0.4, seed=3)


def tokens(model, batch=3, pos=11, seed=0):
    return torch.randint(0, model.cfg.d_vocab, (batch, pos), generator=torch.Generator().manual_seed(seed))


def plain_cache(model, toks, **kw):
    """`run_with_cache` with autograd on (parameters require grad): the plain explicit path."""
    with torch.enable_grad():
        logits, cache = model.run_with_cache(toks, **kw)
    return logits.detach(), {k: v.detach() for k, v in cache.items()}


def assert_close_to_rounding(got, ref, dtype, what):
    """float64: to 1e-10; float32: to 1e-5 of the tensor's largest finite entry (the kernels round differently)."""
    scale = float(ref[ref.isfinite()].abs().max()) if ref.isfinite().any() else 1.0
    tol = 1e-10 if dtype == "float64" else 1e-5 * max(scale, 1.0)
    torch.testing.assert_close(got, ref, rtol=0, atol=tol, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("setting", ["causal", "bidirectional", "alibi", "left padding", "gqa", "kv cache"])
@pytest.mark.parametrize("names", ["all", "patterns", "scores"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_fast_path_matches_plain_path(setting, names, dtype):
    """Every cached activation and the logits agree with the plain path (autograd on) to rounding."""
    kw = {"alibi": dict(positional_embedding_type="alibi"), "bidirectional": dict(attention_dir="bidirectional"),
          "gqa": dict(n_key_value_heads=2)}.get(setting, {})
    model = make(dtype, **kw)
    toks = tokens(model)
    run = {}
    if setting == "left padding":
        run = dict(attention_mask=torch.tensor([[0, 0, 0] + [1] * 8, [1] * 11, [0] + [1] * 10]))
    names_filter = {"all": None, "patterns": lambda n: n.endswith("hook_pattern"),
                    "scores": lambda n: n.endswith("hook_attn_scores")}[names]
    if setting == "kv cache":  # keys longer than queries: the last 4 positions after a cached prefix of 7
        from models import HookedTransformerKeyValueCache
        caches = []
        for grad in (False, True):
            kv = HookedTransformerKeyValueCache.init_cache(model.cfg, model.cfg.device, toks.shape[0])
            with torch.set_grad_enabled(grad):
                model(toks[:, :7], past_kv_cache=kv)
                caches.append(model.run_with_cache(toks[:, 7:], past_kv_cache=kv, names_filter=names_filter))
        (fast_logits, fast), (plain_logits, plain) = caches
        plain_logits = plain_logits.detach()
    else:
        with torch.no_grad():
            fast_logits, fast = model.run_with_cache(toks, names_filter=names_filter, **run)
        plain_logits, plain = plain_cache(model, toks, names_filter=names_filter, **run)
    assert set(fast.keys()) == set(plain.keys()) and len(fast.keys()) >= 2
    for name in fast.keys():
        assert torch.equal(fast[name].isfinite(), plain[name].isfinite()), name
        assert_close_to_rounding(fast[name], plain[name].detach(), dtype, name)
    assert_close_to_rounding(fast_logits, plain_logits, dtype, "logits")


def test_fast_path_matches_a_float64_loop():
    """Scores, pattern and z of each head from the cached float64 q, k, v, one query at a time."""
    model = make("float64")
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
    """An in-place edit that lets layer 1 attend to every key (future ones too) changes z as computed by hand, while
    `run_with_cache` caches that point: the causal shortcut must not be taken."""
    model = make("float64")
    toks = tokens(model)
    P = toks.shape[1]

    def edit(t, hook):  # uniform over all keys: scores all equal, or the pattern itself
        t.fill_(0.0 if where == "hook_attn_scores" else 1.0 / P)

    with torch.no_grad(), model.hooks(fwd_hooks=[(f"blocks.1.attn.{where}", edit)]):
        _, cache = model.run_with_cache(toks)
    v = cache["blocks.1.attn.hook_v"]
    torch.testing.assert_close(cache["blocks.1.attn.hook_z"], v.mean(1, keepdim=True).expand_as(v))
    torch.testing.assert_close(cache["blocks.1.attn.hook_pattern"], torch.full_like(cache["blocks.1.attn.hook_pattern"],
                                                                                      1.0 / P))


def test_no_hook_sees_the_softmax_overwrite_its_scores():
    """A user hook that keeps the scores it saw (not a `CacheHook`) still holds scores, not the pattern."""
    model = make()
    toks = tokens(model)
    kept = {}
    with torch.no_grad():
        model.run_with_hooks(toks, fwd_hooks=[("blocks.0.attn.hook_attn_scores",
                                               lambda t, hook: kept.setdefault("s", t))])
        _, cache = model.run_with_cache(toks, names_filter=lambda n: n.startswith("blocks.0.attn.hook_attn_sc"))
    torch.testing.assert_close(kept["s"], cache["blocks.0.attn.hook_attn_scores"])
    assert torch.isneginf(kept["s"]).any()


@pytest.mark.parametrize("batch,bias", [(3, True), (3, False), (40, True), (40, False)])
def test_scaled_scores_per_sequence_and_batched(batch, bias):
    """Both ways of `scaled_scores` (one call per sequence on strided views; one call on copies) against the
    plain formula, with the strided q and k views of a fused projection."""
    g = torch.Generator().manual_seed(batch)
    qkv = torch.randn(batch, 6, 3 * 4 * 5, generator=g, dtype=torch.float64)  # [batch, pos, 3 · heads · d_head]
    q, k, _ = (t.view(batch, 6, 4, 5).transpose(1, 2) for t in qkv.split(20, -1))
    b = Causal().dense(6, 6, torch.float64) if bias else None
    expected = q @ k.transpose(-1, -2) * 0.3 + (0 if b is None else b)
    torch.testing.assert_close(scaled_scores(q, k, 0.3, b), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("P,K,blocks", [(1, 1, 4), (7, 7, 4), (5, 9, 3), (64, 64, 4), (10, 13, 1)])
def test_causal_pattern_v_matches_the_full_product(P, K, blocks):
    g = torch.Generator().manual_seed(P + K)
    keep = torch.ones(P, K, dtype=torch.bool).tril(K - P)
    pattern = torch.rand(2, 3, P, K, generator=g, dtype=torch.float64) * keep
    v = torch.randn(2, 3, K, 5, generator=g, dtype=torch.float64)
    torch.testing.assert_close(causal_pattern_v(pattern, v, blocks), pattern @ v, rtol=1e-12, atol=1e-12)


def test_only_caching_and_cache_hook():
    point = HookPoint()
    point.name = "p"
    assert only_caching(point)
    cache = {}
    point.add_hook(CacheHook(cache))
    x = torch.randn(3)
    assert only_caching(point) and torch.equal(point(x), x) and torch.equal(cache["p"], x)
    point.add_hook(lambda t, hook: None)
    assert not only_caching(point)
    point.remove_hooks()
    point.add_hook(CacheHook(cache), dir="bwd")
    assert not only_caching(point)


def test_caching_hooks_skip_switched_off_points_and_permanent_hooks_stay():
    model = make(n_layers=1)
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


def test_dense_is_built_once_per_shape_and_masks_future():
    causal = Causal()
    d = causal.dense(4, 6, torch.float32)
    assert causal.dense(4, 6, torch.float32) is d and causal.dense(4, 5, torch.float32) is not d
    assert torch.isneginf(d).tolist() == [[j > i + 2 for j in range(6)] for i in range(4)]
    pad = Padding(torch.tensor([[0, 1, 1]]))
    assert causal.masks_future and combine(Causal(), pad).masks_future
    assert not Bidirectional().masks_future and not pad.masks_future and not ALiBiBias(4, True).masks_future

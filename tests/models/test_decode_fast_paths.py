"""The decoding step's fast paths (issue 15), each against the plain path it replaces:

- `HookedTransformerKeyValueCache` writes into growing buffers in place; TransformerLens 2.18's cache (`torch.cat` of
  everything cached with the new positions, re-implemented below from `transformer_lens/past_key_value_caching.py`)
  is the reference, operation by operation, frozen and unfrozen, with assigned tensors and under autograd;
- a one-query causal step attends to every key without a mask (`Causal.keep`);
- an all-ones attention mask reads the positional rows directly instead of gathering them by cumulative count;
- `models.arch.products.affine` skips a zero bias, and below 32 rows the attention projects per head;
and the cached generation with hooks attached (also attached mid-generation) against the cache-free one."""

from __future__ import annotations

import pytest
import torch
from helpers import byte_model as make

from models import HookedTransformerKeyValueCache
from models.arch.products import affine
from models.arch.score_bias import Causal
from models.generation.kv_cache import HookedTransformerKeyValueCacheEntry


class TLEntry:
    """TransformerLens 2.18's `HookedTransformerKeyValueCacheEntry.append`, verbatim in substance."""

    def __init__(self, keys, values):
        self.past_keys, self.past_values, self.frozen = keys, values, False

    def append(self, new_keys, new_values):
        keys = torch.cat([self.past_keys, new_keys], dim=1)
        values = torch.cat([self.past_values, new_values], dim=1)
        if not self.frozen:
            self.past_keys, self.past_values = keys, values
        return keys, values


# --- the cache object ----------------------------------------------------------------------------------------
# (operation, new positions): "a" append, "f" freeze, "u" unfreeze, "s" assign past_keys/past_values afresh
SCRIPTS = {
    "one at a time": [("a", 5)] + [("a", 1)] * 40,
    "chunks": [("a", 3), ("a", 7), ("a", 1), ("a", 20), ("a", 2)],
    "freeze and back": [("a", 4), ("f", 0), ("a", 3), ("a", 1), ("u", 0), ("a", 2), ("a", 1)],
    "assigned": [("a", 2), ("s", 0), ("a", 1), ("a", 17), ("s", 0), ("a", 1)],
}


@pytest.mark.parametrize("script", SCRIPTS, ids=list(SCRIPTS))
def test_cache_entry_equals_transformer_lens_cat(script):
    g = torch.Generator().manual_seed(0)
    B, H, dh = 3, 2, 4
    ours = HookedTransformerKeyValueCacheEntry(torch.empty(B, 0, H, dh), torch.empty(B, 0, H, dh))
    ref = TLEntry(torch.empty(B, 0, H, dh), torch.empty(B, 0, H, dh))
    earlier = []  # (a tensor given out, a copy of its values then)
    for op, n in SCRIPTS[script]:
        if op in "fu":
            ours.frozen = ref.frozen = op == "f"
            continue
        if op == "s":
            k, v = torch.randn(B, 6, H, dh, generator=g), torch.randn(B, 6, H, dh, generator=g)
            ours.past_keys, ours.past_values = k, v
            ref.past_keys, ref.past_values = k.clone(), v.clone()
            earlier.append((k, k.clone()))
            continue
        k, v = torch.randn(B, n, H, dh, generator=g), torch.randn(B, n, H, dh, generator=g)
        got, want = ours.append(k, v), ref.append(k, v)
        for a, b in zip(got, want):
            assert a.shape == b.shape and torch.equal(a, b)
        assert torch.equal(ours.past_keys, ref.past_keys) and torch.equal(ours.past_values, ref.past_values)
        earlier += [(got[0], got[0].clone()), (ours.past_values, ours.past_values.clone())]
    for t, copy in earlier:  # positions once given out are never written again
        assert torch.equal(t, copy)


def test_unfrozen_appends_write_in_place_and_grow_by_doubling():
    cfg = make().cfg
    cache = HookedTransformerKeyValueCache.init_cache(cfg, None, 2)
    ptrs = set()
    for _ in range(40):
        cache[0].append(torch.randn(2, 1, 4, 4), torch.randn(2, 1, 4, 4))
        ptrs.add(cache[0].past_keys.untyped_storage().data_ptr())
    assert cache[0].past_keys.shape == (2, 40, 4, 4)
    assert len(ptrs) <= 3  # capacity 16, 32, 64: a reallocation per doubling, not per step


def test_attention_mask_equals_transformer_lens_cat():
    cache = HookedTransformerKeyValueCache.init_cache(make().cfg, None, 2)
    ref = torch.empty((2, 0), dtype=torch.int)
    for i, n in enumerate([3, 1, 1, 5, 1]):
        new = (torch.arange(2 * n).view(2, n) % 3 != i % 3).long()
        got = cache.append_attention_mask(new)
        ref = torch.cat([ref, new.to(ref)], dim=-1)
        assert got.dtype == ref.dtype and torch.equal(got, ref) and torch.equal(cache.previous_attention_mask, ref)
        assert cache.n_past == ref.shape[1]
    cache.freeze()
    got = cache.append_attention_mask(torch.ones(2, 2, dtype=torch.long))
    assert got.shape[1] == ref.shape[1] + 2 and torch.equal(cache.previous_attention_mask, ref)


def test_cached_steps_under_autograd_match_the_full_forward_gradients():
    """With autograd on, appends take TransformerLens' cat (an in-place write into keys a previous step saved for
    backward would fail there); gradients through two cached steps equal the cache-free forward's."""
    model = make("rotary")
    tokens = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(0))
    cache = HookedTransformerKeyValueCache.init_cache(model.cfg, None, 2)
    out = [model(tokens[:, :7], past_kv_cache=cache)] + [model(tokens[:, i:i + 1], past_kv_cache=cache)
                                                         for i in (7, 8)]
    cached = torch.cat(out, 1)[:, -2:].square().sum()
    grads = torch.autograd.grad(cached, [model.blocks[0].attn.W_Q, model.blocks[1].attn.W_K])
    full = model(tokens)[:, -2:].square().sum()
    ref = torch.autograd.grad(full, [model.blocks[0].attn.W_Q, model.blocks[1].attn.W_K])
    torch.testing.assert_close(cached, full, rtol=1e-5, atol=1e-5)
    for g, r in zip(grads, ref):
        assert float((g - r).norm() / r.norm()) < 1e-5  # relative Frobenius error, float32


# --- the score bias, the positions, the small products --------------------------------------------------------
@pytest.mark.parametrize("n_q,n_k", [(1, 1), (1, 7), (3, 7), (5, 5)])
def test_causal_keep_against_a_loop(n_q, n_k):
    keep = Causal().keep(n_q, n_k)
    loop = torch.tensor([[j <= i + n_k - n_q for j in range(n_k)] for i in range(n_q)])
    assert (keep is None and bool(loop.all())) or torch.equal(keep, loop)
    mask, is_causal = Causal().sdpa_args(n_q, n_k, torch.float32)
    if loop.all():
        assert mask is None
    else:
        # SDPA's own causal mask is top-left aligned: right only for a square
        assert (is_causal and n_q == n_k and mask is None) or (not is_causal and torch.equal(torch.isinf(mask), ~loop))


@pytest.mark.parametrize("kind", ["standard", "shortformer", "sinusoidal"])
def test_all_ones_mask_reads_the_rows_as_the_gather(kind):
    model = make(kind)
    tokens = torch.randint(0, 256, (3, 11), generator=torch.Generator().manual_seed(1))
    plain = model(tokens)
    torch.testing.assert_close(model(tokens, attention_mask=torch.ones_like(tokens)), plain, rtol=0, atol=0)
    cache = HookedTransformerKeyValueCache.init_cache(model.cfg, None, 3)
    seen = []
    hook = ("hook_pos_embed", lambda x, hook: seen.append(x.clone()))
    with model.hooks(fwd_hooks=[hook]):
        model(tokens[:, :4], past_kv_cache=cache)
        steps = [model(tokens[:, i:i + 1], past_kv_cache=cache) for i in range(4, 11)]
    torch.testing.assert_close(torch.cat(steps, 1), plain[:, 4:], rtol=1e-5, atol=1e-5)
    table = model.pos_embed.rows(11)  # positions 0..10 of the table
    for i, rows in enumerate(seen[1:], start=4):
        assert torch.equal(rows, table[i].expand(3, 1, -1))


def test_small_products_add_the_zero_bias():
    g = torch.Generator().manual_seed(0)
    W = torch.randn(16, 24, generator=g)
    for rows in (1, 8, 31, 32, 40):
        x = torch.randn(rows, 16, generator=g)
        torch.testing.assert_close(affine(torch.zeros(24), x, W), x @ W, rtol=1e-6, atol=1e-6)
        b = torch.randn(24, generator=g)
        torch.testing.assert_close(affine(b, x, W), x @ W + b, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kind,n_kv", [("shortformer", None), ("rotary", 2), ("standard", 2), ("alibi", None)])
def test_per_head_projection_of_few_rows_equals_the_fused_one(kind, n_kv):
    """A cached step below 32 rows projects per head (`baddbmm`); the same sequences inside a batch of 40 take the
    fused QKV product at every step. Hooks editing q and v in place act the same on both."""
    model = make(kind, n_kv=n_kv)
    tokens = torch.randint(0, 256, (40, 6), generator=torch.Generator().manual_seed(2))

    def edit(x, hook):
        x[..., 0, :] *= 0.5
        return x

    def stepped(t):
        cache = HookedTransformerKeyValueCache.init_cache(model.cfg, None, t.shape[0])
        return torch.cat([model(t[:, :3], past_kv_cache=cache)] + [model(t[:, i:i + 1], past_kv_cache=cache)
                                                                    for i in range(3, 6)], 1)

    for hooks in ([], [("blocks.0.attn.hook_q", edit), ("blocks.1.attn.hook_v", edit)]):
        with model.hooks(fwd_hooks=hooks):
            few, many = stepped(tokens[:2]), stepped(tokens)  # 6 then 2 rows a step; 120 then 40
            torch.testing.assert_close(few, many[:2], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(few, model(tokens[:2]), rtol=1e-4, atol=1e-4)


# --- generation with hooks ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind,n_kv", [("standard", None), ("shortformer", None), ("rotary", 2), ("alibi", None)])
def test_cached_patterns_equal_the_full_forward(kind, n_kv):
    """A hooked pattern forces the explicit attention path; each cached step's pattern row (one query, no mask)
    equals the last row of the full forward's pattern."""
    model = make(kind, n_kv=n_kv)
    prompt = model.to_tokens(["ab", "cd"])
    rows = []
    with model.hooks(fwd_hooks=[("blocks.1.attn.hook_pattern", lambda p, hook: rows.append(p.clone()))]):
        out = model.generate(prompt, max_new_tokens=6, do_sample=False, use_past_kv_cache=True)
    assert torch.equal(out, model.generate(prompt, max_new_tokens=6, do_sample=False, use_past_kv_cache=False))
    _, act = model.run_with_cache(out[:, :-1])
    full = act["pattern", 1]  # [batch, head, pos, key]
    assert len(rows) == 6 and rows[0].shape[2] == prompt.shape[1]
    for step, p in enumerate(rows[1:], start=prompt.shape[1]):
        assert p.shape == (2, 4, 1, step + 1)
        torch.testing.assert_close(p[:, :, 0], full[:, :, step, :step + 1], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", ["shortformer", "rotary"])
def test_hook_attached_during_generation_fires_on_both_paths(kind):
    """On the 4th forward a hook attaches a zero-ablation of head 0 in the last layer (it changes only the new
    positions' logits, so the cached and cache-free paths stay comparable); both generate the same tokens, the
    ablation fires on every later forward, and it changes what is generated."""
    model = make(kind, attn_only=True)
    prompt = model.to_tokens(["hello", "world"])

    def run(kv: bool, attach: bool):
        calls = {"embed": 0, "ablate": 0}

        def ablate(z, hook):
            calls["ablate"] += 1
            z[:, :, 0] = 0.0
            return z

        def embed(x, hook):
            calls["embed"] += 1
            if attach and calls["embed"] == 4:
                model.blocks[1].attn.hook_z.add_hook(ablate)
            return x

        model.hook_embed.add_hook(embed)
        try:
            out = model.generate(prompt, max_new_tokens=12, do_sample=False, use_past_kv_cache=kv)
        finally:
            model.reset_hooks()
        return out, calls

    (cached, c1), (free, c2) = run(True, True), run(False, True)
    assert torch.equal(cached, free)
    assert c1 == c2 == {"embed": 12, "ablate": 9}
    assert not torch.equal(cached, run(True, False)[0])

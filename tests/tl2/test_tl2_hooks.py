"""Ports of TransformerLens 2.18's hook tests to our model: tests/integration/test_hooks.py (upstream on the hub
model solu-1l; here the zoo model of tl2_port.TEXT_MODEL: the assertions count hook calls and do not depend on the
weights), acceptance/test_hooked_transformer.py::test_pos_embed_hook (gpt2-small there) and
acceptance/test_hook_tokens.py::test_patch_tokens (gpt2's tokenizer there)."""

from __future__ import annotations

import functools

import pytest
import torch
from tl2_port import text_model, tl_model

PROMPT = "Hello World!"


def embed(name):
    return name == "hook_embed"


class Counter:
    def __init__(self):
        self.count = 0

    def inc(self, *args, **kwargs):
        self.count += 1


@pytest.fixture
def model():
    m = text_model()
    yield m
    m.remove_all_hook_fns(including_permanent=True)


def n_fwd(model, name="hook_embed"):
    return len(model.hook_dict[name].fwd_hooks)


def test_hook_attaches_normally(model):
    """test_hooks.py::test_hook_attaches_normally"""
    c = Counter()
    model.run_with_hooks(PROMPT, fwd_hooks=[(embed, c.inc)])
    assert all(len(hp.fwd_hooks) == 0 for hp in model.hook_dict.values())
    assert c.count == 1


def test_perma_hook_attaches_normally(model):
    """test_hooks.py::test_perma_hook_attaches_normally"""
    c = Counter()
    model.add_perma_hook(embed, c.inc)
    assert n_fwd(model) == 1
    model.run_with_hooks(PROMPT, fwd_hooks=[])
    assert n_fwd(model) == 1 and c.count == 1


def test_hook_context_manager(model):
    """test_hooks.py::test_hook_context_manager"""
    c = Counter()
    with model.hooks(fwd_hooks=[(embed, c.inc)]):
        assert n_fwd(model) == 1
        model.forward(PROMPT)
    assert n_fwd(model) == 0 and c.count == 1


def test_nested_hook_context_manager(model):
    """test_hooks.py::test_nested_hook_context_manager"""
    c = Counter()
    with model.hooks(fwd_hooks=[(embed, c.inc)]):
        model.forward(PROMPT)
        assert c.count == 1
        with model.hooks(fwd_hooks=[(embed, c.inc)]):
            assert n_fwd(model) == 2
            model.forward(PROMPT)
            assert c.count == 3
        assert n_fwd(model) == 1
    assert n_fwd(model) == 0 and c.count == 3


def test_context_manager_run_with_cache(model):
    """test_hooks.py::test_context_manager_run_with_cache"""
    c = Counter()
    with model.hooks(fwd_hooks=[(embed, c.inc)]):
        model.run_with_cache(PROMPT)
        assert n_fwd(model) == 1
    assert n_fwd(model) == 0 and c.count == 1


def test_backward_hook_runs_successfully(model):
    """test_hooks.py::test_backward_hook_runs_successfully"""
    c = Counter()

    def skip_grad(grad, hook):
        c.inc()
        return (grad,)

    with model.hooks(bwd_hooks=[(embed, skip_grad)]):
        assert len(model.hook_dict["hook_embed"].bwd_hooks) == 1
        out = model(PROMPT)
        assert c.count == 0
        out.sum().backward()
    assert len(model.hook_dict["hook_embed"].bwd_hooks) == 0 and c.count == 1
    model.zero_grad(set_to_none=True)


@pytest.mark.parametrize("returns", ["bare_tensor", "none"])
def test_backward_hook_return_value(model, returns):
    """test_hooks.py::test_backward_hook_returning_bare_tensor and ::test_backward_hook_returning_none"""
    c = Counter()

    def hook(grad, hook):
        c.inc()
        return grad if returns == "bare_tensor" else None

    with model.hooks(bwd_hooks=[("blocks.0.hook_resid_post", hook)]):
        model(PROMPT).sum().backward()
    assert c.count == 1
    model.zero_grad(set_to_none=True)


def test_hook_context_manager_with_permanent_hook(model):
    """test_hooks.py::test_hook_context_manager_with_permanent_hook"""
    c = Counter()
    model.add_perma_hook(embed, c.inc)
    with model.hooks(fwd_hooks=[(embed, c.inc)]):
        assert n_fwd(model) == 2
        model.forward(PROMPT)
    assert n_fwd(model) == 1 and c.count == 2


def test_nested_context_manager_with_failure(model):
    """test_hooks.py::test_nested_context_manager_with_failure"""

    def fail(z, hook):
        raise ValueError("fail")

    c = Counter()
    with model.hooks(fwd_hooks=[(embed, c.inc)]):
        with pytest.raises(ValueError):
            with model.hooks(fwd_hooks=[(embed, fail)]):
                assert n_fwd(model) == 2
                model.forward(PROMPT)
        assert n_fwd(model) == 1 and c.count == 1
    assert n_fwd(model) == 0


def test_reset_hooks_in_context_manager(model):
    """test_hooks.py::test_reset_hooks_in_context_manager"""
    c = Counter()
    with model.hooks(fwd_hooks=[(embed, c.inc)]):
        model.reset_hooks()
        assert n_fwd(model) == 0
    assert n_fwd(model) == 0


def test_remove_hook(model):
    """test_hooks.py::test_remove_hook"""
    c = Counter()
    model.add_perma_hook(embed, c.inc)
    model.remove_all_hook_fns()
    assert n_fwd(model) == 1
    model.remove_all_hook_fns(including_permanent=True)
    assert n_fwd(model) == 0
    model.run_with_hooks(PROMPT, fwd_hooks=[])
    assert c.count == 0


def test_conditional_hooks(model):
    """test_hooks.py::test_conditional_hooks: opt-in hook points refuse hooks (AssertionError) until switched on,
    then cache tensors of TransformerLens' shapes. (Upstream uses a 4-token prompt; ours has 13 tokens.)"""

    def identity(z, hook):
        return z

    for name, setter in [("blocks.0.attn.hook_result", model.set_use_attn_result),
                         ("blocks.0.hook_q_input", model.set_use_split_qkv_input),
                         ("blocks.0.hook_mlp_in", model.set_use_hook_mlp_in),
                         ("blocks.0.hook_attn_in", model.set_use_attn_in)]:
        model.reset_hooks()
        setter(False)
        with pytest.raises(AssertionError):
            model.add_hook(name, identity)
        setter(True)
        model.add_hook(name, identity)
        setter(False)
    n_pos = model.to_tokens(PROMPT).shape[1]
    shapes = {3: (1, n_pos, model.cfg.d_model), 4: (1, n_pos, model.cfg.n_heads, model.cfg.d_model)}
    for name, setter, ndim in [("blocks.0.hook_q_input", model.set_use_split_qkv_input, 4),
                               ("blocks.0.hook_attn_in", model.set_use_attn_in, 4),
                               ("blocks.0.hook_mlp_in", model.set_use_hook_mlp_in, 3)]:
        model.reset_hooks()
        setter(True)
        cache = model.run_with_cache(PROMPT, names_filter=lambda x, name=name: x == name)[1]
        assert list(cache.keys()) == [name] and cache[name].shape == shapes[ndim]
        setter(False)


@pytest.mark.parametrize("zero_attach_pos, prepend", [(z, p) for z in range(2) for p in (True, False)])
def test_prepending_hooks(zero_attach_pos, prepend):
    """test_hooks.py::test_prepending_hooks: two hooks on the last block's output, one zeroing it; the logits are
    the unembedding bias exactly when the zeroing hook runs last (upstream: solu-1l, whose folded final norm maps 0
    to 0; here a one-layer model with a fresh LayerNorm, which does too)."""
    model = tl_model(n_layers=1, d_model=16, n_heads=2, d_mlp=32, n_ctx=8, d_vocab=11)
    with torch.no_grad():
        model.unembed.b_U.normal_()

    def set_to_zero(z, hook):
        z[:] = 0.0
        return z

    def set_to_randn(z, hook):
        return torch.randn_like(z) * 0.1

    for i in range(2):
        model.add_hook("blocks.0.hook_resid_post", set_to_zero if i == zero_attach_pos else set_to_randn,
                       prepend=prepend)
    logits = model(torch.arange(5)[None, :])
    assert torch.allclose(logits, model.unembed.b_U[None, :]) == ((zero_attach_pos == 1) != prepend)


@torch.no_grad()
def test_pos_embed_hook(model):
    """test_hooked_transformer.py::test_pos_embed_hook: an in-place edit in hook_pos_embed changes neither W_pos
    nor the other batch element."""
    initial = model.W_pos.detach().clone()

    def remove(z, hook):
        z[:] = 0.0
        return z

    model.run_with_hooks(PROMPT, fwd_hooks=[("hook_pos_embed", remove)])
    assert (model.W_pos == initial).all()

    def edit(z, hook):
        z[1, :] = 0.0
        assert (z[1, :] == 0.0).all()
        assert (z[0, :] == initial[: z.shape[1]]).all()
        return z

    model.run_with_hooks(["Hello, world", "Goodbye, world"], fwd_hooks=[("hook_pos_embed", edit)])


def test_patch_tokens(model):
    """test_hook_tokens.py::test_patch_tokens (upstream: a random model with gpt2's tokenizer; here the zoo model's
    tokenizer): editing hook_tokens in place equals running the edited text."""
    cfg = model.cfg.to_dict() | {"use_hook_tokens": True}  # a construction-time switch, as in TransformerLens
    patched = type(model)(cfg, tokenizer=model.tokenizer)
    patched.load_state_dict(model.state_dict())
    new_first = patched.to_single_token("H")

    def hook_fn(tokens, hook, new_first_token):
        assert tokens[0, 0].item() != new_first_token
        tokens[0, 0] = new_first_token
        return tokens

    edit = functools.partial(hook_fn, new_first_token=new_first)
    out_hook = patched.run_with_hooks("J World!", prepend_bos=False, fwd_hooks=[("hook_tokens", edit)])
    torch.testing.assert_close(out_hook, patched("H World!", prepend_bos=False))


def test_use_attn_in_with_gqa_raises_error():
    """test_hooks.py::test_use_attn_in_with_gqa_raises_error (upstream: Qwen2-0.5B from the hub; here a random
    grouped-query model)."""
    model = tl_model(n_layers=1, d_model=16, n_heads=4, n_key_value_heads=2, n_ctx=8, d_vocab=11, attn_only=True)
    with pytest.raises(AssertionError):
        model.set_use_attn_in(True)

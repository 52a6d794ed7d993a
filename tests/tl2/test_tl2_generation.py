"""Ports of TransformerLens 2.18's key/value-cache, generation, attention-mask and loss tests to our model.
Upstream runs them on hub models (gpt2-small, pythia-14m, solu-1l, gpt2); here on the zoo model of
tl2_port.TEXT_MODEL (2 layers, so upstream's layer 3 of 4 becomes layer 1 of 2): every assertion compares the model
with itself (cached vs uncached, masked vs shortened), so the weights do not matter."""

from __future__ import annotations

import pytest
import torch
from tl2_port import kv_cache_class, text_model

ATOL = 1e-4  # upstream's tolerance for gpt2-small


@pytest.fixture(scope="module")
def model():
    return text_model()


def _init_cache(model, batch):
    return kv_cache_class().init_cache(model.cfg, model.cfg.device, batch)


# --- tests/integration/test_kv_cache.py --------------------------------------------------------------------------
@pytest.mark.parametrize("post", [" Sharon", " to buy myself a mandolin"], ids=["single", "multiple"])
def test_new_tokens_with_cache(model, post):
    """test_kv_cache.py::test_single_new_token and ::test_multiple_new_tokens: logits of new tokens after a cached
    prompt equal those of one uncached run."""
    pre = model.to_tokens("I went to Staten Island,")
    new = model.to_tokens(post, prepend_bos=False)
    no_cache = model(torch.cat([pre, new], dim=-1))
    cache = _init_cache(model, pre.shape[0])
    model(pre, past_kv_cache=cache)
    with_cache = model(new, past_kv_cache=cache)
    torch.testing.assert_close(no_cache[:, -new.shape[1]:], with_cache, atol=ATOL, rtol=0)


@pytest.mark.parametrize("pre_padding", ["left", "right", None])
@pytest.mark.parametrize("post_padding", ["left", "right", None])
def test_multi_token_batch(model, pre_padding, post_padding):
    """test_kv_cache.py::test_multi_token_batch: padded batches through a frozen cache give the first sequence's
    uncached probabilities."""
    padded_pre = ["It's always locked", "I'd rather be burned in Canada"]
    unpadded_pre = ["It's always locked", "It's always blocked"]
    padded_post = [" by the magistrate", " than to freeze here in the South"]
    unpadded_post = [" by the magistrate", " by the candidate"]
    first_post = model.to_tokens(padded_post[0], prepend_bos=False)
    first_full = torch.cat([model.to_tokens(padded_pre[0]), first_post], dim=-1)
    expected = model(first_full)[0, -first_post.shape[1]:]
    pre = (model.to_tokens(unpadded_pre) if pre_padding is None
           else model.to_tokens(padded_pre, padding_side=pre_padding))
    post = (model.to_tokens(unpadded_post, prepend_bos=False) if post_padding is None
            else model.to_tokens(padded_post, prepend_bos=False, padding_side=post_padding))
    cache = _init_cache(model, pre.shape[0])
    model(pre, past_kv_cache=cache, padding_side=pre_padding)
    cache.freeze()
    out = model(post, past_kv_cache=cache, padding_side=post_padding, prepend_bos=False)
    n = first_post.shape[1]
    got = out[0, :n] if post_padding == "right" else out[0, -n:]
    torch.testing.assert_close(expected.softmax(-1), got.softmax(-1), atol=ATOL, rtol=0)


def test_freeze_cache(model):
    """test_kv_cache.py::test_freeze_cache: frozen caches do not grow; unfrozen ones do."""
    pre = model.to_tokens("I went to Staten Island,")
    new_1 = model.to_tokens(" I'm headed to the church to play bingo.", prepend_bos=False)
    new_2 = model.to_tokens(" shine your light on me, Miss Liberty", prepend_bos=False)
    c1, c2 = _init_cache(model, 1), _init_cache(model, 1)
    model(pre, past_kv_cache=c1)
    c1.freeze()
    logits_1 = model(new_1, past_kv_cache=c1)
    model(pre, past_kv_cache=c2)
    c2.freeze()
    model(new_2, past_kv_cache=c2)
    assert len(c1.entries) == len(c2.entries)
    for e1, e2 in zip(c1.entries, c2.entries):
        torch.testing.assert_close(e1.past_keys, e2.past_keys, atol=1e-3, rtol=0)
        torch.testing.assert_close(e1.past_values, e2.past_values, atol=1e-3, rtol=0)
    torch.testing.assert_close(logits_1, model(new_1, past_kv_cache=c2), atol=ATOL, rtol=0)
    c2.unfreeze()
    again = model(new_1, past_kv_cache=c2)
    for e1, e2 in zip(c1.entries, c2.entries):
        assert e1.past_keys.shape[1] < e2.past_keys.shape[1]
    torch.testing.assert_close(logits_1, again, atol=ATOL, rtol=0)
    assert not torch.allclose(logits_1, model(new_1, past_kv_cache=c2), atol=ATOL)


def test_kv_cache_with_custom_attention_mask(model):
    """test_kv_cache.py::test_kv_cache_with_custom_attention_mask: masking an inserted token through the cache gives
    the logits of the text without it."""
    pre = model.to_tokens("An apple")
    post = model.to_tokens(" a day keeps junk the", prepend_bos=False)
    whole = model(model.to_tokens("An apple a day keeps the"))
    cache = _init_cache(model, 1)
    model(pre, past_kv_cache=cache)
    junk = model.to_tokens(" junk", prepend_bos=False).shape[1]
    keep = [1] * post.shape[1]
    start = model.to_tokens(" a day keeps", prepend_bos=False).shape[1]
    keep[start:start + junk] = [0] * junk
    out = model(post, attention_mask=torch.tensor([keep]), past_kv_cache=cache)
    torch.testing.assert_close(whole[:, -1], out[:, -1], atol=ATOL, rtol=0)


def test_kv_cache_and_start_at_layer(model):
    """test_kv_cache.py::test_kv_cache_and_start_at_layer (layer 1 of 2 here, 3 of 4 upstream)"""
    pre = model.to_tokens("I went to Staten Island,")
    new = model.to_tokens(" Sharon", prepend_bos=False)
    no_cache = model(torch.cat([pre, new], dim=-1))
    cache = _init_cache(model, 1)
    model(pre, past_kv_cache=cache)
    cache.freeze()
    _, toks, shortformer_pos_embed, attn_mask = model.input_to_embed(new, past_kv_cache=cache)
    _, act = model.run_with_cache(new, stop_at_layer=2, past_kv_cache=cache)
    out = model(act["blocks.1.hook_resid_pre"], start_at_layer=1, tokens=toks,
                shortformer_pos_embed=shortformer_pos_embed, attention_mask=attn_mask, past_kv_cache=cache)
    # upstream's " Sharon" is one gpt2 token; here it is several bytes: compare all of them
    torch.testing.assert_close(no_cache[:, -new.shape[1]:], out, atol=ATOL, rtol=0)


# --- tests/acceptance/test_hooked_transformer.py::test_different_inputs_for_generation ---------------------------
@pytest.mark.parametrize("input_type", ["str", "tokens", "embeds"])
@pytest.mark.parametrize("return_type", ["input", "str", "tokens", "embeds"])
def test_different_inputs_for_generation(model, input_type, return_type):
    """test_hooked_transformer.py::test_different_inputs_for_generation: text, tokens or embeddings in (one prompt
    and a batch), text, tokens or embeddings out."""
    for text in ["What is the meaning of life?", ["AI will destroy world", "AI will save us"]]:
        tokens = model.to_tokens(text)
        given = {"str": text, "tokens": tokens, "embeds": model.embed(tokens)}[input_type]
        out = model.generate(input=given, max_new_tokens=3, return_type=return_type, verbose=False)
        kind = input_type if return_type == "input" else return_type
        if kind == "str":
            assert isinstance(out, list) and isinstance(out[0], str) if isinstance(text, list) else isinstance(out, str)
        else:
            assert isinstance(out, torch.Tensor) and out.ndim == (2 if kind == "tokens" else 3)


# --- tests/integration/test_attention_mask.py::test_masked_tokens, test_cross_entropy_loss.py --------------------
def test_masked_tokens(model):
    """test_attention_mask.py::test_masked_tokens: an all-ones mask changes nothing; a zero column equals removing
    that position."""
    tokens = model.to_tokens(["Hello world!", "The quick brown fox jumps over the lazy dog."])
    full = torch.ones_like(tokens)
    torch.testing.assert_close(model(tokens), model(tokens, attention_mask=full))
    i = 2
    edited = torch.cat([tokens[:, :i], tokens[:, i + 1:]], dim=1)
    mask = full.clone()
    mask[:, i] = 0
    out = model(tokens, attention_mask=mask)
    torch.testing.assert_close(model(edited), torch.cat([out[:, :i], out[:, i + 1:]], dim=1), atol=1e-4, rtol=0)


def test_cross_entropy_attention_mask(model):
    """test_cross_entropy_loss.py::test_cross_entropy_attention_mask: masked trailing tokens leave the loss as is."""
    tokens = model.to_tokens(["The quick brown fox jumps over the lazy dog."])
    ones = torch.ones_like(tokens)
    loss = model(tokens, return_type="loss")
    torch.testing.assert_close(loss, model(tokens, attention_mask=ones, return_type="loss"), atol=1e-6, rtol=0)
    extra = model.to_tokens(["Lorem ipsum dolor sit amet, consectetur adipiscing elit."])
    combined = torch.cat([tokens, extra], dim=1)[:, : model.cfg.n_ctx]
    mask = torch.cat([ones, torch.zeros_like(extra)], dim=1)[:, : model.cfg.n_ctx]
    torch.testing.assert_close(loss, model(combined, attention_mask=mask, return_type="loss"))

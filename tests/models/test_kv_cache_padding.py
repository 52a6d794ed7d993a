"""The key/value cache, padding masks and partial runs (issue 14's TransformerLens 2.x API), against the plain
forward pass of the same model: cached logits ≈ uncached, greedy tokens equal; a padded batch ≈ each sequence alone."""

from __future__ import annotations

import pytest
import torch
from helpers import byte_model as make

from models import HookedTransformerKeyValueCache

KINDS = ["standard", "shortformer", "rotary", "alibi", "sinusoidal"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n_kv", [None, 2])
def test_cache_matches_full_forward(kind, n_kv):
    model = make(kind, n_kv=n_kv)
    tokens = torch.randint(0, 256, (3, 14), generator=torch.Generator().manual_seed(0))
    full = model(tokens)
    cache = HookedTransformerKeyValueCache.init_cache(model.cfg, model.cfg.device, 3)
    parts = [model(tokens[:, :6], past_kv_cache=cache)]
    parts += [model(tokens[:, i:i + 1], past_kv_cache=cache) for i in range(6, 14)]
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-4, rtol=1e-4)
    assert cache.n_past == 14 and cache[0].past_keys.shape == (3, 14, n_kv or 4, 4)


@pytest.mark.parametrize("kind", KINDS)
def test_generate_with_and_without_cache(kind):
    model = make(kind)
    prompt = model.to_tokens(["ab", "cd"])
    with_kv = model.generate(prompt, max_new_tokens=10, do_sample=False, use_past_kv_cache=True)
    without = model.generate(prompt, max_new_tokens=10, do_sample=False, use_past_kv_cache=False)
    assert torch.equal(with_kv, without)
    assert with_kv.shape == (2, 3 + 10)


def test_string_prompt_returns_text_without_bos():
    model = make()
    out = model.generate("hello", max_new_tokens=4, do_sample=False)
    assert isinstance(out, str) and out.startswith("hello") and "<|bos|>" not in out
    assert isinstance(model.generate(["a", "b"], max_new_tokens=2, do_sample=False), list)


@pytest.mark.parametrize("kind", ["standard", "shortformer", "alibi"])
def test_left_padding_matches_each_sequence_alone(kind):
    model = make(kind)
    texts = ["hi", "a longer prompt"]
    padded = model.to_tokens(texts, padding_side="left")
    assert padded[0, 0] == model.tokenizer.pad_token_id and padded[1, 0] == model.tokenizer.bos_token_id
    logits = model(padded, padding_side="left")
    for i, text in enumerate(texts):
        alone = model(text)
        torch.testing.assert_close(logits[i, -alone.shape[1]:], alone[0], atol=1e-4, rtol=1e-4)
    gen = model.generate(texts, max_new_tokens=5, do_sample=False, padding_side="left")
    for i, text in enumerate(texts):
        assert gen[i] == model.generate(text, max_new_tokens=5, do_sample=False)


def test_right_padding_mask_and_loss():
    model = make()
    texts = ["hi there", "a longer prompt here"]
    padded = model.to_tokens(texts)  # right padding, the default
    mask = (padded != model.tokenizer.pad_token_id).long()
    logits, _ = model.run_with_cache(padded, attention_mask=mask)
    per_token = model(padded, attention_mask=mask, return_type="loss", loss_per_token=True)
    alone = model(texts[0], return_type="loss", loss_per_token=True)[0]
    torch.testing.assert_close(per_token[0, :alone.shape[0]], alone, atol=1e-4, rtol=1e-4)
    assert (per_token[0, alone.shape[0]:] == 0).all()
    mean = model(padded, attention_mask=mask, return_type="loss")
    torch.testing.assert_close(mean, per_token.sum() / (mask[:, 1:] & mask[:, :-1]).sum())
    torch.testing.assert_close(logits[0, :9], model(texts[0])[0], atol=1e-4, rtol=1e-4)


def test_start_and_stop_at_layer_compose():
    model = make()
    tokens = model.to_tokens("partial runs")
    resid = model(tokens, stop_at_layer=1)
    _, cache = model.run_with_cache(tokens)
    torch.testing.assert_close(resid, cache["blocks.1.hook_resid_pre"])
    torch.testing.assert_close(model(resid, start_at_layer=1), model(tokens))
    loss = model(resid, start_at_layer=1, tokens=tokens, return_type="loss")
    torch.testing.assert_close(loss, model(tokens, return_type="loss"))


def test_bad_arguments_are_named():
    model = make()
    with pytest.raises(ValueError, match="padding_side"):
        model.to_tokens(["a", "bb"], padding_side="middle")
    with pytest.raises(ValueError, match="return_type"):
        model.generate("a", max_new_tokens=1, return_type="logits")
    cache = HookedTransformerKeyValueCache.init_cache(model.cfg, model.cfg.device, 2)
    with pytest.raises(ValueError, match="batch"):
        model(model.to_tokens("a"), past_kv_cache=cache)

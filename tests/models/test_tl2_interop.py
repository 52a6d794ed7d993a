"""TransformerLens 2.x interoperability details (issue 14): the Hugging Face tokenizer surface, cfg.dtype as a
torch.dtype (TransformerLens' own head detector runs on our model), models.load in eval mode, text helpers."""

from __future__ import annotations

import sys

import pytest
import torch

import models
from models.data.tokenizer import ByteTokenizer


@pytest.fixture(scope="module")
def model():
    return models.load("gelu-2l")


def test_load_returns_eval_mode(model):
    assert not model.training


def test_dtype_is_torch_dtype_and_json_keeps_the_name(model):
    assert model.cfg.dtype == torch.float32
    assert model.cfg.to_dict()["dtype"] == "float32"
    assert models.HookedTransformerConfig.from_dict(model.cfg.to_dict()).dtype == torch.float32


def test_transformer_lens_detect_head_runs(model):
    from models.arch.tl_compat import head_detector

    detect_head = head_detector().detect_head

    scores = detect_head(model, "the cat sat on the mat", "previous_token_head")
    assert scores.shape == (model.cfg.n_layers, model.cfg.n_heads)
    assert torch.isfinite(scores).all()


def test_hugging_face_surface_matches_our_ids(model):
    tok = model.tokenizer
    text = "héllo, wörld"
    assert tok(text)["input_ids"] == tok.encode(text)
    assert tok.batch_decode([tok.encode(text)]) == [text]
    assert tok.convert_ids_to_tokens([tok.bos_token_id]) == [tok.bos_token]
    assert len(tok) == tok.vocab_size == 259
    assert (tok.bos_token_id, tok.pad_token_id, tok.eos_token_id) == (256, 257, 258)
    tok2 = ByteTokenizer()
    tok2.padding_side = "left"
    assert tok2(["a", "bcd"], padding=True)["input_ids"][0] == [257, 257, 97]


def test_bpe_surface_matches_our_ids():
    tok = models.load("attn-only-2l").tokenizer
    text = "the quick brown fox"
    assert tok(text)["input_ids"] == tok.encode(text)
    assert tok.batch_decode([tok.encode(text)]) == [text]


def test_text_helpers(model):
    assert model.to_single_str_token(104) == "h"
    assert model.get_token_position("l", "hello") == 3  # BOS first
    assert model.get_token_position("l", "hello", mode="last") == 4
    assert model.to_str_tokens(["ab", "c"]) == [["<|bos|>", "a", "b"], ["<|bos|>", "c"]]
    assert model.to_str_tokens("ab", prepend_bos=False) == ["a", "b"]
    with pytest.raises(models.TokenNotFoundError, match="does not occur") as info:
        model.get_token_position("z", "hello")
    assert isinstance(info.value, ValueError) and isinstance(info.value, AssertionError)
    if sys.version_info >= (3, 11):  # exception notes (PEP 678); on 3.10 the error carries its message only
        assert "'z' (id 122)" in info.value.__notes__[0]


def test_pos_embed_without_mask_follows_the_offset(model):
    """TransformerLens 2.x's `PosEmbed(tokens, past_kv_pos_offset)` without a mask: rows offset .. offset + pos for
    every sequence (the masked case is the ported test_left_padding.py)."""
    out = model.pos_embed(torch.zeros(2, 3, dtype=torch.long), 5)
    assert torch.equal(out, model.W_pos[5:8].expand(2, 3, -1))


def test_set_tokenizer_refuses_what_it_cannot_use():
    small = models.HookedTransformer(models.HookedTransformerConfig(n_layers=1, d_model=8, n_ctx=4, d_vocab=20))
    with pytest.raises(models.TokenizerError, match="259 ids but the model's d_vocab is 20"):
        small.set_tokenizer(ByteTokenizer())
    with pytest.raises(models.TokenizerError, match="ByteTokenizer, BPETokenizer"):
        small.set_tokenizer("gpt2")
    with pytest.raises(models.TokenizerError, match="allowed: \\('left', 'right'\\)"):
        small.set_tokenizer(ByteTokenizer(), default_padding_side="top")
    assert small.tokenizer is None


def test_weight_helpers_match_transformer_lens_definitions(model):
    cfg = model.cfg
    expected = cfg.n_layers * (4 * cfg.d_model * cfg.d_head * cfg.n_heads + 2 * cfg.d_model * cfg.d_mlp)
    assert cfg.n_params == expected
    assert torch.equal(model.W_E_pos, torch.cat([model.W_E, model.W_pos]))
    for layer in range(cfg.n_layers):
        torch.testing.assert_close(model.blocks[layer].attn.OV.AB, model.OV[layer].AB)
        torch.testing.assert_close(model.blocks[layer].attn.QK.AB, model.QK[layer].AB)

"""Ports of TransformerLens 2.18's tests/integration/test_tokenization_methods.py to our model.

Adaptations (tests/tl2/README.md): upstream loads solu-1l with the hub tokenizer NeelNanda/gpt-neox-tokenizer-digits
(d_vocab 48262, n_ctx 1024) and gpt2's; the port uses the zoo model `gelu-2l` (n_ctx 128) and our byte tokenizer
(`models.data.tokenizer.ByteTokenizer`: ids 0-255 are the bytes themselves, 256 `<|bos|>`, 257 `<|pad|>`,
258 `<|endoftext|>`; 259 ids). So every expected id below is a byte value or 256, every expected token string a
character, and upstream's multi-character single tokens (" SolidGoldMagikarp", "biomolecules", " some") become single
characters; each such constant is marked.
"""

from __future__ import annotations

import pytest
import torch
from tl2_port import text_model, tl_model
from torch import Size, equal, tensor

from models.data.tokenizer import ByteTokenizer

BOS = 256  # the byte tokenizer's <|bos|> (upstream's 1)


@pytest.fixture(scope="module")
def model():
    return text_model()


def test_set_tokenizer_during_initialization(model):
    """(upstream: the hub tokenizer's name and its 48262 ids; here: the byte tokenizer and its 259 ids)"""
    assert isinstance(model.tokenizer, ByteTokenizer), "initialized with expected tokenizer"
    assert model.cfg.d_vocab == 259, "expected d_vocab"


def test_set_tokenizer_lazy():
    """(upstream: gpt2's tokenizer, d_vocab 50256 and its glitch token " SolidGoldMagikarp" = 43453; here the byte
    tokenizer, d_vocab 259 and "@" = 64)"""
    model2 = tl_model(n_layers=1, d_model=10, n_ctx=1024, d_head=1, act_fn="relu", d_vocab=259)
    assert model2.tokenizer is None, "initialize without tokenizer"
    model2.set_tokenizer(ByteTokenizer())
    assert isinstance(model2.tokenizer, ByteTokenizer), "set tokenizer"
    assert model2.to_single_token("@") == 64, "Glitch token didn't tokenize properly"
    assert model2.to_string([64]) == "@", "Glitch token didn't detokenize properly"


def test_to_tokens_default(model):
    tokens = model.to_tokens("Hello, world!")
    assert equal(tokens, tensor([[BOS, *b"Hello, world!"]]).to(model.cfg.device)), "creates a tensor of tokens with BOS"


def test_to_tokens_without_bos(model):
    tokens = model.to_tokens("Hello, world!", prepend_bos=False)
    assert equal(tokens, tensor([list(b"Hello, world!")]).to(model.cfg.device)), "creates a tensor without BOS"


@pytest.mark.skipif(torch.cuda.is_available() or torch.backends.mps.is_available(),
                    reason="Test not relevant when running on GPU")
def test_to_tokens_device(model):
    s = "Hello, world!"
    tokens1 = model.to_tokens(s, move_to_device=False)
    tokens2 = model.to_tokens(s, move_to_device=True)
    assert equal(tokens1, tokens2), "move to device has no effect when running tests on CPU"


def test_to_tokens_truncate(model):
    """(n_ctx 128 instead of 1024: "@ " * 65 is 130 byte tokens, 131 with the BOS)"""
    assert model.cfg.n_ctx == 128, "verify assumed context length"
    s = "@ " * 65
    tokens1 = model.to_tokens(s)
    tokens2 = model.to_tokens(s, truncate=False)
    assert len(tokens1[0]) == 128, "truncated by default"
    assert len(tokens2[0]) == 131, "not truncated"


def test_to_string_from_to_tokens_without_bos(model):
    s = "Hello, world!"
    tokens = model.to_tokens(s, prepend_bos=False)
    assert s == model.to_string(tokens[0]), "same string when converted back to string"


def test_to_string_multiple(model):
    """(upstream's ids [[1, 11765], [43453, 28666]] become [[BOS, "H"], ["C", "P"]])"""
    s_list = model.to_string(tensor([[BOS, ord("H")], [ord("C"), ord("P")]]))
    assert s_list == ["<|bos|>H", "CP"], "can handle list of lists"


def test_to_str_tokens_default(model):
    s_list = model.to_str_tokens(" SolidGoldMagikarp")
    assert s_list == ["<|bos|>", *" SolidGoldMagikarp"], "not a glitch token"  # one string per byte


def test_to_str_tokens_without_bos(model):
    s_list = model.to_str_tokens(" SolidGoldMagikarp", prepend_bos=False)
    assert s_list == [*" SolidGoldMagikarp"], "without BOS"


def test_to_single_token(model):
    """(upstream's single token "biomolecules" = 31847; here "b" = 98)"""
    assert model.to_single_token("b") == 98, "single token"


def test_to_single_str_tokent(model):
    assert model.to_single_str_token(98) == "b"


def test_get_token_position_not_found(model):
    """(upstream looks for "biomolecules" in a prompt without it as one token; here "z", absent from the prompt)"""
    with pytest.raises(AssertionError) as exc_info:
        model.get_token_position("z", "There were some biomolecules")
    assert str(exc_info.value) == "The token does not occur in the prompt", "assertion error"


def test_get_token_position_str(model):
    """(upstream's " some" is token 3; here "s" is byte 11 of "There were some ...", position 12 after the BOS)"""
    assert model.get_token_position("s", "There were some biomolecules") == 12, "first position"


def test_get_token_position_str_without_bos(model):
    assert model.get_token_position("s", "There were some biomolecules", prepend_bos=False) == 11, "without BOS"


def test_get_token_position_int_pos(model):
    single = 2
    input = tensor([2.0, 3, 4])
    pos1 = model.get_token_position(single, input)
    pos2 = model.get_token_position(single, input, prepend_bos=False)
    assert pos1 == 0, "first position"
    assert pos2 == 0, "no effect from BOS when using tensor as input"


def test_get_token_position_int_pos_last(model):
    assert model.get_token_position(2, tensor([2.0, 3, 4, 2, 5]), mode="last") == 3, "last position"


def test_get_token_position_int_1_pos(model):
    assert model.get_token_position(2, tensor([[2.0, 3, 4]])) == 0, "first position"


def test_tokens_to_residual_directions(model):
    """(d_model 128 instead of 512)"""
    res_dir = model.tokens_to_residual_directions(model.to_tokens(""))
    assert res_dir.shape == Size([128]), ""

"""Bad input to the model raises `ValueError` whose message names the problem and what is allowed."""

from __future__ import annotations

import pytest
import torch

from models import HookedTransformer, HookedTransformerConfig
from models.data.tokenizer import ByteTokenizer


@pytest.fixture(scope="module")
def model():
    cfg = HookedTransformerConfig(n_layers=1, d_model=16, n_ctx=8, d_vocab=50, n_heads=2, d_mlp=None, seed=0)
    return HookedTransformer(cfg)


@pytest.mark.parametrize("tokens,bad", [
    (torch.tensor([[1, 2, -1]]), "-1"),
    (torch.tensor([[1, 50, 3]]), "50"),
    (torch.tensor([[1, 2**40]]), str(2**40)),
    ([[0, 1], [2, -7]], "-7"),
])
def test_out_of_range_ids(model, tokens, bad):
    with pytest.raises(ValueError, match="out of range") as info:
        model(tokens)
    assert f"token id {bad}" in str(info.value) and "0..49" in str(info.value)


@pytest.mark.parametrize("tokens,dtype", [
    (torch.tensor([[1.0, 2.0]]), "float32"),
    (torch.tensor([[1.0, 2.0]], dtype=torch.float64), "float64"),
    (torch.tensor([[True, False]]), "bool"),
    ([1.5, 2.0], "float32"),
    (torch.tensor([[1 + 0j]]), "complex"),
])
def test_non_integer_tokens(model, tokens, dtype):
    with pytest.raises(ValueError, match="integer") as info:
        model(tokens)
    assert dtype in str(info.value)


@pytest.mark.parametrize("shape", [(1, 2, 3), (2, 2, 2, 2)])
def test_wrong_rank(model, shape):
    with pytest.raises(ValueError, match=r"\[batch, pos\] or \[pos\]") as info:
        model(torch.zeros(shape, dtype=torch.long))
    assert str(shape) in str(info.value)


@pytest.mark.parametrize("tokens", [torch.zeros(1, 0, dtype=torch.long), torch.zeros(0, dtype=torch.long),
                                    torch.zeros(0, 5, dtype=torch.long), [], [[]]])
def test_empty_input(model, tokens):
    with pytest.raises(ValueError, match="empty") as info:
        model(tokens)
    assert "at least one token" in str(info.value)


def test_ragged_list(model):
    with pytest.raises(ValueError, match="rectangular"):
        model([[1, 2], [3]])


@pytest.mark.parametrize("tokens", [object(), 3, {"a": 1}])
def test_not_tokens_at_all(model, tokens):
    with pytest.raises(ValueError, match="tensor"):
        model(tokens)


def test_over_long_context(model):
    with pytest.raises(ValueError, match="longer than n_ctx=8") as info:
        model(torch.zeros(2, 9, dtype=torch.long))
    assert "truncate" in str(info.value)


@pytest.mark.parametrize("return_type", ["logit", "LOSS", "probs", 1])
def test_wrong_return_type(model, return_type):
    with pytest.raises(ValueError, match="return_type") as info:
        model(torch.zeros(1, 3, dtype=torch.long), return_type=return_type)
    for allowed in ("'logits'", "'loss'", "'both'", "None"):
        assert allowed in str(info.value)


def test_loss_needs_two_tokens(model):
    with pytest.raises(ValueError, match="at least 2 tokens"):
        model(torch.zeros(1, 1, dtype=torch.long), return_type="loss")


@pytest.mark.parametrize("call", [
    lambda m: m("hello"), lambda m: m(["a", "b"]), lambda m: m.to_tokens("x"), lambda m: m.to_string([1, 2]),
    lambda m: m.to_str_tokens("x"), lambda m: m.generate("hi", max_new_tokens=1),
])
def test_text_without_tokenizer(model, call):
    with pytest.raises(ValueError, match="no tokenizer") as info:
        call(model)
    assert "token ids" in str(info.value)


def test_text_ids_outside_d_vocab_are_checked():
    """A byte tokenizer has 259 ids; a model with d_vocab=50 must refuse text that maps outside its vocab."""
    cfg = HookedTransformerConfig(n_layers=1, d_model=16, n_ctx=8, d_vocab=50, n_heads=2, seed=0)
    m = HookedTransformer(cfg, tokenizer=ByteTokenizer())
    with pytest.raises(ValueError, match="out of range"):
        m("hi")  # BOS = 256 and b"h" = 104 are both >= 50
    m.cfg.default_prepend_bos = False
    with pytest.raises(ValueError, match="empty"):
        m("")


def test_valid_inputs_still_work(model):
    """The accepted forms: [pos], [batch, pos], lists, int32."""
    ref = model(torch.tensor([[1, 2, 3]]))
    for tokens in (torch.tensor([1, 2, 3]), [1, 2, 3], [[1, 2, 3]], torch.tensor([[1, 2, 3]], dtype=torch.int32)):
        torch.testing.assert_close(model(tokens), ref)
    cfg = HookedTransformerConfig(n_layers=1, d_model=16, n_ctx=8, d_vocab=259, n_heads=2, seed=0)
    m = HookedTransformer(cfg, tokenizer=ByteTokenizer())
    assert m("hi").shape == (1, 3, 259)  # BOS + 2 bytes
    assert m(["hi", "abc"]).shape == (2, 4, 259)

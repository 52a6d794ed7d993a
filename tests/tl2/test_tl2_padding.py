"""Ports of TransformerLens 2.18's tests/integration/test_left_padding.py and test_prepend_bos.py to our model.

Adaptations (tests/tl2/README.md): upstream runs each test on gpt2-small and facebook/opt-125m from the hub; the
port runs it once, on the zoo model `gelu-2l` (learned positions, a byte tokenizer whose pad id differs from its BOS
id, as gpt2's does not and opt's does). The attention masks come from TransformerLens' own `get_attention_mask`
(transformer-lens 4.x, same code as 2.18's `utils.get_attention_mask`). Cache names are those of a 2-layer model.
"""

from __future__ import annotations

import pytest
import torch
from tl2_port import kv_cache_class, text_model
from transformer_lens.utilities import get_attention_mask

PROMPTS = ["Hello world!", "How are you today?", "I'm fine, thank you.", "I am happy."]


@pytest.fixture()
def model():
    return text_model()


# --- tests/integration/test_left_padding.py ------------------------------------------------------------------------
def _check_outputs_identity(i, single, left, right, left_start, left_end, right_start, right_end):
    atol = 1e-4
    assert torch.allclose(left[i, left_start:left_end, :], right[i, right_start:right_end, :], atol=atol)
    assert torch.allclose(left[i, left_start:left_end, :], single[0], atol=atol)
    assert torch.allclose(right[i, right_start:right_end, :], single[0], atol=atol)


def _padded(model, padding_side, prepend_bos):
    """The setup both pos_embed tests share: the prompts' tokens, str tokens and attention mask."""
    model.tokenizer.padding_side = padding_side
    tokens = model.to_tokens(PROMPTS, prepend_bos=prepend_bos)
    str_tokens = model.to_str_tokens(PROMPTS, prepend_bos=prepend_bos)
    return tokens, str_tokens, get_attention_mask(model.tokenizer, tokens, prepend_bos)  # mask: [batch pos]


PADDINGS = pytest.mark.parametrize("padding_side,prepend_bos", [(side, bos) for bos in (True, False)
                                                                for side in ("left", "right")])


@PADDINGS
def test_pos_embed(model, padding_side, prepend_bos):
    """test_left_padding.py::TestLeftPadding::test_pos_embed"""
    tokens, str_tokens, attention_mask = _padded(model, padding_side, prepend_bos)
    output_pos_embed = model.pos_embed(tokens, 0, attention_mask=attention_mask)  # [batch pos d_model]
    assert output_pos_embed.shape == (tokens.shape[0], tokens.shape[1], model.pos_embed.W_pos.shape[1])
    target_position_ids = torch.tensor(sum([list(range(len(t))) for t in str_tokens], []), device=tokens.device)
    target_output_pos_embed = model.pos_embed.W_pos[target_position_ids, :]
    attended_output_pos_embed = output_pos_embed[attention_mask.bool()]
    assert torch.allclose(attended_output_pos_embed, target_output_pos_embed, atol=1e-4)
    assert output_pos_embed[~attention_mask.bool()].sum() == 0  # padded positions have zero pos_embed


@PADDINGS
def test_pos_embed_with_cache(model, padding_side, prepend_bos):
    """test_left_padding.py::TestLeftPadding::test_pos_embed_with_cache"""
    tokens, str_tokens, attention_mask = _padded(model, padding_side, prepend_bos)
    tokens_2 = model.to_tokens(PROMPTS, prepend_bos=False)
    past_kv_cache = kv_cache_class().init_cache(model.cfg, model.cfg.device, tokens.shape[0])
    str_tokens_2 = model.to_str_tokens(PROMPTS, prepend_bos=False)
    past_kv_cache.append_attention_mask(attention_mask)
    attention_mask_2 = get_attention_mask(model.tokenizer, tokens_2, False)  # [batch pos]
    cached_attention_mask = past_kv_cache.append_attention_mask(attention_mask_2)
    output_pos_embed = model.pos_embed(tokens_2, tokens.shape[1], attention_mask=cached_attention_mask)
    target_position_ids = torch.tensor(
        sum([list(range(len(t1), len(t1) + len(t2))) for t1, t2 in zip(str_tokens, str_tokens_2)], []),
        device=tokens.device)
    target_output_pos_embed = model.pos_embed.W_pos[target_position_ids, :]
    attended_output_pos_embed = output_pos_embed[attention_mask_2.bool()]
    assert torch.allclose(attended_output_pos_embed, target_output_pos_embed, atol=1e-4)
    assert output_pos_embed[~attention_mask_2.bool()].sum() == 0


def test_left_padding_by_comparing_outputs(model):
    """test_left_padding.py::TestLeftPadding::test_left_padding_by_comparing_outputs (cache names of layers 0 and 1
    for upstream's gpt2 layers 2-6: "k1a", "pre1", "embed", "k1", "scale1ln1", "pre0")"""
    num_str_tokens_list = [len(t) for t in model.to_str_tokens(PROMPTS)]
    model.tokenizer.padding_side = "left"
    left_logits, left_cache = model.run_with_cache(PROMPTS)
    left_last_logits = left_logits[:, -1, :]
    left_first_token_positions = left_logits.shape[1] - torch.tensor(num_str_tokens_list, device=left_logits.device)
    left_first_logits = left_logits[torch.arange(len(PROMPTS)), left_first_token_positions, :].squeeze(1)
    model.tokenizer.padding_side = "right"
    right_logits, right_cache = model.run_with_cache(PROMPTS)
    right_last_token_positions = torch.tensor(num_str_tokens_list, device=right_logits.device) - 1
    right_last_logits = right_logits[torch.arange(len(PROMPTS)), right_last_token_positions, :].squeeze(1)
    right_first_logits = right_logits[:, 0, :]
    assert torch.allclose(left_last_logits, right_last_logits, atol=1e-4)
    assert torch.allclose(left_first_logits, right_first_logits, atol=1e-4)

    right_token_start = 0
    left_token_end = left_logits.shape[1]
    for i, (prompt, left_token_start, right_token_end) in enumerate(
            zip(PROMPTS, left_first_token_positions.tolist(), (right_last_token_positions + 1).tolist())):
        single_logits, single_cache = model.run_with_cache(prompt)
        assert right_token_end - right_token_start == left_token_end - left_token_start == single_logits.shape[1]
        bounds = (left_token_start, left_token_end, right_token_start, right_token_end)
        _check_outputs_identity(i, single_logits, left_logits, right_logits, *bounds)
        for name in ["k1a", "pre1", "embed", "k1", "scale1ln1", "pre0"]:
            _check_outputs_identity(i, single_cache[name], left_cache[name], right_cache[name], *bounds)


# --- tests/integration/test_prepend_bos.py -------------------------------------------------------------------------
PROMPT = "Hello world!"


def _num_tokens_in_prompt(model, prompt, intended_prepend_bos):
    """Upstream re-tokenizes with a fresh hub tokenizer without BOS; ours: `tokenizer.encode` (never adds a BOS)."""
    return len(model.tokenizer.encode(prompt)) + int(intended_prepend_bos)


def _check_first_token(model, str_tokens, tokens, intended_prepend_bos):
    if intended_prepend_bos:
        assert str_tokens[0] == model.tokenizer.bos_token
        assert tokens[0][0] == model.tokenizer.bos_token_id
    else:
        assert str_tokens[0] != model.tokenizer.bos_token
        assert tokens[0][0] != model.tokenizer.bos_token_id


def _check_tokens_length(model, logits, str_tokens, tokens, intended_prepend_bos):
    expected_num_tokens = _num_tokens_in_prompt(model, PROMPT, intended_prepend_bos)
    assert logits.shape[1] == len(str_tokens) == tokens.shape[1] == expected_num_tokens


def _check_default_run(model, intended_prepend_bos):
    logits = model(PROMPT)  # [batch pos d_vocab]
    str_tokens = model.to_str_tokens(PROMPT)
    tokens = model.to_tokens(PROMPT)  # [batch pos]
    _check_first_token(model, str_tokens, tokens, intended_prepend_bos)
    _check_tokens_length(model, logits, str_tokens, tokens, intended_prepend_bos)


def test_default_prepend_bos(model):
    """test_prepend_bos.py::TestPrependBos::test_default_prepend_bos"""
    assert model.cfg.default_prepend_bos is True, "Default prepend_bos should be True"
    _check_default_run(model, True)
    assert model.get_token_position(model.tokenizer.bos_token_id, PROMPT) == 0


def test_default_prepend_bos_to_false(model):
    """test_prepend_bos.py::TestPrependBos::test_default_prepend_bos_to_false (upstream passes
    default_prepend_bos=False to from_pretrained; here it is set on the loaded model's config)"""
    model.cfg.default_prepend_bos = False
    _check_default_run(model, False)


@pytest.mark.parametrize("intended_prepend_bos", [True, False])
def test_override_prepend_bos(model, intended_prepend_bos):
    """test_prepend_bos.py::TestPrependBos::test_override_prepend_bos"""
    for default_prepend_bos in [True, False]:
        model.cfg.default_prepend_bos = default_prepend_bos
        logits = model(PROMPT, prepend_bos=intended_prepend_bos)  # [batch pos d_vocab]
        str_tokens = model.to_str_tokens(PROMPT, prepend_bos=intended_prepend_bos)
        tokens = model.to_tokens(PROMPT, prepend_bos=intended_prepend_bos)
        _check_first_token(model, str_tokens, tokens, intended_prepend_bos)
        _check_tokens_length(model, logits, str_tokens, tokens, intended_prepend_bos)


def test_prepend_bos_with_get_token_position(model):
    """test_prepend_bos.py::TestPrependBos::test_prepend_bos_with_get_token_position"""
    assert model.get_token_position(model.tokenizer.bos_token_id, PROMPT) == 0
    with pytest.raises(AssertionError):
        model.get_token_position(model.tokenizer.bos_token_id, PROMPT, prepend_bos=False)
    model.cfg.default_prepend_bos = False
    with pytest.raises(AssertionError):
        model.get_token_position(model.tokenizer.bos_token_id, PROMPT)
    assert model.get_token_position(model.tokenizer.bos_token_id, PROMPT, prepend_bos=True) == 0


def test_same_tokenization(model):
    """test_prepend_bos.py::TestPrependBos::test_same_tokenization"""
    prompts = ["Italy is in Europe.", "Pyeongchang Olympics was held in 2018", "2023-09-09", "287594812673495"]
    model.tokenizer.padding_side = "right"
    for input in [PROMPT, prompts]:
        tokens_with_bos = model.to_tokens(input, prepend_bos=True)
        tokens_without_bos = model.to_tokens(input, prepend_bos=False)
        assert tokens_with_bos[..., 1:].equal(tokens_without_bos)
        str_tokens_with_bos = model.to_str_tokens(input, prepend_bos=True)
        str_tokens_without_bos = model.to_str_tokens(input, prepend_bos=False)
        if isinstance(str_tokens_with_bos[0], list):
            for i in range(len(str_tokens_with_bos)):
                assert str_tokens_with_bos[i][1:] == str_tokens_without_bos[i]
        else:
            assert str_tokens_with_bos[1:] == str_tokens_without_bos

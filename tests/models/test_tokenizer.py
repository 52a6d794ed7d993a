"""Tokenizers: round trips, determinism (train twice → identical vocab and ids), specs and errors."""

import pytest

from models.data.tokenizer import (
    BOS,
    BPETokenizer,
    ByteTokenizer,
    TokenizerError,
    load_tokenizer,
    make_tokenizer,
)

TEXTS = [
    "def add(a, b):\n    return a + b\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "# ünïcödé — λ → ∑ 🚀\nprint('hello, world')\n",
] * 20


def test_byte_round_trip_and_specials():
    tok = ByteTokenizer()
    text = "héllo\n\t🚀 λ"
    ids = tok.encode(text)
    assert all(0 <= i < 256 for i in ids)
    assert tok.decode(ids) == text
    assert tok.vocab_size == 259 and tok.bos_token_id == 256
    assert BOS in tok.decode([tok.bos_token_id] + ids)


def test_bpe_round_trip_save_load(tmp_path):
    tok = BPETokenizer.train(TEXTS, vocab_size=300)
    assert tok.vocab_size <= 300 and tok.bos_token_id is not None
    for t in TEXTS[:3] + ["unseen  words\n\n\tand 🚀 ∑"]:
        assert tok.decode(tok.encode(t)) == t
    tok.save(tmp_path / "tokenizer.json")
    back = load_tokenizer(tmp_path / "tokenizer.json")
    assert back.encode(TEXTS[1]) == tok.encode(TEXTS[1])
    assert back.bos_token_id == tok.bos_token_id


def test_bpe_training_is_deterministic():
    a = BPETokenizer.train(TEXTS, vocab_size=320)
    b = BPETokenizer.train(list(TEXTS), vocab_size=320)
    assert a.tok.to_str() == b.tok.to_str()  # identical vocabulary and merges
    assert a.encode(TEXTS[2] * 3) == b.encode(TEXTS[2] * 3)


def test_make_tokenizer_specs(tmp_path):
    assert isinstance(make_tokenizer("bytes"), ByteTokenizer)
    bpe = make_tokenizer("bpe-280", iter(TEXTS))
    assert isinstance(bpe, BPETokenizer) and bpe.vocab_size <= 280
    bpe.save(tmp_path / "t.json")
    assert make_tokenizer(str(tmp_path / "t.json")).encode("def x") == bpe.encode("def x")
    with pytest.raises(TokenizerError, match="bpe-<vocab size>"):
        make_tokenizer("bpe-lots", TEXTS)
    with pytest.raises(TokenizerError, match="unknown tokenizer"):
        make_tokenizer("sentencepiece")
    with pytest.raises(TokenizerError, match="vocab_size"):
        make_tokenizer("bpe-10", TEXTS)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="bad.json"):
        load_tokenizer(tmp_path / "bad.json")

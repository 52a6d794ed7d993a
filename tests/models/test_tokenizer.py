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


@pytest.mark.parametrize("pattern,refused", [
    ("(a+)+$", "nested repetition"), ("(a|aa)*", "nested repetition"), ("((a+)b)+", "nested repetition"),
    ("(a{1,3}){2}", "nested repetition"), (r"(\w)\1", "backreference"), (r"(?P<x>a)(?P=x)\k<x>", "backreference"),
    ("a*a*a*b", "repeated atoms"), ("(a+)(b+)c+", "repeated atoms"), ("a" * 300, "characters"), ("(ab", "unbalanced"),
])
def test_tokenizer_regexes_that_can_backtrack_badly_are_refused(pattern, refused):
    from models.data.tokenizer import regex_problem

    assert refused in regex_problem(pattern)


@pytest.mark.parametrize("pattern", [
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",  # GPT-2
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
    r"\s+(?!\S)|\s+",  # cl100k / Llama 3
    " ?[a-z]+", "(?:ab)+", "a{2,5}b?", r"[\[\]()+*]+", "(ab)?c+",
])
def test_tokenizer_regexes_of_the_gpt2_family_are_allowed(pattern):
    from models.data.tokenizer import regex_problem

    assert regex_problem(pattern) is None


def test_a_tokenizer_table_beyond_its_bounds_is_refused(tmp_path):
    import json

    from models.data.tokenizer import MAX_MERGES, tokenizer_json_problem

    data = json.loads(BPETokenizer.train(iter(TEXTS), vocab_size=280).tok.to_str())
    assert tokenizer_json_problem(data) is None
    data["model"]["merges"] = [["a", "b"]] * (MAX_MERGES + 1)
    assert "merges" in tokenizer_json_problem(data)

"""Tokenizers: byte-level (256 bytes + specials) and byte-level BPE trained with Hugging Face `tokenizers`.

Both expose `encode(text) -> list[int]`, `decode(ids) -> str`, `bos_token_id`, `pad_token_id`,
`vocab_size`, `id_to_token(i)` and `save(path)` (a `tokenizer.json`). Same text → same ids on every machine:
the byte tokenizer is a fixed table, and BPE training is deterministic for a given corpus order.

Both also carry the Hugging Face tokenizer surface that TransformerLens code calls (`__call__`, `batch_decode`,
`convert_ids_to_tokens`, `__len__`, `padding_side`, the special-token ids and tokens, ...): `hf` is a
`transformers.PreTrainedTokenizerFast` wrapping the same `tokenizers.Tokenizer` (for bytes: a byte-level BPE
without merges, so ids are the UTF-8 bytes), and names this module does not define are looked up there.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

from ..arch.tokens import decode_known, unknown_id_text
from ..errors import TokenizerError
from ..files.safe_read import TOKENIZER_LIMIT, loads_strict, read_text

BOS, PAD, EOS = "<|bos|>", "<|pad|>", "<|endoftext|>"
SPECIALS = (BOS, PAD, EOS)


class HFSurface:
    """The Hugging Face tokenizer surface over `self.tokenizers_object()` (a `tokenizers.Tokenizer`)."""

    padding_side = "right"

    @property
    def hf(self):
        """A `transformers.PreTrainedTokenizerFast` over the same tokenizer (built once), `padding_side` in sync."""
        hf = self.__dict__.get("_hf")
        if hf is None:
            from transformers import PreTrainedTokenizerFast

            hf = PreTrainedTokenizerFast(tokenizer_object=self.tokenizers_object(), bos_token=BOS, pad_token=PAD,
                                         eos_token=EOS, unk_token=None)
            self.__dict__["_hf"] = hf
        hf.padding_side = self.padding_side
        return hf

    def __call__(self, *args, **kwargs):
        return self.hf(*args, **kwargs)

    def __len__(self) -> int:
        return self.vocab_size

    def batch_decode(self, sequences, **kwargs) -> list[str]:
        return self.hf.batch_decode(sequences, **kwargs)

    def convert_ids_to_tokens(self, ids, **kwargs):
        return self.hf.convert_ids_to_tokens(ids, **kwargs)

    @property
    def bos_token(self) -> str:
        return BOS

    @property
    def pad_token(self) -> str:
        return PAD

    @property
    def eos_token(self) -> str:
        return EOS

    def __getattr__(self, name: str):  # only for names not found on the object: the rest of the HF surface
        if name.startswith("_") or name in ("tok", "tokenizers_object"):
            raise AttributeError(name)
        return getattr(self.hf, name)


@contextmanager
def rust_panics_refused():
    """A panic of the `tokenizers` library's Rust code (pyo3's `PanicException`, a `BaseException` that no
    `except Exception` catches: e.g. a regular expression past its backtracking limit) as `TokenizerError`."""
    try:
        yield
    except BaseException as e:
        if type(e).__name__ != "PanicException":
            raise
        raise TokenizerError(f"the tokenizer failed on this text ({(str(e).splitlines() or [''])[0][:160]})") from None


def id_list(ids) -> list[int]:
    """The ids `decode` takes, as a list of ints: a sequence or 1-d tensor of ids, or one id (an int or a 0-d tensor,
    as Hugging Face's `decode(5)` accepts)."""
    if getattr(ids, "ndim", None) == 0 or isinstance(ids, int) or type(ids).__name__.startswith(("int", "uint")):
        return [int(ids)]
    return [int(i) for i in ids]


@lru_cache(maxsize=1)
def byte_level_unicode() -> dict[int, str]:
    """GPT-2's byte → printable character table (Radford et al. 2019), as `tokenizers`' ByteLevel uses it."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


class ByteTokenizer(HFSurface):
    """Ids 0..255 are the UTF-8 bytes; 256.. are the special tokens (BOS, PAD, EOS)."""

    kind = "bytes"

    def tokenizers_object(self):
        """The same table as a `tokenizers.Tokenizer`: byte-level BPE with no merges, then the specials."""
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers

        vocab = {ch: b for b, ch in byte_level_unicode().items()}
        tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        tok.decoder = decoders.ByteLevel()
        tok.add_special_tokens(list(SPECIALS))
        return tok

    def __init__(self):
        self.specials = {s: 256 + i for i, s in enumerate(SPECIALS)}
        self.bos_token_id, self.pad_token_id, self.eos_token_id = (self.specials[s] for s in SPECIALS)
        self.vocab_size = 256 + len(SPECIALS)

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids) -> str:
        out, buf = [], bytearray()
        for i in id_list(ids):
            i = int(i)
            if i < 256:
                buf.append(i)
                continue
            out.append(buf.decode("utf-8", errors="replace"))
            buf = bytearray()
            out.append(SPECIALS[i - 256] if 0 <= i - 256 < len(SPECIALS) else unknown_id_text(i))
        out.append(buf.decode("utf-8", errors="replace"))
        return "".join(out)

    def id_to_token(self, i: int) -> str:
        return self.decode([i])

    def save(self, path) -> None:
        Path(path).write_text(json.dumps({"toy_circuits_tokenizer": "bytes", "specials": list(SPECIALS)}))


class BPETokenizer(HFSurface):
    """Byte-level BPE (GPT-2 style pre-tokenisation) over a `tokenizers.Tokenizer`."""

    kind = "bpe"

    def tokenizers_object(self):
        return self.tok

    def __init__(self, tok):
        self.tok = tok
        self.bos_token_id = tok.token_to_id(BOS)
        self.pad_token_id = tok.token_to_id(PAD)
        self.eos_token_id = tok.token_to_id(EOS)
        if self.bos_token_id is None:
            raise TokenizerError(f"BPE tokenizer lacks the {BOS} special token")
        self.vocab_size = tok.get_vocab_size()

    @classmethod
    def train(cls, texts, vocab_size: int = 2048, min_frequency: int = 2) -> BPETokenizer:
        """Train on an iterable of strings (order matters for reproducibility: pass a deterministic order)."""
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        if vocab_size < 256 + len(SPECIALS):
            raise ValueError(f"vocab_size must be >= {256 + len(SPECIALS)} (bytes + specials), got {vocab_size}")
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=list(SPECIALS),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
        )
        tok.train_from_iterator(texts, trainer=trainer)
        return cls(tok)

    def encode(self, text: str) -> list[int]:
        with rust_panics_refused():
            return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids) -> str:
        return decode_known(id_list(ids), self.vocab_size, lambda run: self.tok.decode(run, skip_special_tokens=False))

    def id_to_token(self, i: int) -> str:
        return self.decode([i])

    def save(self, path) -> None:
        self.tok.save(str(path))


def make_tokenizer(spec: str, texts=None):
    """A tokenizer from a spec: `"bytes"` (256 bytes + specials), `"bpe-N"` (byte-level BPE with N ids trained
    on the iterable of strings `texts`, in its given order), or a path to a `tokenizer.json`."""
    if not isinstance(spec, (str, Path)):
        raise TokenizerError(f"tokenizer spec must be 'bytes', 'bpe-<vocab size>' or a tokenizer.json path, got "
                             f"{type(spec).__name__} {spec!r}")
    if spec == "bytes":
        return ByteTokenizer()
    if isinstance(spec, str) and spec.startswith("bpe-"):
        try:
            n = int(spec[4:])
        except ValueError:
            raise TokenizerError(f"tokenizer spec {spec!r}: expected 'bpe-<vocab size>', e.g. 'bpe-2048'") from None
        if texts is None:
            raise TokenizerError(f"tokenizer spec {spec!r} needs texts to train on")
        try:
            return BPETokenizer.train(texts, vocab_size=n)
        except ValueError as e:
            raise TokenizerError(f"tokenizer spec {spec!r}: {e}") from None
    if Path(spec).is_file():
        return load_tokenizer(spec)
    raise TokenizerError(f"unknown tokenizer {spec!r}: use 'bytes', 'bpe-<vocab size>' or a tokenizer.json path")


def load_tokenizer(path, contained: bool = False):
    """The reader of `tokenizer.json` (either tokenizer's, a seq2seq pair, or another tool's `tokenizers` table):
    a regular file of at most `TOKENIZER_LIMIT` bytes, strict JSON (`models.files.safe_read.loads_strict`), checked by
    `tokenizer_json_problem` before the `tokenizers` library sees it; `TokenizerError` naming the file otherwise.
    `contained`: a symbolic link leading out of the file's folder is refused (a model folder's own file)."""
    path = Path(path)
    try:
        text = read_text(path, TOKENIZER_LIMIT, TokenizerError, "the tokenizer file", contained)
    except TokenizerError as e:
        raise TokenizerError(f"{path}: not a readable tokenizer file ({str(e).split(': ', 2)[-1]})") from None
    except OSError as e:
        raise TokenizerError(f"{path}: not a readable tokenizer file ({type(e).__name__}: {e})") from None
    try:
        data = loads_strict(text, TokenizerError)
    except TokenizerError as e:
        raise TokenizerError(f"{path}: not a readable tokenizer file ({e})") from None
    if not isinstance(data, dict):
        raise TokenizerError(f"{path}: not a valid tokenizer (a JSON {type(data).__name__}, not an object)")
    if data.get("toy_circuits_tokenizer") == "bytes":
        return ByteTokenizer()
    if data.get("toy_circuits_tokenizer") == "seq2seq":
        try:
            return Seq2SeqTokenizer.from_dict(data)
        except (KeyError, TypeError, ValueError) as e:
            raise TokenizerError(f"{path}: not a valid seq2seq tokenizer ({type(e).__name__}: {e})") from None
    problem = tokenizer_json_problem(data)
    if problem:
        raise TokenizerError(f"{path}: {problem}")
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_str(text)
    except Exception as e:
        raise TokenizerError(f"{path}: not a valid tokenizer ({e})") from None
    if tok.token_to_id(BOS) is None:  # another tokenizer's table (a Hugging Face one a model was given): as it is
        from transformers import PreTrainedTokenizerFast

        from ..arch.tokens import HFTokenizer

        return HFTokenizer(PreTrainedTokenizerFast(tokenizer_object=tok))
    return BPETokenizer(tok)


#: Bounds on a `tokenizers` table: ids (vocabulary and added tokens) and merges.
MAX_IDS = 1 << 20
MAX_MERGES = 1 << 20
#: Regular expressions allowed in a tokenizer.json whatever their shape: the pre-tokenizer patterns of GPT-2 and
#: of OpenAI's cl100k / o200k tables as Hugging Face tokenizers spell them. Any other pattern must pass `regex_problem`.
KNOWN_REGEXES = frozenset({
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
    r"\s+(?!\S)|\s+",
})
MAX_REGEX = 256  # characters of a pattern not in KNOWN_REGEXES
MAX_REPEATS = 2  # repeated atoms (`*`, `+`, `{m,n}`) in one branch of a pattern not in KNOWN_REGEXES


def tokenizer_json_problem(data: dict) -> str | None:
    """What makes a `tokenizers` table unsafe or silently wrong here, or None: `truncation` or `padding` set (the
    library would cut or pad every text this toolkit encodes, silently: the toolkit truncates and pads itself, so
    such a file is refused, not half-used), more than `MAX_IDS` ids or `MAX_MERGES` merges, or a regular expression
    (a `Split` pre-tokenizer's or a `Replace` normaliser's `{"Regex": ...}`) that `regex_problem` refuses (a pattern
    that backtracks catastrophically makes the library's Rust code panic, which no `except Exception` catches)."""
    for key in ("truncation", "padding"):
        if data.get(key) is not None:
            return (f"sets {key!r} ({json.dumps(data[key])[:120]}), so every text would be silently "
                    f"{'cut' if key == 'truncation' else 'padded'}; this toolkit truncates and pads itself: set "
                    f"\"{key}\": null in the file")
    model = data.get("model")
    if not isinstance(model, dict):
        return "not a valid tokenizer (no 'model' object)"
    vocab, merges, added = model.get("vocab"), model.get("merges"), data.get("added_tokens")
    for what, value, bound in (("vocabulary entries", vocab, MAX_IDS), ("merges", merges, MAX_MERGES),
                               ("added tokens", added, MAX_IDS)):
        if value is not None and not isinstance(value, (list, dict)):
            return f"'{what}' must be a JSON list or object, got {type(value).__name__}"
        if value is not None and len(value) > bound:
            return f"{len(value):,} {what}, more than the {bound:,} allowed"
    for pattern in _regexes(data):
        problem = regex_problem(pattern)
        if problem:
            return f"refused regular expression {pattern[:80]!r}: {problem}"
    return None


def _regexes(node):
    """Every `{"Regex": pattern}` value anywhere in a tokenizer's JSON."""
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, dict):
            if "Regex" in n:
                yield n["Regex"] if isinstance(n["Regex"], str) else repr(n["Regex"])
            stack.extend(n.values())
        elif isinstance(n, list):
            stack.extend(n)


def regex_problem(pattern: str) -> str | None:
    """Why `pattern` may backtrack catastrophically, or None. Allowed: `KNOWN_REGEXES`, and patterns of at most
    `MAX_REGEX` characters with no backreference, no repeated group (`*`, `+` or `{m,n}` with n > 1 after a group)
    that holds a quantifier or an alternation (`(a+)+`, `(a|aa)*`: matching time exponential in the text) and at most
    `MAX_REPEATS` repeated atoms in one branch (`a*a*a*b`: polynomial of that degree). A rule on the pattern's text,
    stricter than needed (`(ab|cd)+` is refused too), which GPT-2's family of patterns passes; `encode` still turns
    a panic of the library into `TokenizerError`."""
    if pattern in KNOWN_REGEXES:
        return None
    if len(pattern) > MAX_REGEX:
        return f"{len(pattern)} characters, more than the {MAX_REGEX} allowed for a pattern of unknown shape"
    frames = [[False, False, 0, 0]]  # per open group: holds a quantifier, an alternation; repeats in this branch, max
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            nxt = pattern[i + 1: i + 2]
            if nxt.isdigit() and nxt != "0" or nxt in ("k", "g"):
                return "a backreference"
            i += 2
        elif c == "[":  # a character class: one atom
            j = i + 1
            if pattern[j: j + 1] == "^":
                j += 1
            if pattern[j: j + 1] == "]":
                j += 1
            while j < n and pattern[j] != "]":
                j += 2 if pattern[j] == "\\" else 1
            i = j + 1
        elif c == "(":
            frames.append([False, False, 0, 0])
            i += 1
            if pattern[i: i + 1] == "?":  # (?:, (?=, (?!, (?<=, (?i: ...: group syntax, not a quantifier
                i += 1
            continue
        elif c == ")":
            if len(frames) == 1:
                return "an unbalanced ')'"
            quant, alt, branch, most = frames.pop()
            repeat, i = _quantifier(pattern, i + 1)
            if repeat and (quant or alt):
                return "a repeated group holding a quantifier or an alternation (nested repetition)"
            frames[-1][0] |= quant or repeat is not None
            frames[-1][1] |= alt
            frames[-1][2] += max(branch, most) + bool(repeat)
            if frames[-1][2] > MAX_REPEATS:
                return f"more than {MAX_REPEATS} repeated atoms in one branch (polynomial backtracking)"
            continue
        elif c == "|":
            frames[-1][1] = True
            frames[-1][3] = max(frames[-1][3], frames[-1][2])
            frames[-1][2] = 0
            i += 1
            continue
        else:
            i += 1
        repeat, i = _quantifier(pattern, i)
        if repeat is not None:
            frames[-1][0] = True
            frames[-1][2] += bool(repeat)
            if frames[-1][2] > MAX_REPEATS:
                return f"more than {MAX_REPEATS} repeated atoms in one branch (polynomial backtracking)"
    if len(frames) != 1:
        return "an unbalanced '('"
    return None


def _quantifier(pattern: str, i: int) -> tuple[bool | None, int]:
    """The quantifier at `pattern[i:]`, if any: (True for one that repeats, `*` `+` `{m,n}` with n > 1 or open;
    False for `?`, `{0,1}`, `{1}`; None for no quantifier), and the index after it (and any lazy `?` or possessive
    `+` suffix)."""
    c = pattern[i: i + 1]
    if c in ("*", "+"):
        repeat, i = True, i + 1
    elif c == "?":
        repeat, i = False, i + 1
    elif c == "{":
        close = pattern.find("}", i)
        body = pattern[i + 1: close] if close > 0 else ""
        lo, comma, hi = body.partition(",")
        if not (lo.strip().isdigit() and (not comma or not hi.strip() or hi.strip().isdigit())):
            return None, i  # a literal "{"
        top = int(lo) if not comma else (int(hi) if hi.strip() else None)
        repeat, i = top is None or top > 1, close + 1
    else:
        return None, i
    if pattern[i: i + 1] in ("?", "+"):
        i += 1
    return repeat, i


# --- the seq2seq tasks' character vocabularies -------------------------------------------------------------------
CHAR_PAD, CHAR_BOS, CHAR_EOS = 0, 1, 2
CHAR_SPECIALS = ("<pad>", "<bos>", "<eos>")


class CharVocab:
    """A character vocabulary: ids 0..2 are `CHAR_SPECIALS`, then one id per symbol (a one-character string)."""

    kind = "chars"

    def __init__(self, symbols):
        self.tokens = list(CHAR_SPECIALS) + list(symbols)
        self.index = {t: i for i, t in enumerate(self.tokens)}
        self.pad_token_id, self.bos_token_id, self.eos_token_id = CHAR_PAD, CHAR_BOS, CHAR_EOS
        self.vocab_size = len(self.tokens)

    def encode(self, text: str) -> list[int]:
        unknown = sorted(set(text) - set(self.tokens[len(CHAR_SPECIALS):]))
        if unknown:
            raise TokenizerError(f"characters {unknown} are not in this vocabulary: {''.join(self.tokens[3:])!r}")
        return [self.index[c] for c in text]

    def decode(self, ids) -> str:
        return "".join(self.tokens[i] if 0 <= i < self.vocab_size else unknown_id_text(i) for i in id_list(ids))

    def id_to_token(self, i: int) -> str:
        return self.decode([i])


class Seq2SeqTokenizer:
    """The source and target `CharVocab`s of a task, saved together as one tokenizer.json."""

    kind = "seq2seq"

    def __init__(self, source: CharVocab, target: CharVocab):
        self.source, self.target = source, target

    def to_json(self) -> str:
        return json.dumps({"toy_circuits_tokenizer": "seq2seq", "source": self.source.tokens[len(CHAR_SPECIALS):],
                           "target": self.target.tokens[len(CHAR_SPECIALS):]})

    def save(self, path) -> None:
        Path(path).write_text(self.to_json())

    @classmethod
    def from_dict(cls, d: dict) -> Seq2SeqTokenizer:
        return cls(CharVocab(d["source"]), CharVocab(d["target"]))

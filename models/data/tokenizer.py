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
from functools import lru_cache
from pathlib import Path

from ..errors import TokenizerError
from ..files.safe_read import TOKENIZER_LIMIT, read_text

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
            out.append(SPECIALS[i - 256] if i - 256 < len(SPECIALS) else f"<|{i}|>")
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
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids) -> str:
        return self.tok.decode(id_list(ids), skip_special_tokens=False)

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


def load_tokenizer(path):
    """Read a `tokenizer.json` written by either tokenizer."""
    path = Path(path)
    try:
        text = read_text(path, TOKENIZER_LIMIT, TokenizerError, "the tokenizer file")
        data = json.loads(text)
    except TokenizerError as e:
        raise TokenizerError(f"{path}: not a readable tokenizer file ({str(e).split(': ', 1)[-1]})") from None
    except (OSError, json.JSONDecodeError, RecursionError) as e:
        raise TokenizerError(f"{path}: not a readable tokenizer file ({type(e).__name__}: {e})") from None
    if isinstance(data, dict) and data.get("toy_circuits_tokenizer") == "bytes":
        return ByteTokenizer()
    if isinstance(data, dict) and data.get("toy_circuits_tokenizer") == "seq2seq":

        try:
            return Seq2SeqTokenizer.from_dict(data)
        except (KeyError, TypeError, ValueError) as e:
            raise TokenizerError(f"{path}: not a valid seq2seq tokenizer ({type(e).__name__}: {e})") from None
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
        return "".join(self.tokens[i] if i < self.vocab_size else f"<{i}>" for i in id_list(ids))

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

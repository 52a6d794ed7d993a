"""Text in and out of `HookedTransformer`, with TransformerLens 2.x's names and arguments (`to_tokens`,
`to_str_tokens`, `to_string`, `to_single_token`, `to_single_str_token`, `get_token_position`, `set_tokenizer`)."""

from __future__ import annotations

import warnings

import torch

from ..errors import ContextWindowWarning
from .padding import padding_side_of

__all__ = ["ContextWindowWarning", "TextMixin", "int_ids"]


class TextMixin:
    """The text methods of `HookedTransformer` (they read `self.tokenizer`, `self.cfg` and the device)."""

    @property
    def tokenizer(self):
        """The attached tokenizer (None: none). A Hugging Face tokenizer assigned here is kept as `HFTokenizer(it)`,
        as `set_tokenizer` attaches it."""
        return self.__dict__.get("_tokenizer")

    @tokenizer.setter
    def tokenizer(self, value) -> None:
        self.__dict__["_tokenizer"] = HFTokenizer(value) if is_hugging_face_tokenizer(value) else value

    def _need_tokenizer(self):
        if self.tokenizer is None:
            raise ValueError("this model has no tokenizer attached; pass token ids, or set model.tokenizer")
        return self.tokenizer

    def to_tokens(self, text, prepend_bos: bool | None = None, padding_side: str | None = None,
                  move_to_device: bool = True, truncate: bool | str = True) -> torch.Tensor:
        """Text (or a list of texts) to `[batch, pos]` int64 ids; a list is padded with the pad id (the BOS id
        without one) on `padding_side` (default: the tokenizer's, else right). `truncate`: True keeps the first
        n_ctx ids (TransformerLens 2.x), False all of them, `"last"` the last n_ctx of each text that the model's
        positions can read (`cfg.positions.max_context`; BOS dropped with the start), with a `ContextWindowWarning`
        saying how many fell out of view: the rule of every entry point of this toolkit that takes text (the
        forward pass, `validate_tokens`, the analyses and the command line). `move_to_device`: on the model's
        device (else the CPU), as TransformerLens 2.x."""
        tok = self._need_tokenizer()
        prepend_bos = self.cfg.default_prepend_bos if prepend_bos is None else prepend_bos
        side = padding_side_of(self, padding_side)
        texts = [text] if isinstance(text, str) else list(text)
        ids = [([tok.bos_token_id] if prepend_bos else []) + tok.encode(t) for t in texts]
        if truncate == "last":
            ids = self._last_window(ids)
        elif truncate:
            ids = [x[: self.cfg.n_ctx] for x in ids]
        width = max(len(x) for x in ids)
        pad = tok.pad_token_id if getattr(tok, "pad_token_id", None) is not None else tok.bos_token_id
        out = torch.full((len(ids), width), pad, dtype=torch.long)
        for i, x in enumerate(ids):
            if x:
                (out[i, : len(x)] if side == "right" else out[i, width - len(x):]).copy_(torch.tensor(x))
        return out.to(self.W_E.device) if move_to_device else out

    def _last_window(self, ids: list[list[int]]) -> list[list[int]]:
        limit = self.cfg.positions.max_context
        longest = max(len(x) for x in ids)
        if limit is None or longest <= limit:
            return ids
        warnings.warn(f"the text has {longest} tokens, more than n_ctx={limit}: the model reads its last {limit} "
                      f"(the first {longest - limit} are out of view)", ContextWindowWarning, stacklevel=4)
        return [x[-limit:] for x in ids]

    def set_tokenizer(self, tokenizer, default_padding_side: str = "right") -> None:
        """Attach `tokenizer` (TransformerLens 2.x's `set_tokenizer`), one of ours (`models.data.tokenizer`: its
        `ByteTokenizer`, `BPETokenizer` or `load_tokenizer`'s result) or a Hugging Face one (a `transformers`
        tokenizer, attached as `HFTokenizer(tokenizer)`), padding on `default_padding_side`.
        `TokenizerError` for another kind of tokenizer or one with more ids than the model's d_vocab."""
        from ..errors import TokenizerError
        from .padding import PADDING_SIDES

        if is_hugging_face_tokenizer(tokenizer):
            tokenizer = HFTokenizer(tokenizer)
        if not all(callable(getattr(tokenizer, name, None)) for name in ("encode", "decode")) or \
                not isinstance(getattr(tokenizer, "vocab_size", None), int):
            raise TokenizerError(f"set_tokenizer takes a tokenizer with encode, decode and vocab_size (one of "
                                 f"models.data.tokenizer's: ByteTokenizer, BPETokenizer; or a Hugging Face "
                                 f"tokenizer), got "
                                 f"{type(tokenizer).__name__}")
        if default_padding_side not in PADDING_SIDES:
            raise TokenizerError(f"default_padding_side={default_padding_side!r} is not supported; allowed: "
                                 f"{PADDING_SIDES}")
        n = len(tokenizer) if hasattr(tokenizer, "__len__") else tokenizer.vocab_size  # added tokens included
        if n > self.cfg.d_vocab:
            raise TokenizerError(f"the tokenizer has {n} ids but the model's d_vocab is "
                                 f"{self.cfg.d_vocab}")
        tokenizer.padding_side = default_padding_side
        self.tokenizer = tokenizer

    def to_string(self, tokens):
        """Token ids (`[pos]`, `[batch, pos]`, a list, or one id: an int or a 0-d tensor) to text (or a list of
        texts)."""
        tok = self._need_tokenizer()
        t = int_ids([tokens] if isinstance(tokens, int) and not isinstance(tokens, bool) else tokens,
                    "to_string needs token ids:")
        if t.ndim == 2:
            return [tok.decode(row.tolist()) for row in t]
        return tok.decode(t.reshape(-1).tolist())

    def to_str_tokens(self, input, prepend_bos: bool | None = None, padding_side: str | None = None):
        """The token strings of text, of ids (`[pos]`, `[1, pos]`, a list of ints), or of a list of those (then a
        list of lists), as TransformerLens 2.x."""
        tok = self._need_tokenizer()
        if isinstance(input, list) and input and not isinstance(input[0], int):
            return [self.to_str_tokens(x, prepend_bos, padding_side) for x in input]
        if isinstance(input, str):
            ids = self.to_tokens(input, prepend_bos, padding_side, truncate="last")[0]
        else:
            ids = torch.as_tensor(input)
            if ids.ndim == 2 and ids.shape[0] != 1:
                raise ValueError(f"to_str_tokens takes one sequence, got a batch of {ids.shape[0]}: pass a list")
            ids = ids.reshape(-1)
        return [tok.decode([int(i)]) for i in ids]

    def to_single_token(self, string: str) -> int:
        """The id of a string that is exactly one token (no BOS)."""
        ids = self._need_tokenizer().encode(string)
        if len(ids) != 1:
            raise ValueError(f"{string!r} is {len(ids)} tokens, not one")
        return ids[0]

    def to_single_str_token(self, int_token: int) -> str:
        """The string of one token id."""
        if isinstance(int_token, torch.Tensor):
            if int_token.numel() != 1:
                raise ValueError(f"to_single_str_token takes one id, got {int_token.numel()}")
            int_token = int(int_token.item())
        return self._need_tokenizer().decode([int(int_token)])

    def get_token_position(self, single_token, input, mode: str = "first", prepend_bos: bool | None = None,
                           padding_side: str | None = None) -> int:
        """The index of `single_token` (a string that is one token, or an id) in `input` (text, or ids `[pos]` /
        `[1, pos]`): its first (`mode="first"`) or last (`"last"`) occurrence; `TokenNotFoundError` (a ValueError and an
        AssertionError) if absent."""
        if mode not in ("first", "last"):
            raise ValueError(f"mode={mode!r} is not supported; allowed: ('first', 'last')")
        tokens = (self.to_tokens(input, prepend_bos, padding_side, truncate="last") if isinstance(input, str)
                  else torch.as_tensor(input))
        if tokens.ndim == 2:
            if tokens.shape[0] != 1:
                raise ValueError(f"get_token_position takes one sequence, got a batch of {tokens.shape[0]}")
            tokens = tokens[0]
        token = self.to_single_token(single_token) if isinstance(single_token, str) else int(single_token)
        where = (tokens == token).nonzero()[:, 0]
        if where.numel() == 0:
            from ..errors import TokenNotFoundError

            error = TokenNotFoundError("The token does not occur in the prompt")
            if hasattr(error, "add_note"):  # Python ≥ 3.11 (PEP 678); the message itself is TransformerLens'
                error.add_note(f"token {single_token!r} (id {token}) is not among the {tokens.numel()} input tokens")
            raise error
        return int(where[0] if mode == "first" else where[-1])


def unknown_id_text(i: int) -> str:
    """How an id its tokenizer lacks (a model's vocabulary larger than its tokenizer's) is shown: `<id 517>`, visible
    and unlike any decoded text (tokenizers return '' for it, which prints as nothing)."""
    return f"<id {int(i)}>"


def decode_known(ids: list[int], n_known: int, decode) -> str:
    """`decode(run)` of each run of ids below `n_known` (runs decode together: a character may span tokens), and
    `unknown_id_text` for every other id."""
    out, run = [], []
    for i in ids:
        if 0 <= i < n_known:
            run.append(i)
            continue
        if run:
            out.append(decode(run))
            run = []
        out.append(unknown_id_text(i))
    if run or not out:
        out.append(decode(run))
    return "".join(out)


def is_hugging_face_tokenizer(tokenizer) -> bool:
    """Whether `tokenizer` is a `transformers` tokenizer (a `PreTrainedTokenizerBase`; found by class name, so that
    `transformers` is not imported to ask)."""
    return any(c.__name__ == "PreTrainedTokenizerBase" and c.__module__.startswith("transformers")
               for c in type(tokenizer).__mro__)


class HFTokenizer:
    """A Hugging Face tokenizer (`hf`) under the protocol this toolkit reads (`encode`, `decode`, `vocab_size`,
    `bos_token_id`, `pad_token_id`, `eos_token_id`, `id_to_token`, `save`), every other name read from `hf`.

    `encode(text)` adds no special tokens (`add_special_tokens=False`): BOS is prepended by `to_tokens` by its
    `prepend_bos` rule, as TransformerLens 2.x does for tokenizers that do not add it. As TransformerLens 2.x's
    `set_tokenizer`, a tokenizer without a BOS (or pad) token uses its EOS token for it. `vocab_size` is `len(hf)`,
    added tokens included (Hugging Face's own `vocab_size` leaves them out)."""

    def __init__(self, hf):
        self.__dict__["hf"] = hf

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.__dict__["hf"], name)

    def __setattr__(self, name: str, value) -> None:
        setattr(self.hf, name, value)  # padding_side and the rest live on the Hugging Face object

    def __call__(self, *args, **kwargs):
        return self.hf(*args, **kwargs)

    def __len__(self) -> int:
        return len(self.hf)

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    @property
    def bos_token_id(self):
        return self.hf.bos_token_id if self.hf.bos_token_id is not None else self.hf.eos_token_id

    @property
    def pad_token_id(self):
        return self.hf.pad_token_id if self.hf.pad_token_id is not None else self.hf.eos_token_id

    def encode(self, text: str) -> list[int]:
        try:
            return list(self.hf.encode(text, add_special_tokens=False))
        except BaseException as e:  # a panic of the `tokenizers` library's Rust code (see `models.data.tokenizer`)
            if type(e).__name__ != "PanicException":
                raise
            from ..errors import TokenizerError

            raise TokenizerError(f"the tokenizer failed on this text ({(str(e).splitlines() or [''])[0][:160]})") \
                from None

    def decode(self, ids) -> str:
        ids = torch.as_tensor(ids).reshape(-1).tolist() if hasattr(ids, "ndim") else ids
        if isinstance(ids, int):
            ids = [ids]
        return decode_known([int(i) for i in ids], len(self.hf),
                            lambda run: self.hf.decode(run, skip_special_tokens=False))

    def id_to_token(self, i: int) -> str:
        return self.decode([int(i)])

    def save(self, path) -> None:
        """Its `tokenizer.json` (fast tokenizers: the `tokenizers` table itself), which `load_tokenizer` reads back."""
        from ..errors import TokenizerError

        backend = getattr(self.hf, "backend_tokenizer", None)
        if backend is None:
            raise TokenizerError(f"{type(self.hf).__name__} is a slow Hugging Face tokenizer with no tokenizer.json; "
                                 "save it with its own save_pretrained")
        backend.save(str(path))


def int_ids(ids, what: str) -> torch.Tensor:
    """`ids` (a tensor, numpy array, list, tuple or range of integers) as an int64 tensor. `TypeError` starting with
    `what` for anything else: a set, dict or generator has no order to reproduce, None is no ids, and float ids
    would be truncated silently."""
    if not (isinstance(ids, (torch.Tensor, list, tuple, range)) or hasattr(ids, "__array__")):
        raise TypeError(f"{what} a tensor, numpy array, list, tuple or range of integer ids, got {type(ids).__name__}")
    try:
        t = torch.as_tensor(ids)
    except (TypeError, ValueError, RuntimeError) as e:
        raise TypeError(f"{what} integer ids ({e})") from None
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise TypeError(f"{what} integer ids, got dtype {t.dtype}")
    return t.long()

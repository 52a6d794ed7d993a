"""What every causal tool checks first: the model (eval mode), clean/corrupt token pairs, single answer tokens,
head addresses and kind names. Bad input raises `PatchingError` (a `ValueError`) naming the problem and the allowed
values, before any forward pass runs."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from circuits.checks import as_tokens as checked_tokens
from models.errors import ToyCircuitsError


class PatchingError(ToyCircuitsError, ValueError):
    """Bad input to a causal tool (mismatched prompts, an answer that is not one token, an unknown kind, a head out
    of range, ...); the message names the problem and the allowed values."""


DIRECTIONS = ("denoising", "noising")


def prepare(model):
    """`model` in eval mode (TransformerLens' patching refuses training mode; `models.load` returns a model in
    training mode, and our models have no dropout, so nothing else changes). Returns the model."""
    if not hasattr(model, "cfg") or not hasattr(model, "run_with_hooks"):
        raise PatchingError(f"needs a hooked model (models.HookedTransformer or a TransformerLens bridge), got "
                            f"{type(model).__name__}")
    if getattr(model.cfg, "n_layers", 0) < 1:
        raise PatchingError("causal tools need a model with at least one layer; this one has n_layers=0")
    return model.eval()


def prompt_tokens(model, tokens, name: str = "tokens") -> torch.Tensor:
    """`[batch, pos]` int64 ids on the model's device, from ids (tensor, list, array) or text (a string or a list of
    strings, tokenized with the model's tokenizer and its default BOS). Ids go through `circuits.checks.as_tokens`;
    ids outside the vocabulary are refused here too for models without `validate_tokens` (a TransformerLens bridge)."""
    try:
        if isinstance(tokens, str) or (isinstance(tokens, (list, tuple)) and tokens and isinstance(tokens[0], str)):
            if getattr(model, "tokenizer", None) is None:
                raise PatchingError(f"{name} is text but the model has no tokenizer; pass token ids")
            if not all(isinstance(t, str) and t for t in ([tokens] if isinstance(tokens, str) else tokens)):
                raise PatchingError(f"{name} is empty text; give a prompt")
            # ours: the last n_ctx tokens of over-long text, with a ContextWindowWarning (models.arch.tokens); a
            # TransformerLens bridge keeps its own to_tokens
            tokens = model.to_tokens(tokens, truncate="last") if hasattr(model, "validate_tokens") else \
                model.to_tokens(tokens)
        t = checked_tokens(model, tokens)
    except PatchingError:
        raise
    except (ValueError, TypeError, RuntimeError) as e:
        raise PatchingError(f"{name}: {e}") from None
    if t.ndim != 2 or t.numel() == 0:
        raise PatchingError(f"{name} must have shape [batch, pos] or [pos], got {tuple(t.shape)}")
    if int(t.min()) < 0 or int(t.max()) >= model.cfg.d_vocab:
        raise PatchingError(f"{name} holds ids outside 0..{model.cfg.d_vocab - 1}")
    return t


def token_pair(model, clean, corrupt) -> tuple[torch.Tensor, torch.Tensor]:
    """Clean and corrupt prompts as `[batch, pos]` ids of the same shape (activations are patched position by
    position, so the two must tokenize to the same length)."""
    c, x = prompt_tokens(model, clean, "clean"), prompt_tokens(model, corrupt, "corrupt")
    if c.shape[1] != x.shape[1]:
        raise PatchingError(f"clean and corrupt prompts must have the same number of tokens (activations are patched "
                            f"position by position): clean has {c.shape[1]}, corrupt has {x.shape[1]}")
    if c.shape[0] != x.shape[0]:
        raise PatchingError(f"clean and corrupt must hold the same number of prompts: {c.shape[0]} vs {x.shape[0]}")
    return c, x


def single_token(model, token, name: str = "answer") -> int:
    """A token id from an int or from a string that the tokenizer encodes as exactly one token (no BOS)."""
    if isinstance(token, bool):
        raise PatchingError(f"{name} must be a token id or a one-token string, got {token!r}")
    if isinstance(token, str):
        tok = getattr(model, "tokenizer", None)
        if tok is None:
            raise PatchingError(f"{name} {token!r} is text but the model has no tokenizer; pass a token id")
        ids = tok.encode(token)
        ids = ids.ids if hasattr(ids, "ids") else list(ids)
        bos = getattr(tok, "bos_token_id", None)
        if len(ids) > 1 and bos is not None and ids[0] == bos:  # HF tokenizers may add BOS themselves
            ids = ids[1:]
        if len(ids) != 1:
            pieces = [tok.decode([i]) for i in ids]
            raise PatchingError(f"{name} {token!r} is {len(ids)} tokens {pieces}, not one; give a single token "
                                "(e.g. with its leading space) or its id")
        token = ids[0]
    try:
        token = int(token)
    except (TypeError, ValueError):
        raise PatchingError(f"{name} must be a token id or a one-token string, got {token!r}") from None
    if not 0 <= token < model.cfg.d_vocab:
        raise PatchingError(f"{name} id {token} is out of range; allowed ids are 0..{model.cfg.d_vocab - 1}")
    return token


def check_direction(direction: str) -> str:
    if direction not in DIRECTIONS:
        raise PatchingError(f"unknown direction {direction!r}; allowed: {', '.join(DIRECTIONS)} (denoising: run the "
                            "corrupt prompt and patch in clean activations; noising: the reverse)")
    return direction


def check_choice(value, allowed, what: str):
    if value not in allowed:
        raise PatchingError(f"unknown {what} {value!r}; allowed: {', '.join(map(str, allowed))}")
    return value


@dataclass(frozen=True, order=True)
class Head:
    """An attention head's address: `(layer, head)` in the attention module `attn` of the stack `stack`, whose hook
    names are `{stack}.{layer}.{attn}.hook_{name}`. Decoder-only models have one stack ("blocks") with one
    attention module ("attn"); an encoder–decoder model would address its cross-attention heads with another
    `stack`/`attn` pair, and every tool here reaches heads only through `hook`."""

    layer: int
    head: int
    stack: str = "blocks"
    attn: str = "attn"

    def hook(self, name: str) -> str:
        return f"{self.stack}.{self.layer}.{self.attn}.hook_{name}"

    def __str__(self) -> str:
        base = f"L{self.layer}H{self.head}"
        return base if (self.stack, self.attn) == ("blocks", "attn") else f"{self.stack}.{self.attn}.{base}"


@dataclass(frozen=True)
class Embedding:
    """A path-patching sender that is no head: the token embedding (`"embed"`, hook `hook_embed`) or the positional
    embedding (`"pos_embed"`, hook `hook_pos_embed`), both before layer 0 (`layer` −1), so every head can receive."""

    name: str
    layer: int = -1

    def hook(self, name: str | None = None) -> str:
        return f"hook_{self.name}"

    def __str__(self) -> str:
        return self.name


EMBEDDINGS = ("embed", "pos_embed")


def as_sender(model, spec, name: str = "sender"):
    """A path-patching sender: an `Embedding` for `"embed"` / `"pos_embed"` (when the model has that hook; rotary
    and ALiBi models have no positional embedding to send), else a `Head` (`as_head`)."""
    if isinstance(spec, Embedding):
        return spec
    if isinstance(spec, str) and spec.strip().lower() in EMBEDDINGS:
        e = Embedding(spec.strip().lower())
        if e.hook() not in getattr(model, "hook_dict", {}):
            raise PatchingError(f"{name} {spec!r}: this model has no {e.hook()} (its positions are not an added "
                                "embedding); use 'embed' or heads")
        return e
    return as_head(model, spec, name)


def as_head(model, spec, name: str = "head") -> Head:
    """A `Head` from a `Head`, a `(layer, head)` pair, `"L1H2"` or `"1.2"`, checked against the model's shape."""
    if isinstance(spec, Head):
        layer, head = spec.layer, spec.head
    elif isinstance(spec, str):
        s = spec.strip().upper()
        try:
            layer, head = (int(x) for x in (s[1:].split("H", 1) if s.startswith("L") else s.split(".", 1)))
        except ValueError:
            raise PatchingError(f"{name} {spec!r}: expected L1H2, 1.2 or a (layer, head) pair") from None
    elif isinstance(spec, (tuple, list)) and len(spec) == 2 and all(isinstance(v, int) and not isinstance(v, bool)
                                                                  for v in spec):
        layer, head = spec
    else:
        raise PatchingError(f"{name} must be a (layer, head) pair, 'L1H2' or '1.2', got {spec!r}")
    L, H = model.cfg.n_layers, model.cfg.n_heads
    if not (0 <= layer < L and 0 <= head < H):
        raise PatchingError(f"{name} {spec!r} is out of range: layers 0..{L - 1}, heads 0..{H - 1}")
    return spec if isinstance(spec, Head) else Head(layer, head)


def all_heads(model, layers=None) -> list[Head]:
    layers = range(model.cfg.n_layers) if layers is None else layers
    return [Head(l, h) for l in layers for h in range(model.cfg.n_heads)]


def has_mlps(model) -> bool:
    return not getattr(model.cfg, "attn_only", False) and getattr(model.cfg, "d_mlp", None) is not None


def grouped_kv(model) -> bool:
    """True for grouped-query attention (fewer key/value heads than query heads: `hook_k`/`hook_v` are per kv head)."""
    kv = getattr(model.cfg, "n_key_value_heads", None)
    return kv is not None and kv != model.cfg.n_heads

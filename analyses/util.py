"""Small helpers the analyses share: token strings, markdown tables, token windows, the weights circuits read."""

from __future__ import annotations

import math

import torch

from circuits.checks import check_model_finite
from circuits.fold import fold_layer_norm
from circuits.interface import norms_are_trivial
from models.errors import WeightProcessingError


def token_str(model, i: int, max_len: int = 24) -> str:
    """A readable form of token id `i` for tables and the terminal: `analyses.labels.token_labels` of it (whitespace
    and control characters made visible, at most `max_len` characters), or `#i` without a tokenizer."""
    from .labels import token_labels

    return token_labels(model, [int(i)], max_len)[0]


def device_of(model) -> torch.device:
    return model.W_E.device


def fmt(x, digits: int = 3) -> str:
    """A number for a table: fixed digits, `—` for None/NaN, booleans as yes/no."""
    if x is None:
        return "—"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return str(x)
    if isinstance(x, (float, torch.Tensor)):
        x = float(x)
        return "—" if math.isnan(x) else f"{x:.{digits}f}"
    return str(x)


def check_threshold(value, name: str = "threshold") -> float:
    """A finite real number (a NaN threshold would judge every head negative, silently): `TypeError` for other
    types, `ValueError` for NaN and ±inf."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def markdown_table(headers: list[str], rows: list[list]) -> str:
    """A GitHub-flavoured markdown table; numbers go through `fmt`, text (headers included) through
    `analyses.labels.markdown_text`: a cell is data (token text from a model folder) and renders as itself."""
    from .labels import markdown_text

    cell = lambda c: markdown_text(c) if isinstance(c, str) else fmt(c)
    lines = ["| " + " | ".join(markdown_text(h) for h in headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def as_1d_tokens(tokens) -> torch.Tensor:
    """A token array (numpy memmap, list, tensor) as a flat int64 CPU tensor."""
    import numpy as np

    if not isinstance(tokens, torch.Tensor):
        arr = np.asarray(tokens)
        if arr.dtype.kind not in "iu" and arr.size:  # floats would be truncated silently; bools are not ids
            raise ValueError(f"tokens must be integer ids, got an array of dtype {arr.dtype}")
        return torch.from_numpy(arr.astype(np.int64).reshape(-1))
    if tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool:
        raise ValueError(f"tokens must be integer ids, got dtype {tokens.dtype}")
    return tokens.detach().reshape(-1).long().cpu()


def windows(tokens, seq_len: int, n: int, seed: int = 0, bos: int | None = None) -> torch.Tensor:
    """`n` evenly spaced windows of `seq_len` tokens from a 1-D token array (with BOS prepended when given,
    the window then holds `seq_len - 1` corpus tokens): `[n, seq_len]` int64. Deterministic: windows start at
    evenly spaced offsets shifted by `seed`."""
    flat = as_1d_tokens(tokens)
    body = seq_len - (bos is not None)
    if flat.numel() < body + 1:
        raise ValueError(f"need at least {body + 1} tokens for a window of {seq_len}, got {flat.numel()}")
    span = flat.numel() - body
    starts = (torch.arange(n) * max(span // max(n, 1), 1) + seed) % span
    out = torch.stack([flat[s : s + body] for s in starts.tolist()])
    if bos is not None:
        out = torch.cat([torch.full((n, 1), bos, dtype=torch.long), out], 1)
    return out


def weight_view(model):
    """The model whose weights the weight-space circuits should read: `model` itself when its norms are trivial
    (no norm, or already folded), else `circuits.fold_layer_norm(model)` (a folded copy). Models that cannot be
    folded (a TransformerLens bridge; post-norm blocks, an encoder's MLM head, Shortformer with norms:
    `models.WeightProcessingError`) are returned as they are, and the circuits warn that they read unfolded weights.
    Raises `NonFiniteError` (a `ValueError`) when a weight holds NaN/inf: spectra, norms and rankings of such weights
    mean nothing."""
    check_model_finite(model, "weight-space analysis", ("W_E", "W_pos", "W_Q", "W_K", "W_V", "W_O", "W_U"))
    if getattr(model.cfg, "normalization_type", None) is None:
        return model
    try:
        return model if norms_are_trivial(model) else fold_layer_norm(model)
    except (TypeError, AttributeError, NotImplementedError, WeightProcessingError):  # not foldable
        return model

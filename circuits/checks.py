"""Argument checks shared by `circuits` and `analyses`: clear `TypeError` / `ValueError` messages that name the
argument and the allowed values, instead of an `IndexError` or `AttributeError` from deep inside torch; and
`as_tokens`, the one coercion of token input. Weights and matrices without values (meta tensors, uninitialised lazy
parameters, fake tensors) raise `ValueError` naming them (`check_materialised`) before anything reads them.

Conventions (docs/RELIABILITY.md): a wrong *type* raises `TypeError`; a value of the right type outside its
allowed range raises `ValueError`; weights or matrices holding NaN/inf raise `NonFiniteError` (a `ValueError`)
naming the tensor, wherever eigenvalues, norms or rankings would be computed from them.
"""

from __future__ import annotations

import operator

import torch

from models.arch.tl_compat import FactoredMatrix
from models.errors import ToyCircuitsError


class NonFiniteError(ToyCircuitsError, ValueError):
    """A weight or matrix holds NaN or ±inf where a spectrum, norm or ranking is asked of it; the message names it."""


def as_index(value, name: str) -> int:
    """`value` as a Python int (ints, numpy ints and 0-d integer tensors qualify; bools, floats and strings do not)."""
    if isinstance(value, bool) or (isinstance(value, torch.Tensor) and value.dtype == torch.bool):
        raise TypeError(f"{name} must be an int, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}") from None


def check_int(value, name: str, low: int = 1) -> int:
    """An int ≥ `low` (TypeError for other types, ValueError below `low`)."""
    v = as_index(value, name)
    if v < low:
        raise ValueError(f"{name} must be an int >= {low}, got {v}")
    return v


def as_tokens(model, tokens) -> torch.Tensor:
    """`[batch, pos]` int64 token ids on the model's device. Our model's `validate_tokens` refuses float, empty,
    out-of-range and over-long input with a `ValueError`; for other models (a TransformerLens bridge) float, complex
    and bool tensors are refused here."""
    if hasattr(model, "validate_tokens"):
        return model.validate_tokens(tokens)
    t = torch.as_tensor(tokens)
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise ValueError(f"tokens must be integer ids, got dtype {t.dtype}")
    t = t.long()
    return (t[None] if t.ndim == 1 else t).to(model.W_E.device)


def check_materialised(tensors: dict, what: str) -> None:
    """Raise `ValueError` naming the first tensor of `{name: tensor}` that holds no values: a meta tensor (a
    model built on or moved to `device="meta"`), an uninitialised lazy parameter, or a fake tensor (shapes only),
    whose values could not be read."""
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            continue
        kind = ("a meta tensor" if t.is_meta else
                "an uninitialised lazy parameter" if isinstance(t, torch.nn.parameter.UninitializedTensorMixin) else
                "a fake tensor" if type(t).__name__ == "FakeTensor" else None)
        if kind is not None:
            raise ValueError(f"{what}: {name} is {kind} (shapes only, no values); load or build the model on a real "
                             "device (e.g. models.load(..., device='cpu'), or model.to_empty(device='cpu') and load "
                             "its weights) first")


def check_weight_properties(model, what: str):
    """`model` must expose `cfg` and the weight properties of the `circuits` interface, its weights materialised
    (`check_materialised`)."""
    if not hasattr(model, "cfg") or not hasattr(model, "W_E"):
        raise TypeError(f"{what} needs a model with `cfg` and weight properties (W_E, W_Q, ...), got "
                        f"{type(model).__name__}")
    if hasattr(model, "named_parameters"):
        check_materialised(dict(model.named_parameters()), what)
    return model


def check_layer_head(model, layer, head, what: str = "this circuit") -> tuple[int | None, int | None]:
    """Check `layer` in 0..n_layers-1 and `head` in 0..n_heads-1 (each may be None). Negative indices are refused:
    heads are named `L{layer}H{head}` everywhere, and -1 would silently mean the last one."""
    check_weight_properties(model, what)
    L, H = model.cfg.n_layers, model.cfg.n_heads
    if L == 0:
        raise ValueError(f"{what} needs attention heads, but this model has n_layers=0 (only the direct path "
                         "W_E W_U); see analyses.zero_layer for 0-layer models")
    if layer is not None:
        layer = as_index(layer, "layer")
        if not 0 <= layer < L:
            raise ValueError(f"layer={layer} is out of range: this model has layers 0..{L - 1}")
    if head is not None:
        head = as_index(head, "head")
        if not 0 <= head < H:
            raise ValueError(f"head={head} is out of range: this model has heads 0..{H - 1}")
    return layer, head


def check_head_pair(model, pair, name: str) -> tuple[int, int]:
    """A `(layer, head)` pair, checked against the model's shape."""
    if not isinstance(pair, (tuple, list)) or len(pair) != 2:
        raise TypeError(f"{name} must be a (layer, head) pair, got {pair!r}")
    layer, head = check_layer_head(model, pair[0], pair[1], name)
    return layer, head


def check_matrix(fm, what: str):
    """A `FactoredMatrix` or a tensor of at least 2 dims (else TypeError / ValueError)."""
    if not isinstance(fm, (FactoredMatrix, torch.Tensor)):
        raise TypeError(f"{what} needs a FactoredMatrix or a torch.Tensor, got {type(fm).__name__}")
    if len(fm.shape) < 2:
        raise ValueError(f"{what} needs a matrix (or a stack of matrices), got shape {tuple(fm.shape)}")
    if isinstance(fm, torch.Tensor) and (fm.dtype == torch.bool or fm.dtype.is_complex):
        raise TypeError(f"{what} needs a real-valued matrix, got dtype {fm.dtype}")
    check_materialised({"the matrix": fm} if isinstance(fm, torch.Tensor) else {"factor A": fm.A, "factor B": fm.B},
                       what)
    return fm


def check_finite(tensors: dict, what: str) -> None:
    """Raise `NonFiniteError` naming the first tensor of `{name: tensor}` that holds NaN or ±inf.

    Each tensor is first summed (one read, no mask): a NaN or ±inf entry makes the sum NaN or ±inf (IEEE
    arithmetic), so a finite sum clears the tensor; a non-finite sum (also possible by overflow of finite
    entries) is settled by testing every entry."""
    check_materialised(tensors, what)
    for name, t in tensors.items():
        if t is None or not isinstance(t, torch.Tensor) or not (t.dtype.is_floating_point or t.dtype.is_complex):
            continue
        if bool(torch.isfinite(t.sum())):
            continue
        if not bool(torch.isfinite(t).all()):
            n_nan, n_inf = int(torch.isnan(t).sum()), int(torch.isinf(t).sum())
            raise NonFiniteError(f"{what}: {name} holds non-finite values ({n_nan} NaN, {n_inf} inf of "
                                 f"{t.numel()}); the result would be meaningless")


def check_model_finite(model, what: str, names=("W_E", "W_Q", "W_K", "W_V", "W_O", "W_U")) -> None:
    """`check_finite` on the model's weight properties `names` (those it has)."""
    tensors = {}
    for n in names:
        try:
            tensors[n] = getattr(model, n).detach()
        except AttributeError:  # a 0-layer model has no attention weights
            continue
    check_finite(tensors, what)


def analysis_dtype(t: torch.Tensor) -> torch.dtype:
    """float32 for float16/bfloat16 tensors (spectra, norms and rankings are never taken in half precision),
    float64 for integer tensors, else the tensor's own dtype."""
    if not t.dtype.is_floating_point:
        return torch.float64
    return torch.float32 if t.dtype in (torch.float16, torch.bfloat16) else t.dtype

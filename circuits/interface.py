"""The small interface `circuits` reads from a model, and the helpers every module shares.

A "model" here is any object with
- `cfg` carrying `n_layers, n_heads, d_model, d_head, d_vocab, positional_embedding_type, normalization_type`
  (and `eps`, `rotary_*`, `attention_dir`, `attn_only` where the analysis needs them);
- the stacked weight properties `W_E [d_vocab, d_model]`, `W_pos [n_ctx, d_model]` (when positions are a table),
  `W_Q, W_K, W_V [n_layers, n_heads, d_model, d_head]`, `W_O [n_layers, n_heads, d_head, d_model]`,
  `W_U [d_model, d_vocab]` and the biases `b_Q, b_K, b_V [n_layers, n_heads, d_head]`, `b_O [n_layers, d_model]`,
  `b_U [d_vocab]`;
- for the forward-pass analyses (path expansion, score decomposition): `run_with_cache(tokens, names_filter=...)`
  with TransformerLens hook names, and norms at `blocks[l].ln1` / `ln_final`.

Our `models.HookedTransformer` and TransformerLens' `TransformerBridge` (`models.to_transformer_lens(model)`) both
qualify. Row-vector convention throughout: activations multiply weights on the left, `x @ W`.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from dataclasses import dataclass

import torch

from models.arch.positions import scheme


def positional_scheme(model):
    """The model's positional scheme object (`models.arch.positions`): what its positions do, asked, never compared by
    name. Works on a TransformerLens bridge's config too."""
    return scheme(model.cfg)


def select(t: torch.Tensor, layer: int | None, head: int | None) -> torch.Tensor:
    """Index a stacked `[n_layers, n_heads, ...]` tensor: both None keeps the stack, `layer` alone gives
    `[n_heads, ...]`, both give one head's matrix."""
    if layer is None:
        if head is not None:
            return t[:, head]
        return t
    t = t[layer]
    return t if head is None else t[head]


def f64(t: torch.Tensor) -> torch.Tensor:
    """Detached float64 copy (or view) of `t`, where eigenvalues and norms are taken."""
    return t.detach().to(torch.float64)


@contextlib.contextmanager
def serial_ops():
    """Run torch's CPU ops in this Python thread single-threaded inside the block (the count is restored after).

    For sequences of small or medium ops (d_head-sized factorisations, batched small eigenproblems, the tiles
    of `diagonal_rank_stats`' worker threads): each op gains little from intra-op threads, and each parallel
    region is a barrier that waits for a descheduled thread whenever another process holds a core
    (`benchmarks/circuits.py` times the routes). Setting the count costs microseconds. (OpenMP's count is per
    thread: worker threads set their own.)"""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def attn_scale(model, layer: int = 0) -> float:
    """The divisor of q·k in layer `layer`'s attention scores: √d_head (ours and TransformerLens' default), or
    `attn_scale`, or 1 without `use_attn_scale`; times layer + 1 with `scale_attn_by_inverse_layer_idx`."""
    cfg = model.cfg
    scale = getattr(cfg, "attn_scale", None)
    if getattr(cfg, "use_attn_scale", True) is False:
        div = 1.0
    elif scale is None or scale <= 0:  # TransformerLens stores -1 for "the default √d_head"
        div = math.sqrt(cfg.d_head)
    else:
        div = float(scale)
    return div * (layer + 1) if getattr(cfg, "scale_attn_by_inverse_layer_idx", False) else div


# --- norms -------------------------------------------------------------------------------------------
@dataclass
class NormParams:
    """One pre-norm as the affine part of `ln(x) = centre(x) / scale · w + b` (centre only for LN)."""

    kind: str | None  # None, "LN" or "RMS"
    w: torch.Tensor | None  # [d_model]; None means 1
    b: torch.Tensor | None  # [d_model]; None means 0
    eps: float

    def scale(self, x: torch.Tensor) -> torch.Tensor:
        """The norm's denominator for the full residual `x [..., d_model]` → `[..., 1]`."""
        if self.kind == "LN":
            x = x - x.mean(-1, keepdim=True)
        return (x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt()

    def linear(self, x: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
        """The linear part with the scale frozen: `centre(x) / scale · w` (the bias `b` is a separate source)."""
        if self.kind is None:
            return x
        if self.kind == "LN":
            x = x - x.mean(-1, keepdim=True)
        x = x / scale
        return x * self.w if self.w is not None else x

    @property
    def trivial(self) -> bool:
        one = self.w is None or bool(torch.all(self.w == 1))
        zero = self.b is None or bool(torch.all(self.b == 0))
        return one and zero


def _tensor_attr(module, names):
    for name in names:
        t = getattr(module, name, None)
        if isinstance(t, torch.Tensor):
            return t.detach()
    inner = getattr(module, "_original_component", None)  # TransformerLens bridge wraps the torch module
    if inner is not None and inner is not module:
        return _tensor_attr(inner, names)
    return None


#: the parameter-free norms (TransformerLens' LayerNormPre / RMSNormPre) and the norm whose centring and scaling they do
PARAMETER_FREE = {"LNPre": "LN", "RMSPre": "RMS"}


def norm_params(model, layer: int | None) -> NormParams:
    """The norm read before attention in `layer` (`blocks[layer].ln1`), or the final norm for `layer=None`."""
    cfg = model.cfg
    kind, module = cfg.normalization_type, None
    if kind is not None:
        module = model.ln_final if layer is None else model.blocks[layer].ln1
        kind = getattr(module, "kind", kind)  # our Norm knows its own kind (ln_final with final_rms)
    if kind is None or kind in PARAMETER_FREE:
        return NormParams(PARAMETER_FREE.get(kind), None, None, float(getattr(cfg, "eps", 1e-5)))
    if kind not in ("LN", "RMS"):
        raise NotImplementedError(f"normalization_type={kind!r} is not supported by circuits")
    w = _tensor_attr(module, ("w", "weight"))
    b = _tensor_attr(module, ("b", "bias")) if kind == "LN" else None
    return NormParams(kind, w, b, float(getattr(cfg, "eps", 1e-5)))


def norms_are_trivial(model) -> bool:
    """True when every norm has weight 1 and bias 0 (no norm, or norms already folded)."""
    if model.cfg.normalization_type is None:
        return True
    layers = [*range(model.cfg.n_layers), None]
    return all(norm_params(model, l).trivial for l in layers)


def warn_if_unfolded(model) -> None:
    """Weight-space circuits ignore norm weights: warn when a model still has non-trivial ones."""
    try:
        trivial = norms_are_trivial(model)
    except (AttributeError, NotImplementedError):
        return
    if not trivial:
        warnings.warn(
            "the model has LayerNorm/RMSNorm weights that the weight-space circuits do not see; "
            "call circuits.fold_layer_norm(model) first for the effective circuits",
            stacklevel=3,
        )

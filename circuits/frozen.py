"""The model's forward pass with its nonlinear parts frozen: the shared engine of path expansion and score
decomposition.

Framework (Elhage et al. 2021), §"Path expansion": once the attention patterns `A^h` of a real forward pass are
held fixed, an attention-only transformer is linear in its inputs. Norms are frozen the same way: with the
denominator `scale` of each LayerNorm/RMSNorm taken from the real pass, `ln(x) = centre(x) / scale · w + b` is
affine (its `b` becomes a bias source), so models with norms decompose exactly too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from models.arch.kind import ENCODER, model_kind

from .checks import as_tokens, check_weight_properties
from .interface import NormParams, norm_params, positional_scheme


def positional_tables(model, n_pos: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """`(pos_resid, pos_qk)`, each `[pos, d_model]` or None: the positional table's rows when the positional scheme
    adds them to the residual stream (standard, sinusoidal) or only to the query/key inputs (shortformer)."""
    positions = positional_scheme(model)
    if not positions.table:
        return None, None
    rows = positions.rows(model.W_pos.detach(), n_pos)
    return (rows, None) if positions.adds_to == "residual" else (None, rows)


@dataclass
class FrozenForward:
    """Everything a linear replay of `model(tokens)` needs; tensors detached, in the model's dtype.

    Per layer l: `patterns[l] [batch, head, query_pos, key_pos]`, `norms[l]` with its frozen `scales[l]`
    `[batch, pos, 1]` (None without a norm; the value input's), `resid_pre[l] [batch, pos, d_model]` (plus one
    more entry: the residual after the last replayed layer), `results[l] [batch, pos, head, d_model]` (each
    head's output, its b_V included). `final_norm`/`final_scale` precede the unembedding; `logits` are the
    model's own output."""

    model: object
    tokens: torch.Tensor
    logits: torch.Tensor
    embed: torch.Tensor  # [batch, pos, d_model]
    pos_resid: torch.Tensor | None  # [pos, d_model]
    pos_qk: torch.Tensor | None  # [pos, d_model], shortformer
    patterns: list[torch.Tensor]
    norms: list[NormParams]
    scales: list[torch.Tensor | None]
    resid_pre: list[torch.Tensor]
    results: list[torch.Tensor]
    final_norm: NormParams
    final_scale: torch.Tensor | None
    cache: dict = field(default_factory=dict)


def frozen_forward(model, tokens, n_layers: int | None = None, extra_hooks: tuple[str, ...] = ()) -> FrozenForward:
    """Run `model` once with its cache, then replay its attention layers linearly with the patterns and norm
    scales of that run (through `n_layers` layers; default all). Attention-only models only."""
    check_weight_properties(model, "path expansion")
    cfg = model.cfg
    if not getattr(cfg, "attn_only", False):
        raise ValueError("path expansion and score decomposition need an attention-only model (attn_only=True)")
    if model_kind(model) == ENCODER:
        raise ValueError("path expansion and score decomposition need logits linear in the residual stream; this "
                         "encoder's masked-LM head (dense, activation, norm) is not")
    tokens = as_tokens(model, tokens)
    L = cfg.n_layers if n_layers is None else n_layers
    names = {f"blocks.{l}.attn.hook_pattern" for l in range(L)} | set(extra_hooks)
    with torch.no_grad():
        logits, raw = model.run_with_cache(tokens, names_filter=lambda n: n in names)
        cache = {n: raw[n].detach() for n in names}
        W_E = model.W_E.detach()
        B, P = tokens.shape
        embed = W_E[tokens]
        pos_resid, pos_qk = positional_tables(model, P)
        resid = embed + pos_resid if pos_resid is not None else embed.clone()
        ff = FrozenForward(model, tokens, logits.detach(), embed, pos_resid, pos_qk, [], [], [], [], [],
                           norm_params(model, None), None, cache)
        if L:
            W_V, W_O, b_V, b_O = (getattr(model, n).detach() for n in ("W_V", "W_O", "b_V", "b_O"))
        for l in range(L):
            norm = norm_params(model, l)
            scale = norm.scale(resid) if norm.kind else None
            x = norm.linear(resid, scale)
            if norm.b is not None:
                x = x + norm.b
            pattern = cache[f"blocks.{l}.attn.hook_pattern"].to(W_E.dtype)
            v = torch.einsum("bpd,hde->bhpe", x, W_V[l]) + b_V[l][None, :, None]
            result = torch.einsum("bhqk,bhke,hem->bqhm", pattern, v, W_O[l])
            ff.patterns.append(pattern)
            ff.norms.append(norm)
            ff.scales.append(scale)
            ff.resid_pre.append(resid)
            ff.results.append(result)
            resid = resid + result.sum(-2) + b_O[l]
        ff.resid_pre.append(resid)  # the residual after the last replayed layer
        if L == cfg.n_layers and ff.final_norm.kind:
            ff.final_scale = ff.final_norm.scale(resid)
    return ff

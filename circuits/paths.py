"""Path expansion of an attention-only transformer's logits with the attention patterns frozen.

Framework (Elhage et al. 2021), §"Path expansion of logits": with each layer `Id + Σ_h A^h ⊗ W_OV^h`,

    T = Id ⊗ W_E W_U + Σ_h A^h ⊗ W_E W_OV^h W_U + Σ_{h2 later than h1} (A^{h2} A^{h1}) ⊗ W_E W_OV^{h1} W_OV^{h2} W_U + …

(row form: the feature matrices multiply in the order the stream meets them; the paper writes `W_U W_OV W_E`).
Each term is computed as a residual contribution `[batch, pos, d_model]` propagated layer by layer and
multiplied by `W_U` only when its logits are asked for; no `d_vocab × d_vocab` object is built.

Term names: a path of heads written later head first, joined by "∘" ("L1H3∘L0H5"), or "direct" for the
empty path; then the source in brackets, none for the token embedding:

- "direct", "L0H1", "L1H3∘L0H5": token embedding `W_E[t]` through those heads;
- "direct[pos]", "L0H1[pos]": the positional rows `W_pos[i]`, for positions added to the residual stream
  (standard, sinusoidal; shortformer, rotary, ALiBi and none only shape the frozen patterns, so they have none);
- "direct[bias]", "L0H1[bias]", …: the constant terms. A bias enters where the model adds it: `b_O` and
  LayerNorm biases into the residual stream / the head's input, `b_V` with its own head (so "L1H0[bias]" holds
  L1H0's `b_V W_O` and the earlier biases L1H0 moves), `b_U` in "direct[bias]". Present only when some bias or
  norm bias is non-zero.

With norms (LN/RMS) the denominators are frozen too (see `frozen.py`), so the sum stays exact.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch

from models.arch.model import head_label

from .checks import check_int
from .frozen import FrozenForward, frozen_forward

SOURCES = ("tok", "pos", "bias")
_SUFFIX = {"tok": "", "pos": "[pos]", "bias": "[bias]"}
CHUNK_BYTES = 256 * 2**20  # bound on one layer's batched head outputs


def term_name(path: tuple[tuple[int, int], ...], source: str = "tok") -> str:
    """Name of the term for `path` (heads earliest first, `(layer, head)` pairs) from `source`."""
    core = "∘".join(head_label(l, h) for l, h in reversed(path)) if path else "direct"
    return core + _SUFFIX[source]


class _LogitTerms(Mapping):
    """name → logits `[batch, pos, d_vocab]`, computed on access from the term's residual contribution."""

    def __init__(self, exp: PathExpansion):
        self._exp = exp

    def __getitem__(self, name: str) -> torch.Tensor:
        exp = self._exp
        out = exp.streams[name] @ exp.W_U
        return out + exp.b_U if name == "direct[bias]" else out

    def __iter__(self) -> Iterator[str]:
        return iter(self._exp.streams)

    def __len__(self) -> int:
        return len(self._exp.streams)


@dataclass
class PathExpansion:
    """The result of `path_expansion`.

    `streams`: name → residual contribution `[batch, pos, d_model]` at the unembedding (after the frozen final
    norm); `terms`: name → logits `[batch, pos, d_vocab]` (lazy, `streams[name] @ W_U`, plus `b_U` for
    "direct[bias]"); `orders` / `sources`: name → number of heads on the path / "tok", "pos" or "bias";
    `logits`: the model's own logits; `patterns`: the frozen `[batch, head, q, k]` per layer."""

    streams: dict[str, torch.Tensor]
    orders: dict[str, int]
    sources: dict[str, str]
    W_U: torch.Tensor
    b_U: torch.Tensor
    logits: torch.Tensor
    patterns: list[torch.Tensor]
    max_order: int

    @property
    def terms(self) -> Mapping[str, torch.Tensor]:
        return _LogitTerms(self)

    def names(self, order: int | None = None, source: str | None = None) -> list[str]:
        """Term names, optionally only those of one order and/or one source."""
        return [n for n in self.streams if (order is None or self.orders[n] == order)
                and (source is None or self.sources[n] == source)]

    def total(self, max_order: int | None = None, exclude: tuple[str, ...] = ()) -> torch.Tensor:
        """Sum of the terms' logits (of order ≤ `max_order`; without `exclude`), `[batch, pos, d_vocab]`."""
        keep = [n for n in self.streams if (max_order is None or self.orders[n] <= max_order) and n not in exclude]
        resid = self.logits.new_zeros(*self.logits.shape[:-1], self.W_U.shape[0])
        for n in keep:
            resid = resid + self.streams[n]
        out = resid @ self.W_U
        return out + self.b_U if "direct[bias]" in keep else out

    @property
    def reconstruction_error(self) -> float:
        """`‖total() − logits‖_F / ‖logits‖_F` against the model's own logits (0 up to rounding when every
        order is kept)."""
        diff = (self.total() - self.logits).to(torch.float64)
        return float(diff.norm() / self.logits.to(torch.float64).norm().clamp_min(1e-300))

    def __repr__(self) -> str:
        by_order = {}
        for n in self.streams:
            by_order[self.orders[n]] = by_order.get(self.orders[n], 0) + 1
        counts = ", ".join(f"order {k}: {v}" for k, v in sorted(by_order.items()))
        return f"PathExpansion({len(self.streams)} terms; {counts}; batch×pos={tuple(self.logits.shape[:2])})"


def _has_bias(ff: FrozenForward) -> bool:
    model, L = ff.model, len(ff.patterns)
    tensors = [model.b_U.detach()]
    if L:
        tensors += [model.b_V.detach(), model.b_O.detach()]
    tensors += [n.b for n in (*ff.norms, ff.final_norm) if n.b is not None]
    return any(bool(torch.any(t != 0)) for t in tensors)


def head_outputs(state: dict, max_order: int, value_input, A: torch.Tensor, W_V: torch.Tensor, W_O: torch.Tensor,
                 const: torch.Tensor | None, label) -> dict:
    """One attention layer of the path expansion: for every term `(path, source)` of `state` with fewer than
    `max_order` heads, each head h's output `A^h x W_V^h W_O^h` `[batch, q_pos, d_model]` under the key
    `((*path, label(h)), source)`, where `x = value_input(state[key])` `[batch, k_pos, d_model]` (the frozen norm's
    linear part). `A [batch, head, q_pos, k_pos]` need not be square (cross-attention). `const [head, d_head]`
    (b_V and the norm's bias through W_V) joins the values of the empty-path "bias" term. Terms are stacked in
    chunks of at most `CHUNK_BYTES` of head outputs."""
    keys = [k for k in state if len(k[0]) < max_order]
    if not keys:
        return {}
    B, H, Q, _ = A.shape
    dm = W_O.shape[-1]
    step = max(1, CHUNK_BYTES // max(B * H * Q * dm * A.element_size(), 1))
    new: dict[tuple, torch.Tensor] = {}
    for start in range(0, len(keys), step):
        chunk = keys[start:start + step]
        X = torch.stack([value_input(state[k]) for k in chunk])  # [n, batch, k_pos, d_model]
        v = torch.einsum("nbpd,hde->nbhpe", X, W_V)
        if const is not None and ((), "bias") in chunk:
            v[chunk.index(((), "bias"))] += const[None, :, None, :]
        z = torch.einsum("bhqk,nbhke->nbhqe", A, v)
        out = torch.einsum("nbhqe,hem->nhbqm", z, W_O)  # [n, head, batch, q_pos, d_model]
        for i, (path, src) in enumerate(chunk):
            for h in range(out.shape[1]):
                new[((*path, label(h)), src)] = out[i, h]
    return new


def path_expansion(model, tokens, max_order: int | None = None) -> PathExpansion:
    """Every path term of an attention-only model's logits on `tokens`, attention patterns frozen from the real
    forward pass (Framework, §"Path expansion"; see the module docstring for names and sources).

    Terms of order k (k heads on the path) are kept for k ≤ `max_order` (default: all, up to n_layers); with
    every order kept, `total()` equals the model's logits up to rounding. Works for every positional type
    (rotary, ALiBi and shortformer act only through the frozen patterns), LN/RMS/no norm, any depth, on any
    model exposing the `circuits` interface (ours or a TransformerLens bridge). Computed in the model's dtype."""
    ff = frozen_forward(model, tokens)
    L = model.cfg.n_layers
    max_order = L if max_order is None else check_int(max_order, "max_order", low=0)
    B, P = ff.tokens.shape
    dm = ff.embed.shape[-1]
    with torch.no_grad():
        state: dict[tuple, torch.Tensor] = {((), "tok"): ff.embed}
        if ff.pos_resid is not None:
            state[((), "pos")] = ff.pos_resid.expand(B, P, dm)
        bias = _has_bias(ff)
        if bias:
            state[((), "bias")] = torch.zeros_like(ff.embed)
        if L:
            W_V, W_O, b_V, b_O = (getattr(model, n).detach() for n in ("W_V", "W_O", "b_V", "b_O"))
        for l in range(L):
            const = None
            if bias:  # constants entering at this layer: LN bias, b_V
                norm = ff.norms[l]
                const = b_V[l] if norm.b is None else b_V[l] + torch.einsum("d,hde->he", norm.b, W_V[l])
            new = head_outputs(state, max_order, lambda x, l=l: ff.norms[l].linear(x, ff.scales[l]), ff.patterns[l],
                               W_V[l], W_O[l], const, lambda h, l=l: (l, h))
            if bias:
                state[((), "bias")] = state[((), "bias")] + b_O[l]
            state.update(new)
        final, fscale = ff.final_norm, ff.final_scale
        streams, orders, sources = {}, {}, {}
        for (path, src) in sorted(state, key=lambda k: (len(k[0]), SOURCES.index(k[1]), k[0])):
            x = final.linear(state[(path, src)], fscale)
            if src == "bias" and not path and final.b is not None:
                x = x + final.b
            name = term_name(path, src)
            streams[name], orders[name], sources[name] = x, len(path), src
    return PathExpansion(streams, orders, sources, model.W_U.detach(), model.b_U.detach(), ff.logits,
                         ff.patterns, max_order)

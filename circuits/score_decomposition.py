"""Decomposition of one head's attention scores by the sources of its query and its key.

Framework (Elhage et al. 2021), §"Two-layer attention-only transformers / QK circuit": with earlier patterns
frozen, the query and key inputs of a layer-2 head are sums of sources (token embedding, positions, each
earlier head's output), so its scores split into `A_q ⊗ A_k ⊗ W` terms, one per (query source, key source):
direct (no head on either side), Q-composition (a head on the query side only), K-composition (key side only)
and Q-and-K composition (both).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from models.arch.model import head_label

from .checks import check_layer_head
from .frozen import frozen_forward
from .interface import attn_scale, norm_params, positional_scheme

KINDS = ("direct", "q_composition", "k_composition", "qk_composition")
_NON_HEAD = ("tok", "pos", "bias")


def source_kind(query_source: str, key_source: str) -> str:
    """"direct", "q_composition", "k_composition" or "qk_composition" for a pair of sources."""
    q_head, k_head = query_source not in _NON_HEAD, key_source not in _NON_HEAD
    return {(False, False): "direct", (True, False): "q_composition", (False, True): "k_composition",
            (True, True): "qk_composition"}[(q_head, k_head)]


@dataclass
class ScoreDecomposition:
    """The result of `attention_score_decomposition`.

    `terms`: (query source, key source) → `[batch, query_pos, key_pos]`; sources are "tok" (`W_E[t]`), "pos"
    (`W_pos[i]`: residual positions, or shortformer's query/key-only positions), "bias" (b_O of earlier layers,
    norm biases, and this head's b_Q / b_K) and "L{l}H{h}" (each earlier head's output, its b_V included).
    `alibi`: the ALiBi bias `[query_pos, key_pos]` or None. `scores`: the model's own scores from
    `hook_attn_scores` (after its causal mask: −inf above the diagonal), or None where that hook carries the
    post-softmax pattern (TransformerLens' bridge does, following Hugging Face); `pattern`: the model's
    `hook_pattern`. All terms are before masking; they plus `alibi` sum to the scores."""

    layer: int
    head: int
    terms: dict[tuple[str, str], torch.Tensor]
    alibi: torch.Tensor | None
    scores: torch.Tensor | None
    pattern: torch.Tensor
    causal: bool

    def total(self) -> torch.Tensor:
        out = sum(self.terms.values())
        return out + self.alibi if self.alibi is not None else out

    def by_kind(self) -> dict[str, torch.Tensor]:
        """The terms summed by kind ("direct", "q_composition", "k_composition", "qk_composition", and "alibi"
        when present); these also sum to the scores."""
        out = {k: torch.zeros_like(self.pattern) for k in KINDS}
        for (q, k), t in self.terms.items():
            out[source_kind(q, k)] = out[source_kind(q, k)] + t
        if self.alibi is not None:
            out["alibi"] = self.alibi.expand_as(self.pattern)
        return out

    def mask(self) -> torch.Tensor:
        """`[query_pos, key_pos]` bool: entries the model does not mask."""
        P_q, P_k = self.pattern.shape[-2:]
        keep = torch.ones(P_q, P_k, dtype=torch.bool, device=self.pattern.device)
        return keep.tril() if self.causal else keep

    def total_pattern(self) -> torch.Tensor:
        """softmax of the masked `total()`: the pattern the terms imply."""
        return self.total().masked_fill(~self.mask(), float("-inf")).softmax(-1)

    @property
    def pattern_error(self) -> float:
        """Relative Frobenius error of `total_pattern()` against the model's `hook_pattern`."""
        a, b = self.total_pattern().to(torch.float64), self.pattern.to(torch.float64)
        return float((a - b).norm() / b.norm().clamp_min(1e-300))

    @property
    def reconstruction_error(self) -> float:
        """Relative Frobenius error of `total()` against the model's scores on the unmasked entries (against
        its pattern, as `pattern_error`, where the model exposes no pre-softmax scores)."""
        if self.scores is None:
            return self.pattern_error
        m = self.mask()
        a, b = self.total()[..., m].to(torch.float64), self.scores[..., m].to(torch.float64)
        return float((a - b).norm() / b.norm().clamp_min(1e-300))


def attention_score_decomposition(model, tokens, layer: int, head: int) -> ScoreDecomposition:
    """Split head (`layer`, `head`)'s pre-softmax scores `q·k / √d_head` on `tokens` by the source of the query
    and of the key (Framework, §"Two-layer attention-only transformers": the `A_q ⊗ A_k ⊗ W` terms).

    Earlier layers' patterns and every norm's denominator are frozen from the real forward pass; the query and
    key inputs are then sums over sources (see `ScoreDecomposition`), and each (query source, key source) term
    is `(x_q^s W_Q [+ b_Q]) · (x_k^s' W_K [+ b_K]) / √d_head` (biases with the "bias" source). Rotary positions
    rotate each source's q and k (rotation is linear); ALiBi adds its own term. Attention-only models."""
    cfg = model.cfg
    layer, head = check_layer_head(model, layer, head, "attention_score_decomposition")
    cap = getattr(cfg, "attn_scores_soft_cap", None)
    if cap is not None and cap > 0:
        raise ValueError(f"attn_scores_soft_cap={cap}: soft-capped scores (cap·tanh(s/cap)) are not a sum of terms")
    score_hook, pattern_hook = f"blocks.{layer}.attn.hook_attn_scores", f"blocks.{layer}.attn.hook_pattern"
    ff = frozen_forward(model, tokens, n_layers=layer, extra_hooks=(score_hook, pattern_hook))
    B, P = ff.tokens.shape
    with torch.no_grad():
        W_Q, W_K = model.W_Q[layer, head].detach(), model.W_K[layer, head].detach()
        b_Q, b_K = model.b_Q[layer, head].detach(), model.b_K[layer, head].detach()
        sources: dict[str, torch.Tensor] = {"tok": ff.embed}
        if ff.pos_resid is not None:
            sources["pos"] = ff.pos_resid.expand_as(ff.embed)
        for l in range(layer):
            for h in range(cfg.n_heads):
                sources[head_label(l, h)] = ff.results[l][:, :, h]
        bias = sum((model.b_O[l].detach() for l in range(layer)), torch.zeros_like(ff.embed))
        resid = ff.resid_pre[layer]  # [batch, pos, d_model]
        norm = norm_params(model, layer)
        scale = norm.scale(resid) if norm.kind else None
        inputs = {name: norm.linear(x, scale) for name, x in sources.items()}
        if ff.pos_qk is not None:  # shortformer: positions are added to the normalised query/key input
            inputs["pos"] = ff.pos_qk.expand_as(ff.embed)
        bias_in = norm.linear(bias, scale) + (norm.b if norm.b is not None else 0)
        has_bias = any(bool(torch.any(t != 0)) for t in (bias_in, b_Q, b_K))
        qs = {n: x @ W_Q for n, x in inputs.items()}
        ks = {n: x @ W_K for n, x in inputs.items()}
        if has_bias:
            qs["bias"], ks["bias"] = bias_in @ W_Q + b_Q, bias_in @ W_K + b_K
        positions = positional_scheme(model)
        rotation = positions.rotation(P, ff.embed.dtype, ff.embed.device)
        if rotation is not None:  # linear, so it rotates each source's q and k separately
            qs = {n: rotation(q[:, :, None])[:, :, 0] for n, q in qs.items()}
            ks = {n: rotation(k[:, :, None])[:, :, 0] for n, k in ks.items()}
        div = attn_scale(model, layer)
        terms = {(nq, nk): q @ k.transpose(-1, -2) / div for nq, q in qs.items() for nk, k in ks.items()}
        bias = positions.score_bias()
        alibi = bias.additive(P, P, ff.embed.dtype, ff.embed.device) if bias is not None else None
        if alibi is not None:
            alibi = alibi.expand(cfg.n_heads, P, P)[head]
        scores, pattern = ff.cache[score_hook][:, head], ff.cache[pattern_hook][:, head]
        if torch.equal(scores, pattern):  # a post-softmax "scores" hook (TransformerLens bridge)
            scores = None
    causal = getattr(cfg, "attention_dir", "causal") == "causal"
    return ScoreDecomposition(layer, head, terms, alibi, scores, pattern, causal)

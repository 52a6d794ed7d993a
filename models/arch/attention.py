"""Multi-head attention with per-head hooks: the `Attention` layer and `attend`, the one explicit softmax(q·kᵀ)·v that
every path needing the pattern runs.

Parameter names and layouts follow TransformerLens' former `HookedTransformer`: `W_Q [n_heads, d_model, d_head]`,
`W_K`, `W_V [n_key_value_heads, d_model, d_head]`, `W_O [n_heads, d_head, d_model]`, biases `b_Q`, `b_K`, `b_V`,
`b_O`. Axis vocabulary in shape comments as in `models.arch.components`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .config import HookedTransformerConfig
from .positions import Rotation
from .products import DECODE_ROWS, affine, linear, rounded_product
from .score_bias import ScoreBias
from .tl_compat import FactoredMatrix, HookPoint
from .watch import hooked_path

__all__ = ["Attention", "attend", "linear", "score_scale", "soft_cap"]


def param_or_buffer(module: nn.Module, name: str, tensor: torch.Tensor, trainable: bool) -> None:
    if trainable:
        module.register_parameter(name, nn.Parameter(tensor))
    else:
        module.register_buffer(name, tensor)


def score_scale(cfg: HookedTransformerConfig, layer: int) -> float:
    """The factor multiplying q·kᵀ: 1/√d_head (Vaswani et al. 2017, §3.2.1), or 1/attn_scale, or 1 without
    `use_attn_scale`; divided further by layer + 1 with `scale_attn_by_inverse_layer_idx` (Mistral's stanford-gpt2
    models, as TransformerLens)."""
    if cfg.use_attn_scale and cfg.attn_scale is None and not cfg.scale_attn_by_inverse_layer_idx:
        return 1 / math.sqrt(cfg.d_head)
    divisor = (cfg.attn_scale or math.sqrt(cfg.d_head)) if cfg.use_attn_scale else 1.0
    if cfg.scale_attn_by_inverse_layer_idx:
        divisor *= layer + 1
    return 1 / divisor


def soft_cap(x: torch.Tensor, cap: float | None) -> torch.Tensor:
    """Gemma 2's soft cap (Gemma Team 2024, §2): cap · tanh(x / cap), or x unchanged when `cap` is None."""
    return x if cap is None else cap * torch.tanh(x / cap)


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, score_bias: ScoreBias, scale: float,
           cap: float | None = None, hook_scores=_identity, hook_pattern=_identity) -> torch.Tensor:
    """Scaled dot-product attention written out (Vaswani et al. 2017, §3.2.1), for `q [batch, head, pos, d_head]` and
    `k`, `v [batch, head, key, d_head]` (grouped-query heads already expanded): scores = soft_cap(q·kᵀ·scale) + the
    score bias (−inf where masked), seen by `hook_scores`; pattern = softmax(scores), seen by `hook_pattern`; returns
    z = pattern·v `[batch, head, pos, d_head]`. A query with no key left (a left pad) attends nowhere (pattern 0)."""
    B, H, P, dh = q.shape
    K = k.shape[-2]
    bias = score_bias.dense(P, K, q.dtype, q.device)  # [(head,) pos, key], −inf where masked
    if cap is None and (bias is None or bias.dim() == 2):  # one kernel: the bias is the product's starting value
        start, beta = (q.new_zeros(()), 0) if bias is None else (bias, 1)
        scores = rounded_product(lambda q, k, start: torch.baddbmm(
            start, q.reshape(B * H, P, dh), k.reshape(B * H, K, dh).transpose(1, 2), beta=beta, alpha=scale), q, k,
            start).view(B, H, P, K)
    else:
        scores = soft_cap(rounded_product(lambda q, k: q @ k.transpose(-1, -2), q, k) * scale, cap)
        scores = scores if bias is None else scores + bias
    pattern = hook_scores(scores).softmax(-1)  # [batch, head, pos, key]
    if score_bias.empty_rows:
        pattern = pattern.nan_to_num(0.0)
    return rounded_product(torch.matmul, hook_pattern(pattern), v)


class Attention(nn.Module):
    """Multi-head attention (Vaswani et al. 2017, §3.2: softmax(q·kᵀ·scale) v per head, outputs summed through
    W_O), optionally grouped-query (Ainslie et al. 2023: query head h reads key/value head h // (H / H_kv)), with
    per-head hooks. The scale is `score_scale` (1/√d_head by default), the scores optionally soft-capped
    (`soft_cap`, before the score bias, as TransformerLens).

    Two paths compute the same function. When anything watches the model (`models.arch.watch`) or the scores are
    soft-capped, `attend` writes the scores and the pattern out and every hook point fires, `hook_result` included
    with `cfg.use_attn_result`; otherwise `F.scaled_dot_product_attention` runs and z is multiplied by the flattened
    W_O in one product. q, k and v come from one product per distinct input (`W_Q`, `W_K`, `W_V` side by side for
    self-attention), or, in a cached decoding step of under `models.arch.products.DECODE_ROWS` rows, from one batched
    product per input that reads the weights in place (`_per_head_project`; the fused projection's weight is a fresh
    concatenation).
    """

    def __init__(self, cfg: HookedTransformerConfig, layer: int = 0):
        super().__init__()
        self.cfg, self.layer = cfg, layer
        H, Hkv, D, dh, dt = cfg.n_heads, cfg.n_key_value_heads, cfg.d_model, cfg.d_head, cfg.torch_dtype
        self.W_Q = nn.Parameter(torch.empty(H, D, dh, dtype=dt))
        self.W_K = nn.Parameter(torch.empty(Hkv, D, dh, dtype=dt))
        self.W_V = nn.Parameter(torch.empty(Hkv, D, dh, dtype=dt))
        self.W_O = nn.Parameter(torch.empty(H, dh, D, dtype=dt))
        for name, shape in (("b_Q", (H, dh)), ("b_K", (Hkv, dh)), ("b_V", (Hkv, dh)), ("b_O", (D,))):
            param_or_buffer(self, name, torch.zeros(shape, dtype=dt), cfg.use_bias)
        self.hook_q = HookPoint()  # [batch, pos, head, d_head]
        self.hook_k = HookPoint()  # [batch, key, kv_head, d_head]
        self.hook_v = HookPoint()  # [batch, key, kv_head, d_head]
        if cfg.positions.rotates_qk:
            self.hook_rot_q = HookPoint()  # [batch, pos, head, d_head]
            self.hook_rot_k = HookPoint()  # [batch, key, kv_head, d_head]
        self.hook_attn_scores = HookPoint()  # [batch, head, pos, key], −inf where masked
        self.hook_pattern = HookPoint()  # [batch, head, pos, key]
        self.hook_z = HookPoint()  # [batch, pos, head, d_head]
        self.hook_result = HookPoint()  # [batch, pos, head, d_model], with cfg.use_attn_result

    @property
    def OV(self) -> FactoredMatrix:  # [head, d_model, d_model] = W_V W_O (grouped-query heads expanded)
        return FactoredMatrix(self._per_head(self.W_V), self.W_O)

    @property
    def QK(self) -> FactoredMatrix:  # [head, d_model, d_model] = W_Q W_Kᵀ
        return FactoredMatrix(self.W_Q, self._per_head(self.W_K).transpose(-2, -1))

    def _per_head(self, t: torch.Tensor) -> torch.Tensor:
        return t.repeat_interleave(self.cfg.n_heads // self.cfg.n_key_value_heads, dim=0)

    def kv_heads(self) -> int:
        """Key/value heads as computed and hooked: n_key_value_heads, or n_heads with
        `ungroup_grouped_query_attention` (W_K, W_V expanded to every query head first, as TransformerLens)."""
        return self.cfg.n_heads if self.cfg.ungroup_grouped_query_attention else self.cfg.n_key_value_heads

    def forward(self, x_q: torch.Tensor, x_k: torch.Tensor, x_v: torch.Tensor, score_bias: ScoreBias,
                rotation: Rotation | None = None, cache=None, hooked: bool | None = None) -> torch.Tensor:
        """Queries read `x_q [batch, pos, d_model]`, keys and values `x_k`, `x_v [batch, key, d_model]`; pass the same
        tensor for inputs that are the same (self-attention: all three, one fused product; Shortformer: queries and
        keys). Per-head inputs `[batch, pos, heads, d_model]` (TransformerLens' split QKV input) are read head by
        head. `score_bias` is added to the scores (`models.arch.score_bias`); `rotation` rotates queries and keys.
        `cache` (incremental decoding, `models.generation.kv_cache.KeyValueCacheEntry`): `cache.append(k, v)`
        returns the keys and values of the earlier positions followed by these, before rotation (as TransformerLens
        caches), which the queries, the last positions, then attend to. `hooked`: the model's decision to run the
        hooked path (`models.arch.watch`; None: decide from this layer's own watchers)."""
        cfg, hooks_on = self.cfg, hooked_path(hooked, self)
        B, P, H, Hkv, dh = x_q.shape[0], x_q.shape[1], cfg.n_heads, self.kv_heads(), cfg.d_head
        q, k, v = self._qkv(x_q, x_k, x_v, decoding=cache is not None)  # [batch, pos | key, head | kv_head, d_head]
        q, k, v = (_own(point, t, hooks_on) for point, t in ((self.hook_q, q), (self.hook_k, k), (self.hook_v, v)))
        if cache is not None:
            k, v = cache.append(k, v)
        if rotation is not None:
            q, k = self.hook_rot_q(rotation(q)), self.hook_rot_k(rotation(k))
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [batch, head, pos | key, d_head]
        scale, cap = score_scale(cfg, self.layer), cfg.attn_scores_soft_cap
        if hooks_on or cap is not None:
            if Hkv != H:  # query head h reads kv head h // (H / Hkv)
                k, v = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
            z = attend(q, k, v, score_bias, scale, cap, self.hook_attn_scores, self.hook_pattern)
        else:
            mask, is_causal = score_bias.sdpa_args(P, k.shape[2], q.dtype, q.device)
            default = cfg.use_attn_scale and cfg.attn_scale is None and not cfg.scale_attn_by_inverse_layer_idx
            z = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, enable_gqa=Hkv != H,
                                               scale=None if default else scale)
        z = self.hook_z(z.transpose(1, 2))  # [batch, pos, head, d_head]
        if cfg.use_attn_result and hooks_on:
            per_head = rounded_product(lambda z, W: torch.einsum("bphd,hdm->bphm", z, W), z, self.W_O)
            return self.hook_result(per_head).sum(-2) + self.b_O  # hook_result: [batch, pos, head, d_model]
        return affine(self.b_O, z.reshape(B * P, H * dh), self.W_O.reshape(H * dh, -1)).view(B, P, -1)

    def _qkv(self, x_q, x_k, x_v, decoding: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`x @ W[h] + b[h]` for queries, keys and values: `[batch, pos, head, d_head]`, keys and values with
        `kv_heads()` heads (ungrouped: every query head gets its own copy of its kv head)."""
        cfg = self.cfg
        H, Hkv, dh = cfg.n_heads, self.kv_heads(), cfg.d_head
        W_K, W_V, b_K, b_V = self.W_K, self.W_V, self.b_K, self.b_V
        if Hkv != cfg.n_key_value_heads:
            W_K, W_V, b_K, b_V = (t.repeat_interleave(H // cfg.n_key_value_heads, 0) for t in (W_K, W_V, b_K, b_V))
        triples = ((x_q, self.W_Q, self.b_Q), (x_k, W_K, b_K), (x_v, W_V, b_V))
        if x_q.ndim == 4:  # per-head inputs
            q, k, v = (rounded_product(lambda x, W: torch.einsum("bphd,hde->bphe", x, W), x, W) + b
                       for x, W, b in triples)
        elif decoding and x_q.shape[0] * max(x_q.shape[1], x_k.shape[1]) < DECODE_ROWS:
            q, k, v = _per_head_project(triples)
        else:
            q, k, v = _project(triples)
        return (q.view(*x_q.shape[:2], H, dh), k.view(*x_k.shape[:2], Hkv, dh), v.view(*x_v.shape[:2], Hkv, dh))


def _own(point: HookPoint, x: torch.Tensor, hooks_on: bool) -> torch.Tensor:
    """`point(x)` when anything watches (under autograd on a copy: q, k and v are views into one fused product's
    output, which autograd forbids editing in place; TransformerLens hands its hooks separate tensors); `x` itself
    when nothing does (no one could see the call)."""
    if not hooks_on:
        return x
    return point(x.clone() if x.requires_grad else x)


def _per_head_project(triples) -> list:
    """`x @ W[h] + b[h]` for each `(x [batch, pos, d_model], W [heads, d_model, d_head], b [heads, d_head])`, one
    batched product per input, as `[batch·pos, heads, d_head]` views. For a few rows this beats the fused
    projection, whose weight `[d_model, (H + 2·H_kv)·d_head]` is a fresh copy of every weight on each call."""
    out = []
    for x, W, b in triples:
        rows = x.reshape(1, -1, x.shape[-1]).expand(W.shape[0], -1, -1)  # [heads, batch·pos, d_model], no copy
        out.append(rounded_product(lambda b, rows, W: torch.baddbmm(b[:, None], rows, W), b, rows, W).transpose(0, 1))
    return out


def _project(triples) -> list:
    """`x @ W[h] + b[h]` for each `(x [batch, pos, d_model], W [heads, d_model, d_head], b [heads, d_head])`, as one
    product per run of consecutive inputs that are the same tensor, their weights side by side (all three at once
    for plain self-attention). Returns 2-D `[batch·pos, heads·d_head]` views of each run's output."""
    out, i = [], 0
    while i < len(triples):
        j = i + 1
        while j < len(triples) and triples[j][0] is triples[i][0]:
            j += 1
        run = triples[i:j]
        x, d_model = run[0][0], run[0][1].shape[1]
        W = torch.cat([W for _, W, _ in run]) if len(run) > 1 else run[0][1]
        b = torch.cat([b for _, _, b in run]) if len(run) > 1 else run[0][2]
        y = affine(b.reshape(-1), x.reshape(-1, x.shape[-1]), W.permute(1, 0, 2).reshape(d_model, -1))
        out += y.split([W.shape[0] * W.shape[2] for _, W, _ in run], -1) if len(run) > 1 else [y]
        i = j
    return out

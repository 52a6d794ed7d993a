"""Multi-head attention with per-head hooks, and `linear`, the affine map the layers share (`models.gemm.affine`).

Parameter names and layouts follow TransformerLens' former `HookedTransformer`: `W_Q [n_heads, d_model, d_head]`,
`W_K`, `W_V [n_key_value_heads, d_model, d_head]`, `W_O [n_heads, d_head, d_model]`, biases `b_Q`, `b_K`, `b_V`,
`b_O`. Axis vocabulary in shape comments as in `models.components`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformer_lens import FactoredMatrix
from transformer_lens.hook_points import HookPoint

from . import train_attention
from .config import HookedTransformerConfig
from .gemm import MIN_ROWS, affine, dual_level, inference_only, rounded_product, traced
from .hook_switches import only_caching
from .positions import Rotation
from .score_bias import ScoreBias


def hooked(*points: HookPoint) -> bool:
    """True when any of the hook points has a forward or backward hook attached (so the explicit path that computes
    them is needed: a backward hook only fires on a tensor that passed through its hook point)."""
    for p in points:  # a loop, not any(generator): called a dozen times per decoding step
        if p.fwd_hooks or p.bwd_hooks:
            return True
    return False


def param_or_buffer(module: nn.Module, name: str, tensor: torch.Tensor, trainable: bool) -> None:
    if trainable:
        module.register_parameter(name, nn.Parameter(tensor))
    else:
        module.register_buffer(name, tensor)


def linear(x: torch.Tensor, W: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """`x @ W + b` for `x [..., d_in]`, `W [d_in, d_out]` (see `affine`)."""
    return affine(b, x.reshape(-1, x.shape[-1]), W).view(*x.shape[:-1], W.shape[-1])


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


class Attention(nn.Module):
    """Multi-head attention (Vaswani et al. 2017, §3.2: softmax(q·kᵀ·scale) v per head, outputs summed through
    W_O), optionally grouped-query (Ainslie et al. 2023: query head h reads key/value head h // (H / H_kv)), with
    per-head hooks. The scale is `score_scale` (1/√d_head by default), the scores optionally soft-capped
    (`soft_cap`, before the score bias, as TransformerLens).

    Two paths compute the same function:
    - explicit: scores = q·kᵀ·scale (soft-capped) + the score bias (−inf where masked), `hook_attn_scores`, softmax,
      `hook_pattern`, z = pattern·v. Taken whenever `hook_attn_scores` or `hook_pattern` is hooked (e.g.
      `run_with_cache`, or a backward hook) or the scores are soft-capped.
    - fused: `F.scaled_dot_product_attention`, taken otherwise (plain forward, generation); in training on CPUs where
      `models.gemm` chose oneDNN, `models.train_attention` (the same function, its products on oneDNN).
    The per-head output `hook_result [batch, pos, head, d_model]` is formed only with `cfg.use_attn_result` and when
    hooked; otherwise z is multiplied by the flattened W_O in one matmul. q, k and v come from one fused product
    (`W_Q`, `W_K`, `W_V` side by side), or, with a key/value cache and below `models.gemm.MIN_ROWS` rows (a decoding
    step), from one batched product per input that reads the weights in place (`_per_head_project`; kept to decoding
    so that a plain forward's results do not depend on how many rows it runs).
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
                rotation: Rotation | None = None, cache=None, kv_entry=None) -> torch.Tensor:
        """Queries read `x_q [batch, pos, d_model]`, keys and values `x_k`, `x_v [batch, key, d_model]`; pass the same
        tensor for inputs that are the same (self-attention: all three, one fused matmul; Shortformer: queries and
        keys). Per-head inputs `[batch, pos, heads, d_model]` (TransformerLens' split QKV input) are read head by
        head. `score_bias` is added to the scores (`models.score_bias`); `rotation` rotates queries and keys.
        `cache` (incremental decoding, e.g. `models.encoder_decoder_generate.KVCache`): `cache.append(k, v)` returns
        the keys and values of the earlier positions followed by these (`[batch, key, kv_head, d_head]`, hooked and
        rotated), which the queries, the last positions, then attend to. `kv_entry` (a `models.kv_cache` entry, the
        decoder-only model's TransformerLens-style cache) does the same before rotation, as TransformerLens caches."""
        cfg = self.cfg
        B, P = x_q.shape[:2]
        K = x_k.shape[1]
        H, Hkv, dh = cfg.n_heads, self.kv_heads(), cfg.d_head
        W_K, W_V, b_K, b_V = self.W_K, self.W_V, self.b_K, self.b_V
        if Hkv != cfg.n_key_value_heads:  # ungrouped: every query head gets its own copy of its kv head
            W_K, W_V, b_K, b_V = (t.repeat_interleave(H // cfg.n_key_value_heads, 0) for t in (W_K, W_V, b_K, b_V))
        if x_q.ndim == 4:  # per-head inputs
            q, k, v = (rounded_product(lambda x, W: torch.einsum("bphd,hde->bphe", x, W), x, W) + b
                       for x, W, b in ((x_q, self.W_Q, self.b_Q), (x_k, W_K, b_K), (x_v, W_V, b_V)))
        elif (kv_entry is not None or cache is not None) and B * max(P, K) < MIN_ROWS:  # a decoding step
            q, k, v = _per_head_project(((x_q, self.W_Q, self.b_Q), (x_k, W_K, b_K), (x_v, W_V, b_V)))
        else:  # one product per distinct input (self-attention: one for all three; Shortformer: q and k, then v)
            # the fused attention can hand back q, k, v's gradients packed only where they reach it unchanged
            packed = rotation is None and Hkv == H and not hooked(self.hook_q, self.hook_k, self.hook_v)
            q, k, v = _project(((x_q, self.W_Q, self.b_Q), (x_k, W_K, b_K), (x_v, W_V, b_V)), packed)
        q = _own(self.hook_q, q.view(B, P, H, dh))  # [batch, pos, head, d_head]
        k = _own(self.hook_k, k.view(B, K, Hkv, dh))  # [batch, key, kv_head, d_head]
        v = _own(self.hook_v, v.view(B, K, Hkv, dh))
        if kv_entry is not None:  # keys and values of the earlier positions, cached before rotation (as TL)
            k, v = kv_entry.append(k, v)
            K = k.shape[1]
        if rotation is not None:
            q, k = self.hook_rot_q(rotation(q)), self.hook_rot_k(rotation(k))
        if cache is not None:
            k, v = cache.append(k, v)
            K = k.shape[1]
        scale = score_scale(cfg, self.layer)
        explicit = hooked(self.hook_attn_scores, self.hook_pattern) or cfg.attn_scores_soft_cap is not None
        mask, is_causal = (None, False) if explicit else score_bias.sdpa_args(P, K, q.dtype, q.device)
        if not explicit and train_attention.usable(q, k, v, mask, score_bias.empty_rows):
            z = train_attention.attention(q, k, v, mask, is_causal, scale)  # training: the oneDNN products
        else:
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [batch, head, pos, d_head]
            if explicit:
                if Hkv != H:  # query head h reads kv head h // (H / Hkv)
                    k, v = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
                z = self._explicit(q, k, v, score_bias, scale)
            else:
                default = cfg.use_attn_scale and cfg.attn_scale is None and not cfg.scale_attn_by_inverse_layer_idx
                z = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal,
                                                   enable_gqa=Hkv != H, scale=None if default else scale)
            z = z.transpose(1, 2)
        z = self.hook_z(z)  # [batch, pos, head, d_head]
        if cfg.use_attn_result and hooked(self.hook_result):
            per_head = rounded_product(lambda z, W: torch.einsum("bphd,hdm->bphm", z, W), z, self.W_O)
            result = self.hook_result(per_head)  # [batch, pos, head, d_model]
            return result.sum(-2) + self.b_O
        return affine(self.b_O, z.reshape(B * P, H * dh), self.W_O.reshape(H * dh, -1)).view(B, P, -1)

    def _explicit(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, score_bias: ScoreBias,
                  scale: float) -> torch.Tensor:
        """The explicit path for `q [batch, head, pos, d_head]`, `k`, `v [batch, head, key, d_head]`: scores,
        `hook_attn_scores`, softmax, `hook_pattern`; returns z = pattern·v `[batch, head, pos, d_head]`.
        Without autograd and soft cap (`run_with_cache`, inference hooks) it writes each `[pos, key]` square once
        per step: `scaled_scores` scales the product and adds the bias in one kernel, and the softmax overwrites the
        scores when no hook saw them. When the bias masks future keys and only `run_with_cache` watches the scores
        and the pattern (`only_caching`), the pattern's upper triangle is exactly zero and pattern·v skips it
        (`causal_pattern_v`)."""
        P, K = q.shape[-2], k.shape[-2]
        bias = score_bias.dense(P, K, q.dtype, q.device)  # [(head,) pos, key], −inf where masked
        cap = self.cfg.attn_scores_soft_cap
        fast = cap is None and inference_only(q, k, v)
        if fast and (bias is None or bias.dim() == 2):
            scores = rounded_product(lambda q, k, bias: scaled_scores(q, k, scale, bias), q, k, bias)
        else:
            qk = rounded_product(lambda q, k: q @ k.transpose(-1, -2), q, k)
            scores = soft_cap(qk.mul_(scale), cap)  # in place: the square once
            if bias is not None:
                scores.add_(bias)
        seen = hooked(self.hook_attn_scores)
        scores = self.hook_attn_scores(scores)  # [batch, head, pos, key]
        pattern = torch.softmax(scores, -1, out=scores) if fast and not seen else scores.softmax(-1)
        if score_bias.empty_rows:  # a query with no key left (a left pad) attends nowhere
            pattern = pattern.nan_to_num(0.0)
        pattern = self.hook_pattern(pattern)
        if (fast and score_bias.masks_future and K >= P and only_caching(self.hook_attn_scores)
                and only_caching(self.hook_pattern)):
            return rounded_product(causal_pattern_v, pattern, v)
        return rounded_product(torch.matmul, pattern, v)


def scaled_scores(q: torch.Tensor, k: torch.Tensor, scale: float, bias: torch.Tensor | None,
                  max_loop: int = 32) -> torch.Tensor:
    """`q kᵀ · scale + bias` for `q [batch, head, pos, d_head]`, `k [batch, head, key, d_head]` and `bias [pos, key]`
    or None, as `torch.baddbmm` (one kernel: the bias is the product's starting value). On one thread and up to
    `max_loop` sequences one call each, reading the strided q and k of the fused QKV projection as they are;
    otherwise one call over copies of q and k (fewer calls: each parallel region of several threads waits for all
    of them, which costs most on a busy machine; benchmarks/README.md)."""
    B, H, P, dh = q.shape
    K = k.shape[-2]
    start, beta = (q.new_zeros(()), 0) if bias is None else (bias, 1)
    if B > max_loop or torch.get_num_threads() > 1:
        return torch.baddbmm(start, q.reshape(B * H, P, dh), k.reshape(B * H, K, dh).transpose(1, 2), beta=beta,
                             alpha=scale).view(B, H, P, K)
    scores = q.new_empty(B, H, P, K)
    for b in range(B):
        torch.baddbmm(start, q[b], k[b].transpose(-1, -2), beta=beta, alpha=scale, out=scores[b])
    return scores


def causal_pattern_v(pattern: torch.Tensor, v: torch.Tensor, blocks: int = 4) -> torch.Tensor:
    """`pattern @ v` for `pattern [batch, head, pos, key]` that is zero after each query's own key (the last `pos`
    of `key` positions) and `v [batch, head, key, d_head]`: `blocks` runs of queries, each multiplied with the keys up
    to its last query only (5/8 of the products with 4 runs; the skipped terms are exact zeros)."""
    B, H, P, K = pattern.shape
    a, b = pattern.reshape(B * H, P, K), v.reshape(B * H, K, v.shape[-1])
    step = -(-P // blocks)  # the keys of queries r0..r1-1 end at key K - P + r1
    z = torch.cat([torch.bmm(a[:, r0:r0 + step, :K - P + min(P, r0 + step)], b[:, :K - P + min(P, r0 + step)])
                   for r0 in range(0, P, step)], 1)
    return z.view(B, H, P, -1)


def _own(point: HookPoint, x: torch.Tensor) -> torch.Tensor:
    """`point(x)`; under autograd a hooked point gets a copy: q, k and v are views into one fused matmul's output,
    which autograd forbids editing in place (TransformerLens hands its hooks separate tensors)."""
    if not hooked(point):
        return x
    return point(x.clone() if x.requires_grad else x)


def _per_head_project(triples) -> list:
    """`x @ W[h] + b[h]` for each `(x [batch, pos, d_model], W [heads, d_model, d_head], b [heads, d_head])`, one
    batched product per input, as `[batch·pos, heads, d_head]` views. For a few rows this beats the fused
    projection, whose weight `[d_model, (H + 2·H_kv)·d_head]` is a fresh copy of every weight on each call
    (benchmarks/README.md, generate.py)."""
    out = []
    for x, W, b in triples:
        rows = x.reshape(1, -1, x.shape[-1]).expand(W.shape[0], -1, -1)  # [heads, batch·pos, d_model], no copy
        out.append(rounded_product(lambda b, rows, W: torch.baddbmm(b[:, None], rows, W), b, rows, W).transpose(0, 1))
    return out


def _project(triples, packed: bool = False) -> list:
    """`x @ W[h] + b[h]` for each `(x [batch, pos, d_model], W [heads, d_model, d_head], b [heads, d_head])`, as one
    product per run of consecutive inputs that are the same tensor, their weights side by side (all three at once
    for plain self-attention). Returns 2-D `[batch·pos, heads·d_head]` views of each run's output (`_columns`, with
    `packed`: their gradients may come back as the blocks of one buffer)."""
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
        out += _columns(y, [W.shape[0] * W.shape[2] for _, W, _ in run], packed)
        i = j
    return out


def _columns(y: torch.Tensor, widths: list[int], packed: bool = True) -> list:
    """`y.split(widths, -1)`; under autograd, where the gradients may come back `packed`, through `_Columns`, whose
    backward takes the gradients' buffer whole where they are its column blocks in place."""
    if len(widths) == 1:
        return [y]
    if packed and y.requires_grad and torch.is_grad_enabled() and not traced() and not dual_level():
        return list(_Columns.apply(y, *widths))
    return list(y.split(widths, -1))


class _Columns(torch.autograd.Function):
    """`y.split(widths, -1)` for a 2-D `y`. Its backward concatenates the gradients, unless they are already the
    column blocks of one buffer laid out as `y` (`models.fused_attention` writes q, k and v's so): then it returns
    that buffer, with no copy."""

    @staticmethod
    def forward(ctx, y, *widths):
        ctx.shape, ctx.widths = y.shape, widths
        ctx.set_materialize_grads(False)  # an unused block's gradient comes as None, not a tensor of zeros
        return y.split(widths, -1)

    @staticmethod
    def backward(ctx, *grads):
        rows, width = ctx.shape
        first = grads[0]
        if all(g is None for g in grads):
            return None, *(None for _ in grads)
        if not torch.is_grad_enabled() and all(g is not None for g in grads):
            start, col = first.storage_offset(), 0
            packed = True
            for g in grads:
                packed = (packed and g.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()
                          and g.dtype == first.dtype and g.shape[0] == rows and g.stride() == (width, 1)
                          and g.storage_offset() == start + col)
                col += g.shape[1]
            if packed:
                return first.as_strided((rows, width), (width, 1), start), *(None for _ in grads)
        like = next(g for g in grads if g is not None)
        full = [g if g is not None else like.new_zeros(rows, w) for g, w in zip(grads, ctx.widths)]
        return torch.cat(full, -1), *(None for _ in grads)

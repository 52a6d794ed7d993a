"""The layers of the hookable transformer. Parameter names and layouts follow TransformerLens' former
`HookedTransformer` (so its state dicts load as they are): `embed.W_E [d_vocab, d_model]`,
`blocks.{l}.attn.W_Q [n_heads, d_model, d_head]`, `W_O [n_heads, d_head, d_model]`, `ln1.w`, `unembed.W_U`, ...

Axis vocabulary in shape comments: batch, pos (query pos), key (key pos), head, kv_head, d_model, d_head,
d_mlp, d_vocab. Row-vector convention: activations are multiplied on the left, `x @ W`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformer_lens import FactoredMatrix
from transformer_lens.hook_points import HookPoint

from .config import HookedTransformerConfig
from .gemm import affine
from .positions import Rotation
from .score_bias import ScoreBias


def hooked(*points: HookPoint) -> bool:
    """True when any of the hook points has a forward hook attached (so a slow, explicit path is needed)."""
    return any(p.fwd_hooks for p in points)


def _param_or_buffer(module: nn.Module, name: str, tensor: torch.Tensor, trainable: bool) -> None:
    if trainable:
        module.register_parameter(name, nn.Parameter(tensor))
    else:
        module.register_buffer(name, tensor)


class Embed(nn.Module):
    def __init__(self, cfg: HookedTransformerConfig):
        super().__init__()
        self.W_E = nn.Parameter(torch.empty(cfg.d_vocab, cfg.d_model, dtype=cfg.torch_dtype))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # [batch, pos] -> [batch, pos, d_model]
        return F.embedding(tokens, self.W_E)


class PosEmbed(nn.Module):
    """The positional scheme's table `W_pos [n_ctx, d_model]`: a parameter when learned, a buffer (not saved) when
    fixed; `forward(n)` gives rows 0..n-1."""

    def __init__(self, cfg: HookedTransformerConfig):
        super().__init__()
        self.scheme = cfg.positions
        if self.scheme.table == "learned":
            self.W_pos = nn.Parameter(torch.empty(cfg.n_ctx, cfg.d_model, dtype=cfg.torch_dtype))
        else:
            self.register_buffer("W_pos", self.scheme.fixed_table(cfg.n_ctx, cfg.torch_dtype), False)

    def forward(self, n_pos: int) -> torch.Tensor:  # -> [pos, d_model]
        return self.scheme.rows(self.W_pos, n_pos)


class Norm(nn.Module):
    """Pre-norm (Xiong et al. 2020): LayerNorm ("LN", Ba et al. 2016), RMSNorm ("RMS", Zhang & Sennrich 2019) or
    none (identity that still fires `hook_normalized`).

    LN: x ← x − mean(x); scale = √(mean(x²) + ε); out = x / scale · w + b (TransformerLens' formula); RMS skips the
    centring and the bias.
    The fused `F.layer_norm` / `F.rms_norm` kernels are used unless `hook_scale`/`hook_normalized` are hooked.
    """

    def __init__(self, cfg: HookedTransformerConfig, d: int | None = None):
        super().__init__()
        self.kind, self.eps = cfg.normalization_type, cfg.eps
        d = d or cfg.d_model
        if self.kind is not None:
            self.w = nn.Parameter(torch.ones(d, dtype=cfg.torch_dtype))
        if self.kind == "LN":
            self.b = nn.Parameter(torch.zeros(d, dtype=cfg.torch_dtype))
        self.hook_scale = HookPoint()  # [batch, pos, 1]
        self.hook_normalized = HookPoint()  # [batch, pos, d_model]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind is None:
            return self.hook_normalized(x)
        if not hooked(self.hook_scale, self.hook_normalized):
            if self.kind == "LN":
                return F.layer_norm(x, x.shape[-1:], self.w, self.b, self.eps)
            return F.rms_norm(x, x.shape[-1:], self.w, self.eps)
        if self.kind == "LN":
            x = x - x.mean(-1, keepdim=True)
        scale = self.hook_scale((x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt())
        x = x / scale * self.w
        return self.hook_normalized(x + self.b if self.kind == "LN" else x)


class Attention(nn.Module):
    """Multi-head attention (Vaswani et al. 2017, §3.2: softmax(q·kᵀ/√d_head) v per head, outputs summed through
    W_O), optionally grouped-query (Ainslie et al. 2023: query head h reads key/value head h // (H / H_kv)), with
    per-head hooks.

    Two paths compute the same function:
    - explicit: scores = q·kᵀ/√d_head + the score bias (−inf where masked), `hook_attn_scores`, softmax,
      `hook_pattern`, z = pattern·v. Taken whenever `hook_attn_scores` or `hook_pattern` is hooked (e.g.
      `run_with_cache`).
    - fused: `F.scaled_dot_product_attention`, taken otherwise (plain forward, training, generation).
    The per-head output `hook_result [batch, pos, head, d_model]` is formed only when it is hooked and
    `cfg.use_attn_result`; otherwise z is multiplied by the flattened W_O in one matmul.
    """

    def __init__(self, cfg: HookedTransformerConfig):
        super().__init__()
        self.cfg = cfg
        H, Hkv, D, dh, dt = cfg.n_heads, cfg.n_key_value_heads, cfg.d_model, cfg.d_head, cfg.torch_dtype
        self.W_Q = nn.Parameter(torch.empty(H, D, dh, dtype=dt))
        self.W_K = nn.Parameter(torch.empty(Hkv, D, dh, dtype=dt))
        self.W_V = nn.Parameter(torch.empty(Hkv, D, dh, dtype=dt))
        self.W_O = nn.Parameter(torch.empty(H, dh, D, dtype=dt))
        for name, shape in (("b_Q", (H, dh)), ("b_K", (Hkv, dh)), ("b_V", (Hkv, dh)), ("b_O", (D,))):
            _param_or_buffer(self, name, torch.zeros(shape, dtype=dt), cfg.use_bias)
        self.hook_q = HookPoint()  # [batch, pos, head, d_head]
        self.hook_k = HookPoint()  # [batch, key, kv_head, d_head]
        self.hook_v = HookPoint()  # [batch, key, kv_head, d_head]
        self.hook_rot_q = HookPoint()  # [batch, pos, head, d_head], rotary positions only
        self.hook_rot_k = HookPoint()  # [batch, key, kv_head, d_head], rotary positions only
        self.hook_attn_scores = HookPoint()  # [batch, head, pos, key], −inf where masked
        self.hook_pattern = HookPoint()  # [batch, head, pos, key]
        self.hook_z = HookPoint()  # [batch, pos, head, d_head]
        self.hook_result = HookPoint()  # [batch, pos, head, d_model]

    @property
    def OV(self) -> FactoredMatrix:  # [head, d_model, d_model] = W_V W_O (grouped-query heads expanded)
        return FactoredMatrix(self._per_head(self.W_V), self.W_O)

    @property
    def QK(self) -> FactoredMatrix:  # [head, d_model, d_model] = W_Q W_Kᵀ
        return FactoredMatrix(self.W_Q, self._per_head(self.W_K).transpose(-2, -1))

    def _per_head(self, t: torch.Tensor) -> torch.Tensor:
        return t.repeat_interleave(self.cfg.n_heads // self.cfg.n_key_value_heads, dim=0)

    def forward(self, x_q: torch.Tensor, x_k: torch.Tensor, x_v: torch.Tensor, score_bias: ScoreBias,
                rotation: Rotation | None = None, kv_entry=None) -> torch.Tensor:
        """Queries read `x_q [batch, pos, d_model]`, keys and values `x_k`, `x_v [batch, key, d_model]`; pass the same
        tensor for inputs that are the same (self-attention: all three, one fused matmul; Shortformer: queries and
        keys). `score_bias` is added to the scores (`models.score_bias`); `rotation` rotates queries and keys;
        `kv_entry` (a `models.kv_cache` entry) prepends the cached keys and values of earlier positions and appends
        the new ones."""
        cfg = self.cfg
        B, P, _ = x_q.shape
        K = x_k.shape[1]
        H, Hkv, dh = cfg.n_heads, cfg.n_key_value_heads, cfg.d_head
        W = torch.cat([self.W_Q, self.W_K, self.W_V]).permute(1, 0, 2).reshape(cfg.d_model, -1)
        b = torch.cat([self.b_Q, self.b_K, self.b_V]).reshape(-1)
        widths = (H * dh, Hkv * dh, Hkv * dh)
        if x_q is x_k is x_v:  # self-attention: one fused QKV matmul
            q, k, v = affine(b, x_q.reshape(B * P, -1), W).split(widths, -1)
        else:
            q, k, v = _project((x_q, x_k, x_v), W, b, widths)
        q = self.hook_q(q.view(B, P, H, dh))  # [batch, pos, head, d_head]
        k = self.hook_k(k.view(B, K, Hkv, dh))  # [batch, key, kv_head, d_head]
        v = self.hook_v(v.view(B, K, Hkv, dh))
        if kv_entry is not None:  # keys and values of the earlier positions, cached (before rotation, as TL)
            k, v = kv_entry.append(k, v)
            K = k.shape[1]
        if rotation is not None:
            q, k = self.hook_rot_q(rotation(q)), self.hook_rot_k(rotation(k))
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [batch, head, pos, d_head]
        if hooked(self.hook_attn_scores, self.hook_pattern):
            if Hkv != H:  # query head h reads kv head h // (H / Hkv)
                k, v = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
            scores = (q @ k.transpose(-1, -2)).mul_(1 / math.sqrt(dh))  # in place: the [pos, key] square once
            bias = score_bias.dense(P, K, q.dtype, q.device)  # [(head,) pos, key], −inf where masked
            if bias is not None:
                scores.add_(bias)
            pattern = self.hook_attn_scores(scores).softmax(-1)  # [batch, head, pos, key]
            if score_bias.empty_rows:  # a query with no key left (a left pad) attends nowhere
                pattern = pattern.nan_to_num(0.0)
            pattern = self.hook_pattern(pattern)
            z = pattern @ v
        else:
            mask, is_causal = score_bias.sdpa_args(P, K, q.dtype, q.device)
            z = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, enable_gqa=Hkv != H)
        z = self.hook_z(z.transpose(1, 2))  # [batch, pos, head, d_head]
        if cfg.use_attn_result and hooked(self.hook_result):
            result = self.hook_result(torch.einsum("bphd,hdm->bphm", z, self.W_O))  # [batch, pos, head, d_model]
            return result.sum(-2) + self.b_O
        return affine(self.b_O, z.reshape(B * P, H * dh), self.W_O.reshape(H * dh, -1)).view(B, P, -1)


def _project(xs: tuple[torch.Tensor, ...], W: torch.Tensor, b: torch.Tensor, widths: tuple[int, ...]) -> list:
    """`x_i @ W_i + b_i` for the inputs `xs` and the column blocks `widths` of `W` / `b`, as one matmul per run of
    consecutive inputs that are the same tensor (all three at once for plain self-attention). Returns 2-D
    `[batch·pos, width]` views."""
    out, i = [], 0
    while i < len(xs):
        j = i + 1
        while j < len(xs) and xs[j] is xs[i]:
            j += 1
        lo, hi = sum(widths[:i]), sum(widths[:j])
        x = xs[i]
        out += affine(b[lo:hi], x.reshape(-1, x.shape[-1]), W[:, lo:hi]).split(widths[i:j], -1)
        i = j
    return out


def linear(x: torch.Tensor, W: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """`x @ W + b` for `x [..., d_in]`, `W [d_in, d_out]` (see `affine`)."""
    return affine(b, x.reshape(-1, x.shape[-1]), W).view(*x.shape[:-1], W.shape[-1])


#: GELU (Hendrycks & Gimpel 2016; "gelu_new": its tanh approximation, as GPT-2), ReLU, SiLU (Elfwing et al. 2018).
_ACTIVATIONS = {
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
}


class MLP(nn.Module):
    """The position-wise feed-forward layer (Vaswani et al. 2017, §3.3): act(x W_in + b_in) W_out + b_out."""

    def __init__(self, cfg: HookedTransformerConfig):
        super().__init__()
        dt = cfg.torch_dtype
        self.W_in = nn.Parameter(torch.empty(cfg.d_model, cfg.d_mlp, dtype=dt))
        self.W_out = nn.Parameter(torch.empty(cfg.d_mlp, cfg.d_model, dtype=dt))
        _param_or_buffer(self, "b_in", torch.zeros(cfg.d_mlp, dtype=dt), cfg.use_bias)
        _param_or_buffer(self, "b_out", torch.zeros(cfg.d_model, dtype=dt), cfg.use_bias)
        self.act = _ACTIVATIONS[cfg.act_fn]
        self.hook_pre = HookPoint()  # [batch, pos, d_mlp]
        self.hook_post = HookPoint()  # [batch, pos, d_mlp]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pre = self.hook_pre(linear(x, self.W_in, self.b_in))
        return linear(self.hook_post(self.act(pre)), self.W_out, self.b_out)


@dataclass
class BlockInputs:
    """What a block reads besides its residual stream; the model builds it once per forward pass.

    `score_bias`: added to every head's attention scores: the attention mask and a positional bias such as ALiBi
    (`models.score_bias`). `pos_qk`: positions added to the query and key inputs only, `[batch, pos, d_model]`
    (Shortformer), or None. `rotation`: rotates queries and keys by position (RoPE), or None."""

    score_bias: ScoreBias
    pos_qk: torch.Tensor | None = None
    rotation: Rotation | None = None
    kv_entry: object | None = None  # this block's `models.kv_cache.HookedTransformerKeyValueCacheEntry`, or None


class TransformerBlock(nn.Module):
    """A pre-norm residual block: resid + attn(ln1(resid)), then (with MLPs) + mlp(ln2(resid)); Elhage et al. (2021)
    read the residual stream as the sum of what every layer writes to it."""

    #: TransformerLens' marker (its bridge blocks carry it): the block's output `hook_resid_post` is the one residual
    #: stream the model unembeds, so its logit lens and Jacobian lens may read it.
    hook_out_is_single_residual_stream = True

    def __init__(self, cfg: HookedTransformerConfig):
        super().__init__()
        self.cfg = cfg
        self.ln1 = Norm(cfg)
        self.attn = Attention(cfg)
        self.hook_resid_pre = HookPoint()  # [batch, pos, d_model]
        self.hook_attn_out = HookPoint()  # [batch, pos, d_model]
        self.hook_resid_post = HookPoint()  # [batch, pos, d_model]
        if not cfg.attn_only:
            self.ln2 = Norm(cfg)
            self.mlp = MLP(cfg)
            self.hook_resid_mid = HookPoint()  # [batch, pos, d_model]
            self.hook_mlp_out = HookPoint()  # [batch, pos, d_model]

    def forward(self, resid: torch.Tensor, side: BlockInputs) -> torch.Tensor:
        resid = self.hook_resid_pre(resid)
        x_qk = self.ln1(resid + side.pos_qk) if side.pos_qk is not None else None  # Q/K see positions, V does not
        x = self.ln1(resid)
        x_qk = x if x_qk is None else x_qk
        attn_out = self.hook_attn_out(self.attn(x_qk, x_qk, x, side.score_bias, side.rotation, side.kv_entry))
        if self.cfg.attn_only:
            return self.hook_resid_post(resid + attn_out)
        resid = self.hook_resid_mid(resid + attn_out)
        return self.hook_resid_post(resid + self.hook_mlp_out(self.mlp(self.ln2(resid))))


class Unembed(nn.Module):
    def __init__(self, cfg: HookedTransformerConfig):
        super().__init__()
        self.W_U = nn.Parameter(torch.empty(cfg.d_model, cfg.d_vocab, dtype=cfg.torch_dtype))
        _param_or_buffer(self, "b_U", torch.zeros(cfg.d_vocab, dtype=cfg.torch_dtype), cfg.use_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [batch, pos, d_model] -> [batch, pos, d_vocab]
        return linear(x, self.W_U, self.b_U)

"""The layers of the hookable transformer. Parameter names and layouts follow TransformerLens' former
`HookedTransformer` (so its state dicts load as they are): `embed.W_E [d_vocab, d_model]`,
`blocks.{l}.attn.W_Q [n_heads, d_model, d_head]`, `W_O [n_heads, d_head, d_model]`, `ln1.w`, `unembed.W_U`, ...

Axis vocabulary in shape comments: batch, pos (query pos), key (key pos), head, kv_head, d_model, d_head,
d_mlp, d_vocab. Row-vector convention: activations are multiplied on the left, `x @ W`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformer_lens.hook_points import HookPoint

from .config import HookedTransformerConfig
from .positions import apply_rotary, sinusoidal_table


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
    """Learned (`standard`, `shortformer`) or fixed sinusoidal table; `forward(n)` gives rows 0..n-1."""

    def __init__(self, cfg: HookedTransformerConfig):
        super().__init__()
        self.cfg = cfg
        if cfg.positional_is_learned:
            self.W_pos = nn.Parameter(torch.empty(cfg.n_ctx, cfg.d_model, dtype=cfg.torch_dtype))
        else:  # sinusoidal: not a parameter, not saved
            self.register_buffer("W_pos", sinusoidal_table(cfg.n_ctx, cfg.d_model, cfg.torch_dtype), False)

    def forward(self, n_pos: int) -> torch.Tensor:  # -> [pos, d_model]
        if n_pos <= self.W_pos.shape[0]:
            return self.W_pos[:n_pos]
        return sinusoidal_table(n_pos, self.cfg.d_model, self.W_pos.dtype, self.W_pos.device)


class Norm(nn.Module):
    """Pre-norm: LayerNorm ("LN"), RMSNorm ("RMS") or none (identity that still fires `hook_normalized`).

    LN: x ← x − mean(x); scale = √(mean(x²) + ε); out = x / scale · w + b (TransformerLens' formula).
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
    """Multi-head (optionally grouped-query) attention with per-head hooks.

    Two paths compute the same function:
    - explicit: scores = q·kᵀ/√d_head (+ ALiBi) masked to −inf, `hook_attn_scores`, softmax, `hook_pattern`,
      z = pattern·v. Taken whenever `hook_attn_scores` or `hook_pattern` is hooked (e.g. `run_with_cache`).
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
        for name in ("q", "k", "v", "rot_q", "rot_k", "attn_scores", "pattern", "z", "result"):
            setattr(self, f"hook_{name}", HookPoint())

    def forward(self, x_qk: torch.Tensor, x_v: torch.Tensor, rope=None, bias=None) -> torch.Tensor:
        """x_qk, x_v: `[batch, pos, d_model]` (the same tensor unless positions are shortformer).
        rope: `(cos, sin)` tables `[pos, rotary_dim/2]`; bias: additive scores `[head, pos, key]` (ALiBi)."""
        cfg = self.cfg
        B, P, _ = x_v.shape
        H, Hkv, dh = cfg.n_heads, cfg.n_key_value_heads, cfg.d_head
        W = torch.cat([self.W_Q, self.W_K, self.W_V]).permute(1, 0, 2).reshape(cfg.d_model, -1)
        b = torch.cat([self.b_Q, self.b_K, self.b_V]).reshape(-1)
        n_qk = (H + Hkv) * dh
        if x_qk is x_v:  # one fused QKV matmul
            q, k, v = affine(b, x_v.reshape(B * P, -1), W).split([H * dh, Hkv * dh, Hkv * dh], -1)
        else:  # shortformer: positions reach queries and keys only
            q, k = affine(b[:n_qk], x_qk.reshape(B * P, -1), W[:, :n_qk]).split([H * dh, Hkv * dh], -1)
            v = affine(b[n_qk:], x_v.reshape(B * P, -1), W[:, n_qk:])
        q = self.hook_q(q.view(B, P, H, dh))  # [batch, pos, head, d_head]
        k = self.hook_k(k.view(B, P, Hkv, dh))  # [batch, key, kv_head, d_head]
        v = self.hook_v(v.view(B, P, Hkv, dh))
        if rope is not None:
            q = self.hook_rot_q(apply_rotary(q, *rope, cfg.rotary_adjacent_pairs))
            k = self.hook_rot_k(apply_rotary(k, *rope, cfg.rotary_adjacent_pairs))
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [batch, head, pos, d_head]
        causal = cfg.attention_dir == "causal"
        if hooked(self.hook_attn_scores, self.hook_pattern):
            if Hkv != H:  # query head h reads kv head h // (H / Hkv)
                k, v = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
            # q·kᵀ/√d_head + ALiBi, −inf above the diagonal; in place, so the [pos, key] square is written once
            scores = (q @ k.transpose(-1, -2)).mul_(1 / math.sqrt(dh)).add_(score_bias(P, causal, bias, q))
            pattern = self.hook_pattern(self.hook_attn_scores(scores).softmax(-1))  # [batch, head, pos, key]
            z = pattern @ v
        else:
            mask = score_bias(P, causal, bias, q) if bias is not None else None
            z = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=causal and bias is None, enable_gqa=Hkv != H
            )
        z = self.hook_z(z.transpose(1, 2))  # [batch, pos, head, d_head]
        if cfg.use_attn_result and hooked(self.hook_result):
            result = self.hook_result(torch.einsum("bphd,hdm->bphm", z, self.W_O))  # [batch, pos, head, d_model]
            return result.sum(-2) + self.b_O
        return affine(self.b_O, z.reshape(B * P, H * dh), self.W_O.reshape(H * dh, -1)).view(B, P, -1)


def score_bias(n_pos: int, causal: bool, bias, like: torch.Tensor) -> torch.Tensor:
    """Additive attention-score bias: `bias [head, pos, key]` (ALiBi) or zeros `[pos, key]`, with −inf above
    the diagonal when causal."""
    out = torch.zeros(n_pos, n_pos, dtype=like.dtype, device=like.device) if bias is None else bias
    if causal:
        out = out.masked_fill(torch.ones(n_pos, n_pos, dtype=torch.bool, device=like.device).triu(1), float("-inf"))
    return out


def affine(b: torch.Tensor, x: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """`x @ W + b` for a 2-D `x`, as one fused addmm (no separate bias pass). A bias that is zero and needs no
    gradient (the buffers of `use_bias=False`) is skipped on the CPU, saving addmm's copy of the broadcast bias
    into the output (~2% of a training step of the zoo models); the zero test reads the values, so a bias
    written later (`circuits.fold_layer_norm`) still counts. On a GPU the test would synchronise, so the add stays."""
    if not b.requires_grad and b.device.type == "cpu" and not b.any():
        return x @ W
    return torch.addmm(b, x, W)


def linear(x: torch.Tensor, W: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """`x @ W + b` for `x [..., d_in]`, `W [d_in, d_out]` (see `affine`)."""
    return affine(b, x.reshape(-1, x.shape[-1]), W).view(*x.shape[:-1], W.shape[-1])


_ACTIVATIONS = {
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
}


class MLP(nn.Module):
    def __init__(self, cfg: HookedTransformerConfig):
        super().__init__()
        dt = cfg.torch_dtype
        self.W_in = nn.Parameter(torch.empty(cfg.d_model, cfg.d_mlp, dtype=dt))
        self.W_out = nn.Parameter(torch.empty(cfg.d_mlp, cfg.d_model, dtype=dt))
        _param_or_buffer(self, "b_in", torch.zeros(cfg.d_mlp, dtype=dt), cfg.use_bias)
        _param_or_buffer(self, "b_out", torch.zeros(cfg.d_model, dtype=dt), cfg.use_bias)
        self.act = _ACTIVATIONS[cfg.act_fn]
        self.hook_pre = HookPoint()  # [batch, pos, d_mlp]
        self.hook_post = HookPoint()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pre = self.hook_pre(linear(x, self.W_in, self.b_in))
        return linear(self.hook_post(self.act(pre)), self.W_out, self.b_out)


class TransformerBlock(nn.Module):
    #: TransformerLens' marker (its bridge blocks carry it): the block's output `hook_resid_post` is the one residual
    #: stream the model unembeds, so its logit lens and Jacobian lens may read it.
    hook_out_is_single_residual_stream = True

    def __init__(self, cfg: HookedTransformerConfig):
        super().__init__()
        self.cfg = cfg
        self.ln1 = Norm(cfg)
        self.attn = Attention(cfg)
        self.hook_resid_pre = HookPoint()  # [batch, pos, d_model]
        self.hook_attn_out = HookPoint()
        self.hook_resid_post = HookPoint()
        if not cfg.attn_only:
            self.ln2 = Norm(cfg)
            self.mlp = MLP(cfg)
            self.hook_resid_mid = HookPoint()
            self.hook_mlp_out = HookPoint()

    def forward(self, resid: torch.Tensor, pos_qk=None, rope=None, bias=None) -> torch.Tensor:
        resid = self.hook_resid_pre(resid)
        x_qk = self.ln1(resid + pos_qk) if pos_qk is not None else None  # shortformer: Q/K see positions
        x = self.ln1(resid)
        attn_out = self.hook_attn_out(self.attn(x if x_qk is None else x_qk, x, rope, bias))
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

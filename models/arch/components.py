"""The layers of the hookable transformer. Parameter names and layouts follow TransformerLens' former
`HookedTransformer` (so its state dicts load as they are): `embed.W_E [d_vocab, d_model]`,
`blocks.{l}.attn.W_Q [n_heads, d_model, d_head]`, `W_O [n_heads, d_head, d_model]`, `ln1.w`, `unembed.W_U`, ...

Axis vocabulary in shape comments: batch, pos (query pos), key (key pos), head, kv_head, d_model, d_head,
d_mlp, d_vocab. Row-vector convention: activations are multiplied on the left, `x @ W`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .attention import Attention
from .attention import param_or_buffer as _param_or_buffer
from .config import HookedTransformerConfig
from .positions import Rotation
from .products import linear
from .score_bias import ScoreBias
from .tl_compat import HookPoint
from .watch import hooked_path

__all__ = ["Attention", "BlockInputs", "attention_inputs", "Embed", "GatedMLP", "LayerNorm", "LayerNormPre", "MLP",
           "Norm", "PosEmbed",
           "RMSNorm", "RMSNormPre", "TransformerBlock", "Unembed"]


class Embed(nn.Module):
    def __init__(self, cfg: HookedTransformerConfig):
        super().__init__()
        self.W_E = nn.Parameter(torch.empty(cfg.d_vocab, cfg.d_model, dtype=cfg.torch_dtype))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # [batch, pos] -> [batch, pos, d_model]
        return F.embedding(tokens, self.W_E)


class PosEmbed(nn.Module):
    """The positional scheme's table `W_pos [n_ctx, d_model]`: a parameter when learned, a buffer (not saved) when
    fixed. `forward(tokens, past_kv_pos_offset, attention_mask)` as TransformerLens 2.x's `PosEmbed`; `rows(n)` gives
    rows 0..n-1."""

    def __init__(self, cfg: HookedTransformerConfig):
        super().__init__()
        self.scheme = cfg.positions
        if self.scheme.table == "learned":
            self.W_pos = nn.Parameter(torch.empty(cfg.n_ctx, cfg.d_model, dtype=cfg.torch_dtype))
        else:
            self.register_buffer("W_pos", self.scheme.fixed_table(cfg.n_ctx, cfg.torch_dtype), False)

    def rows(self, n_pos: int) -> torch.Tensor:  # -> [pos, d_model]
        return self.scheme.rows(self.W_pos, n_pos)

    def forward(self, tokens: torch.Tensor, past_kv_pos_offset: int = 0,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """`[batch, pos, d_model]`, the rows of `tokens [batch, pos]`'s positions, which follow `past_kv_pos_offset`
        cached ones. With `attention_mask [batch, past + pos]` (1 real, 0 padding) a position counts the real tokens
        before it and padding gets zeros (`models.arch.padding.position_ids`), as TransformerLens 2.x."""
        from .padding import position_ids

        B, P = tokens.shape[:2]
        mask = None if attention_mask is None else attention_mask[:, :past_kv_pos_offset + P]
        if mask is None or bool(mask.eq(1).all()):  # no padding (a decoding step): the rows the gather would give
            return self.rows(past_kv_pos_offset + P)[past_kv_pos_offset:].expand(B, P, -1)
        ids, real = position_ids(mask, past_kv_pos_offset)
        return self.rows(int(ids.max()) + 1)[ids] * real[..., None].to(self.W_pos.dtype)


class Norm(nn.Module):
    """Pre-norm (Xiong et al. 2020): LayerNorm ("LN", Ba et al. 2016), RMSNorm ("RMS", Zhang & Sennrich 2019), their
    parameter-free forms "LNPre" / "RMSPre" (TransformerLens' LayerNormPre / RMSNormPre: the norm left once its weight
    and bias are folded into the weights that read it, `models.arch.weight_processing`) or none (the identity, with no
    hook points, as TransformerLens' `nn.Identity`).

    LN: x ← x − mean(x); scale = √(mean(x²) + ε); out = x / scale · w + b (TransformerLens' formula), hooked at
    `hook_scale` and `hook_normalized` (the output). RMS skips the centring and the bias and hooks `hook_normalized`
    at x / scale, before the weight (as TransformerLens' RMSNorm); the *Pre forms stop at x / scale. The fused
    `F.layer_norm` / `F.rms_norm` kernels run when nothing watches the model (`models.arch.watch`). `kind` overrides
    `cfg.normalization_type`; `d` the width (d_model).
    """

    def __init__(self, cfg: HookedTransformerConfig, d: int | None = None, kind: str | None = "cfg"):
        super().__init__()
        self.kind = cfg.normalization_type if kind == "cfg" else kind
        self.centre = self.kind in ("LN", "LNPre")
        self.eps = cfg.eps
        d = d or cfg.d_model
        if self.kind is not None:
            self.hook_scale = HookPoint()  # [batch, pos, 1]
            self.hook_normalized = HookPoint()  # [batch, pos, d_model]
        if self.kind in ("LN", "RMS"):
            self.w = nn.Parameter(torch.ones(d, dtype=cfg.torch_dtype))
        if self.kind == "LN":
            self.b = nn.Parameter(torch.zeros(d, dtype=cfg.torch_dtype))

    def forward(self, x: torch.Tensor, hooked: bool | None = None) -> torch.Tensor:
        if self.kind is None:
            return x
        w, b = getattr(self, "w", None), getattr(self, "b", None)
        if not hooked_path(hooked, self):
            if self.centre:
                return F.layer_norm(x, x.shape[-1:], w, b, self.eps)
            return F.rms_norm(x, x.shape[-1:], w, self.eps)
        if self.centre:
            x = x - x.mean(-1, keepdim=True)
        scale = self.hook_scale((x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt())
        if self.kind == "LN":
            return self.hook_normalized(x / scale * w + b)
        out = self.hook_normalized(x / scale)
        return out * w if w is not None else out


class LayerNorm(Norm):
    """TransformerLens 2.x's `LayerNorm(cfg, length=None)`: a `Norm` of kind "LN" over `length` features (default
    d_model); `cfg` a config or its dict. The subclasses below fix the other kinds the same way."""

    KIND = "LN"

    def __init__(self, cfg: HookedTransformerConfig | dict, length: int | None = None):
        super().__init__(HookedTransformerConfig.unwrap(cfg), length, self.KIND)


class LayerNormPre(LayerNorm):
    """TransformerLens 2.x's `LayerNormPre(cfg)`: centre and scale, no weight or bias (a `Norm` of kind "LNPre")."""

    KIND = "LNPre"


class RMSNorm(LayerNorm):
    """TransformerLens 2.x's `RMSNorm(cfg, length=None)`: a `Norm` of kind "RMS" (weight, no centring, no bias)."""

    KIND = "RMS"


class RMSNormPre(LayerNorm):
    """TransformerLens 2.x's `RMSNormPre(cfg)`: scale only (a `Norm` of kind "RMSPre")."""

    KIND = "RMSPre"


def norm_of_kind(cfg: HookedTransformerConfig, d: int | None = None, kind: str | None = "cfg") -> Norm:
    """A `Norm` of `kind` (default `cfg.normalization_type`) as the class TransformerLens 2.x names it (`LayerNorm`,
    `LayerNormPre`, `RMSNorm`, `RMSNormPre`): `isinstance(model.ln_final, LayerNorm)` holds as there; none: `Norm`."""
    kind = cfg.normalization_type if kind == "cfg" else kind
    cls = {c.KIND: c for c in (LayerNorm, LayerNormPre, RMSNorm, RMSNormPre)}.get(kind)
    return Norm(cfg, d, None) if cls is None else cls(cfg, d)


def final_norm(cfg: HookedTransformerConfig) -> Norm:
    """`ln_final`: the blocks' norm, or RMSNorm with `final_rms` (when the model has norms at all); none with post-norm
    blocks, whose output is normalised already (Vaswani et al. 2017)."""
    if cfg.normalization_position == "post":
        return Norm(cfg, kind=None)
    if cfg.final_rms and cfg.normalization_type:
        return norm_of_kind(cfg, kind="RMSPre" if cfg.normalization_type.endswith("Pre") else "RMS")
    return norm_of_kind(cfg)


def gelu_fast(x: torch.Tensor) -> torch.Tensor:
    """GELU's tanh approximation with TransformerLens' (and Hugging Face's) constants:
    0.5·x·(1 + tanh(0.7978845608·x·(1 + 0.044715·x²)))."""
    return 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))


def solu(x: torch.Tensor) -> torch.Tensor:
    """SoLU (Elhage et al. 2022, "Softmax Linear Units"): x · softmax(x) over the MLP neurons."""
    return x * x.softmax(-1)


#: GELU (Hendrycks & Gimpel 2016; "gelu_new", "gelu_pytorch_tanh", "gelu_fast": its tanh approximation, as GPT-2),
#: ReLU, SiLU (Elfwing et al. 2018), SoLU ("solu_ln" adds the LayerNorm, `MLP`).
_ACTIVATIONS = {
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_fast": gelu_fast,
    "relu": F.relu,
    "silu": F.silu,
    "solu": solu,
    "solu_ln": solu,
}


class MLP(nn.Module):
    """The position-wise feed-forward layer (Vaswani et al. 2017, §3.3): act(x W_in + b_in) W_out + b_out.

    `act_fn="solu_ln"`: SoLU, `hook_mid`, then a LayerNorm over the neurons (`mlp.ln`), as TransformerLens' SoLU
    models. `gated_mlp` (Shazeer 2020, "GLU variants"): (act(x W_gate) ⊙ (x W_in) + b_in) W_out + b_out, with
    `hook_pre` = x W_gate and `hook_pre_linear` = x W_in (TransformerLens' GatedMLP; gated with "solu_ln" is
    ln(solu(x W_gate)) W_out + b_out there, W_in unread, and here too)."""

    def __init__(self, cfg: HookedTransformerConfig):
        super().__init__()
        dt = cfg.torch_dtype
        self.gated = cfg.gated_mlp
        self.W_in = nn.Parameter(torch.empty(cfg.d_model, cfg.d_mlp, dtype=dt))
        if self.gated:
            self.W_gate = nn.Parameter(torch.empty(cfg.d_model, cfg.d_mlp, dtype=dt))
            self.hook_pre_linear = HookPoint()  # [batch, pos, d_mlp]
        self.W_out = nn.Parameter(torch.empty(cfg.d_mlp, cfg.d_model, dtype=dt))
        _param_or_buffer(self, "b_in", torch.zeros(cfg.d_mlp, dtype=dt), cfg.use_bias)
        _param_or_buffer(self, "b_out", torch.zeros(cfg.d_model, dtype=dt), cfg.use_bias)
        self.act = _ACTIVATIONS[cfg.act_fn]
        self.hook_pre = HookPoint()  # [batch, pos, d_mlp]
        if cfg.act_fn == "solu_ln":
            self.hook_mid = HookPoint()  # [batch, pos, d_mlp]
            self.ln = norm_of_kind(cfg, cfg.d_mlp, "LNPre" if cfg.normalization_type in ("LNPre", "RMSPre") else "LN")
        self.hook_post = HookPoint()  # [batch, pos, d_mlp]

    def forward(self, x: torch.Tensor, hooked: bool | None = None) -> torch.Tensor:
        if self.gated:
            act = self.act(self.hook_pre(x @ self.W_gate))
            if hasattr(self, "ln"):  # TransformerLens 2.18's gated SoLU-LN reads neither W_in nor b_in
                post = self.ln(self.hook_mid(act), hooked)
            else:
                post = act * self.hook_pre_linear(x @ self.W_in) + self.b_in
        else:
            post = self.act(self.hook_pre(linear(x, self.W_in, self.b_in)))
            if hasattr(self, "ln"):
                post = self.ln(self.hook_mid(post), hooked)
        return linear(self.hook_post(post), self.W_out, self.b_out)


class GatedMLP(MLP):
    """TransformerLens 2.x's `GatedMLP(cfg)`: an `MLP` gated whatever `cfg.gated_mlp` says (its parameters in our
    order: W_in, W_gate, W_out)."""

    def __init__(self, cfg: HookedTransformerConfig | dict):
        cfg = HookedTransformerConfig.unwrap(cfg)
        super().__init__(cfg if cfg.gated_mlp else cfg.replace(gated_mlp=True))


@dataclass
class BlockInputs:
    """What a block reads besides its residual stream; the model builds it once per forward pass.

    `score_bias`: added to every head's attention scores: the attention mask and a positional bias such as ALiBi
    (`models.arch.score_bias`). `pos_qk`: positions added to the query and key inputs only, `[batch, pos, d_model]`
    (Shortformer), or None. `rotation`: rotates queries and keys by position (RoPE), or None. `cache`: the block's
    key/value cache entry when decoding step by step, or None. `hooked`: whether the layers run their hooked path."""

    score_bias: ScoreBias
    pos_qk: torch.Tensor | None = None
    rotation: Rotation | None = None
    cache: object | None = None  # this block's `models.generation.kv_cache.HookedTransformerKeyValueCacheEntry`
    hooked: bool | None = None  # the model's decision: every hook point runs (`models.arch.watch`); None: each decides


def norm_inputs(norm: Norm, resid: torch.Tensor, pos_qk: torch.Tensor | None, position: str,
                hooked: bool | None = None) -> tuple:
    """`(x_qk, x)`: what a sublayer's queries/keys and its values read. Pre-norm (Xiong et al. 2020): `norm(resid)`;
    post-norm (Vaswani et al. 2017): `resid` itself. With `pos_qk` (Shortformer) the query/key input is that plus the
    positions, added after the norm as TransformerLens does; otherwise `x_qk is x` (one fused projection)."""
    x = norm(resid, hooked) if position == "pre" else resid
    return (x if pos_qk is None else x + pos_qk), x


def add_output(norm: Norm, resid: torch.Tensor, out: torch.Tensor, position: str, hook_out: HookPoint,
               hooked: bool | None = None) -> torch.Tensor:
    """The residual addition of a sublayer's output `out` (seen by `hook_out`): `resid + out` (pre-norm) or
    `norm(resid + out)` (post-norm, Vaswani et al. 2017, §3.1: LayerNorm(x + Sublayer(x)))."""
    out = hook_out(out)
    return resid + out if position == "pre" else norm(resid + out, hooked)


class TransformerBlock(nn.Module):
    """A residual block: attention, then (with MLPs) an MLP, each normalised before ("pre": resid + attn(ln1(resid)))
    or after ("post": ln1(resid + attn(resid))) its residual addition (`cfg.normalization_position`, `norm_inputs`,
    `add_output`); Elhage et al. (2021) read the pre-norm residual stream as the sum of what every layer writes to it.
    With `parallel_attn_mlp` (GPT-J) both read the block's input: resid + attn(ln1(resid)) + mlp(ln2(resid)), and
    there is no `hook_resid_mid`.

    Shortformer positions are added after the norm, to the query and key inputs: ln1(resid) + pos (TransformerLens);
    ln1 runs once. TransformerLens 2.x's opt-in hooks (`cfg.use_*`, switched by `model.set_use_*`): `hook_attn_in`
    (the block input, one copy per head) and `hook_q_input` / `hook_k_input` / `hook_v_input` (one per input, then
    normalised separately), `hook_mlp_in` (a copy of the MLP's input, before ln2)."""

    #: TransformerLens' marker (its bridge blocks carry it): the block's output `hook_resid_post` is the one residual
    #: stream the model unembeds, so its logit lens and Jacobian lens may read it.
    hook_out_is_single_residual_stream = True

    def __init__(self, cfg: HookedTransformerConfig, layer: int = 0):
        super().__init__()
        self.cfg = cfg
        self.ln1 = norm_of_kind(cfg)
        self.attn = Attention(cfg, layer)
        self.hook_resid_pre = HookPoint()  # [batch, pos, d_model]
        self.hook_attn_in = HookPoint()  # [batch, pos, head, d_model], with cfg.use_attn_in
        self.hook_q_input = HookPoint()  # [batch, pos, head, d_model], with cfg.use_split_qkv_input
        self.hook_k_input = HookPoint()  # [batch, pos, kv_head, d_model]
        self.hook_v_input = HookPoint()  # [batch, pos, kv_head, d_model]
        self.hook_attn_out = HookPoint()  # [batch, pos, d_model]
        self.hook_resid_post = HookPoint()  # [batch, pos, d_model]
        if not cfg.attn_only:
            self.ln2 = norm_of_kind(cfg)
            self.mlp = MLP(cfg)
            self.hook_mlp_in = HookPoint()  # [batch, pos, d_model], with cfg.use_hook_mlp_in
            if not cfg.parallel_attn_mlp:
                self.hook_resid_mid = HookPoint()  # [batch, pos, d_model]
            self.hook_mlp_out = HookPoint()  # [batch, pos, d_model]

    def forward(self, resid: torch.Tensor, side: BlockInputs) -> torch.Tensor:
        cfg = self.cfg
        position = cfg.normalization_position
        hooked = side.hooked
        ln1 = (lambda x: self.ln1(x, hooked)) if position == "pre" else _identity
        resid = self.hook_resid_pre(resid)
        if cfg.use_attn_in and not cfg.use_split_qkv_input:  # one per-head copy [batch, pos, head, d_model]
            x_q = x_k = x_v = ln1(self.hook_attn_in(_per_head(resid, cfg.n_heads)))
            if side.pos_qk is not None:
                x_q = x_k = x_q + side.pos_qk[:, :, None]
        else:
            x_q, x_k, x_v = attention_inputs(self, self.ln1, resid, resid, side.pos_qk, side.pos_qk, hooked)
        attn_out = self.attn(x_q, x_k, x_v, side.score_bias, side.rotation, side.cache, hooked)
        if cfg.parallel_attn_mlp:  # pre-norm only (the config refuses "post" with it)
            attn_out = self.hook_attn_out(attn_out)
            mlp_in = self.hook_mlp_in(resid.clone()) if cfg.use_hook_mlp_in else resid
            mlp_out = self.hook_mlp_out(self.mlp(self.ln2(mlp_in, hooked), hooked))
            return self.hook_resid_post(resid + attn_out + mlp_out)
        resid = add_output(self.ln1, resid, attn_out, position, self.hook_attn_out, hooked)
        if cfg.attn_only:
            return self.hook_resid_post(resid)
        resid = self.hook_resid_mid(resid)
        mlp_in = self.hook_mlp_in(resid.clone()) if cfg.use_hook_mlp_in else resid
        x, _ = norm_inputs(self.ln2, mlp_in, None, position, hooked)
        mlp_out = self.mlp(x, hooked)
        return self.hook_resid_post(add_output(self.ln2, resid, mlp_out, position, self.hook_mlp_out, hooked))


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


def attention_inputs(block: nn.Module, norm: Norm, resid: torch.Tensor, source: torch.Tensor,
                     pos_q: torch.Tensor | None, pos_k: torch.Tensor | None, hooked: bool | None = None,
                     source_norm=None, prefix: str = "") -> tuple:
    """`(x_q, x_k, x_v)`, what an attention layer's queries read (from `resid [batch, pos, d_model]`) and its keys
    and values (from `source [batch, key, d_model]`: `resid` itself for self-attention, an encoder's output for
    cross-attention), each normalised before the layer (pre-norm: `norm` for the queries, `source_norm`, default
    `norm`, for keys and values) and with the positions `pos_q` / `pos_k` added after the norm (Shortformer).

    With `cfg.use_split_qkv_input` (TransformerLens 2.x) each head gets its own copy of each input, hooked before the
    norm at `block.hook_{prefix}q_input` / `k_input` / `v_input` (`[batch, pos, head, d_model]`), so that one head's
    query, key or value input can be patched alone; otherwise (self-attention only) one input, `x_k is x_q`: one
    fused projection."""
    cfg = block.cfg
    pre = cfg.normalization_position == "pre"
    if not cfg.use_split_qkv_input:  # self-attention (`source is resid`): one input
        x_q, x = norm_inputs(norm, resid, pos_q, cfg.normalization_position, hooked)
        return x_q, x_q, x
    hkv = cfg.n_heads if cfg.ungroup_grouped_query_attention else cfg.n_key_value_heads
    src_norm = source_norm or norm

    def q_norm(x):
        return norm(x, hooked) if pre else x

    def kv_norm(x):
        return src_norm(x, hooked) if pre else x

    x_q = q_norm(getattr(block, f"hook_{prefix}q_input")(_per_head(resid, cfg.n_heads)))
    x_k = kv_norm(getattr(block, f"hook_{prefix}k_input")(_per_head(source, hkv)))
    x_v = kv_norm(getattr(block, f"hook_{prefix}v_input")(_per_head(source, hkv)))
    if pos_q is not None:
        x_q = x_q + pos_q[:, :, None]
    if pos_k is not None:
        x_k = x_k + pos_k[:, :, None]
    return x_q, x_k, x_v


def _per_head(x: torch.Tensor, n: int) -> torch.Tensor:
    """`x [batch, pos, d_model]` repeated to `[batch, pos, n, d_model]`, a copy (an in-place edit of one head's
    input must not reach the others, nor `x`)."""
    return x[:, :, None].expand(-1, -1, n, -1).clone()


class Unembed(nn.Module):
    def __init__(self, cfg: HookedTransformerConfig):
        super().__init__()
        self.W_U = nn.Parameter(torch.empty(cfg.d_model, cfg.d_vocab_out, dtype=cfg.torch_dtype))
        _param_or_buffer(self, "b_U", torch.zeros(cfg.d_vocab_out, dtype=cfg.torch_dtype), cfg.use_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [batch, pos, d_model] -> [batch, pos, d_vocab_out]
        return linear(x, self.W_U, self.b_U)

"""N attention-only decoders of one configuration as one set of stacked weights `[model, ...]`, for seed sweeps
(`models.training.sweep`): every dense product is one batched product (`torch.bmm`) over the model axis, attention one
`F.scaled_dot_product_attention` call over `model × batch`, and the loss `models.lm_cross_entropy` per member.

Member k computes what `HookedTransformer` computes with member k's weights (the tests hold the two to float32
rounding: a batched product may sum in another order than the single model's). Nothing mixes members: each product,
attention row and loss row reads one member's weights and tokens only, so a diverging member (NaN) leaves the others'
numbers unchanged, bit for bit.

Supported: the toy models of Elhage et al. (2021): attention-only, no normalisation, causal attention, one key/value
head per query head, learned positions (standard or Shortformer), default attention scale, optional biases, no
soft caps or split/per-head inputs. `check_stackable` names what a config has outside that.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..arch.config import HookedTransformerConfig
from ..arch.model import HookedTransformer, lm_cross_entropy
from ..errors import TrainConfigError

#: (field, the value a stackable config holds) for every field the stacked forward does not implement.
REQUIRED = (("attn_only", True), ("normalization_type", None), ("attention_dir", "causal"),
            ("attn_scores_soft_cap", None), ("output_logits_soft_cap", None), ("use_split_qkv_input", False),
            ("use_attn_in", False), ("scale_attn_by_inverse_layer_idx", False), ("attn_scale", None),
            ("use_attn_scale", True), ("ungroup_grouped_query_attention", False))
POSITIONS = ("standard", "shortformer")
DTYPES = (torch.float32, torch.float64)


def check_stackable(cfg) -> None:
    """Raise `TrainConfigError` naming every setting of model config `cfg` the stacked forward does not implement."""
    if type(cfg) is not HookedTransformerConfig:
        raise TrainConfigError(f"a seed sweep trains decoder-only HookedTransformer models, not {type(cfg).__name__}")
    bad = [f"{name}={getattr(cfg, name)!r} (needs {want!r})" for name, want in REQUIRED if getattr(cfg, name) != want]
    if cfg.positional_embedding_type not in POSITIONS:
        bad.append(f"positional_embedding_type={cfg.positional_embedding_type!r} (needs one of {POSITIONS})")
    if cfg.n_key_value_heads != cfg.n_heads:
        bad.append(f"n_key_value_heads={cfg.n_key_value_heads} (needs n_heads={cfg.n_heads})")
    if cfg.torch_dtype not in DTYPES:
        bad.append(f"dtype={cfg.torch_dtype} (needs float32 or float64)")
    if bad:
        raise TrainConfigError("a seed sweep stacks attention-only toy models (models.training.stacked); this config "
                               "has " + "; ".join(bad))


class StackedDecoder(nn.Module):
    """The weights of `models` (HookedTransformers of one stackable config) stacked along a new first axis, as
    parameters named like the single model's with "." written "__" (`name_of`). `forward(tokens [model, batch, pos])`
    gives logits `[model, batch, pos, d_vocab_out]`; `losses(tokens)` each member's mean next-token loss `[model]`."""

    def __init__(self, models: list[HookedTransformer]):
        super().__init__()
        if not models:
            raise TrainConfigError("a stacked model needs at least one member")
        cfg = models[0].cfg
        check_stackable(cfg)
        for m in models[1:]:
            if m.cfg.replace(seed=cfg.seed).to_dict() != cfg.to_dict():
                raise TrainConfigError("the members of a stacked model must share one config (seeds may differ)")
        self.cfg, self.n_models = cfg, len(models)
        self.names = [n for n, _ in models[0].named_parameters()]
        sds = [dict(m.named_parameters()) for m in models]
        for n in self.names:
            self.register_parameter(name_of(n), nn.Parameter(torch.stack([sd[n].detach() for sd in sds])))

    def stacked(self, name: str) -> nn.Parameter:
        """The stacked parameter of the single model's parameter `name` (e.g. "blocks.0.attn.W_Q")."""
        return getattr(self, name_of(name))

    def named_stacked(self):
        """`(single-model name, stacked parameter)` in the single model's parameter order."""
        return [(n, self.stacked(n)) for n in self.names]

    def member_state(self, k: int) -> dict[str, torch.Tensor]:
        """Member k's parameters `{single-model name: tensor}` (views into the stacked weights)."""
        return {n: p.detach()[k] for n, p in self.named_stacked()}

    def _bias(self, name: str) -> torch.Tensor | None:
        return self.stacked(name) if self.cfg.use_bias else None

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        resid = self.residual(tokens)
        W_U, b_U = self.stacked("unembed.W_U"), self._bias("unembed.b_U")
        logits = torch.bmm(resid, W_U) if b_U is None else torch.baddbmm(b_U[:, None], resid, W_U)
        return logits.view(*tokens.shape, -1)

    def residual(self, tokens: torch.Tensor) -> torch.Tensor:
        """The final residual stream `[model, batch·pos, d_model]` of `tokens [model, batch, pos]`."""
        cfg = self.cfg
        N, B, P = tokens.shape
        if N != self.n_models:
            raise ValueError(f"tokens [model, batch, pos] have {N} models, the stack {self.n_models}")
        V, D, H, dh = cfg.d_vocab, cfg.d_model, cfg.n_heads, cfg.d_head
        if P > cfg.n_ctx:
            raise ValueError(f"{P} positions exceed n_ctx={cfg.n_ctx}")
        W_E = self.stacked("embed.W_E")  # [model, vocab, d_model]
        offset = torch.arange(N, device=tokens.device).view(N, 1, 1) * V
        resid = F.embedding(tokens + offset, W_E.reshape(N * V, D)).view(N, B * P, D)
        pos = self.stacked("pos_embed.W_pos")[:, None, :P]  # [model, 1, pos, d_model]

        def plus_pos(x):  # [model, batch·pos, d_model] + each row's position
            return (x.view(N, B, P, D) + pos).view(N, B * P, D)

        shortformer = cfg.positional_embedding_type == "shortformer"
        if not shortformer:
            resid = plus_pos(resid)
        for i in range(cfg.n_layers):
            a = f"blocks.{i}.attn."
            x_qk = plus_pos(resid) if shortformer else resid
            W_Q, W_K, W_V, W_O = (self.stacked(a + w) for w in ("W_Q", "W_K", "W_V", "W_O"))
            q, k, v = (_project(x, W, self._bias(a + b)) for x, W, b in
                       ((x_qk, W_Q, "b_Q"), (x_qk, W_K, "b_K"), (resid, W_V, "b_V")))
            q, k, v = (t.view(N * B, P, H, dh).transpose(1, 2) for t in (q, k, v))  # [model·batch, head, pos, d_head]
            z = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            z = z.transpose(1, 2).reshape(N, B * P, H * dh)
            W_O = W_O.reshape(N, H * dh, D)
            b_O = self._bias(a + "b_O")
            resid = resid + (torch.bmm(z, W_O) if b_O is None else torch.baddbmm(b_O[:, None], z, W_O))
        return resid

    def losses(self, tokens: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
        """Each member's mean next-token cross-entropy on its own rows `tokens [model, batch, pos]`: `[model]`,
        float32 (as `models.lm_cross_entropy` per member).

        The unembedding and the loss run member by member: the logits of one member (batch·pos × d_vocab) are the
        largest tensor of the step, and N of them at once (67 MB for the attn-only-2l preset at N = 8) are fresh
        memory each step (page faults and zeroing) where one member's are reused."""
        resid = self.residual(tokens)
        N, B, P = tokens.shape
        W_U, b_U = self.stacked("unembed.W_U"), self._bias("unembed.b_U")
        # unbind, not resid[k]: its backward stacks the members' gradients once, where N selections would each
        # backpropagate a zero-filled gradient of the whole stack
        biases = [None] * N if b_U is None else b_U.unbind(0)
        losses = []
        for r, W, b, t in zip(resid.unbind(0), W_U.unbind(0), biases, tokens.unbind(0), strict=True):
            logits = (r @ W if b is None else torch.addmm(b, r, W)).view(B, P, -1)
            losses.append(lm_cross_entropy(logits, t, label_smoothing=label_smoothing))
        return torch.stack(losses)


def _project(x: torch.Tensor, W: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """`x [model, rows, d_model] @ W [model, head, d_model, d_head] (+ b [model, head, d_head])` as
    `[model, rows, head·d_head]`, one batched product."""
    N, H, D, dh = W.shape
    W = W.permute(0, 2, 1, 3).reshape(N, D, H * dh)
    return torch.bmm(x, W) if b is None else torch.baddbmm(b.reshape(N, 1, H * dh), x, W)


def name_of(single_name: str) -> str:
    """The stacked parameter's attribute name of a single-model parameter name ("." is not allowed in one)."""
    return single_name.replace(".", "__")


@torch.no_grad()
def clip_per_member(params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """`torch.nn.utils.clip_grad_norm_` for each member on its own: member k's gradients (row k of every stacked
    parameter's `.grad`) are scaled by min(1, max_norm / (‖g_k‖₂ + 1e-6)), torch's rule. Returns the norms `[model]`
    (NaN for a member whose gradient is not finite; the others are untouched by it)."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(0)
    N = grads[0].shape[0]
    sq = torch.stack([g.reshape(N, -1).float().pow(2).sum(1) for g in grads]).sum(0)
    norms = sq.sqrt()
    coef = (max_norm / (norms + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(coef.to(g.dtype).view(N, *([1] * (g.dim() - 1))))
    return norms

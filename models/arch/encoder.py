"""`HookedEncoder`: an encoder-only transformer (bidirectional self-attention) with a masked-language-model head, as
BERT (Devlin et al. 2019) and TransformerLens' `HookedEncoder`: `blocks.{l}.attn.hook_pattern`, ..., then
`mlm_head` (dense, activation, norm: `mlm_head.hook_pre/post`, `mlm_head.ln`) and the unembedding.

It is the decoder-only `HookedTransformer` with `attention_dir="bidirectional"` and the MLM head between the final
norm and the unembedding, so every weight property, hook, circuit and checkpoint routine of that model applies.
Inputs are unpadded windows (no attention mask); the loss is the cross-entropy at the masked positions only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError, InputError
from .components import _ACTIVATIONS, Norm, linear
from .config import HookedTransformerConfig
from .initialization import init_weights_gpt2_scaled
from .model import RETURN_TYPES, HookedTransformer
from .tl_compat import HookPoint


@dataclass
class EncoderConfig(HookedTransformerConfig):
    """`HookedTransformerConfig` of an encoder: bidirectional attention, and `mask_token_id`, the id that replaces
    masked tokens (default: the last id, `d_vocab - 1`)."""

    attention_dir: str = "bidirectional"
    mask_token_id: int | None = None
    init_mode: str = "gpt2_scaled"  # the encoder's initialisation before TransformerLens' modes were accepted

    model_type = "encoder"  # a class constant, written to config.json

    def __post_init__(self, initializer_range: float | None = None) -> None:
        super().__post_init__(initializer_range)
        if self.attention_dir != "bidirectional":
            raise ConfigError(f"an encoder's attention_dir must be 'bidirectional', got {self.attention_dir!r}")
        if self.mask_token_id is None:
            self.mask_token_id = self.d_vocab - 1
        if not isinstance(self.mask_token_id, int) or isinstance(self.mask_token_id, bool) or not (
                0 <= self.mask_token_id < self.d_vocab):
            raise ConfigError(f"mask_token_id must be an id in 0..{self.d_vocab - 1}, got {self.mask_token_id!r}")

    def to_dict(self) -> dict:
        return dict(super().to_dict(), model_type=self.model_type)  # `from_dict`, `from_json`: inherited


class MLMHead(nn.Module):
    """BERT's prediction-head transform: norm(act(x W + b)), then the unembedding (Devlin et al. 2019)."""

    def __init__(self, cfg: HookedTransformerConfig):
        super().__init__()
        self.W = nn.Parameter(torch.empty(cfg.d_model, cfg.d_model, dtype=cfg.torch_dtype))
        self.b = nn.Parameter(torch.zeros(cfg.d_model, dtype=cfg.torch_dtype))
        self.act = _ACTIVATIONS[cfg.act_fn]
        self.ln = Norm(cfg)
        self.hook_pre, self.hook_post = HookPoint(), HookPoint()  # [batch, pos, d_model]

    def forward(self, x: torch.Tensor, hooked: bool | None = None) -> torch.Tensor:
        return self.ln(self.hook_post(self.act(self.hook_pre(linear(x, self.W, self.b)))), hooked)


class HookedEncoder(HookedTransformer):
    """An encoder with a masked-language-model head (see the module docstring). `forward(tokens, return_type,
    labels)`: logits `[batch, pos, d_vocab]`; the loss needs `labels [batch, pos]`, the original ids at the masked
    positions and −100 elsewhere (`models.training.tasks.mask_tokens` makes both)."""

    def __init__(self, cfg: EncoderConfig | dict, tokenizer=None):
        if isinstance(cfg, dict):
            cfg = EncoderConfig.from_dict(cfg)
        if not isinstance(cfg, EncoderConfig):
            raise ConfigError(f"HookedEncoder needs an EncoderConfig, got {type(cfg).__name__}")
        super().__init__(cfg, tokenizer)
        self.mlm_head = MLMHead(cfg)
        init_weights_gpt2_scaled(self.mlm_head, cfg.init_range, cfg.n_layers,
                                 None if cfg.seed is None else cfg.seed + 1)
        self.to(cfg.device)
        self.setup()

    def head(self, resid: torch.Tensor, hooked: bool | None = None) -> torch.Tensor:
        return self.unembed(self.mlm_head(self.ln_final(resid, hooked), hooked))

    def forward(self, tokens, return_type: str | None = "logits", labels=None):
        if return_type not in RETURN_TYPES:
            raise ValueError(f"return_type={return_type!r} is not supported; allowed: {RETURN_TYPES}")
        logits = super().forward(tokens, "logits")
        if return_type in ("logits", None):
            return logits if return_type else None
        if labels is None:
            raise InputError("an MLM loss needs labels [batch, pos]: the original ids at masked positions, -100 "
                             "elsewhere")
        loss = mlm_cross_entropy(logits, torch.as_tensor(labels, device=logits.device))
        return loss if return_type == "loss" else (logits, loss)


def mlm_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
    """Masked-language-model loss (Devlin et al. 2019): mean −log softmax(logits[b, i])[labels[b, i]] over the
    positions whose label is not −100, in float32 or wider."""
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), label_smoothing=label_smoothing)

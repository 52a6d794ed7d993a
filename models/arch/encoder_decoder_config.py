"""`EncoderDecoderConfig`: the architecture of an encoder–decoder transformer (Vaswani et al. 2017), validated at
construction, JSON round trip.

The encoder and the decoder are each described by a `HookedTransformerConfig` (`encoder_cfg`, `decoder_cfg`), built
from the shared fields here: the encoder's is bidirectional over `n_ctx_src` positions of `d_vocab_src` ids, the
decoder's causal over `n_ctx_tgt` positions of `d_vocab_tgt` ids. Building both validates every shared field with
the decoder-only model's own checks, and the layers (`models.arch.components`) take them as they are. The positional
scheme (`models.arch.positions`) numbers source and target positions separately; cross-attention adds no positional
term of its own except that, with a scheme that adds positions to queries and keys only (shortformer), its queries
carry target positions and its keys source positions.

`model_type` is written to config.json so that `models.load` knows which model a folder holds.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from .config import (
    NORMALIZATION_POSITIONS,
    HookedTransformerConfig,
    checked_fields,
    config_json_dict,
    config_json_text,
    dtype_name,
)

#: Fields that both stacks share, copied into their `HookedTransformerConfig`s.
_SHARED = ("d_model", "n_heads", "d_head", "d_mlp", "act_fn", "normalization_type", "normalization_position", "eps",
           "positional_embedding_type", "rotary_dim", "rotary_base", "rotary_adjacent_pairs", "use_bias",
           "use_attn_result", "init_range", "seed", "dtype", "device")


@dataclass
class EncoderDecoderConfig:
    """Architecture of `models.HookedEncoderDecoder` (weight shapes as in TransformerLens).

    `d_mlp=None` gives attention-only blocks. `normalization_position="pre"` normalises each sublayer's input
    (Xiong et al. 2020) and the encoder's and decoder's outputs; `"post"` normalises after each residual addition
    (Vaswani et al. 2017) and has no final norms. `tie_embeddings` ties the target embedding to the unembedding
    (`W_U = W_E_tgtᵀ`, Press & Wolf 2017); `share_embeddings` uses one embedding for source and target (equal
    vocabularies only). `pad/bos/eos_token_id` are target ids (and source ids: the same specials start both
    vocabularies)."""

    d_model: int
    d_vocab_src: int
    d_vocab_tgt: int
    n_ctx_src: int
    n_ctx_tgt: int
    n_heads: int = 1
    d_head: int | None = None
    d_mlp: int | None = None
    n_encoder_layers: int = 1
    n_decoder_layers: int = 1
    act_fn: str = "gelu"
    normalization_type: str | None = "LN"
    normalization_position: str = "pre"
    eps: float = 1e-5
    positional_embedding_type: str = "standard"
    rotary_dim: int | None = None
    rotary_base: float = 10000.0
    rotary_adjacent_pairs: bool = False
    tie_embeddings: bool = False
    share_embeddings: bool = False
    use_bias: bool = True
    use_attn_result: bool = True
    init_range: float = 0.02
    pad_token_id: int = 0
    bos_token_id: int = 1
    eos_token_id: int = 2
    seed: int | None = None
    dtype: str = "float32"
    device: str = "cpu"
    model_name: str = "custom"
    extra: dict = field(default_factory=dict)

    model_type = "encoder_decoder"  # a class constant, written to config.json

    def __post_init__(self) -> None:
        for name in ("n_encoder_layers", "n_decoder_layers"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"{name} must be an int >= 1, got {v!r}")
        self._check_choice("normalization_position", NORMALIZATION_POSITIONS)
        enc, dec = self.encoder_cfg, self.decoder_cfg  # validates every shared field
        self.d_head, self.rotary_dim, self.device = dec.d_head, dec.rotary_dim, dec.device
        self.dtype = dtype_name(dec.dtype)
        for name in ("tie_embeddings", "share_embeddings"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.share_embeddings and self.d_vocab_src != self.d_vocab_tgt:
            raise ConfigError(f"share_embeddings needs equal vocabularies, got d_vocab_src={self.d_vocab_src} and "
                              f"d_vocab_tgt={self.d_vocab_tgt}; set share_embeddings=false")
        for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < min(enc.d_vocab, dec.d_vocab):
                raise ConfigError(f"{name} must be an id in 0..{min(enc.d_vocab, dec.d_vocab) - 1} (both "
                                  f"vocabularies), got {v!r}")
        if not isinstance(self.extra, dict):
            raise ConfigError(f"extra must be a dict, got {type(self.extra).__name__}")

    def _check_choice(self, name: str, allowed: tuple) -> None:
        if getattr(self, name) not in allowed:
            raise ConfigError(f"{name}={getattr(self, name)!r} is not supported; allowed: "
                              f"{', '.join(map(repr, allowed))}")

    # --- the two stacks -------------------------------------------------------------------------------------
    def _stack(self, n_layers: int, n_ctx: int, d_vocab: int, attention_dir: str) -> HookedTransformerConfig:
        shared = {k: getattr(self, k) for k in _SHARED}
        return HookedTransformerConfig(n_layers=n_layers, n_ctx=n_ctx, d_vocab=d_vocab, attention_dir=attention_dir,
                                       model_name=self.model_name, **shared)

    @property
    def encoder_cfg(self) -> HookedTransformerConfig:
        """The encoder stack: bidirectional, `n_ctx_src` positions, `d_vocab_src` ids."""
        return self._stack(self.n_encoder_layers, self.n_ctx_src, self.d_vocab_src, "bidirectional")

    @property
    def decoder_cfg(self) -> HookedTransformerConfig:
        """The decoder stack: causal, `n_ctx_tgt` positions, `d_vocab_tgt` ids."""
        return self._stack(self.n_decoder_layers, self.n_ctx_tgt, self.d_vocab_tgt, "causal")

    @property
    def attn_only(self) -> bool:
        return self.d_mlp is None

    @property
    def torch_dtype(self):
        return self.decoder_cfg.torch_dtype

    @property
    def positions(self):
        """The decoder's positional scheme object (the encoder's is `encoder_cfg.positions`)."""
        return self.decoder_cfg.positions

    def weights_lower_bound(self) -> int:
        """A lower bound on the number of weights (embeddings, unembedding, attention and MLP matrices), checked
        against a checkpoint before anything is allocated."""
        attn = 2 * self.n_heads * self.d_head * self.d_model
        mlp = 2 * self.d_model * self.d_mlp if self.d_mlp else 0
        return (self.d_model * self.d_vocab_tgt + self.n_encoder_layers * (attn + mlp)
                + self.n_decoder_layers * (2 * attn + mlp))

    def layer_stacks(self) -> dict[str, int]:
        """`{prefix: layers}` of the numbered stacks a model of this config holds (`encoder.…`, `decoder.…`)."""
        return {"encoder": self.n_encoder_layers, "decoder": self.n_decoder_layers}

    # --- (de)serialisation ------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return dict(dataclasses.asdict(self), model_type=self.model_type)

    @classmethod
    def from_dict(cls, d: dict) -> EncoderDecoderConfig:
        return cls(**checked_fields(cls, d, cls.model_type))

    def to_json(self) -> str:
        """The architecture as JSON: every field but `device` (a run-time choice, as `HookedTransformerConfig`'s)."""
        return config_json_text(self)

    @classmethod
    def from_json(cls, text: str) -> EncoderDecoderConfig:
        return cls.from_dict(config_json_dict(text))

    def replace(self, **changes: Any) -> EncoderDecoderConfig:
        return dataclasses.replace(self, **changes)

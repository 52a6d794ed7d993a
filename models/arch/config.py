"""`HookedTransformerConfig`: every architectural choice of a toy transformer, validated at construction.

Field names follow TransformerLens' former `HookedTransformerConfig` where the concept exists, so configs
and notebooks written for it carry over. A config round-trips through JSON (`to_json` / `from_json`).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import InitVar, dataclass, field
from typing import Any

import torch

from ..errors import ConfigError
from ..files.safe_read import loads_strict
from .initialization import INIT_MODES, default_init_range, seed_everywhere
from .positions import SCHEMES, PositionalScheme, scheme
from .score_bias import MASKS

#: TransformerLens 2.18's activations (models.arch.components._ACTIVATIONS); "solu_ln" is SoLU followed by a LayerNorm.
ACT_FNS = ("gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "relu", "silu", "solu", "solu_ln")
NORMALIZATION_TYPES = (None, "LN", "RMS", "LNPre", "RMSPre")  # *Pre: no weight or bias (folded away)
NORMALIZATION_POSITIONS = ("pre", "post")  # Xiong et al. 2020 / Vaswani et al. 2017
DTYPES = ("float32", "float64", "float16", "bfloat16")
RUNTIME_FIELDS = ("device",)  # chosen when a model is built or loaded; never written to config.json
BOOL_FIELDS = ("attn_only", "rotary_adjacent_pairs", "use_bias", "default_prepend_bos", "gated_mlp",
               "parallel_attn_mlp", "final_rms", "use_attn_scale", "scale_attn_by_inverse_layer_idx", "alibi_symmetric",
               "ungroup_grouped_query_attention", "use_attn_result", "use_split_qkv_input", "use_attn_in",
               "use_hook_mlp_in", "use_hook_tokens", "load_in_4bit", "init_weights")


def config_json_dict(text: str):
    """A config.json's text as every config class reads it: unreadable JSON and duplicated keys are a `ConfigError`
    (naming the key: which value was meant is unknowable), a stored run-time field (`device`, older folders) is
    dropped, so the config builds on the CPU until the caller moves it."""
    try:
        d = loads_strict(text, ConfigError)  # duplicated keys, NaN / ±Infinity, overflowing numbers, deep nesting
    except ConfigError as e:
        raise ConfigError(f"config is {e}") from None
    return {k: v for k, v in d.items() if k not in RUNTIME_FIELDS} if isinstance(d, dict) else d


def checked_fields(cls, d: dict, model_type: str) -> dict:
    """The fields of `d` for dataclass `cls`, refusing a non-object, unknown fields, missing required ones and a
    `model_type` other than `model_type` (each a `ConfigError` naming the fields)."""
    if not isinstance(d, dict):
        raise ConfigError(f"a config must be a JSON object, got {type(d).__name__}")
    d = dict(d)
    if d.pop("model_type", model_type) != model_type:
        raise ConfigError(f"model_type must be {model_type!r} for {cls.__name__}")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - names)
    if unknown:
        raise ConfigError(f"unknown config field(s) {unknown}; allowed fields: {sorted(names)}")
    missing = [f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING and f.name not in d]
    if missing:
        raise ConfigError(f"config is missing required field(s) {missing}")
    return d


def config_json_text(config) -> str:
    """A config's architecture as JSON (`config.to_dict()` less the run-time fields), keys sorted."""
    return json.dumps({k: v for k, v in config.to_dict().items() if k not in RUNTIME_FIELDS}, indent=2,
                      sort_keys=True)


def dtype_name(dtype: Any) -> str:
    """A supported dtype (a `torch.dtype` or its name) as its name; `ConfigError` otherwise."""
    name = str(dtype).replace("torch.", "")
    if name not in DTYPES:
        raise ConfigError(f"dtype={dtype!r} is not supported; allowed: {', '.join(DTYPES)}")
    return name


@dataclass
class HookedTransformerConfig:
    """Architecture of a hookable transformer (see the field comments; weight shapes as in TransformerLens).

    `d_mlp=None` (or `attn_only=True`) gives an attention-only model. `d_head` defaults to
    `d_model // n_heads`. `dtype` may be given as a string or a `torch.dtype`; it is held as a `torch.dtype` (as
    TransformerLens) and written to JSON as its name.
    """

    model_type = "decoder"  # a class constant (`models.model_kind`); config.json of a decoder omits it

    n_layers: int
    d_model: int
    n_ctx: int
    d_vocab: int
    n_heads: int = 1
    d_head: int | None = None
    d_mlp: int | None = None
    attn_only: bool = False
    act_fn: str = "gelu"
    normalization_type: str | None = "LN"
    normalization_position: str = "pre"  # "pre": norm each sublayer's input; "post": after each residual addition
    eps: float = 1e-5
    positional_embedding_type: str = "standard"
    rotary_dim: int | None = None  # features rotated per head; default d_head
    rotary_base: float = 10000.0
    rotary_adjacent_pairs: bool = False  # False: pair i with i + d/2 (GPT-NeoX); True: (2i, 2i+1) (Llama)
    attention_dir: str = "causal"
    n_key_value_heads: int | None = None  # grouped-query attention; None = n_heads
    use_bias: bool = True  # biases on Q/K/V/O, MLP and unembed; False keeps them as zero buffers
    d_vocab_out: int | None = None  # unembedding width; None = d_vocab
    gated_mlp: bool = False  # MLP out = (act(x W_gate) * (x W_in) + b_in) W_out + b_out (Shazeer 2020)
    parallel_attn_mlp: bool = False  # resid_post = resid_pre + attn(ln1(resid_pre)) + mlp(ln2(resid_pre)) (GPT-J)
    final_rms: bool = False  # ln_final is RMSNorm even when the blocks use LN
    # attention scores: q·k / (attn_scale or √d_head if use_attn_scale else 1) / (layer + 1 if scale_attn_by_inverse_
    # layer_idx), then cap·tanh(s / cap) with attn_scores_soft_cap; logits likewise with output_logits_soft_cap
    use_attn_scale: bool = True
    attn_scale: float | None = None
    scale_attn_by_inverse_layer_idx: bool = False
    attn_scores_soft_cap: float | None = None
    output_logits_soft_cap: float | None = None
    alibi_symmetric: bool = True  # bidirectional ALiBi: −slope·|i−j|; False: future keys unbiased (TransformerLens)
    ungroup_grouped_query_attention: bool = False  # hook_k / hook_v (and hook_k_input, ...) with n_heads heads
    # opt-in hooks, as TransformerLens 2.x (`model.set_use_*`): per-head `attn.hook_result`; per-head query/key/value
    # inputs `hook_q_input` / `hook_k_input` / `hook_v_input`; `hook_attn_in`; `hook_mlp_in`; `hook_tokens`
    use_attn_result: bool = False
    use_split_qkv_input: bool = False
    use_attn_in: bool = False
    use_hook_mlp_in: bool = False
    use_hook_tokens: bool = False
    load_in_4bit: bool = False  # TransformerLens' field; only False (4-bit weights need bitsandbytes and CUDA)
    original_architecture: str | None = None  # metadata (TransformerLens' field)
    tokenizer_name: str | None = None  # metadata: stored, never fetched
    # a fresh model's weights (models.arch.initialization): TransformerLens 2.18's init_mode ("gpt2", "xavier_uniform",
    # "xavier_normal", "kaiming_uniform", "kaiming_normal", "muP"; bitwise its weights for the same seed) or
    # "gpt2_scaled" (this toolkit's own, the zoo presets'); init_range is 2.18's initializer_range (None: its default,
    # 0.8/√d_model for "gpt2", 1.0 for the others; 0.02 for "gpt2_scaled"); init_weights=False: weight matrices 0
    init_range: float | None = None
    initializer_range: InitVar[float | None] = None  # TransformerLens 2.18's name of init_range (read it too)
    init_mode: str = "gpt2"
    init_weights: bool = True
    seed: int | None = None
    dtype: torch.dtype | str = "float32"
    device: str = "cpu"
    model_name: str = "custom"
    default_prepend_bos: bool = True
    extra: dict = field(default_factory=dict)  # free-form metadata (training provenance, notes)

    # TransformerLens 2.x's checkpoint labels (not fields: never saved): `models.load` sets `checkpoint_value` (the
    # step) and `checkpoint_label_type` ("step") for a training checkpoint folder `checkpoints/step-N`; None otherwise.
    checkpoint_index = None
    checkpoint_value = None
    checkpoint_label_type = None

    def __post_init__(self, initializer_range: float | None = None) -> None:
        for name in ("n_layers", "d_model", "n_ctx", "d_vocab", "n_heads"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool):
                raise ConfigError(f"{name} must be an int, got {v!r}")
        if self.n_layers < 0:
            raise ConfigError(f"n_layers must be >= 0, got {self.n_layers}")
        for name in ("d_model", "n_ctx", "d_vocab", "n_heads"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.d_head is None:
            if self.d_model % self.n_heads:
                raise ConfigError(
                    f"d_head is unset and d_model={self.d_model} is not divisible by n_heads={self.n_heads}; "
                    "set d_head explicitly"
                )
            self.d_head = self.d_model // self.n_heads
        if not isinstance(self.d_head, int) or isinstance(self.d_head, bool) or self.d_head < 1:
            raise ConfigError(f"d_head must be a positive int, got {self.d_head!r}")
        if self.attn_only:
            self.d_mlp = None
        elif self.d_mlp is None:
            self.attn_only = True
        elif not isinstance(self.d_mlp, int) or isinstance(self.d_mlp, bool) or self.d_mlp < 1:
            raise ConfigError(f"d_mlp must be a positive int or None (attention-only), got {self.d_mlp!r}")
        for name in ("d_vocab_out", "attn_scale", "attn_scores_soft_cap", "output_logits_soft_cap"):
            if getattr(self, name) == -1 and not isinstance(getattr(self, name), bool):  # TransformerLens' "unset"
                setattr(self, name, None)
        if self.d_vocab_out is None:
            self.d_vocab_out = self.d_vocab
        if not isinstance(self.d_vocab_out, int) or isinstance(self.d_vocab_out, bool) or self.d_vocab_out < 1:
            raise ConfigError(f"d_vocab_out must be a positive int or None (= d_vocab), got {self.d_vocab_out!r}")
        self._check_choice("act_fn", ACT_FNS)
        self._check_choice("normalization_type", NORMALIZATION_TYPES)
        self._check_choice("normalization_position", NORMALIZATION_POSITIONS)
        self._check_choice("positional_embedding_type", tuple(SCHEMES))  # models.arch.positions
        self._check_choice("attention_dir", tuple(MASKS))  # models.arch.score_bias
        if self.n_key_value_heads is None:
            self.n_key_value_heads = self.n_heads
        if not isinstance(self.n_key_value_heads, int) or isinstance(self.n_key_value_heads, bool) or (
            self.n_key_value_heads < 1) or (
            self.n_heads % self.n_key_value_heads
        ):
            raise ConfigError(
                f"n_key_value_heads={self.n_key_value_heads!r} must be a positive divisor of "
                f"n_heads={self.n_heads}"
            )
        if self.use_attn_in and self.n_key_value_heads != self.n_heads:
            raise ConfigError("use_attn_in needs n_key_value_heads == n_heads (its input has one copy per query "
                              "head); use use_split_qkv_input with grouped-query attention")
        if self.parallel_attn_mlp and self.attn_only:
            raise ConfigError("parallel_attn_mlp needs an MLP: set d_mlp (and attn_only=False) or drop it")
        if self.rotary_dim is None:
            self.rotary_dim = self.d_head
        if not isinstance(self.rotary_dim, int) or isinstance(self.rotary_dim, bool):
            raise ConfigError(f"rotary_dim must be an int or None, got {self.rotary_dim!r}")
        self.positions.check()
        self._check_choice("init_mode", INIT_MODES)
        if self.init_range is None and not (isinstance(initializer_range, (int, float)) and not isinstance(
                initializer_range, bool) and initializer_range < 0):  # TransformerLens' "unset" is -1.0
            self.init_range = initializer_range  # read only when init_range is not given (`replace` passes both)
        if self.init_range is None:
            self.init_range = default_init_range(self.init_mode, self.d_model)
        for name in ("rotary_base", "init_range", "eps"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0:  # `not >` also rejects NaN
                raise ConfigError(f"{name} must be a number > 0, got {v!r}")
        for name in ("attn_scale", "attn_scores_soft_cap", "output_logits_soft_cap"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0):
                raise ConfigError(f"{name} must be a number > 0, or None or -1 (off), got {v!r}")
        for name in ("original_architecture", "tokenizer_name"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), str):
                raise ConfigError(f"{name} must be a string or None, got {getattr(self, name)!r}")
        for name in BOOL_FIELDS:
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.load_in_4bit:
            raise ConfigError("load_in_4bit=True (bitsandbytes 4-bit weights, CUDA only) is not supported; allowed: "
                              "False")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            raise ConfigError(f"seed must be an int or None, got {self.seed!r}")
        if not isinstance(self.extra, dict):
            raise ConfigError(f"extra must be a dict, got {type(self.extra).__name__}")
        if isinstance(self.device, bool) or not isinstance(self.device, (str, torch.device)):
            raise ConfigError(f"device must be a device name such as 'cpu', 'cuda', 'cuda:1' or 'mps', got "
                              f"{self.device!r}")
        try:
            self.device = str(torch.device(self.device))
        except (RuntimeError, ValueError):
            raise ConfigError(f"device {self.device!r} is not a device name; use e.g. 'cpu', 'cuda', 'cuda:1' or "
                              "'mps'") from None

    def _check_choice(self, name: str, allowed: tuple) -> None:
        if getattr(self, name) not in allowed:
            raise ConfigError(
                f"{name}={getattr(self, name)!r} is not supported; allowed: {', '.join(map(repr, allowed))}"
            )

    # --- derived -----------------------------------------------------------------------------------
    def __setattr__(self, name: str, value) -> None:
        if name == "dtype":  # a torch.dtype at run time, as TransformerLens (its helpers pass cfg.dtype to torch)
            value = getattr(torch, dtype_name(value))
        super().__setattr__(name, value)

    @property
    def n_params(self) -> int:
        """TransformerLens' count: W_Q, W_K, W_V, W_O (`4·d_model·d_head·n_heads` a layer, grouped-query heads counted
        as full) plus W_in, W_out (and W_gate when gated); no embeddings, biases or norms."""
        per_layer = 4 * self.d_model * self.d_head * self.n_heads
        if not self.attn_only:
            per_layer += self.d_model * self.d_mlp * (2 + bool(getattr(self, "gated_mlp", False)))
        return self.n_layers * per_layer

    @property
    def torch_dtype(self) -> torch.dtype:
        return self.dtype

    @property
    def positions(self) -> PositionalScheme:
        """The positional scheme object of `positional_embedding_type` (`models.arch.positions`)."""
        return scheme(self)

    def set_seed_everywhere(self, seed: int) -> None:
        """Seed torch's, Python's and numpy's global generators (TransformerLens 2.18's method; its config calls it
        when built with a seed, ours never: building a model with a TransformerLens `init_mode` and a seed does)."""
        seed_everywhere(seed)

    def is_layer_norm_activation(self) -> bool:
        """True when the MLP activation carries its own LayerNorm (`act_fn="solu_ln"`), as TransformerLens."""
        return self.act_fn == "solu_ln"

    @classmethod
    def unwrap(cls, config: HookedTransformerConfig | dict) -> HookedTransformerConfig:
        """A config as it is, or built from a dict (TransformerLens' `HookedTransformerConfig.unwrap`)."""
        return cls.from_dict(config) if isinstance(config, dict) else config

    # --- (de)serialisation -------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return dataclasses.asdict(self) | {"dtype": dtype_name(self.dtype)}  # JSON: the dtype's name

    @classmethod
    def from_dict(cls, d: dict) -> HookedTransformerConfig:
        return cls(**checked_fields(cls, d, cls.model_type))

    def to_json(self) -> str:
        """The architecture as JSON: every field but `device`, which is a run-time choice (a model trained on a GPU
        must load on a CPU), chosen when loading."""
        return config_json_text(self)

    @classmethod
    def from_json(cls, text: str) -> HookedTransformerConfig:
        """Parse `to_json`'s output (`config_json_dict`: a duplicated key is refused, a stored `device` ignored)."""
        return cls.from_dict(config_json_dict(text))

    def replace(self, **changes: Any) -> HookedTransformerConfig:
        """A copy with `changes`; an `init_range` at its default follows a changed `init_mode` or `d_model`."""
        if "initializer_range" in changes:
            changes.setdefault("init_range", changes.pop("initializer_range"))
        if ({"init_mode", "d_model"} & set(changes) and "init_range" not in changes
                and self.init_range == default_init_range(self.init_mode, self.d_model)):
            changes["init_range"] = None
        return dataclasses.replace(self, **changes, initializer_range=None)


# TransformerLens 2.18's name of `init_range`, read and written (a constructor argument through the InitVar above)
HookedTransformerConfig.initializer_range = property(
    lambda self: self.init_range, lambda self, value: setattr(self, "init_range", value),
    doc="TransformerLens 2.18's name of `init_range`.")

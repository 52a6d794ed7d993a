"""Positional schemes: how a model knows where each token is, one object per `positional_embedding_type`.

A scheme declares what it does, and the model and the circuits ask it instead of comparing its name:

- `table`: None, "learned" (a parameter `W_pos [n_ctx, d_model]`, trained and saved) or "fixed" (a buffer from
  `fixed_table`, not saved; rows past n_ctx are computed on demand);
- `adds_to`: where the table's rows go: "residual" (the residual stream: `hook_pos_embed` is a component of it and
  a source of path terms) or "query_key" (only the query and key inputs of every layer, as Shortformer does, so
  the residual stream and the OV circuits carry no position);
- `rotates_qk`: queries and keys are rotated by position (`rotation`, RoPE);
- `biases_scores`: a bias is added to the attention scores (`score_bias`, ALiBi);
- `transformer_lens_type`: the TransformerLens 4.x native positional type that computes the same function (the
  table given as its learned `W_pos`), or None when there is none (`models.to_transformer_lens` refuses then).

Adding a scheme is one subclass here (its `name` registers it in `SCHEMES`, which the config validates against),
plus a config field in `models/arch/config.py` if it needs a setting. The formulas live in the functions at the top.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..errors import ConfigError
from .score_bias import ScoreBias


# --- formulas ------------------------------------------------------------------------------------------
def sinusoidal_table(n_ctx: int, d_model: int, dtype=torch.float32, device=None) -> torch.Tensor:
    """Vaswani et al. (2017), §3.5: P[p, 2i] = sin(p / 10000^(2i/d)), P[p, 2i+1] = cos(p / 10000^(2i/d)).

    Returns `[n_ctx, d_model]`, computed in float64 then cast.
    """
    pos = torch.arange(n_ctx, dtype=torch.float64, device=device)[:, None]
    inv = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64, device=device) / d_model)
    table = torch.zeros(n_ctx, d_model, dtype=torch.float64, device=device)
    table[:, 0::2] = torch.sin(pos * inv)
    table[:, 1::2] = torch.cos(pos * inv)
    return table.to(dtype)


def rotary_angles(n_pos: int, rotary_dim: int, base: float, dtype=torch.float32, device=None):
    """RoFormer (Su et al. 2021), §3.4.2: θ_i = base^(-2i/d), angle[m, i] = m·θ_i.

    Returns `(cos, sin)`, each `[n_pos, rotary_dim // 2]`, computed in float64 then cast.
    """
    inv_freq = base ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64, device=device) / rotary_dim)
    ang = torch.arange(n_pos, dtype=torch.float64, device=device)[:, None] * inv_freq
    return ang.cos().to(dtype), ang.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, adjacent_pairs: bool) -> torch.Tensor:
    """Rotate the first `rotary_dim` features of `x [batch, pos, head, d_head]` by position (Su et al. 2021).

    Pair (x_a, x_b) becomes (x_a cos − x_b sin, x_b cos + x_a sin). With `adjacent_pairs=False` the pair of
    feature i is i + rotary_dim/2 (GPT-NeoX's layout); with `True` it is (2i, 2i+1) (RoFormer's matrix, Llama).
    `cos`, `sin`: `[pos, rotary_dim // 2]`.
    """
    rd = 2 * cos.shape[-1]
    rot, rest = x[..., :rd], x[..., rd:]
    c, s = cos[:, None, :], sin[:, None, :]  # [pos, 1, rd/2], broadcast over heads
    if adjacent_pairs:
        a, b = rot[..., 0::2], rot[..., 1::2]
        out = torch.stack((a * c - b * s, b * c + a * s), dim=-1).flatten(-2)
    else:
        a, b = rot[..., : rd // 2], rot[..., rd // 2 :]
        out = torch.cat((a * c - b * s, b * c + a * s), dim=-1)
    return torch.cat((out, rest), dim=-1) if rest.shape[-1] else out


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """Press et al. (2021), §3: slope of head i (1-based) is 2^(-8i/n). Returns `[n_heads]` float64."""
    return torch.tensor([2.0 ** (-8.0 * i / n_heads) for i in range(1, n_heads + 1)], dtype=torch.float64)


def alibi_bias(n_heads: int, q_len: int, k_len: int, dtype=torch.float32, device=None,
               symmetric: bool = True) -> torch.Tensor:
    """ALiBi bias added to attention scores: −slope_h · |i − j|, shape `[n_heads, q_len, k_len]`; with
    `symmetric=False`, −slope_h · max(i − j, 0) (keys after the query unbiased, as TransformerLens 2.x).

    For causal attention only j ≤ i survives the mask, so both are the paper's m·[−(i−1), …, −1, 0].
    Query positions are the last `q_len` of `k_len` (generation with a prefix).
    """
    i = torch.arange(k_len - q_len, k_len, dtype=torch.float64, device=device)[:, None]
    j = torch.arange(k_len, dtype=torch.float64, device=device)[None, :]
    slopes = alibi_slopes(n_heads).to(device)
    distance = (i - j).abs() if symmetric else (i - j).clamp(min=0)
    return (-slopes[:, None, None] * distance).to(dtype)


# --- the pieces a scheme hands to the model ---------------------------------------------------------------
@dataclass
class Rotation:
    """Rotary position embedding of queries and keys: `rotation(x)` rotates `x [batch, pos, head, d_head]` by the
    angles of its positions, the last `pos` rows of `cos`/`sin` `[n_pos, rotary_dim // 2]` (queries are the
    last positions of the keys, as in `models.arch.score_bias`)."""

    cos: torch.Tensor
    sin: torch.Tensor
    adjacent_pairs: bool

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        return apply_rotary(x, self.cos[-n:], self.sin[-n:], self.adjacent_pairs)


class ALiBiBias(ScoreBias):
    """ALiBi's −slope_h·|i − j| on every head's scores (`alibi_bias`); computed once per size (one per forward)."""

    def __init__(self, n_heads: int, symmetric: bool = True):
        self.n_heads, self.symmetric = n_heads, symmetric
        self._memo: dict = {}

    def additive(self, n_q, n_k, dtype, device=None):
        key = (n_q, n_k, dtype, str(device))
        if key not in self._memo:
            self._memo[key] = alibi_bias(self.n_heads, n_q, n_k, dtype, device, self.symmetric)  # [head, q, k]
        return self._memo[key]


# --- the schemes ---------------------------------------------------------------------------------------
#: `positional_embedding_type` → scheme class (filled by each subclass's `name`).
SCHEMES: dict[str, type[PositionalScheme]] = {}


class PositionalScheme:
    """Base class: no positions at all (`"none"`); subclasses override the declarations and pieces they use."""

    name: ClassVar[str] = ""
    table: ClassVar[str | None] = None  # None, "learned" or "fixed"
    adds_to: ClassVar[str | None] = None  # with a table: "residual" or "query_key"
    rotates_qk: ClassVar[bool] = False
    biases_scores: ClassVar[bool] = False
    transformer_lens_type: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if (cls.table is None) != (cls.adds_to is None) or cls.adds_to not in (None, "residual", "query_key"):
            raise TypeError(f"{cls.__name__}: a table needs adds_to 'residual' or 'query_key'; no table, no adds_to")
        if cls.name:
            SCHEMES[cls.name] = cls

    def __init__(self, cfg):
        self.cfg = cfg

    def check(self) -> None:
        """Raise `ConfigError` for settings of `cfg` this scheme cannot use (called by the config)."""

    @property
    def max_context(self) -> int | None:
        """The longest context the model accepts: n_ctx for a learned table (later rows do not exist), else None."""
        return self.cfg.n_ctx if self.table == "learned" else None

    def fixed_table(self, n_pos: int, dtype=torch.float32, device=None) -> torch.Tensor:
        """The rows of a fixed table, `[n_pos, d_model]`."""
        raise NotImplementedError(f"{self.name!r} has no fixed table")

    def rows(self, W_pos: torch.Tensor, n_pos: int) -> torch.Tensor:
        """The table's first `n_pos` rows, `[n_pos, d_model]` (a fixed table is extended past n_ctx)."""
        if n_pos <= W_pos.shape[0]:
            return W_pos[:n_pos]
        if self.table == "fixed":
            return self.fixed_table(n_pos, W_pos.dtype, W_pos.device)
        raise ValueError(f"{n_pos} positions but W_pos has only {W_pos.shape[0]} rows")

    def rotation(self, n_pos: int, dtype: torch.dtype, device=None) -> Rotation | None:
        """The rotation of queries and keys for `n_pos` positions, or None."""
        return None

    def score_bias(self) -> ScoreBias | None:
        """The bias this scheme adds to the attention scores, or None."""
        return None


class Standard(PositionalScheme):
    """A learned table added to the residual stream (GPT-2, Radford et al. 2019; TransformerLens' "standard")."""

    name = "standard"
    table, adds_to = "learned", "residual"
    transformer_lens_type = "standard"


class Sinusoidal(Standard):
    """Vaswani et al. (2017)'s fixed sinusoids added to the residual stream (`sinusoidal_table`)."""

    name = "sinusoidal"
    table = "fixed"

    def check(self) -> None:
        if self.cfg.d_model % 2:
            raise ConfigError(f"sinusoidal positions need an even d_model, got {self.cfg.d_model}")

    def fixed_table(self, n_pos, dtype=torch.float32, device=None):
        return sinusoidal_table(n_pos, self.cfg.d_model, dtype, device)


class Shortformer(PositionalScheme):
    """A learned table added to the query and key inputs only (Press et al. 2021, "Shortformer"), as in the toy
    models of Elhage et al. (2021): positions shape the attention patterns but never enter the residual stream."""

    name = "shortformer"
    table, adds_to = "learned", "query_key"


class Rotary(PositionalScheme):
    """Rotary embeddings (RoPE, Su et al. 2021) of the first `rotary_dim` features of each query and key head, base
    `rotary_base`, pairs `(i, i + rotary_dim/2)` or adjacent `(2i, 2i+1)` (`rotary_adjacent_pairs`)."""

    name = "rotary"
    rotates_qk = True
    transformer_lens_type = "rotary"

    def check(self) -> None:
        cfg = self.cfg
        if cfg.rotary_dim < 2 or cfg.rotary_dim % 2 or cfg.rotary_dim > cfg.d_head:
            raise ConfigError(f"rotary_dim={cfg.rotary_dim} must be even and in [2, d_head={cfg.d_head}]")

    def rotation(self, n_pos, dtype, device=None) -> Rotation:
        cfg = self.cfg
        cos, sin = rotary_angles(n_pos, cfg.rotary_dim, cfg.rotary_base, dtype, device)
        return Rotation(cos, sin, bool(getattr(cfg, "rotary_adjacent_pairs", False)))


class ALiBi(PositionalScheme):
    """Attention with linear biases (Press et al. 2021): no table, −slope_h·|i − j| added to every head's scores
    (keys after the query unbiased with `alibi_symmetric=False`, as TransformerLens 2.x; bidirectional only)."""

    name = "alibi"
    biases_scores = True

    def score_bias(self) -> ALiBiBias:
        return ALiBiBias(self.cfg.n_heads, bool(getattr(self.cfg, "alibi_symmetric", True)))


class NoPositions(PositionalScheme):
    """No positional information: attention can only count (a causal mask still breaks the symmetry)."""

    name = "none"
    transformer_lens_type = "standard"  # with a zero table


def scheme(cfg) -> PositionalScheme:
    """The positional scheme of a config (ours, or a TransformerLens config with `positional_embedding_type`)."""
    name = getattr(cfg, "positional_embedding_type", "standard")
    if name not in SCHEMES:
        raise ConfigError(f"positional_embedding_type={name!r} is not supported; allowed: "
                          f"{', '.join(map(repr, SCHEMES))}")
    return SCHEMES[name](cfg)

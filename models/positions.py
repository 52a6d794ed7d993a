"""Fixed positional schemes: sinusoidal table, rotary embeddings (RoPE) and ALiBi biases.

Each formula lives here once; the model and the reference tests call these functions.
"""

from __future__ import annotations

import torch


def sinusoidal_table(n_ctx: int, d_model: int, dtype=torch.float32, device=None) -> torch.Tensor:
    """Vaswani et al. (2017): P[p, 2i] = sin(p / 10000^(2i/d)), P[p, 2i+1] = cos(p / 10000^(2i/d)).

    Returns `[n_ctx, d_model]` (seeds 000 and 004).
    """
    pos = torch.arange(n_ctx, dtype=torch.float64, device=device)[:, None]
    inv = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64, device=device) / d_model)
    table = torch.zeros(n_ctx, d_model, dtype=torch.float64, device=device)
    table[:, 0::2] = torch.sin(pos * inv)
    table[:, 1::2] = torch.cos(pos * inv)
    return table.to(dtype)


def rotary_angles(n_pos: int, rotary_dim: int, base: float, dtype=torch.float32, device=None):
    """RoFormer (Su et al. 2021), seed 000: θ_i = base^(-2i/d), angle[m, i] = m·θ_i.

    Returns `(cos, sin)`, each `[n_pos, rotary_dim // 2]`, computed in float64 then cast.
    """
    inv_freq = base ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64, device=device) / rotary_dim)
    ang = torch.arange(n_pos, dtype=torch.float64, device=device)[:, None] * inv_freq
    return ang.cos().to(dtype), ang.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, adjacent_pairs: bool) -> torch.Tensor:
    """Rotate the first `rotary_dim` features of `x [batch, pos, head, d_head]` by position.

    Pair (x_a, x_b) becomes (x_a cos − x_b sin, x_b cos + x_a sin). With `adjacent_pairs=False` the pair of
    feature i is i + rotary_dim/2 (seed 000, GPT-NeoX); with `True` it is (2i, 2i+1) (Llama, RoFormer's matrix).
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
    """Press et al. (2021), seed 003: slope of head i (1-based) is 2^(-8i/n). Returns `[n_heads]` float64."""
    return torch.tensor([2.0 ** (-8.0 * i / n_heads) for i in range(1, n_heads + 1)], dtype=torch.float64)


def alibi_bias(n_heads: int, q_len: int, k_len: int, dtype=torch.float32, device=None) -> torch.Tensor:
    """ALiBi bias added to attention scores: −slope_h · |i − j|, shape `[n_heads, q_len, k_len]`.

    For causal attention only j ≤ i survives the mask, so this is the paper's m·[−(i−1), …, −1, 0].
    Query positions are the last `q_len` of `k_len` (generation with a prefix).
    """
    i = torch.arange(k_len - q_len, k_len, dtype=torch.float64, device=device)[:, None]
    j = torch.arange(k_len, dtype=torch.float64, device=device)[None, :]
    slopes = alibi_slopes(n_heads).to(device)
    return (-slopes[:, None, None] * (i - j).abs()).to(dtype)


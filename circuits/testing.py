"""A hand-built two-layer attention-only induction model, for tests of circuits and of head detectors.

Every weight is set by hand on orthogonal subspaces of the residual stream (no training), so the mechanism is
known exactly (Elhage et al. 2021, "Induction heads"; Olsson et al. 2022):

    residual stream = [ tok (d_vocab) | prev (d_vocab) | out (d_vocab) | scratch (d_vocab) | pos (n_ctx) ]

- `W_E[t] = e_tok[t]`; `W_pos[i] = e_pos[i]` (shortformer: added to the query/key inputs only; standard: added
  to the residual stream, which no head reads through its values); `W_U` reads `out`: logit t = `x · e_out[t]`.
- L0H0, previous-token head: QK on positions only (query at i matches key at i−1); OV moves `tok` → `prev`, so
  after layer 0 position i holds the previous token in `prev`.
- L0H1, current-token head: QK matches query i with key i; OV moves `tok` → `scratch`, which nothing reads
  (full OV circuit zero).
- L1H0, induction head: W_Q reads the current token (`tok`), W_K reads the key's previous token (`prev`):
  it K-composes with L0H0 and attends to the position after an earlier occurrence of the current token; OV
  copies `tok` → `out` with gain `copy_gain` (full OV circuit = copy_gain · Id, copying score +1).
- L1H1, first-token head: attends to position 0; OV maps `tok` → −`out` with gain 1 (an anti-copying head,
  copying score −1).

Only (L0H0 → L1H0) composes (K-composition); every other pair's Q/K/V-composition score is 0 (up to `noise`).
Token 0 is meant as BOS: `induction_tokens` draws the repeated tokens from 1..d_vocab−1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from models.arch.config import HookedTransformerConfig
from models.arch.model import HookedTransformer


@dataclass(frozen=True)
class InductionModelInfo:
    """What `build_induction_model` built: head roles as `(layer, head)` and the residual layout."""

    previous_token_heads: tuple[tuple[int, int], ...]
    induction_heads: tuple[tuple[int, int], ...]
    copying_heads: tuple[tuple[int, int], ...]  # full OV circuit copies (copying score +1)
    current_token_heads: tuple[tuple[int, int], ...]
    first_token_heads: tuple[tuple[int, int], ...]
    anti_copying_heads: tuple[tuple[int, int], ...]  # copying score −1
    subspaces: dict  # name → slice of d_model: "tok", "prev", "out", "scratch", "pos"
    bos_token: int = 0


def build_induction_model(d_vocab: int = 16, n_ctx: int = 32, positional: str = "shortformer",
                          attn_sharpness: float = 12.0, copy_gain: float = 10.0, noise: float = 0.0,
                          seed: int = 0, dtype: str = "float64"):
    """Build the hand-made induction model described in this module's docstring; returns `(model, info)`.

    `positional`: "shortformer" (the Framework's setting) or "standard". `attn_sharpness`: the score gap (after
    the 1/√d_head scale) between a matching key and the others, so attention on the intended key is
    ≈ 1 − n_ctx·e^(−sharpness). `noise`: std of Gaussian noise added to every weight (seeded), for tests that
    want non-zero but small scores elsewhere. d_model = 4·d_vocab + n_ctx, d_head = max(d_vocab, n_ctx),
    2 layers × 2 heads, attention-only, no norm, no biases."""
    if positional not in ("shortformer", "standard"):
        raise ValueError(f"positional must be 'shortformer' or 'standard', got {positional!r}")
    V, N = d_vocab, n_ctx
    d_model, d_head = 4 * V + N, max(V, N)
    cfg = HookedTransformerConfig(
        n_layers=2, d_model=d_model, n_ctx=N, d_vocab=V, n_heads=2, d_head=d_head, d_mlp=None, attn_only=True,
        normalization_type=None, positional_embedding_type=positional, use_bias=False, dtype=dtype, seed=seed,
        model_name="hand-built-induction",
    )
    model = HookedTransformer(cfg)
    tok, prev, out, scratch = (slice(k * V, (k + 1) * V) for k in range(4))
    pos = slice(4 * V, 4 * V + N)
    a = math.sqrt(attn_sharpness * math.sqrt(d_head))  # W_Q, W_K entries: score = a²/√d_head = sharpness
    eye_v, ar_v, ar_n = torch.eye(V), torch.arange(V), torch.arange(N)
    W_E = torch.zeros(V, d_model)
    W_E[:, tok] = eye_v
    W_pos = torch.zeros(N, d_model)
    W_pos[:, pos] = torch.eye(N)
    W_U = torch.zeros(d_model, V)
    W_U[out] = eye_v
    Q, K = torch.zeros(2, 2, d_model, d_head), torch.zeros(2, 2, d_model, d_head)
    Vw, O = torch.zeros(2, 2, d_model, d_head), torch.zeros(2, 2, d_head, d_model)
    p0 = 4 * V
    # L0H0 previous-token: query position i -> feature i; key position j -> feature j+1.
    Q[0, 0, p0 + ar_n, ar_n] = a
    K[0, 0, p0 + ar_n[:-1], ar_n[1:]] = a
    Vw[0, 0, ar_v, ar_v] = 1.0
    O[0, 0, ar_v, V + ar_v] = 1.0  # -> prev
    # L0H1 current-token: query i and key i -> feature i; OV tok -> scratch.
    Q[0, 1, p0 + ar_n, ar_n] = a
    K[0, 1, p0 + ar_n, ar_n] = a
    Vw[0, 1, ar_v, ar_v] = 1.0
    O[0, 1, ar_v, 3 * V + ar_v] = 1.0
    # L1H0 induction: query reads tok, key reads prev; OV copies tok -> out.
    Q[1, 0, ar_v, ar_v] = a
    K[1, 0, V + ar_v, ar_v] = a
    Vw[1, 0, ar_v, ar_v] = 1.0
    O[1, 0, ar_v, 2 * V + ar_v] = copy_gain
    # L1H1 first-token: every query position -> feature 0, key position 0 -> feature 0; OV tok -> -out.
    Q[1, 1, p0 + ar_n, 0] = a
    K[1, 1, p0, 0] = a
    Vw[1, 1, ar_v, ar_v] = 1.0
    O[1, 1, ar_v, 2 * V + ar_v] = -1.0
    gen = torch.Generator().manual_seed(seed)
    jitter = lambda t: t + noise * torch.randn(t.shape, generator=gen, dtype=t.dtype) if noise else t
    with torch.no_grad():
        model.embed.W_E.copy_(jitter(W_E))
        model.pos_embed.W_pos.copy_(jitter(W_pos))
        model.unembed.W_U.copy_(jitter(W_U))
        for l, block in enumerate(model.blocks):
            block.attn.W_Q.copy_(jitter(Q[l]))
            block.attn.W_K.copy_(jitter(K[l]))
            block.attn.W_V.copy_(jitter(Vw[l]))
            block.attn.W_O.copy_(jitter(O[l]))
    info = InductionModelInfo(
        previous_token_heads=((0, 0),), induction_heads=((1, 0),), copying_heads=((1, 0),),
        current_token_heads=((0, 1),), first_token_heads=((1, 1),), anti_copying_heads=((1, 1),),
        subspaces={"tok": tok, "prev": prev, "out": out, "scratch": scratch, "pos": pos},
    )
    return model, info


def induction_tokens(d_vocab: int = 16, half_len: int | None = None, batch: int = 4, seed: int = 0,
                     bos: int = 0) -> torch.Tensor:
    """`[batch, 1 + 2·half_len]` sequences `[BOS] + R + R`, R a random ordering of `half_len` distinct tokens
    other than `bos` (distinct, so every second-half token has one earlier occurrence). Default
    half_len = d_vocab − 1."""
    half_len = d_vocab - 1 if half_len is None else half_len
    if not 1 <= half_len <= d_vocab - 1:
        raise ValueError(f"half_len must be in 1..{d_vocab - 1}, got {half_len}")
    gen = torch.Generator().manual_seed(seed)
    ids = torch.tensor([t for t in range(d_vocab) if t != bos])
    rows = []
    for _ in range(batch):
        choice = ids[torch.randperm(len(ids), generator=gen)[:half_len]]
        rows.append(torch.cat([torch.tensor([bos]), choice, choice]))
    return torch.stack(rows)


def random_model(n_layers: int = 2, n_heads: int = 3, d_model: int = 16, d_head: int = 6, d_vocab: int = 23,
                 n_ctx: int = 12, positional: str = "standard", normalization: str | None = None,
                 attn_only: bool = True, biases: bool = True, scale: float = 0.3, seed: int = 0,
                 dtype: str = "float64", **cfg_kw):
    """A small model with every weight, bias and norm parameter random (N(0, scale²) added to the default
    init, seeded), so that biases and norm weights are non-trivial too. For property tests."""
    cfg = HookedTransformerConfig(
        n_layers=n_layers, d_model=d_model, n_ctx=n_ctx, d_vocab=d_vocab, n_heads=n_heads, d_head=d_head,
        d_mlp=None if attn_only else 2 * d_model, attn_only=attn_only, normalization_type=normalization,
        positional_embedding_type=positional, use_bias=biases, dtype=dtype, seed=seed,
        **{"init_mode": "gpt2_scaled", **cfg_kw},  # drawn in float64 whatever `dtype`: the same weights in each
    )
    model = HookedTransformer(cfg)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_((torch.randn(p.shape, generator=gen, dtype=torch.float64) * scale).to(p.dtype))
    return model

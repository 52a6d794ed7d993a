"""Behavioural head scores: one cached forward pass, one formula per function, `[n_layers, n_heads]` out.

Every function takes our `models.HookedTransformer` or a TransformerLens-protocol model (`cfg`,
`run_with_cache`, weight properties) and caches only what it needs (`names_filter`): the attention
patterns `blocks.{l}.attn.hook_pattern`, plus `hook_z` and `ln_final.hook_scale` for the copying score.
Probe sequences come from `analyses.sequences` (seeded; special tokens never drawn). Results are float32
CPU tensors indexed `[layer, head]`.

Conventions: `pattern[b, h, q, k]` is the attention from query (destination) position q to key (source)
position k. Position 0 holds BOS in every generated probe; its row is forced (it can only attend to itself)
and is excluded from every mean below.
"""

from __future__ import annotations

import torch

from circuits.checks import NonFiniteError, as_tokens, check_finite
from circuits.interface import norm_params

from .sequences import bos_token_id, random_tokens, repeated_tokens
from .util import windows

__all__ = [
    "attention_patterns", "induction_scores", "arena_induction_scores", "prefix_matching_scores",
    "previous_token_scores", "current_token_scores", "first_token_scores", "duplicate_token_scores",
    "copying_scores_behavioural",
    "in_context_learning_score", "in_context_learning_differences", "icl_positions", "icl_windows",
    "position_losses", "ICL_EXAMPLES",
]


@torch.no_grad()
def attention_patterns(model, tokens) -> torch.Tensor:
    """Attention patterns of every layer from one forward pass: `[layer, batch, head, q, k]` (float32, CPU)."""
    tokens = as_tokens(model, tokens)
    L = model.cfg.n_layers
    if L == 0:
        return torch.zeros(0, tokens.shape[0], model.cfg.n_heads, tokens.shape[1], tokens.shape[1])
    names = [f"blocks.{l}.attn.hook_pattern" for l in range(L)]
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names)
    out = torch.stack([cache[n].float().cpu() for n in names])
    if not bool(torch.isfinite(out).all()):  # every score would be NaN: say why instead
        check_finite(dict(model.named_parameters()) if hasattr(model, "named_parameters") else {}, "attention_patterns")
        raise NonFiniteError("attention_patterns: the patterns hold NaN/inf although the weights are finite "
                             "(overflow in the scores?)")
    return out


def _default_tokens(model, seed: int = 0, length: int = 64) -> torch.Tensor:
    """`[BOS] + random tokens`, 4 sequences of min(length, n_ctx) positions."""
    n = min(length, model.cfg.n_ctx) - 1
    r = random_tokens(model, n, 4, seed)
    return torch.cat([torch.full((4, 1), bos_token_id(model)), r], 1)


def _masked_attention_mass(pattern: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean, over query rows with at least one marked key, of the attention mass on the marked keys.

    pattern `[layer, batch, head, q, k]`, mask `[batch, q, k]` (bool) → `[layer, head]`."""
    mask = mask.to(pattern.dtype)[None, :, None]  # [1, batch, 1, q, k]
    rows = (mask.sum(-1) > 0).to(pattern.dtype)  # [1, batch, 1, q]
    mass = (pattern * mask).sum(-1)  # [layer, batch, head, q]
    n = rows.sum((1, 3)).clamp_min(1)
    return (mass * rows).sum((1, 3)) / n


def _induction_stripe(model, seq_len: int, batch: int, seed: int, tokens_from) -> torch.Tensor:
    """`pattern.diagonal(offset=1 − seq_len)` on `[BOS] + R + R`: `[layer, batch, head, seq_len + 2]`, entry j the
    attention from query seq_len − 1 + j to key j. Entries 0 and 1 are first-copy queries (to keys 0 = BOS and 1);
    entries 2 … seq_len + 1 are the second copy's queries, each to the token after its first occurrence."""
    tokens = repeated_tokens(model, seq_len, 2, batch, seed, tokens_from)
    pattern = attention_patterns(model, tokens)  # [layer, batch, head, q, k]
    return pattern.diagonal(offset=1 - seq_len, dim1=-2, dim2=-1)


def induction_scores(model, seq_len: int = 50, batch: int = 10, seed: int = 0, tokens_from=None) -> torch.Tensor:
    """Induction score per head, `[n_layers, n_heads]`: on `[BOS] + R + R` (R = `seq_len` random tokens, see
    `analyses.sequences`), the attention from each token of the **second** copy to the token right after its
    first occurrence, pattern[seq_len + j, j + 1] for j = 1 … seq_len, averaged over those seq_len queries and
    the batch. In [0, 1]; 1 for a perfect induction head.

    This is the stripe `pattern.diagonal(offset=1 − seq_len)` of ARENA 1.2 ("Induction heads",
    `induction_attn_detector`) restricted to the queries of the second copy: ARENA's mean also holds the stripe's
    two first-copy entries (queries seq_len − 1 → BOS and seq_len → position 1), which are no induction and
    reward attention to BOS; `arena_induction_scores` keeps that literal recipe. Threshold (ARENA): 0.4.
    """
    return _induction_stripe(model, seq_len, batch, seed, tokens_from)[..., 2:].mean((1, 3))


def arena_induction_scores(model, seq_len: int = 50, batch: int = 10, seed: int = 0,
                           tokens_from=None) -> torch.Tensor:
    """ARENA's induction score per head, `[n_layers, n_heads]`, exactly the formula of ARENA 1.2 ("Induction
    heads", `induction_attn_detector` / `induction_score_hook`): the mean over the batch and over the whole stripe
    `pattern.diagonal(offset=1 − seq_len)` of `[BOS] + R + R`, seq_len + 2 entries.

    How it differs from `induction_scores` (the documented "second copy → token after the first occurrence"):
    the stripe's first two entries are first-copy queries, seq_len − 1 → key 0 (BOS) and seq_len → key 1, so
    a head that rests on BOS scores ≈ 1/(seq_len + 2) and a perfect induction head ≈ (seq_len + 1)/(seq_len + 2)
    or less. Probe: as `induction_scores` (R distinct within a row, special ids never drawn; ARENA draws R with
    replacement from all of GPT-2's 50k ids, where repeats inside R are rare). Threshold (ARENA): 0.4.
    """
    return _induction_stripe(model, seq_len, batch, seed, tokens_from).mean((1, 3))


def prefix_matching_scores(model, seq_len: int = 25, n_repeats: int = 4, batch: int = 10, seed: int = 0,
                           tokens_from=None, tokens=None) -> torch.Tensor:
    """Olsson et al. (2022) prefix-matching score per head, `[n_layers, n_heads]`.

    Tokens `[BOS] + R × n_repeats`, R = `seq_len` random tokens (25 × 4 in the paper). For each query q
    whose token occurred earlier, the attention mass on the keys right after those earlier occurrences,
    Σ_{k ≤ q, t[k−1] = t[q], k−1 < q} pattern[q, k]; averaged over such queries and the batch. Queries of the
    first copy (no earlier occurrence, save chance repeats inside R) do not count. Pass `tokens [batch, pos]`
    to score other sequences. TransformerLens' `induction_head` detection pattern marks the same keys (its
    "mul" score divides by all rows instead of the rows with a match).
    """
    if tokens is None:
        tokens = repeated_tokens(model, seq_len, n_repeats, batch, seed, tokens_from)
    tokens = as_tokens(model, tokens).cpu()
    P = tokens.shape[1]
    prev = torch.cat([torch.full_like(tokens[:, :1], -1), tokens[:, :-1]], 1)  # t[k-1]; -1 at k=0
    mask = (prev[:, None, :] == tokens[:, :, None]) & torch.ones(P, P, dtype=torch.bool).tril()  # [b, q, k]
    return _masked_attention_mass(attention_patterns(model, tokens), mask)


def _offset_mask(tokens: torch.Tensor, which: str) -> torch.Tensor:
    B, P = tokens.shape
    q = torch.arange(P)[:, None]
    k = torch.arange(P)[None, :]
    m = {"previous": k == q - 1, "current": (k == q) & (q >= 1), "first": (k == 0) & (q >= 1)}[which]
    return m.expand(B, P, P)


def previous_token_scores(model, tokens=None, seed: int = 0) -> torch.Tensor:
    """Previous-token score per head, `[n_layers, n_heads]`: mean over batch and queries i ≥ 1 of
    pattern[i, i−1]. Meant for natural text `tokens [batch, pos]`; without them, `[BOS]` + 63 seeded random
    tokens × 4. Source: ARENA 1.2 (threshold 0.4); TransformerLens' `previous_token_head` detection pattern
    (whose "mul" score divides by all `pos` rows, ours by the `pos − 1` rows that have a previous token)."""
    tokens = as_tokens(model, _default_tokens(model, seed) if tokens is None else tokens).cpu()
    return _masked_attention_mass(attention_patterns(model, tokens), _offset_mask(tokens, "previous"))


def current_token_scores(model, tokens=None, seed: int = 0) -> torch.Tensor:
    """Current-token score per head: mean over batch and queries i ≥ 1 of pattern[i, i] (the diagonal;
    row 0 is forced to 1 and left out). Source: ARENA 1.2 (threshold 0.4). Default tokens as
    `previous_token_scores`."""
    tokens = as_tokens(model, _default_tokens(model, seed) if tokens is None else tokens).cpu()
    return _masked_attention_mass(attention_patterns(model, tokens), _offset_mask(tokens, "current"))


def first_token_scores(model, tokens=None, seed: int = 0) -> torch.Tensor:
    """First-token score per head: mean over batch and queries i ≥ 1 of pattern[i, 0] (column 0, usually
    BOS: the "resting" position). Source: ARENA 1.2 (threshold 0.4). Default tokens as
    `previous_token_scores`."""
    tokens = as_tokens(model, _default_tokens(model, seed) if tokens is None else tokens).cpu()
    return _masked_attention_mass(attention_patterns(model, tokens), _offset_mask(tokens, "first"))


def duplicate_token_scores(model, tokens=None, seq_len: int = 25, n_repeats: int = 4, batch: int = 10,
                           seed: int = 0, tokens_from=None) -> torch.Tensor:
    """Duplicate-token score per head, `[n_layers, n_heads]`: for each query q whose token occurred earlier,
    the attention mass on those earlier occurrences, Σ_{k < q, t[k] = t[q]} pattern[q, k]; averaged over
    such queries and the batch. Default tokens: `[BOS] + R × n_repeats` as for prefix matching. Source:
    TransformerLens' `duplicate_token_head` detection pattern (which divides by all rows instead)."""
    if tokens is None:
        tokens = repeated_tokens(model, seq_len, n_repeats, batch, seed, tokens_from)
    tokens = as_tokens(model, tokens).cpu()
    P = tokens.shape[1]
    mask = (tokens[:, None, :] == tokens[:, :, None]) & torch.ones(P, P, dtype=torch.bool).tril(-1)
    return _masked_attention_mass(attention_patterns(model, tokens), mask)


@torch.no_grad()
def copying_scores_behavioural(model, seq_len: int = 25, n_repeats: int = 4, batch: int = 4, seed: int = 0,
                               tokens_from=None) -> torch.Tensor:
    """Olsson et al. (2022) behavioural copying score per head, `[n_layers, n_heads]`, in [−1, 1].

    Our precise reading of the paper's one-sentence definition ("the head's direct logit effect,
    mean-subtracted and ReLU'd; the raise on the attended token over the raise on all sample tokens,
    rescaled from [0, 0.5] to [−1, 1]"). On `[BOS] + R × n_repeats` (R = 25 random tokens, S = the n distinct
    tokens of R), for each sequence, head h and query position q ≥ 1:
      1. direct logit effect on the sample tokens  Δ_v = (LN_final(result_h[q]) @ W_U)[v], v ∈ S (result_h =
         z_h W_O^h; the final norm applied at its cached scale; no b_U);
      2. mean-subtracted over the sample  d_v = Δ_v − mean_{u ∈ S} Δ_u, and ReLU'd  r_v = max(d_v, 0);
      3. ratio  ρ_q = Σ_{k ≥ 1} pattern[q, k] · r[t_k]  /  Σ_{v ∈ S} |d_v|  (0 when d = 0): the raise on the
         tokens the head attends to (weighted by attention; BOS, outside S, contributes nothing) over the
         movement of all sample tokens. Since Σ_v d_v = 0, Σ_v |d_v| = 2 Σ_v r_v, so ρ ∈ [0, 0.5]: 0.5 exactly
         when the head raises the attended token alone — this is the paper's [0, 0.5] range;
      4. average ρ over queries and batch and map [0, 0.5] → [−1, 1]: score = 4·mean(ρ) − 1.
    A perfect copier scores 1 (less the queries whose attention has nowhere to go but BOS); a head that lowers
    what it attends to scores −1; a head whose raise ignores what it attends to scores ≈ 4/(2n) − 1 ≈ −0.92.
    Reading choices (the paper gives no formula): the mean is over the sample tokens (which makes the range
    [0, 0.5]), "the attended token" is the attention-weighted sum over keys, and every query q ≥ 1 counts.
    """
    tokens = repeated_tokens(model, seq_len, n_repeats, batch, seed, tokens_from)
    L = model.cfg.n_layers
    if L == 0:
        return torch.zeros(0, model.cfg.n_heads)
    names = {f"blocks.{l}.attn.hook_{w}" for l in range(L) for w in ("pattern", "z")} | {"ln_final.hook_scale"}
    _, cache = model.run_with_cache(tokens.to(model.W_E.device), names_filter=lambda n: n in names)
    W_O, W_U = model.W_O, model.W_U  # [layer, head, d_head, d_model], [d_model, d_vocab]
    final = norm_params(model, None)  # applied at its cached scale, a linear map of each head's output
    scale = cache["ln_final.hook_scale"][:, :, None] if final.kind else None  # [batch, pos, 1, 1]
    out = torch.zeros(L, model.cfg.n_heads)
    for l in range(L):
        z = cache[f"blocks.{l}.attn.hook_z"]  # [batch, pos, head, d_head]
        result = final.linear(torch.einsum("bphd,hdm->bphm", z, W_O[l]), scale)  # [batch, pos, head, d_model]
        pattern = cache[f"blocks.{l}.attn.hook_pattern"]  # [batch, head, q, k]
        ratios = []
        for b in range(tokens.shape[0]):
            t = tokens[b].to(W_U.device)
            S, key_idx = torch.unique(t[1:], return_inverse=True)  # sample tokens; key k -> its index in S
            logit = result[b, 1:].float() @ W_U[:, S].float()  # Δ: [q, head, n], queries q >= 1
            d = logit - logit.mean(-1, keepdim=True)
            denom = d.abs().sum(-1)  # [q, head] = 2 Σ r
            at_keys = d.relu()[..., key_idx]  # [q, head, k >= 1]: r[t_k]
            num = (pattern[b, :, 1:, 1:].permute(1, 0, 2).float() * at_keys).sum(-1)  # [q, head]
            ratio = torch.where(denom > 0, num / denom.clamp_min(1e-30), torch.zeros_like(num))
            ratios.append(ratio.mean(0))  # [head], each in [0, 0.5]
        out[l] = 4 * torch.stack(ratios).mean(0).cpu() - 1
    return out


#: Examples (validation windows) an ICL score is averaged over by default here, in reports, cards and
#: REPRODUCTION.md: one token per example spreads by ~2.5–3 nats, so the standard error is ≈ 0.08–0.12 nats.
ICL_EXAMPLES = 1024


def icl_windows(model, text, seed: int = 0, seq_len: int | None = None) -> torch.Tensor:
    """`ICL_EXAMPLES` evenly spaced windows of `seq_len` (default n_ctx) tokens of a 1-D token array, BOS
    first: the examples behind the ICL scores of reports and REPRODUCTION.md."""
    return windows(text, seq_len or model.cfg.n_ctx, ICL_EXAMPLES, seed, bos=bos_token_id(model))


def icl_positions(n_ctx: int) -> tuple[int, int]:
    """Olsson et al.'s tokens 50 and 500 of a 512-token context, scaled to `n_ctx`: `(early, late)`."""
    return max(1, round(n_ctx * 50 / 512)), min(n_ctx - 1, round(n_ctx * 500 / 512))


@torch.no_grad()
def position_losses(model, tokens, chunk: int = 64) -> torch.Tensor:
    """Next-token loss of every sequence at every position, `[batch, pos − 1]` float64 on the CPU (index i is
    the loss of predicting token i + 1), computed `chunk` sequences at a time."""
    tokens = as_tokens(model, tokens)
    return torch.cat([model(part, return_type="loss", loss_per_token=True).double().cpu()
                      for part in tokens.split(max(1, int(chunk)))])


def in_context_learning_differences(model, tokens, early: int = 50, late: int = 500, chunk: int = 64,
                                    losses: torch.Tensor | None = None) -> torch.Tensor:
    """Per example, loss(token `late`) − loss(token `early`) (`[batch]` float64): the terms whose mean is
    `in_context_learning_score`. `losses` (from `position_losses` on the same tokens) skips the forward."""
    n = (losses.shape[1] + 1) if losses is not None else as_tokens(model, tokens).shape[1]
    if not 1 <= early < late < n:
        raise ValueError(
            f"need 1 <= early < late < sequence length; got early={early}, late={late} for sequences of "
            f"{n} tokens (n_ctx={model.cfg.n_ctx}); pick positions that fit"
        )
    per = position_losses(model, tokens, chunk) if losses is None else losses
    return per[:, late - 1] - per[:, early - 1]


def in_context_learning_score(model, tokens, early: int = 50, late: int = 500, chunk: int = 64) -> float:
    """Olsson et al. (2022) in-context learning score: mean over examples of loss(token `late`) −
    loss(token `early`), in nats; more negative = more in-context learning (the paper: 500 vs 50 in
    contexts of 512; < 0.15 nats of improvement before the induction-head phase change, ≈ 0.4 after;
    `icl_positions` scales the two positions to another context).

    "Loss at token t" is the loss of predicting the token at position t from positions < t, i.e. index
    t − 1 of `model(tokens, return_type="loss", loss_per_token=True)` (`[batch, pos − 1]`). One token per
    example makes the score noisy (its standard error is ~2.5 nats / √batch for byte- or BPE-level text), so
    pass many examples (`ICL_EXAMPLES`); they are run `chunk` sequences at a time."""
    return float(in_context_learning_differences(model, tokens, early, late, chunk).mean())

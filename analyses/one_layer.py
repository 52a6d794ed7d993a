"""One layer: copying heads, positional vs content heads, pattern-preserving head ablation.

Framework (Elhage et al. 2021), "One-layer attention-only transformers": logits = direct path + Σ_h A^h ⊗
W_E W_OV^h W_U; each head is a set of skip-trigrams read off its full QK and OV circuits (`analyses.trigrams`), and
most heads of their 1-layer model copy (10 of 12; the other two are positional). The functions also apply to any
layer of deeper models (for layers > 0 the full circuits are the direct-path parts only).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from circuits.checks import as_tokens, check_head_pair
from circuits.diagonal import diagonal_rank_stats
from circuits.eigen import copying_scores, positive_eigenvalue_fraction
from circuits.factored import full_ov_circuit, full_qk_circuit
from circuits.interface import positional_scheme
from models.arch.model import head_label
from models.arch.tl_compat import FactoredMatrix

from .resume import resumable, resume_name, run_from_layer
from .scores import attention_patterns, copying_scores_behavioural
from .sequences import bos_token_id, random_tokens, token_pool
from .util import check_threshold, device_of, markdown_table, weight_view

__all__ = ["CopyingHeads", "copying_heads_table", "copying_verdict", "PositionalContent", "positional_vs_content",
           "positional_r2", "AblationResult", "head_ablation_losses", "ablated_position_losses"]

#: Eigenvalue half of the copying verdict: Σλ/Σ|λ| of the full OV circuit (Elhage et al. 2021). Random matrices
#: give ≈ 0 (± 0.03 at d_model 768, wider for small d_head); the Framework's copying heads sit near 1.
COPYING_THRESHOLD = 0.5
#: Diagonal half of the copying verdict: top-1 diagonal accuracy of the full OV circuit (ARENA 1.2, "Full OV
#: circuit"), the share of tokens whose own logit the head raises most. Σλ/Σ|λ| can be near 1 while few tokens
#: map to themselves; the verdict "copying" needs both, "OV-positive" names heads that pass the eigenvalues only.
DIAGONAL_THRESHOLD = 0.5


def copying_verdict(score: float | None, top1: float | None, threshold: float = COPYING_THRESHOLD,
                    diagonal: float = DIAGONAL_THRESHOLD) -> str:
    """The copying verdict on both measures: "copying" when the eigenvalue copying score Σλ/Σ|λ| ≥ `threshold`
    **and** the top-1 diagonal accuracy of the full OV circuit ≥ `diagonal` (most tokens raise their own logit
    most); "OV-positive" when only the eigenvalue score passes; "" otherwise (or when a measure is missing)."""
    if score is None or score < threshold:
        return ""
    return "copying" if top1 is not None and top1 >= diagonal else "OV-positive"


@dataclass
class CopyingHeads:
    """Per-head copying evidence, `[n_layers, n_heads]` tensors (see `copying_heads_table`)."""

    copying_score: torch.Tensor  # Σλ/Σ|λ| of W_E W_OV W_U
    positive_fraction: torch.Tensor  # share of eigenvalues with positive real part
    top1: torch.Tensor  # top-1 diagonal accuracy of the full OV circuit over the ids of `vocab`
    top5: torch.Tensor
    behavioural: torch.Tensor | None  # Olsson's behavioural copying score (None when not measured)
    threshold: float = COPYING_THRESHOLD
    heads: list[tuple[int, int]] = field(default_factory=list)  # judged copying (both measures)
    n_ids: int = 0  # ids the diagonal accuracies count
    top1_all: torch.Tensor | None = None  # the same over every non-special id (when `vocab` is a subset)
    top5_all: torch.Tensor | None = None
    n_ids_all: int = 0
    diagonal: float = DIAGONAL_THRESHOLD
    ov_positive: list[tuple[int, int]] = field(default_factory=list)  # eigenvalue score passes, top-1 does not

    def verdict(self, layer: int, head: int) -> str:
        return copying_verdict(float(self.copying_score[layer, head]), float(self.top1[layer, head]),
                               self.threshold, self.diagonal)

    def markdown(self) -> str:
        L, H = self.copying_score.shape
        sub = self.top1_all is not None
        rows = []
        for l in range(L):
            for h in range(H):
                beh = None if self.behavioural is None else float(self.behavioural[l, h])
                acc = [float(self.top1[l, h]), float(self.top5[l, h])]
                if sub:
                    acc += [float(self.top1_all[l, h]), float(self.top5_all[l, h])]
                rows.append([head_label(l, h), float(self.copying_score[l, h]), float(self.positive_fraction[l, h]),
                             *acc, beh, self.verdict(l, h) or "—"])
        ids = f" ({self.n_ids} trained ids)" if sub else f" ({self.n_ids} ids)"
        acc_h = [f"top-1 diag. acc.{ids}", f"top-5 diag. acc.{ids}"]
        if sub:
            acc_h += [f"top-1 (all {self.n_ids_all} ids)", f"top-5 (all {self.n_ids_all} ids)"]
        return markdown_table(["head", "OV copying score Σλ/Σ|λ|", "positive eigenvalues", *acc_h,
                               "behavioural copying", "verdict"], rows)

    def __str__(self) -> str:
        return (f"CopyingHeads: {len(self.heads)} of {self.copying_score.numel()} heads copy (OV copying score ≥ "
                f"{self.threshold} and top-1 diagonal accuracy ≥ {self.diagonal}); {len(self.ov_positive)} more "
                f"pass the eigenvalue score only\n{self.markdown()}")


@torch.no_grad()
def copying_heads_table(model, vocab=None, threshold: float = COPYING_THRESHOLD, behavioural: bool = True,
                        diagonal: float = DIAGONAL_THRESHOLD) -> CopyingHeads:
    """Copying evidence for every head: the eigenvalue copying score of its full OV circuit W_E W_OV W_U
    (`circuits.copying_scores`), the fraction of positive eigenvalues, the top-1 / top-5 diagonal accuracy over
    the vocabulary subset `vocab` (default every non-special id; `circuits.diagonal_rank_stats`; with a `vocab`,
    also over every non-special id, never-trained ones included, in `top1_all` / `top5_all`), and the
    behavioural copying score (`analyses.scores.copying_scores_behavioural`). A head is judged copying
    (`copying_verdict`) when its copying score ≥ `threshold` **and** its top-1 diagonal accuracy over `vocab` ≥
    `diagonal`; `ov_positive` lists the heads that pass the copying score only. Norm weights are folded first."""
    threshold, diagonal = check_threshold(threshold), check_threshold(diagonal, "diagonal")
    m = weight_view(model)
    L, H = m.cfg.n_layers, m.cfg.n_heads
    cs = copying_scores(m).float().cpu()
    pos = torch.zeros(L, H)
    pools = [token_pool(m, vocab).to(m.W_E.device)]
    if vocab is not None:
        pools.append(token_pool(m).to(m.W_E.device))
    acc = torch.zeros(len(pools), 2, L, H)  # [pool, top-1 / top-5, layer, head]
    for l in range(L):
        fm = full_ov_circuit(m, l)  # [head, d_vocab, d_vocab], factored
        pos[l] = positive_eigenvalue_fraction(fm).float().cpu()
        for i, S in enumerate(pools):
            stats = diagonal_rank_stats(FactoredMatrix(fm.A[:, S], fm.B[:, :, S]), k=(1, 5))
            acc[i, 0, l], acc[i, 1, l] = stats[1].float().cpu(), stats[5].float().cpu()
    pl = min(25, (model.cfg.n_ctx - 1) // 4)
    beh = copying_scores_behavioural(model, pl, 4, tokens_from=vocab) if behavioural and L else None
    verdicts = {(l, h): copying_verdict(float(cs[l, h]), float(acc[0, 0, l, h]), threshold, diagonal)
                for l in range(L) for h in range(H)}
    heads = [k for k, v in verdicts.items() if v == "copying"]
    out = CopyingHeads(cs, pos, acc[0, 0], acc[0, 1], beh, threshold, heads, n_ids=pools[0].numel(),
                       diagonal=diagonal, ov_positive=[k for k, v in verdicts.items() if v == "OV-positive"])
    if len(pools) > 1:
        out.top1_all, out.top5_all, out.n_ids_all = acc[1, 0], acc[1, 1], pools[1].numel()
    return out


@dataclass
class PositionalContent:
    """Per-head `[n_layers, n_heads]` measures of how much attention depends on position vs content."""

    content_independence: torch.Tensor  # 1 − mean TV distance between patterns on two random sequences
    entropy: torch.Tensor  # mean attention entropy (nats) over queries ≥ 1
    previous: torch.Tensor  # mean attention to i−1
    first: torch.Tensor  # mean attention to position 0
    positional_r2: torch.Tensor | None  # layer 0: share of row-centred QK score variance from position terms
    labels: list[list[str]] = field(default_factory=list)

    def markdown(self) -> str:
        L, H = self.entropy.shape
        rows = [[head_label(l, h), float(self.content_independence[l, h]),
                 None if self.positional_r2 is None or l > 0 else float(self.positional_r2[l, h]),
                 float(self.entropy[l, h]), float(self.previous[l, h]), float(self.first[l, h]), self.labels[l][h]]
                for l in range(L) for h in range(H)]
        return markdown_table(["head", "content independence", "positional R² (layer 0)", "entropy (nats)",
                               "prev-token", "first-token", "kind"], rows)

    def __str__(self) -> str:
        return "PositionalContent\n" + self.markdown()


@torch.no_grad()
def positional_r2(model, tokens: torch.Tensor) -> torch.Tensor | None:
    """Layer 0: R² of the position-position term of the full QK circuit for the row-centred scores on `tokens`
    (`circuits.full_qk_circuit(positional=True)`); None without a positional table or with norms."""
    if not positional_scheme(model).table:
        return None
    if getattr(model.cfg, "normalization_type", None) is not None or model.cfg.n_layers == 0:
        return None
    parts = full_qk_circuit(model, 0, None, positional=True)
    P = tokens.shape[1]
    mask = torch.ones(P, P, dtype=torch.bool).tril()
    num = torch.zeros(model.cfg.n_heads, dtype=torch.float64)
    den = torch.zeros_like(num)
    for t in tokens.to(device_of(model)):
        total = parts.total(t, t).double().cpu()  # [head, q, k]
        pp = (parts.pos_pos.A[..., :P, :] @ parts.pos_pos.B[..., :, :P]).double().cpu()

        def centre(x):
            x = x.masked_fill(~mask, 0)
            return (x - x.sum(-1, keepdim=True) / mask.sum(-1)).masked_fill(~mask, 0)

        tc, pc = centre(total), centre(pp)
        num += ((tc - pc) ** 2).sum((-2, -1))
        den += (tc**2).sum((-2, -1))
    r2 = torch.zeros(model.cfg.n_layers, model.cfg.n_heads)
    r2[0] = (1 - num / den.clamp_min(1e-30)).float()
    return r2


@torch.no_grad()
def positional_vs_content(model, seq_len: int = 64, batch: int = 8, seed: int = 0, vocab=None,
                          threshold: float = 0.8) -> PositionalContent:
    """Which heads attend by position and which by content, from behaviour on random tokens.

    content independence = 1 − mean_{batch, q ≥ 1} TV(A₁[q], A₂[q]), with A₁, A₂ one head's patterns on two
    independent random sequences `[BOS] + R` (TV = ½ Σ_k |a − b|): 1 when the pattern ignores the tokens.
    A head with content independence ≥ `threshold` is labelled positional, refined by where it looks
    ("previous token" if it attends ≥ 0.4 to i−1, "first token" if ≥ 0.4 to position 0); others "content".
    For layer 0 with a positional table and no norm, also the R² of the position-position QK term."""
    threshold = check_threshold(threshold)
    n = min(seq_len, model.cfg.n_ctx) - 1
    bos = torch.full((batch, 1), bos_token_id(model))
    t1 = torch.cat([bos, random_tokens(model, n, batch, seed, vocab)], 1)
    t2 = torch.cat([bos, random_tokens(model, n, batch, seed + 1, vocab)], 1)
    A1, A2 = attention_patterns(model, t1), attention_patterns(model, t2)  # [layer, batch, head, q, k]
    tv = 0.5 * (A1 - A2).abs().sum(-1)[..., 1:]  # [layer, batch, head, q>=1]
    indep = 1 - tv.mean((1, 3))
    ent = -(A1 * A1.clamp_min(1e-30).log()).sum(-1)[..., 1:].mean((1, 3))
    q = torch.arange(1, n + 1)
    prev = A1[..., q, q - 1].mean((1, 3))
    first = A1[..., 1:, 0].mean((1, 3))
    labels = []
    for l in range(model.cfg.n_layers):
        row = []
        for h in range(model.cfg.n_heads):
            if indep[l, h] < threshold:
                row.append("content")
            elif prev[l, h] >= 0.4:
                row.append("positional: previous token")
            elif first[l, h] >= 0.4:
                row.append("positional: first token")
            else:
                row.append("positional")
        labels.append(row)
    r2 = positional_r2(weight_view(model), t1[:2])
    return PositionalContent(indep, ent, prev, first, r2, labels)


@dataclass
class AblationResult:
    """Loss increase (nats) from zeroing each head's output with every attention pattern frozen: `delta`
    `[n_layers, n_heads]`, the mean over `n_sequences` sequences, and `se`, its standard error over them."""

    clean_loss: float
    delta: torch.Tensor  # [n_layers, n_heads]
    se: torch.Tensor | None = None  # [n_layers, n_heads]
    n_sequences: int | None = None

    def markdown(self) -> str:
        L, H = self.delta.shape
        order = sorted(((float(self.delta[l, h]), l, h) for l in range(L) for h in range(H)), reverse=True)
        if self.se is None:
            return markdown_table(["head", "loss increase (nats)"], [[head_label(l, h), d] for d, l, h in order])
        return markdown_table(["head", "loss increase (nats)", "± s.e."],
                              [[head_label(l, h), d, float(self.se[l, h])] for d, l, h in order])

    def __str__(self) -> str:
        return f"AblationResult(clean loss {self.clean_loss:.4f} nats)\n{self.markdown()}"


@torch.no_grad()
def head_ablation_losses(model, tokens, heads: list[tuple[int, int]] | None = None, chunk: int = 64
                         ) -> AblationResult:
    """Pattern-preserving ablation (Olsson et al. 2022): for each head, the next-token loss on `tokens` when its
    output is zeroed (`hook_z` of that head set to 0, so z·W_O = 0; b_O kept) while every layer's attention
    pattern is frozen to its clean value, minus the clean loss. In nats; positive = the head helps. The
    increase is measured per sequence of `tokens [batch, pos]`, so the result carries its standard error over
    them; sequences are run `chunk` at a time."""
    tokens = as_tokens(model, tokens)  # ValueError for float, empty, out-of-range, over-long
    L, H = model.cfg.n_layers, model.cfg.n_heads
    if heads is not None:
        heads = [check_head_pair(model, p, "heads[i]") for p in heads]
    names = _pattern_names(model)
    todo = heads if heads is not None else [(l, h) for l in range(L) for h in range(H)]
    # an ablation of a layer-l head changes nothing before block l: the run starts there (`analyses.resume`)
    kept = set(names) | ({resume_name(l) for l in range(1, L)} if resumable(model) else set())
    clean_parts, per_seq = [], torch.zeros(tokens.shape[0], L, H, dtype=torch.float64)
    start = 0
    for part in tokens.split(max(1, int(chunk))):
        clean, cache = model.run_with_cache(part, return_type="loss", loss_per_token=True,
                                            names_filter=lambda n: n in kept)
        clean = clean.double().mean(-1).cpu()  # [chunk]
        frozen = {n: cache[n] for n in names}  # reused by every run below
        for l, h in todo:
            loss = run_from_layer(model, part, cache, l, _ablation_hooks(frozen, [(l, h)]), return_type="loss",
                                  loss_per_token=True)
            per_seq[start:start + part.shape[0], l, h] = loss.double().mean(-1).cpu() - clean
        clean_parts.append(clean)
        start += part.shape[0]
    n = tokens.shape[0]
    se = per_seq.std(0) / n**0.5 if n > 1 else torch.zeros(L, H, dtype=torch.float64)
    return AblationResult(float(torch.cat(clean_parts).mean()), per_seq.mean(0).float(), se.float(), n)


def _pattern_names(model) -> list[str]:
    return [f"blocks.{l}.attn.hook_pattern" for l in range(model.cfg.n_layers)]


def _ablation_hooks(frozen: dict, heads) -> list:
    """Forward hooks of a pattern-preserving ablation: every `hook_pattern` replaced by its clean value in
    `frozen`, and the `hook_z` of each of `heads` (together) set to 0."""
    by_layer: dict[int, list[int]] = {}
    for l, h in heads:
        by_layer.setdefault(l, []).append(h)

    def zero(z, hook, hs):
        z = z.clone()
        z[:, :, hs] = 0
        return z

    return [(n, lambda p, hook: frozen[hook.name]) for n in frozen] + [
        (f"blocks.{l}.attn.hook_z", lambda z, hook, hs=hs: zero(z, hook, hs)) for l, hs in sorted(by_layer.items())]


@torch.no_grad()
def ablated_position_losses(model, tokens, heads, chunk: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-position next-token losses `[batch, pos − 1]` (float64, CPU; index i predicts token i + 1): clean,
    and with all of `heads` zeroed together while every attention pattern keeps its clean value (the
    pattern-preserving ablation of `head_ablation_losses`). Run `chunk` sequences at a time, so the frozen
    patterns of one chunk are all that is held."""
    tokens = as_tokens(model, tokens)
    heads = [check_head_pair(model, p, "heads[i]") for p in heads]
    names = _pattern_names(model)
    clean, ablated = [], []
    for part in tokens.split(max(1, int(chunk))):
        per, cache = model.run_with_cache(part, return_type="loss", loss_per_token=True,
                                          names_filter=lambda n: n in names)
        clean.append(per.double().cpu())
        if heads:
            per = model.run_with_hooks(part, return_type="loss", loss_per_token=True,
                                       fwd_hooks=_ablation_hooks({n: cache[n] for n in names}, heads))
            ablated.append(per.double().cpu())
    clean_t = torch.cat(clean)
    return clean_t, (torch.cat(ablated) if heads else clean_t)

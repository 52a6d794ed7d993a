"""Zero layers: the direct path `W_E W_U` as a bigram model, against the corpus's empirical bigrams.

Framework (Elhage et al. 2021), "Zero-layer transformers": logits = one-hot(t) W_E W_U (+ b_U), so the best a
zero-layer model can do is approximate the bigram log-likelihood log P(next | current), limited by rank
d_model. In deeper models the same product is the direct-path ("residual bigram") term `Id ⊗ W_U W_E` of the
path expansion. The final norm, when present, is applied to each row `W_E[a]` alone: exact for a 0-layer
model whose residual carries no positions (shortformer, rotary, none), the token-only part otherwise.

Nothing forms the `d_vocab × d_vocab` table: the bigram counts are kept sparse (observed pairs only) and the
direct-path log-probabilities are computed over blocks of source rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from circuits.checks import check_int, check_model_finite
from circuits.interface import norm_params

from .util import as_1d_tokens, device_of, markdown_table, token_str, windows


@dataclass
class BigramTable:
    """Sparse empirical bigram counts of a token stream: `count[i]` occurrences of `src[i]` followed by `dst[i]`."""

    src: torch.Tensor  # [n_pairs] int64, sorted by (src, dst)
    dst: torch.Tensor  # [n_pairs] int64
    count: torch.Tensor  # [n_pairs] float64
    d_vocab: int

    @property
    def n_tokens(self) -> int:
        return int(self.count.sum())

    def row_totals(self) -> torch.Tensor:
        """Occurrences of each source token as a bigram's first element, `[d_vocab]` float64."""
        return torch.zeros(self.d_vocab, dtype=torch.float64).index_add_(0, self.src, self.count)

    def conditional(self) -> torch.Tensor:
        """P(dst | src) for each observed pair, `[n_pairs]`."""
        return self.count / self.row_totals()[self.src]

    def entropy(self) -> float:
        """H(next | current) = −Σ_ab p(a, b) log P(b | a) in nats: the loss of the corpus's own bigram model
        (in-sample), the floor a zero-layer model approaches."""
        return float(-(self.count * self.conditional().log()).sum() / self.count.sum())

    def lookup(self, src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
        """P(dst | src) for the given pairs (0 for pairs never observed)."""
        keys = self.src * self.d_vocab + self.dst  # sorted
        q = src.long() * self.d_vocab + dst.long()
        i = torch.searchsorted(keys, q).clamp_max(keys.numel() - 1)
        return torch.where(keys[i] == q, self.conditional()[i], torch.zeros((), dtype=torch.float64))

    def top_next(self) -> tuple[torch.Tensor, torch.Tensor]:
        """For each source id, the most frequent next token and its P (−1 / 0 where the source never occurs)."""
        cond = self.conditional()
        prob = torch.zeros(self.d_vocab, dtype=torch.float64).scatter_reduce(0, self.src, cond, "amax")
        best = torch.full((self.d_vocab,), -1, dtype=torch.long)
        hit = cond == prob[self.src]  # the row maxima (ties: one of them)
        best[self.src[hit]] = self.dst[hit]
        return best, prob


#: Vocabularies with at most this many pair keys (d_vocab²; 2048² = 4M, 32 MiB of counts) count bigrams in one dense
#: `np.bincount`; larger ones sort chunks of keys (memory O(observed pairs)).
DENSE_BIGRAMS = 1 << 22


def bigram_table(tokens, d_vocab: int, chunk: int = 1 << 22) -> BigramTable:
    """Count the bigrams (t[i], t[i+1]) of a 1-D token array (numpy memmap, tensor, list): a dense count of the
    pair keys `t[i] · d_vocab + t[i+1]` for small vocabularies (`DENSE_BIGRAMS`), else sorted in chunks."""
    flat = as_1d_tokens(tokens).numpy()
    if flat.size < 2:
        raise ValueError("a bigram table needs at least 2 tokens")
    if flat.min() < 0 or flat.max() >= d_vocab:
        raise ValueError(f"token ids must lie in 0..{d_vocab - 1}")
    if d_vocab * d_vocab <= DENSE_BIGRAMS:  # one O(n) count over every pair key; the same table as the sort below
        n = np.bincount(flat[:-1] * d_vocab + flat[1:], minlength=d_vocab * d_vocab)
        k = np.flatnonzero(n)
        return BigramTable(torch.from_numpy(k // d_vocab), torch.from_numpy(k % d_vocab),
                           torch.from_numpy(n[k].astype(np.float64)), d_vocab)
    keys, counts = [], []
    for i in range(0, flat.size - 1, chunk):
        c = flat[i : i + chunk + 1]
        k, n = np.unique(c[:-1] * d_vocab + c[1:], return_counts=True)
        keys.append(k)
        counts.append(n)
    k, inv = np.unique(np.concatenate(keys), return_inverse=True)
    n = np.bincount(inv, weights=np.concatenate(counts).astype(np.float64))
    k = torch.from_numpy(k)
    return BigramTable(k // d_vocab, k % d_vocab, torch.from_numpy(n), d_vocab)


@torch.no_grad()
def direct_path_logits(model, rows: torch.Tensor) -> torch.Tensor:
    """Direct-path logits `ln_final(W_E[a]) @ W_U + b_U` for source ids `rows [n]` → `[n, d_vocab]` (float64)."""
    x = model.W_E[rows.to(device_of(model))].double()  # [n, d_model]
    final = norm_params(model, None)
    if final.kind is not None:  # the final norm of each row alone, its own scale
        x = final.linear(x, final.scale(x))
        x = x + final.b.double() if final.b is not None else x
    logits = x @ model.W_U.double()
    b_U = getattr(model, "b_U", None)
    return (logits + b_U.double() if isinstance(b_U, torch.Tensor) else logits).cpu()


@dataclass
class DirectPathFit:
    """How well the direct path `W_E W_U` matches the corpus bigrams (all losses in nats per token).

    `weighted_kl` = Σ_a p(a) KL(P(·|a) ‖ softmax(W_E W_U)[a]) = `direct_path_loss` − `bigram_entropy`, where
    `direct_path_loss` is the cross-entropy of the direct path used as a bigram model on the same text."""

    weighted_kl: float
    bigram_entropy: float
    direct_path_loss: float
    argmax_agreement: float  # frequency-weighted share of sources whose top next token the direct path gets right
    n_tokens: int
    n_pairs: int
    top_bigrams: list = field(default_factory=list)  # rows: source, predicted next, Q, corpus P(pred|src), ...

    def table(self) -> str:
        headers = ["source", "direct path's next", "its prob.", "corpus P(that | source)", "corpus's next", "P"]
        return markdown_table(headers, [list(r) for r in self.top_bigrams])

    def __str__(self) -> str:
        return (f"DirectPathFit(weighted KL {self.weighted_kl:.3f} nats, bigram entropy {self.bigram_entropy:.3f}, "
                f"direct-path loss {self.direct_path_loss:.3f}, argmax agreement {self.argmax_agreement:.1%}, "
                f"{self.n_tokens} bigrams)\n" + self.table())


@torch.no_grad()
def direct_path_fit(model, tokens, block: int = 512, top: int = 15, table: BigramTable | None = None) -> DirectPathFit:
    """Frequency-weighted KL between the corpus bigrams of `tokens` and softmax(W_E W_U) (reference.md, "Zero
    layers"): Σ_a p(a) KL(P(·|a) ‖ Q_a), Q_a = softmax(direct_path_logits(a)); streamed over blocks of `block`
    source rows, so memory is O(block · d_vocab + observed pairs). NaN/inf in W_E or W_U raises `NonFiniteError`."""
    check_model_finite(model, "direct_path_fit", ("W_E", "W_U"))
    block = check_int(block, "block")
    V = model.cfg.d_vocab
    table = table if table is not None else bigram_table(tokens, V)
    cond = table.conditional()
    logq = torch.empty_like(cond)
    sources = torch.unique(table.src)
    top_q = torch.full((V,), -1, dtype=torch.long)
    top_qp = torch.zeros(V, dtype=torch.float64)
    for i in range(0, sources.numel(), block):
        rows = sources[i : i + block]
        lq = direct_path_logits(model, rows).log_softmax(-1)  # [rows, d_vocab]
        top_qp[rows], top_q[rows] = (v.cpu() for v in lq.exp().max(-1))
        lo, hi = torch.searchsorted(table.src, rows[0]), torch.searchsorted(table.src, rows[-1], right=True)
        local = torch.searchsorted(rows, table.src[lo:hi])
        logq[lo:hi] = lq[local, table.dst[lo:hi]]
    N = table.count.sum()
    entropy = table.entropy()
    loss = float(-(table.count * logq).sum() / N)
    best, best_p = table.top_next()
    totals = table.row_totals()
    p_top_q = table.lookup(torch.arange(V), top_q.clamp_min(0))  # corpus P(direct path's top | a)
    agree = float((totals * (p_top_q >= best_p - 1e-12)).sum() / totals.sum())  # ties count as agreement
    rows = []
    for a in torch.argsort(totals, descending=True)[:top].tolist():
        if totals[a] == 0:
            break
        pred = int(top_q[a])
        rows.append([token_str(model, a), token_str(model, pred), float(top_qp[a]), float(p_top_q[a]),
                     token_str(model, int(best[a])), float(best_p[a])])
    return DirectPathFit(loss - entropy, entropy, loss, agree, table.n_tokens, int(table.count.numel()), rows)


@dataclass
class ZeroLayerStudy:
    """The direct path as a bigram model; for a 0-layer model also its actual loss on the same text."""

    fit: DirectPathFit
    model_loss: float | None  # the model's own next-token loss on windows of the text (None when not measured)
    is_zero_layer: bool

    def __str__(self) -> str:
        ml = "—" if self.model_loss is None else f"{self.model_loss:.3f}"
        return f"ZeroLayerStudy(model loss {ml} nats; zero-layer={self.is_zero_layer})\n{self.fit}"


@torch.no_grad()
def zero_layer_study(model, tokens, seq_len: int | None = None, n_windows: int = 16, top: int = 15) -> ZeroLayerStudy:
    """`direct_path_fit` on `tokens` plus the model's mean next-token loss on `n_windows` windows of them."""
    fit = direct_path_fit(model, tokens, top=top)
    seq_len = min(seq_len or 128, model.cfg.n_ctx)
    flat = as_1d_tokens(tokens)
    loss = None
    if flat.numel() > seq_len:
        w = windows(flat, seq_len, n_windows).to(device_of(model))
        loss = float(model(w, return_type="loss"))
    return ZeroLayerStudy(fit, loss, model.cfg.n_layers == 0)


def plot_bigrams(model, tokens, n: int = 24, ax=None, table: BigramTable | None = None):
    """Side-by-side heatmaps over the `n` most frequent tokens: corpus P(next | current) and softmax(W_E W_U)
    restricted to those rows (renormalised over the shown columns, so the two are comparable), on one colour
    scale with one colour bar; whitespace in the token labels shown as `⏎`, `␣`, `\\t`. Returns the figure."""
    import matplotlib.pyplot as plt

    from .labels import figure_text, token_labels

    table = table if table is not None else bigram_table(tokens, model.cfg.d_vocab)
    ids = torch.argsort(table.row_totals(), descending=True)[:n]
    pos = torch.full((table.d_vocab,), -1, dtype=torch.long)
    pos[ids] = torch.arange(len(ids))
    i, j = pos[table.src], pos[table.dst]
    shown = (i >= 0) & (j >= 0)  # pairs are distinct, so each cell gets one count: no sum, no order
    P = torch.zeros(len(ids), len(ids), dtype=torch.float64)
    P[i[shown], j[shown]] = table.count[shown]
    P = P / P.sum(-1, keepdim=True).clamp_min(1e-12)
    Q = direct_path_logits(model, ids)[:, ids].softmax(-1)
    from .plots import COLORBAR_ROOM, fixed_layout, side_colorbar, text_inches

    side = max(4.5, 0.19 * len(ids) + 2.0)
    labels = [figure_text(x) for x in token_labels(model, ids.tolist(), max_len=10)]
    room = 0.35 + max(text_inches(x, 9) for x in labels)  # the token labels (9 pt) and the axis label
    if ax is None:
        fig, axes = plt.subplots(1, 2, figsize=(2 * side + 1.2, side + 0.3))
        fixed_layout(fig, left=room, right=COLORBAR_ROOM, bottom=room, top=0.35, wspace=room + 0.1)
    else:
        fig, axes = ax[0].figure, ax
    vmax = float(max(P.max(), Q.max()))
    for a, M, title in ((axes[0], P, "corpus P(next | current)"), (axes[1], Q, "direct path softmax(W_E W_U)")):
        im = a.imshow(M.numpy(), cmap="Blues", vmin=0, vmax=vmax)
        a.set_title(title, fontsize=10)
        a.set_xticks(range(len(ids)), labels, rotation=90, fontsize=9)
        a.set_yticks(range(len(ids)), labels, fontsize=9)
        a.set_xlabel("next token")
        a.set_ylabel("current token")
    label = "probability (rows renormalised over the shown tokens)"
    if ax is None:
        side_colorbar(fig, im, label)
    else:
        fig.colorbar(im, ax=list(axes), shrink=0.8, label=label)
    return fig

"""Skip-trigrams `[source] … [destination] → [out]` read off one head's full QK and OV circuits, and the
"bugs" their factorisation implies (Elhage et al. 2021, Framework, "One-layer attention-only transformers").

The QK circuit decides, at a destination (query) token, which source (key) token to attend to; the OV circuit
decides which output logits attending to that source raises. Both are `d_vocab × d_vocab`; we stream over
blocks of rows and keep running top-k lists, so no `d_vocab²` (let alone `d_vocab³`) object is formed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from circuits.checks import check_int
from circuits.factored import full_ov_circuit, full_qk_circuit
from circuits.interface import attn_scale
from models.arch.model import head_label

from .sequences import token_pool
from .util import markdown_table, token_str, weight_view


@dataclass
class SkipTrigram:
    source: str
    destination: str
    outs: list[tuple[str, float]]  # the source's top output tokens and their centred logit raise
    qk: float  # destination's centred attention score for the source (pre-softmax, /√d_head)
    ov: float  # centred logit raise of the top out when attending to the source
    strength: float  # relu(qk) · relu(ov)
    ids: tuple[int, int, int]  # (source, destination, top out) token ids
    out_ids: list[int] = field(default_factory=list)  # ids of `outs`


@dataclass
class SkipTrigramTable:
    """The strongest skip-trigrams of head (layer, head), strongest first."""

    layer: int
    head: int
    rows: list[SkipTrigram] = field(default_factory=list)

    def markdown(self, n: int | None = None) -> str:
        rows = [[f"[{r.source}] … [{r.destination}] → [{r.outs[0][0]}]", ", ".join(o for o, _ in r.outs[1:]),
                 r.qk, r.ov, r.strength] for r in self.rows[:n]]
        return markdown_table(["skip-trigram", "also raised", "QK (centred)", "OV (centred)", "strength"], rows)

    def __str__(self) -> str:
        return f"Skip-trigrams of {head_label(self.layer, self.head)}\n{self.markdown(15)}"


def _topk_merge(best_v, best_i, v, i, k):
    v, i = torch.cat([best_v, v]), torch.cat([best_i, i])
    top = torch.topk(v, min(k, v.numel()))
    return top.values, i[top.indices]


@torch.no_grad()
def skip_trigrams(model, layer: int, head: int, k: int = 20, n_outs: int = 3, vocab=None, block: int = 512
                  ) -> SkipTrigramTable:
    """The `k` strongest skip-trigrams of one head.

    Over the vocabulary subset S (`vocab`: ids, e.g. the corpus's seen ids; default every non-special id):
      OV[s, o] = (W_E W_V W_O W_U)[s, o] centred over o ∈ S: how much attending to s raises o above average;
      QK[d, s] = (W_E W_Q W_Kᵀ W_Eᵀ)[d, s] / scale centred over s ∈ S (the layer's score divisor, √d_head by
      default, `circuits.interface.attn_scale`): how much d prefers s (token parts only; positions are left out);
      strength(s, d) = relu(QK[d, s]) · relu(max_o OV[s, o]),
    and the triple is [s] … [d] → [argmax_o OV[s, o]]. Norm weights are folded first (`circuits.fold_layer_norm`).
    Streams over blocks of `block` rows (memory O(block · |S|))."""
    k, n_outs, block = check_int(k, "k"), check_int(n_outs, "n_outs"), check_int(block, "block")
    m = weight_view(model)
    S = token_pool(m, vocab).to(m.W_E.device)
    ov = full_ov_circuit(m, layer, head)
    qk = full_qk_circuit(m, layer, head)
    A_ov, B_ov = ov.A[S].float(), ov.B[:, S].float()
    A_qk, B_qk = qk.A[S].float(), qk.B[:, S].float() / attn_scale(m, layer)
    n = S.numel()
    top_out_v = torch.empty(n, min(n_outs, n))
    top_out_i = torch.empty(n, min(n_outs, n), dtype=torch.long)
    for i in range(0, n, block):
        o = A_ov[i : i + block] @ B_ov  # [rows, |S|]
        o = o - o.mean(-1, keepdim=True)
        t = torch.topk(o, top_out_v.shape[1], dim=-1)
        top_out_v[i : i + block], top_out_i[i : i + block] = t.values.cpu(), t.indices.cpu()
    src_weight = top_out_v[:, 0].clamp_min(0).to(A_qk.device)  # [|S|]
    best_v, best_i = torch.empty(0), torch.empty(0, dtype=torch.long)
    best_qk = {}
    for i in range(0, n, block):
        q = A_qk[i : i + block] @ B_qk  # [rows (destinations), |S| (sources)]
        q = q - q.mean(-1, keepdim=True)
        s = (q.clamp_min(0) * src_weight).reshape(-1)
        t = torch.topk(s, min(k, s.numel()))
        flat = t.indices + i * n
        for f, v in zip(flat.tolist(), q.reshape(-1)[t.indices].tolist()):
            best_qk[f] = v
        best_v, best_i = _topk_merge(best_v, best_i, t.values.cpu(), flat.cpu(), k)
    rows = []
    for v, f in zip(best_v.tolist(), best_i.tolist()):
        if v <= 0:
            break
        d, s = divmod(f, n)
        outs = [(token_str(m, int(S[j])), float(val)) for j, val in zip(top_out_i[s].tolist(), top_out_v[s].tolist())]
        rows.append(SkipTrigram(token_str(m, int(S[s])), token_str(m, int(S[d])), outs, best_qk[f],
                                float(top_out_v[s, 0]), v, (int(S[s]), int(S[d]), int(S[top_out_i[s, 0]])),
                                [int(S[j]) for j in top_out_i[s].tolist()]))
    return SkipTrigramTable(layer, head, rows)


@dataclass
class SkipTrigramBug:
    """Predictions the factorisation forces. kind "shared source": the source's OV raises the same outs at every
    destination that attends to it, so each destination also gets the other destinations' outs (Framework:
    "keep … in mind" and "keep … at bay" ⇒ "keep … in bay"). kind "shared destination": the destination attends
    to several sources with different outs; when both are in context it splits between them."""

    kind: str
    source: str | list[str]
    destination: str | list[str]
    outs: list[str]
    crossed: list[str]  # the implied trigrams, written "[s] … [d] → [o]"
    unseen_in_corpus: list[str] = field(default_factory=list)  # crossed ones whose bigram d→o never occurs


def skip_trigram_bugs(table: SkipTrigramTable, bigrams=None, max_bugs: int = 10) -> list[SkipTrigramBug]:
    """Crossed predictions implied by a head's skip-trigram table (see `SkipTrigramBug`). With `bigrams` (an
    `analyses.zero_layer.BigramTable` of the corpus), each crossed `[d] → [o]` whose bigram d→o never occurs
    in the corpus is listed in `unseen_in_corpus`: a prediction the head makes that the text never supports."""
    by_src: dict[int, list[SkipTrigram]] = {}
    by_dst: dict[int, list[SkipTrigram]] = {}
    for r in table.rows:
        by_src.setdefault(r.ids[0], []).append(r)
        by_dst.setdefault(r.ids[1], []).append(r)
    bugs = []
    for rows in by_src.values():
        dests = list(dict.fromkeys(r.destination for r in rows))
        pos = [(o, i) for (o, v), i in zip(rows[0].outs, rows[0].out_ids) if v > 0]
        outs = [o for o, _ in pos]
        if len(dests) < 2 or len(outs) < 2:
            continue
        crossed = [f"[{rows[0].source}] … [{d}] → [{o}]" for d in dests for o in outs]
        unseen = []
        if bigrams is not None:
            dest_ids = {r.destination: r.ids[1] for r in rows}
            for d in dests:
                for o, oi in pos:
                    if float(bigrams.lookup(torch.tensor([dest_ids[d]]), torch.tensor([oi]))[0]) == 0:
                        unseen.append(f"[{rows[0].source}] … [{d}] → [{o}]")
        bugs.append(SkipTrigramBug("shared source", rows[0].source, dests, outs, crossed, unseen))
    for rows in by_dst.values():
        srcs = list(dict.fromkeys(r.source for r in rows))
        outs = list(dict.fromkeys(r.outs[0][0] for r in rows))
        if len(srcs) < 2 or len(outs) < 2:
            continue
        crossed = [f"[{s}] … [{rows[0].destination}] → [{o}]" for s in srcs for o in outs]
        bugs.append(SkipTrigramBug("shared destination", srcs, rows[0].destination, outs, crossed))
    return bugs[:max_bugs]


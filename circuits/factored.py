"""Per-head and full (embedding-to-unembedding) QK and OV circuits, as TransformerLens `FactoredMatrix`es.

Elhage et al. (2021), "A Mathematical Framework for Transformer Circuits", §"Splitting Attention Head terms into
Circuits". The paper writes column vectors (`W_QK = W_Qᵀ W_K`, `W_OV = W_O W_V`, full OV `W_U W_OV W_E`); we use
row vectors (x @ W) as TransformerLens does, so every product below is the transpose of the paper's and reads
left to right in the order the residual stream meets the weights.

Every function takes `layer` and `head` optionally: both given → one head's `[.., .]` matrix; `layer` only →
`[n_heads, ., .]`; neither → the stack `[n_layers, n_heads, ., .]`. Nothing here forms a `d_vocab × d_vocab`
matrix: call `.AB` on the result to materialise it.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from models.arch.positions import SCHEMES
from models.arch.tl_compat import FactoredMatrix

from .checks import check_head_pair, check_layer_head
from .interface import positional_scheme, select, warn_if_unfolded


def qk_circuit(model, layer: int | None = None, head: int | None = None) -> FactoredMatrix:
    """`W_QK = W_Q W_Kᵀ` `[d_model, d_model]` (row form; the paper's `W_Qᵀ W_K`), inner dim d_head.

    Attention score (before the 1/√d_head scale) from a query residual `x_q` to a key residual `x_k` is
    `x_q W_QK x_kᵀ` (Framework, "QK circuit")."""
    layer, head = check_layer_head(model, layer, head, "qk_circuit")
    warn_if_unfolded(model)
    return FactoredMatrix(select(model.W_Q, layer, head), select(model.W_K, layer, head).transpose(-2, -1))


def ov_circuit(model, layer: int | None = None, head: int | None = None) -> FactoredMatrix:
    """`W_OV = W_V W_O` `[d_model, d_model]` (row form; the paper's `W_O W_V`), inner dim d_head.

    A head that attends fully to a key residual `x_k` writes `x_k W_OV` (Framework, "OV circuit")."""
    layer, head = check_layer_head(model, layer, head, "ov_circuit")
    warn_if_unfolded(model)
    return FactoredMatrix(select(model.W_V, layer, head), select(model.W_O, layer, head))


class PositionalQK(NamedTuple):
    """The four parts of a full QK circuit when the query and key inputs are `W_E[t] + W_pos[i]`.

    Rows index the query (destination), columns the key (source): `tok_pos[t, j]` is the score of a query
    token t for the key at position j."""

    tok_tok: FactoredMatrix  # [d_vocab, d_vocab]
    tok_pos: FactoredMatrix  # [d_vocab, n_ctx]
    pos_tok: FactoredMatrix  # [n_ctx, d_vocab]
    pos_pos: FactoredMatrix  # [n_ctx, n_ctx]

    def total(self, query_tokens: torch.Tensor, key_tokens: torch.Tensor) -> torch.Tensor:
        """Dense scores for `query_tokens [q]` at positions 0..q-1 against `key_tokens [k]` at 0..k-1."""
        qi, ki = torch.arange(len(query_tokens)), torch.arange(len(key_tokens))
        part = lambda fm, rows, cols: fm.A[..., rows, :] @ fm.B[..., :, cols]
        return (part(self.tok_tok, query_tokens, key_tokens) + part(self.tok_pos, query_tokens, ki)
                + part(self.pos_tok, qi, key_tokens) + part(self.pos_pos, qi, ki))


def full_qk_circuit(model, layer: int | None = None, head: int | None = None, positional: bool = False):
    """Full QK circuit `W_E W_QK W_Eᵀ` `[d_vocab, d_vocab]` (paper, column form: `W_Eᵀ W_QK W_E`).

    Entry [t, s] is the pre-scale attention score of a query token t for a key token s along the direct path
    (Framework, "one-layer attention-only transformers"). With `positional=True` (positions from a table:
    standard, sinusoidal or shortformer) returns `PositionalQK`, whose parts sum to
    `(W_E[t] + W_pos[i]) W_QK (W_E[s] + W_pos[j])ᵀ`. Factored with inner dimension d_head."""
    qk = qk_circuit(model, layer, head)
    W_E = model.W_E
    tok_q, k_tail = W_E @ qk.A, qk.B  # [.., d_vocab, d_head], [.., d_head, d_model]
    if not positional:
        return FactoredMatrix(tok_q, k_tail @ W_E.T)
    if not positional_scheme(model).table:
        raise ValueError(
            f"positional=True needs a positional table (one of {tuple(n for n, s in SCHEMES.items() if s.table)}); "
            f"this model has positional_embedding_type={model.cfg.positional_embedding_type!r}"
        )
    W_pos = model.W_pos
    pos_q, tok_k, pos_k = W_pos @ qk.A, k_tail @ W_E.T, k_tail @ W_pos.T
    return PositionalQK(FactoredMatrix(tok_q, tok_k), FactoredMatrix(tok_q, pos_k),
                        FactoredMatrix(pos_q, tok_k), FactoredMatrix(pos_q, pos_k))


def full_ov_circuit(model, layer: int | None = None, head: int | None = None) -> FactoredMatrix:
    """Full OV circuit `W_E W_OV W_U` `[d_vocab, d_vocab]` (paper, column form: `W_U W_OV W_E`).

    Entry [s, o] is how much attending to a source token s raises the logit of output token o along the
    direct path (Framework, "OV circuit"). Factors `W_E W_V` `[d_vocab, d_head]` and `W_O W_U`
    `[d_head, d_vocab]`."""
    ov = ov_circuit(model, layer, head)
    return FactoredMatrix(model.W_E @ ov.A, ov.B @ model.W_U)


def k_composition_circuit(model, later: tuple[int, int], earlier: tuple[int, int]) -> FactoredMatrix:
    """K-composition circuit `W_E W_QK^{h2} (W_OV^{h1})ᵀ W_Eᵀ` `[d_vocab, d_vocab]`, h2 = `later`, h1 = `earlier`.

    Entry [t, s] is the pre-scale score of a query token t for a key position whose residual holds h1's output
    after h1 attended fully to a token s: the key input is `W_E[s] W_OV^{h1}`, so the score is
    `W_E[t] W_QK^{h2} (W_E[s] W_OV^{h1})ᵀ` (Framework, "Two-layer attention-only transformers"; paper, column
    form: `W_Eᵀ W_QK^{h2} W_OV^{h1} W_E`). For an induction head composing with a previous-token head, s is the
    key's previous token and positive eigenvalues mean "same token matches". Factored with inner dim d_head."""
    (l2, h2), (l1, h1) = check_head_pair(model, later, "later"), check_head_pair(model, earlier, "earlier")
    if not l1 < l2:
        raise ValueError(f"the earlier head's layer ({l1}) must be strictly before the later head's ({l2})")
    qk, ov = qk_circuit(model, l2, h2), ov_circuit(model, l1, h1)
    W_E = model.W_E
    # (W_E W_OV W_K)ᵀ = (((W_E W_V) W_O) W_K)ᵀ: d_vocab × d_head products only.
    key_side = (W_E @ ov.A) @ (ov.B @ qk.B.transpose(-2, -1))  # [d_vocab, d_head]
    return FactoredMatrix(W_E @ qk.A, key_side.transpose(-2, -1))

"""Circuits of an encoder–decoder model's cross-attention heads (`models.HookedEncoderDecoder`), factored.

A cross-attention head reads its queries from the decoder's residual stream and its keys and values from the
encoder's output. The seed note (`shared/seeds/002_76b955394c28d955.txt`, "Caveat for Cross-attention") writes it in
the tensor-product notation of Elhage et al. (2021), §"Notation / Tensor products":
`h_cross(x) = (A_cross ⊗ W_O W_V) · x_encoder`, with a non-square pattern `A_cross [target, source]`
(`cross_attention_map`). Along the direct path (the encoder's and decoder's own layers skipped, as the Framework's
full circuits skip every other layer) the decoder's query input at target position i holding token t is
`W_E_tgt[t] + W_pos_tgt[i]` and the key input at source position j holding token s is `W_E_src[s] + W_pos_src[j]`,
so the Framework's full circuits become

- full QK: `(W_E_tgt[t] + W_pos_tgt[i]) W_QK^cross (W_E_src[s] + W_pos_src[j])ᵀ` (`full_cross_qk_circuit`),
- full OV: `W_E_src W_OV^cross W_U` (`full_cross_ov_circuit`): attending to a source token s raises the target
  logits of row s; with a shared vocabulary its eigenvalues say whether the head copies (`cross_copying_scores`),
  and its top-k diagonal accuracy for how many tokens (`cross_diagonal_accuracy`).

`stack_view(model, "cross")` presents the cross-attention stack through the `circuits` interface (`W_Q` … `W_O`,
`W_E` = the source embedding its values read, `W_U`, norms), so `qk_circuit`, `ov_circuit`, `full_ov_circuit` and
`copying_scores` apply unchanged; `"decoder"` (the causal self-attention, `W_E` = the target embedding) and
`"encoder"` likewise. Row-vector convention throughout (`x @ W`), as in `circuits.factored`.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from models.arch.kind import ENCODER_DECODER, model_kind
from models.arch.tl_compat import FactoredMatrix
from models.errors import ConfigError

from .eigen import copying_scores
from .factored import PositionalQK, full_ov_circuit, ov_circuit, qk_circuit
from .tensor_product import TensorProduct

#: stack → (weight prefix, block list, module, norm before it, embedding its values read)
STACKS = {"encoder": ("enc", "encoder", "attn", "ln1", "W_E_src"),
          "decoder": ("dec", "decoder", "attn", "ln1", "W_E_tgt"),
          "cross": ("cross", "decoder", "cross_attn", "ln2", "W_E_src")}


def check_encoder_decoder(model, what: str):
    """`model`, or `TypeError` unless it is an encoder–decoder (`models.model_kind`)."""
    try:
        kind = model_kind(model)
    except ConfigError:  # not a model at all
        kind = None
    if kind != ENCODER_DECODER:
        raise TypeError(f"{what} needs an encoder-decoder model (models.HookedEncoderDecoder), got "
                        f"{type(model).__name__}")
    return model


class StackView:
    """One attention stack of an encoder–decoder model seen through the `circuits` interface (module docstring):
    `cfg.n_layers` is the stack's depth, `W_Q/W_K/W_V/W_O/b_*` its stacked weights, `W_E` the embedding its
    values read along the direct path, `W_U`/`b_U` the target unembedding, `blocks[l].ln1` the norm before the
    stack's attention in layer l, `ln_final` the decoder's final norm. Read-only: weights are the model's own."""

    def __init__(self, model, stack: str):
        check_encoder_decoder(model, "stack_view")
        if stack not in STACKS:
            raise ValueError(f"stack={stack!r} is not one of {', '.join(map(repr, STACKS))}")
        prefix, blocks, module, norm, embed = STACKS[stack]
        self.model, self.stack, self._prefix, self._embed = model, stack, prefix, embed
        c = model.cfg
        sub = c.encoder_cfg if stack == "encoder" else c.decoder_cfg
        self.cfg = SimpleNamespace(**{k: getattr(sub, k) for k in (
            "n_layers", "n_heads", "d_model", "d_head", "positional_embedding_type", "normalization_type", "eps",
            "attn_only", "attention_dir", "n_ctx")}, d_vocab=c.d_vocab_tgt, d_vocab_src=c.d_vocab_src,
            model_name=f"{getattr(c, 'model_name', 'model')}:{stack}")
        layers = getattr(model, blocks)
        self.blocks = [SimpleNamespace(ln1=getattr(b, norm)) for b in layers]
        self.ln_final = model.decoder_ln_final

    def __getattr__(self, name: str):
        if name in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O", "QK", "OV"):
            return getattr(self.model, f"{self._prefix}_{name}")
        if name in ("W_U", "b_U"):
            return getattr(self.model, name)
        if name == "W_E":
            return getattr(self.model, self._embed)
        raise AttributeError(f"{type(self).__name__} of the {self.stack} stack has no attribute {name!r}")


def stack_view(model, stack: str = "cross") -> StackView:
    """`StackView` of `stack` ("encoder", "decoder" or "cross") of an encoder–decoder model."""
    return StackView(model, stack)


def cross_qk_circuit(model, layer: int | None = None, head: int | None = None) -> FactoredMatrix:
    """`W_QK^cross = W_Q W_Kᵀ` `[d_model, d_model]` of cross-attention (Elhage et al. 2021, "QK circuit"): the
    pre-scale score of a decoder residual `x_q` for an encoder output `x_k` is `x_q W_QK x_kᵀ`."""
    return qk_circuit(stack_view(model, "cross"), layer, head)


def cross_ov_circuit(model, layer: int | None = None, head: int | None = None) -> FactoredMatrix:
    """`W_OV^cross = W_V W_O` `[d_model, d_model]` (the seed note's `W_O W_V`, column form): a head attending
    fully to source position j writes `x_encoder[j] W_OV` into the decoder (Elhage et al. 2021, "OV circuit")."""
    return ov_circuit(stack_view(model, "cross"), layer, head)


def full_cross_qk_circuit(model, layer: int | None = None, head: int | None = None, positional: bool = False):
    """Full cross-attention QK circuit `W_E_tgt W_QK^cross W_E_srcᵀ` `[d_vocab_tgt, d_vocab_src]`: entry [t, s] is
    the pre-scale score of a decoder query token t for an encoder key token s along the direct path (Elhage et al.
    2021, full QK circuit, with the query and key sides embedded by their own vocabularies).

    With `positional=True` (a positional table: standard, sinusoidal, shortformer) returns `PositionalQK`
    (`circuits.factored`), query rows = target tokens / positions, key columns = source tokens / positions, whose
    parts sum to `(W_E_tgt[t] + W_pos_tgt[i]) W_QK (W_E_src[s] + W_pos_src[j])ᵀ`; `total(tgt, src)` gives the dense
    scores. Rotary and ALiBi do not act on cross-attention, so positions there reach it only through the layers
    (no direct positional part: refused). Factored with inner dimension d_head."""
    qk = cross_qk_circuit(model, layer, head)
    tok_q, k_tail = model.W_E_tgt @ qk.A, qk.B  # [.., d_vocab_tgt, d_head], [.., d_head, d_model]
    tok_k = k_tail @ model.W_E_src.T
    if not positional:
        return FactoredMatrix(tok_q, tok_k)
    scheme = model.cfg.positions
    if not scheme.table:
        raise ConfigError(f"positional=True needs a positional table; this model has positional_embedding_type="
                          f"{model.cfg.positional_embedding_type!r}, whose positions do not enter cross-attention's "
                          "direct path")
    pos_q = scheme.rows(model.W_pos_tgt, model.cfg.n_ctx_tgt) @ qk.A
    pos_k = k_tail @ model.cfg.encoder_cfg.positions.rows(model.W_pos_src, model.cfg.n_ctx_src).T
    return PositionalQK(FactoredMatrix(tok_q, tok_k), FactoredMatrix(tok_q, pos_k),
                        FactoredMatrix(pos_q, tok_k), FactoredMatrix(pos_q, pos_k))


def full_cross_ov_circuit(model, layer: int | None = None, head: int | None = None) -> FactoredMatrix:
    """Full cross-attention OV circuit `W_E_src W_V W_O W_U` `[d_vocab_src, d_vocab_tgt]` (Elhage et al. 2021,
    full OV circuit; paper, column form `W_U W_OV W_E`): entry [s, o] is how much attending to source token s raises
    the logit of target token o along the direct path. Factors `W_E_src W_V` and `W_O W_U`."""
    return full_ov_circuit(stack_view(model, "cross"), layer, head)


def check_shared_vocabulary(model, what: str) -> None:
    """Copying needs source id k and target id k to be the same token: equal sizes, and equal symbols when the
    model carries a seq2seq tokenizer. Else a `ConfigError` naming the vocabularies."""
    c = model.cfg
    tok = getattr(model, "tokenizer", None)
    same = c.d_vocab_src == c.d_vocab_tgt
    if same and tok is not None and hasattr(tok, "source") and hasattr(tok, "target"):
        same = list(tok.source.tokens) == list(tok.target.tokens)
    if not same:
        raise ConfigError(f"{what} needs source and target vocabularies that share their tokens (a copying score "
                          f"compares source id k with target id k); this model has d_vocab_src={c.d_vocab_src}, "
                          f"d_vocab_tgt={c.d_vocab_tgt}" + ("" if c.d_vocab_src != c.d_vocab_tgt else
                                                            " with different symbols"))


def cross_copying_scores(model) -> torch.Tensor:
    """`[n_decoder_layers, n_heads]` copying scores `Σλ/Σ|λ|` of the full cross-attention OV circuits
    `W_E_src W_V W_O W_U` (Elhage et al. 2021, "Copying / Primarily Positive Eigenvalues"), computed by
    `circuits.eigen.copying_scores` on the cross-attention stack. Needs a shared vocabulary
    (`check_shared_vocabulary`)."""
    check_encoder_decoder(model, "cross_copying_scores")
    check_shared_vocabulary(model, "cross_copying_scores")
    return copying_scores(stack_view(model, "cross"))


def cross_diagonal_accuracy(model, ids=None, k=(1, 5)) -> dict[int, torch.Tensor]:
    """`{k: [n_decoder_layers, n_heads]}` top-k diagonal accuracy of the full cross-attention OV circuits
    `W_E_src W_V W_O W_U` over the token ids `ids` (default: all; rows and columns both restricted to them): the
    share of source tokens s whose own target logit is among the k that attending to s raises most (ARENA 1.2,
    "Full OV circuit", via `circuits.diagonal.diagonal_rank_stats`). The per-token reading beside the eigenvalue
    score of `cross_copying_scores`, which can be near 1 while few tokens map to themselves. Needs a shared
    vocabulary (`check_shared_vocabulary`)."""
    from .diagonal import diagonal_rank_stats

    check_encoder_decoder(model, "cross_diagonal_accuracy")
    check_shared_vocabulary(model, "cross_diagonal_accuracy")
    fm = full_cross_ov_circuit(model)
    if ids is not None:
        S = torch.as_tensor(ids, dtype=torch.long, device=fm.A.device).reshape(-1)
        fm = FactoredMatrix(fm.A[..., S, :], fm.B[..., S])
    return diagonal_rank_stats(fm, k=k)


def cross_attention_map(pattern: torch.Tensor, W_OV: torch.Tensor) -> TensorProduct:
    """The cross-attention head as `A_cross ⊗ W_OV` (seed note 002, after Elhage et al. 2021 §"Tensor products"):
    `pattern [..., target, source]`, `W_OV = W_V W_O` `[d_model, d_model]` (row form) or a `FactoredMatrix`;
    `.apply(x_encoder [..., source, d_model])` is the head's output `[..., target, d_model]` without `b_V`/`b_O`
    (`A_cross x_encoder W_V W_O`)."""
    W = W_OV.AB if isinstance(W_OV, FactoredMatrix) else W_OV
    return TensorProduct(pattern, W)

"""A hand-built encoder–decoder that reverses sources of a fixed length, for tests of cross-attention circuits and of
alignment and copying-head detectors (the encoder–decoder counterpart of `circuits.testing.build_induction_model`).

Every weight is set by hand on orthogonal subspaces of the residual stream (no training), so the mechanism is known
exactly (Elhage et al. 2021: a cross-attention head is `A_cross ⊗ W_OV`, seed note 002):

    residual stream = [ src tok (V) | tgt tok (V) | src pos (L) | tgt pos (n_ctx_tgt) | out (V) ]

- `W_E_src[s] = e_srctok[s]`, `W_E_tgt[t] = e_tgttok[t]`, `W_pos_src[j] = e_srcpos[j]`, `W_pos_tgt[i] = e_tgtpos[i]`
  (standard positions, added to the residual streams); `W_U` reads `out`: logit o = `x · e_out[o]`.
- Encoder and decoder self-attention: all weights zero (they write nothing).
- C0H0, the alignment head: its QK circuit reads positions only, query at target position i < L matches key at
  source position L − 1 − i with pre-scale score `gain` (all others 0): the anti-diagonal. Its OV circuit copies
  `src tok` → `out` (full OV circuit `W_E_src W_OV W_U = I`, copying score +1).
- C0H1: all weights zero (uniform attention, writes nothing; copying score 0).

Decoder position i (its input BOS followed by the target) predicts target token i = source token L − 1 − i, for
i < L; the position after the last (EOS) is not built.
"""

from __future__ import annotations

import math

import torch

from models.arch.encoder_decoder import HookedEncoderDecoder
from models.arch.encoder_decoder_config import EncoderDecoderConfig


def build_reversal_model(d_vocab: int = 8, length: int = 5, gain: float = 60.0,
                         dtype: str = "float64") -> HookedEncoderDecoder:
    """The model of the module docstring for sources of exactly `length` ids (vocabulary of `d_vocab` ids, the
    first three the specials). `gain`: the aligned pair's attention score after the 1/√d_head scale (the other
    source positions get 0, so the aligned one has weight 1 / (1 + (L − 1) e^{−gain}))."""
    V, L, T = d_vocab, length, length + 2
    d_head = max(V, L)
    cfg = EncoderDecoderConfig(d_model=3 * V + L + T, d_vocab_src=V, d_vocab_tgt=V, n_ctx_src=L, n_ctx_tgt=T,
                               n_heads=2, d_head=d_head, normalization_type=None, use_bias=False, dtype=dtype,
                               model_name="hand-built-reversal", seed=0)
    model = HookedEncoderDecoder(cfg)
    src_tok, tgt_tok, src_pos, tgt_pos, out = 0, V, 2 * V, 2 * V + L, 2 * V + L + T
    c = math.sqrt(gain * math.sqrt(d_head))  # W_Q and W_K each carry √(gain·√d_head)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        eye = torch.eye(V, dtype=cfg.torch_dtype)
        model.embed_src.W_E[:, src_tok:src_tok + V] = eye
        model.embed_tgt.W_E[:, tgt_tok:tgt_tok + V] = eye
        model.pos_embed_src.W_pos[:, src_pos:src_pos + L] = torch.eye(L, dtype=cfg.torch_dtype)
        model.pos_embed_tgt.W_pos[:, tgt_pos:tgt_pos + T] = torch.eye(T, dtype=cfg.torch_dtype)
        model.unembed.W_U[out:out + V] = eye
        cross = model.decoder[0].cross_attn
        for i in range(L):
            cross.W_Q[0, tgt_pos + i, i] = c
            cross.W_K[0, src_pos + L - 1 - i, i] = c
        cross.W_V[0, src_tok:src_tok + V, :V] = eye
        cross.W_O[0, :V, out:out + V] = eye
    return model.eval()


def reversal_sources(d_vocab: int = 8, length: int = 5, batch: int = 16, seed: int = 0):
    """`(src [batch, length], tgt [batch, length + 1])`: random non-special source ids and the decoder input BOS
    followed by the reversed source."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, d_vocab, (batch, length), generator=g)
    tgt = torch.cat([torch.ones(batch, 1, dtype=torch.long), src.flip(-1)], dim=1)
    return src, tgt

"""Alignment and copying heads of an encoder–decoder model's cross-attention.

An **alignment head** is a cross-attention head that attends, from the decoder position that predicts a target
token, to the source position(s) that token comes from: the anti-diagonal for reversal, the identity for copying,
the sorted order for sorting (the attention alignments of Bahdanau et al. 2015, read per head as Voita et al. 2019
read "positional" and "rare-token" heads). Its **alignment score** is the attention mass it puts there, averaged
over the predicted tokens (`alignment_scores`). A **cross-attention copying head** is one whose full OV circuit
`W_E_src W_V W_O W_U` has a copying score `Σλ/Σ|λ|` near 1 (Elhage et al. 2021, `circuits.cross_copying_scores`).
Together they are the circuit "find the aligned source token and copy it".
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from circuits.cross_attention import check_encoder_decoder, check_shared_vocabulary, cross_copying_scores


@dataclass(frozen=True)
class ScoredHead:
    """A cross-attention head `(layer, head)` and its score."""

    layer: int
    head: int
    score: float

    @property
    def label(self) -> str:
        return f"C{self.layer}H{self.head}"


def task_alignment(task, src: torch.Tensor, src_mask: torch.Tensor, n_tgt: int) -> torch.Tensor | None:
    """`[batch, n_tgt, src_pos]` bool: row i marks the source positions that decoder position i (which predicts
    target token i; its input is BOS then the target) should attend to, from `task.alignment` of each source
    (`models.data.seq2seq.Task`); rows past the target are False. None when the task's target is not a
    rearrangement of its source (the date task)."""
    out = torch.zeros(src.shape[0], n_tgt, src.shape[1], dtype=torch.bool)
    for b, (s, m) in enumerate(zip(src.cpu(), src_mask.cpu())):
        a = task.alignment(s[m].numpy())
        if a is None:
            return None
        a = torch.as_tensor(a)[:n_tgt]
        out[b, : a.shape[0], : a.shape[1]] = a
    return out


@torch.no_grad()
def alignment_scores(model, src, tgt, aligned: torch.Tensor, src_mask=None, tgt_mask=None) -> torch.Tensor:
    """`[n_decoder_layers, n_heads]` alignment scores: for each cross-attention head, the mean over the
    (sequence, decoder position) pairs with an aligned source position of `Σ_j A[b, h, i, j] · aligned[b, i, j]`,
    the attention the position predicting a target token pays to where that token comes from (module docstring).
    `aligned [batch, tgt_pos, src_pos]` bool (`task_alignment`); float64. 1 for a head that attends only there."""
    check_encoder_decoder(model, "alignment_scores")
    aligned = torch.as_tensor(aligned).to(torch.bool)
    if aligned.shape != (*torch.as_tensor(tgt).shape, torch.as_tensor(src).shape[-1]):
        raise ValueError(f"aligned must be [batch, tgt_pos, src_pos] = {(*tgt.shape, src.shape[-1])}, got "
                         f"{tuple(aligned.shape)}")
    counted = aligned.any(-1)  # [batch, tgt_pos]
    if not counted.any():
        raise ValueError("aligned marks no source position: nothing to score")
    L = model.cfg.n_decoder_layers
    names = {f"decoder.{layer}.cross_attn.hook_pattern" for layer in range(L)}
    _, cache = model.run_with_cache(src, tgt, src_mask, tgt_mask, names_filter=lambda n: n in names,
                                    return_cache_object=False)
    rows = []
    for layer in range(L):
        pattern = cache[f"decoder.{layer}.cross_attn.hook_pattern"].to(torch.float64).cpu()  # [b, head, tgt, src]
        mass = (pattern * aligned[:, None]).sum(-1)  # [batch, head, tgt_pos]
        rows.append(mass.transpose(0, 1)[:, counted].mean(-1))
    return torch.stack(rows)


def ranked(scores: torch.Tensor, threshold: float) -> list[ScoredHead]:
    """The heads of a `[layers, heads]` score table with score ≥ `threshold`, best first."""
    out = [ScoredHead(layer, head, float(scores[layer, head])) for layer in range(scores.shape[0])
           for head in range(scores.shape[1]) if float(scores[layer, head]) >= threshold]
    return sorted(out, key=lambda s: -s.score)


def alignment_heads(model, src, tgt, aligned, src_mask=None, tgt_mask=None, threshold: float = 0.9
                    ) -> list[ScoredHead]:
    """Cross-attention heads whose `alignment_scores` reach `threshold`, best first."""
    return ranked(alignment_scores(model, src, tgt, aligned, src_mask, tgt_mask), threshold)


def cross_copying_heads(model, threshold: float = 0.9) -> list[ScoredHead]:
    """Cross-attention heads whose full OV circuit's copying score (`circuits.cross_copying_scores`) reaches
    `threshold`, best first; a `ConfigError` when source and target vocabularies differ."""
    check_encoder_decoder(model, "cross_copying_heads")
    check_shared_vocabulary(model, "cross_copying_heads")
    return ranked(cross_copying_scores(model), threshold)


@torch.no_grad()
def mean_cross_patterns(model, src, tgt, src_mask=None, tgt_mask=None) -> torch.Tensor:
    """`[n_decoder_layers, n_heads, tgt_pos, src_pos]`: every cross-attention pattern averaged over the batch."""
    check_encoder_decoder(model, "mean_cross_patterns")
    L = model.cfg.n_decoder_layers
    names = {f"decoder.{layer}.cross_attn.hook_pattern" for layer in range(L)}
    _, cache = model.run_with_cache(src, tgt, src_mask, tgt_mask, names_filter=lambda n: n in names,
                                    return_cache_object=False)
    return torch.stack([cache[f"decoder.{layer}.cross_attn.hook_pattern"].to(torch.float64).mean(0).cpu()
                        for layer in range(L)])

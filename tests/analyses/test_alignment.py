"""Alignment and cross-attention copying heads: exact on the hand-built reversal model, a loop reference on random
weights, the task alignments; the encoder–decoder report on the hand-built model with every figure checked."""

import matplotlib
import pytest
import torch
from helpers import checked_report, randomize

from analyses.alignment import (
    alignment_heads,
    alignment_scores,
    cross_copying_heads,
    mean_cross_patterns,
    task_alignment,
)
from analyses.figure_checks import figure_problems
from circuits.encdec_testing import build_reversal_model, reversal_sources
from models import EncoderDecoderConfig, HookedEncoderDecoder
from models.data.seq2seq import make_task
from models.errors import ConfigError

matplotlib.use("Agg")


def anti_diagonal(batch, length, n_tgt):
    a = torch.zeros(batch, n_tgt, length, dtype=torch.bool)
    for i in range(length):
        a[:, i, length - 1 - i] = True
    return a


def test_hand_built_alignment_and_copying_heads_detected_exactly():
    m = build_reversal_model(d_vocab=8, length=5)
    src, tgt = reversal_sources(8, 5, batch=16)
    assert torch.equal(m(src, tgt)[:, :5].argmax(-1), src.flip(-1))  # it reverses
    scores = alignment_scores(m, src, tgt, anti_diagonal(16, 5, 6))
    assert abs(float(scores[0, 0]) - 1.0) < 1e-12  # C0H0 attends only to the aligned position
    assert abs(float(scores[0, 1]) - 0.2) < 1e-12  # C0H1: uniform over 5 source positions
    heads = alignment_heads(m, src, tgt, anti_diagonal(16, 5, 6))
    assert [(h.layer, h.head, h.label) for h in heads] == [(0, 0, "C0H0")]
    copying = cross_copying_heads(m)
    assert [h.label for h in copying] == ["C0H0"] and abs(copying[0].score - 1.0) < 1e-12
    # the identity alignment (copying) is not what this model does
    eye = torch.zeros(16, 6, 5, dtype=torch.bool)
    eye[:, range(5), range(5)] = True
    assert alignment_heads(m, src, tgt, eye) == []


def test_alignment_scores_match_a_loop_on_random_weights():
    cfg = EncoderDecoderConfig(d_model=12, d_vocab_src=9, d_vocab_tgt=9, n_ctx_src=6, n_ctx_tgt=5, n_heads=3,
                               n_decoder_layers=2, dtype="float64", seed=1)
    m = randomize(HookedEncoderDecoder(cfg), seed=1).eval()
    g = torch.Generator().manual_seed(0)
    src, tgt = torch.randint(3, 9, (4, 6), generator=g), torch.randint(3, 9, (4, 5), generator=g)
    aligned = torch.rand(4, 5, 6, generator=g) < 0.3
    aligned[:, 2] = False  # a position with nothing aligned is left out of the mean
    scores = alignment_scores(m, src, tgt, aligned)
    _, cache = m.run_with_cache(src, tgt)
    for layer in range(2):
        A = cache[f"decoder.{layer}.cross_attn.hook_pattern"]
        for h in range(3):
            vals = [sum(float(A[b, h, i, j]) for j in range(6) if aligned[b, i, j])
                    for b in range(4) for i in range(5) if aligned[b, i].any()]
            assert abs(float(scores[layer, h]) - sum(vals) / len(vals)) < 1e-12
    mean = mean_cross_patterns(m, src, tgt)
    torch.testing.assert_close(mean[1], cache["decoder.1.cross_attn.hook_pattern"].mean(0))


def test_task_alignment_reverse_and_sort():
    src = torch.tensor([[5, 3, 4, 0], [7, 7, 3, 0]])
    mask = src != 0
    rev = task_alignment(make_task("seq2seq:reverse"), src, mask, 5)
    assert rev[0, 0, 2] and rev[0, 2, 0] and rev[0].sum() == 3 and not rev[:, 3:].any()
    srt = task_alignment(make_task("seq2seq:sort"), src, mask, 5)
    assert srt[0, 0].tolist() == [False, True, False, False]  # the smallest symbol (3) sits at position 1
    assert srt[1, 1].tolist() == [True, True, False, False]  # repeated symbols: either position
    assert task_alignment(make_task("seq2seq:date"), torch.tensor([[3, 4]]), torch.tensor([[True, True]]), 3) is None


def test_bad_input_named():
    m = build_reversal_model()
    src, tgt = reversal_sources()
    with pytest.raises(ValueError, match=r"aligned must be \[batch, tgt_pos, src_pos\]"):
        alignment_scores(m, src, tgt, torch.ones(16, 5, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="marks no source"):
        alignment_scores(m, src, tgt, torch.zeros(16, 6, 5, dtype=torch.bool))
    cfg = EncoderDecoderConfig(d_model=8, d_vocab_src=9, d_vocab_tgt=7, n_ctx_src=4, n_ctx_tgt=4, seed=0)
    with pytest.raises(ConfigError, match="d_vocab_src=9, d_vocab_tgt=7"):
        cross_copying_heads(HookedEncoderDecoder(cfg))


@pytest.mark.e2e
def test_encdec_report_on_the_hand_built_model(tmp_path, monkeypatch):
    m = build_reversal_model(d_vocab=8, length=5)
    m.cfg.extra = {"task": "seq2seq:reverse", "task_symbols": 5, "task_min_len": 5, "task_max_len": 5}
    found, r = checked_report(monkeypatch, m, tmp_path / "r")
    assert r.sections == ["encdec_overview", "alignment", "cross_copying", "cross_qk_positional", "encdec_paths",
                          "encdec_discovery"]
    assert set(found) == {"cross_attention_patterns", "cross_ov_circuits", "cross_qk_positional", "discovery_circuit"}
    assert {k: v for k, v in found.items() if v} == {}
    md = r.path.read_text()
    assert "Alignment heads (score ≥ 0.9): **C0H0** (1.000)." in md
    assert ("Cross-attention copying heads (copying score ≥ 0.9 and top-1 diagonal accuracy ≥ 0.5): **C0H0** "
            "(1.000, top-1 100%).") in md
    assert "| C0H0\\[src\\] | 1 |" in md  # the copying path carries the correct token (label escaped for Markdown)


def test_cross_pattern_figure_without_alignment_passes_checks():
    """`circuits attention`'s figure for encoder–decoder models: every head, no alignment marked."""
    from analyses.encdec_plots import plot_cross_patterns

    pats = torch.rand(2, 2, 9, 8).softmax(-1)
    fig = plot_cross_patterns(pats, None, [f"{j}:x" for j in range(8)], ["<bos>"] + list("hgfedcba"),
                              ylabel="decoder input (BOS first)")
    assert figure_problems(fig) == []

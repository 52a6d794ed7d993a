"""Activation patching and metrics (`analyses.patching`): agreement with TransformerLens 4.3's own sweeps called
directly, both directions, metrics against hand-computed values, our model and a TransformerLens bridge, and bad
input (named `PatchingError`s)."""

from __future__ import annotations

import pytest
import torch

import models
from analyses import patching as P
from analyses.patching.activation import _TL_SWEEPS, KINDS
from circuits.testing import random_model
from models.arch.tl_compat import patching

tlp = patching()


def _model(**kw):
    d = dict(n_layers=2, n_heads=3, positional="standard", normalization="LN", attn_only=False, dtype="float32")
    d.update(kw)
    return random_model(**d).eval()


def _prompts(model, batch=2, n=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    clean = torch.randint(0, model.cfg.d_vocab, (batch, n), generator=g)
    corrupt = clean.clone()
    corrupt[:, 2:4] = torch.randint(0, model.cfg.d_vocab, (batch, 2), generator=g)
    return clean, corrupt


def _metric(model, batch=2):
    return P.metric("logit_diff", P.answers(model, batch, correct=[3, 5][:batch], wrong=[4, 6][:batch],
                                            positions=[-1, -2]))


# --- metrics ------------------------------------------------------------------------------------------
def test_metrics_match_hand_computed_values():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 9, generator=g, dtype=torch.float64)
    ans = P.Answers(torch.tensor([[4, 2], [-1, 0]]), torch.tensor([[1, 2], [3, 4]]), torch.tensor([[5, 6], [7, 8]]))
    rows = [(0, 4, 1, 5), (0, 2, 2, 6), (1, 4, 3, 7), (1, 0, 4, 8)]
    ld = [[logits[b, p, c] - logits[b, p, w] for b2, p, c, w in rows if b2 == b] for b in (0, 1)]
    lp = logits.log_softmax(-1)
    loss = [[-lp[b, p, c] for b2, p, c, _ in rows if b2 == b] for b in (0, 1)]
    torch.testing.assert_close(P.logit_difference(logits, ans), torch.tensor(ld, dtype=torch.float64).mean(-1))
    torch.testing.assert_close(P.answer_loss(logits, ans), torch.tensor(loss, dtype=torch.float64).mean(-1))
    torch.testing.assert_close(P.answer_probability(logits, ans), torch.tensor(loss).neg().exp().mean(-1).double())
    assert P.normalized(3.0, clean=5.0, corrupt=1.0) == 0.5 and P.normalized(2.0, clean=1.0, corrupt=5.0) == 0.75


def test_answers_broadcast_and_next_token_answers():
    m = _model()
    a = P.answers(m, 3, correct=4, wrong=[1, 2, 3], positions=[-1, -2])
    assert a.positions.shape == a.correct.shape == a.wrong.shape == (3, 2)
    assert a.correct.unique().tolist() == [4] and a.wrong[:, 0].tolist() == [1, 2, 3]
    t = torch.arange(12).reshape(2, 6)
    n = P.next_token_answers(t, [2, 3])
    assert n.correct.tolist() == [[3, 4], [9, 10]]


# --- activation patching against TransformerLens ------------------------------------------------------
@pytest.mark.parametrize("kind,by_pos", [(k, bp) for (k, bp) in _TL_SWEEPS])
def test_activation_patching_equals_transformer_lens(kind, by_pos):
    m = _model()
    clean, corrupt = _prompts(m)
    met = _metric(m)
    ours = P.activation_patching(m, clean, corrupt, met, kind=kind, by_pos=by_pos, progress=False)
    noising = P.activation_patching(m, clean, corrupt, met, kind=kind, by_pos=by_pos, direction="noising",
                                    progress=False)
    _, clean_cache = m.run_with_cache(clean)
    _, corrupt_cache = m.run_with_cache(corrupt)
    sweep = getattr(tlp, _TL_SWEEPS[(kind, by_pos)])
    scalar = lambda logits: met(logits).mean()
    ref = sweep(m, corrupt, clean_cache, scalar)
    ref_noising = sweep(m, clean, corrupt_cache, scalar)
    assert ours.axes == (KINDS[kind][2] if by_pos else KINDS[kind][1])
    torch.testing.assert_close(ours.values.float(), ref.float(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(noising.values.float(), ref_noising.float(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.clean, met(m(clean)).double(), atol=1e-6, rtol=0)


def test_patching_where_the_prompts_agree_changes_nothing():
    """Denoising resid_pre at layer 0 at a position before the corruption leaves the corrupted metric as it is."""
    m = _model()
    clean, corrupt = _prompts(m)
    r = P.activation_patching(m, clean, corrupt, _metric(m), kind="resid_pre", progress=False)
    same = [0, 1]  # _prompts corrupts positions 2 and 3
    torch.testing.assert_close(r.values[0, same], torch.full((len(same),), r.corrupt_value, dtype=torch.float64),
                               atol=1e-5, rtol=0)
    assert r.share().shape == r.values.shape and r.labels[0] == ("0", "1")


@pytest.mark.tl4
def test_our_model_and_its_bridge_agree():
    m = _model(normalization=None, attn_only=True, biases=False)
    bridge = models.to_transformer_lens(m)
    clean, corrupt = _prompts(m)
    met = _metric(m)
    for kind, by_pos in (("resid_pre", None), ("z", False), ("k", True), ("pattern", False)):
        a = P.activation_patching(m, clean, corrupt, met, kind=kind, by_pos=by_pos, progress=False)
        b = P.activation_patching(bridge, clean, corrupt, met, kind=kind, by_pos=by_pos, progress=False)
        torch.testing.assert_close(a.values, b.values, atol=1e-4, rtol=1e-4)


def test_loaded_zoo_model_is_put_in_eval_mode():
    m = models.load("attn-only-1l")
    assert not m.training  # models.load returns eval mode (issue 14), as TransformerLens' from_pretrained
    m.train()  # patching must still put a model in training mode into eval mode
    t = m.to_tokens("x = 1\ny = 2\n")
    ans = P.answers(m, 1, correct=int(t[0, -1]), positions=-2)
    P.activation_patching(m, t, t, P.metric("loss", ans), kind="z", progress=False)
    assert not m.training


# --- bad input ----------------------------------------------------------------------------------------
def test_bad_input_raises_named_errors():
    m = _model(attn_only=True, normalization=None)
    clean, corrupt = _prompts(m)
    met = _metric(m)
    cases = [
        (lambda: P.activation_patching(m, clean, corrupt[:, :-1], met), "same number of tokens"),
        (lambda: P.activation_patching(m, clean, corrupt, met, kind="hook_zz"), "unknown kind 'hook_zz'; allowed"),
        (lambda: P.activation_patching(m, clean, corrupt, met, kind="mlp_out"), "attention-only"),
        (lambda: P.activation_patching(m, clean, corrupt, met, direction="sideways"), "unknown direction"),
        (lambda: P.activation_patching(m, clean, corrupt, met, kind="resid_pre", by_pos=False), "by_pos=False"),
        (lambda: P.activation_patching(m, clean, corrupt, lambda lg: lg.sum()), "one value per prompt"),
        (lambda: P.metric("logit_diff", P.answers(m, 2, correct=3)), "needs a wrong answer"),
        (lambda: P.metric("accuracy", P.answers(m, 2, correct=3)), "unknown metric 'accuracy'"),
        (lambda: P.answers(m, 2, correct=99), "out of range"),
        (lambda: P.answers(m, 3, correct=[1, 2]), "do not fit 3 prompts"),
        (lambda: P.activation_patching(m, clean, corrupt, P.metric("loss", P.answers(m, 2, correct=1, positions=9))),
         "positions must lie in -7..6"),
        (lambda: P.activation_patching(m, clean.float(), corrupt, met), "integer"),
        (lambda: P.activation_patching(m, "some text", corrupt, met), "no tokenizer"),
    ]
    for call, match in cases:
        with pytest.raises(P.PatchingError, match=match):
            call()


def test_answer_text_must_be_one_token():
    m = models.load("attn-only-2l")
    assert P.answers(m, 1, correct=" b").correct.item() == m.tokenizer.encode(" b")[0]
    with pytest.raises(P.PatchingError, match=r"'hello world' is \d+ tokens .*not one"):
        P.answers(m, 1, correct="hello world")
    assert issubclass(P.PatchingError, ValueError)

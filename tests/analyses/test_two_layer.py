"""Two-layer study on the hand-built induction model: composition, the induction circuit, term importance."""

import pytest

from analyses.two_layer import (
    PAPER_TERM_IMPORTANCE,
    composition_study,
    find_induction_circuit,
    term_importance_by_order,
    virtual_head_importance,
)
from circuits.testing import build_induction_model, induction_tokens


@pytest.fixture(scope="module")
def built():
    return build_induction_model(d_vocab=40, n_ctx=64)


def test_composition_only_k_with_the_previous_token_head(built):
    model, info = built
    study = composition_study(model)
    assert study.top("k", 1)[0][:2] == ("L0H0", "L1H0") and study.top("k", 1)[0][2] > 0
    for kind in ("q", "v"):
        assert float(study.excess(kind).max()) <= 1e-9  # no Q- or V-composition at all (scores 0 − baseline)
    assert study.scores["k"].shape == (2, 2, 2, 2)
    from circuits import composition_baseline

    assert study.baselines["k"] == pytest.approx(composition_baseline(model.cfg.d_model, model.cfg.d_head, "k"))
    assert "score − baseline" in study.markdown()


def test_induction_circuit_pairs_and_positivity(built):
    model, info = built
    circ = find_induction_circuit(model)
    assert [(p, i) for p, i, _ in circ.pairs] == [((0, 0), (1, 0))]
    qk, ov = circ.positivity[(1, 0)]
    assert qk > 0.99 and ov > 0.99
    assert circ.positivity[(1, 1)][1] < -0.99
    again = find_induction_circuit(model, detections=(circ.induction, circ.previous))
    assert again.pairs == circ.pairs
    assert "induction head" in circ.markdown()


def test_term_importance_orders_and_layers(built):
    model, info = built
    tokens = induction_tokens(40, 30, batch=3, seed=1)
    imp = term_importance_by_order(model, tokens)
    assert len(imp.losses) == 3
    assert imp.losses[-1] == pytest.approx(imp.model_loss, abs=1e-6)
    assert imp.individual > 1.0  # the induction head's own term does the work on repeated tokens
    assert abs(imp.virtual) < 0.1 * imp.individual  # virtual heads ≪ individual heads
    assert imp.by_layer[1] > imp.by_layer[0]
    assert imp.paper == PAPER_TERM_IMPORTANCE
    assert "Framework's reduction" in imp.markdown()


def test_virtual_head_ranking(built):
    model, info = built
    tokens = induction_tokens(40, 30, batch=2, seed=2)
    rank = virtual_head_importance(model, tokens)
    assert len(rank.virtual) == 4 and len(rank.individual) == 4
    assert all("∘" in n for n, _ in rank.virtual)
    assert rank.individual[0][0] == "L1H0"
    vals = [v for _, v in rank.virtual]
    assert vals == sorted(vals, reverse=True)
    assert rank.individual[0][1] > 10 * abs(rank.virtual[0][1])

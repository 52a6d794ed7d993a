"""Bad input to every public `circuits` function: a specific exception whose message names the problem and
what is allowed (TypeError for a wrong type, ValueError for a wrong value, NonFiniteError for NaN/inf)."""

from __future__ import annotations

import warnings

import pytest
import torch

import circuits
from circuits.checks import NonFiniteError
from models.arch.tl_compat import FactoredMatrix

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

CIRCUIT_FNS = ["qk_circuit", "ov_circuit", "full_qk_circuit", "full_ov_circuit"]


def fm(n=5, m=3, k=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    return FactoredMatrix(torch.randn(n, m, generator=g), torch.randn(m, n if k is None else k, generator=g))


@pytest.mark.parametrize("fn", CIRCUIT_FNS)
@pytest.mark.parametrize("layer,head,match", [
    (2, 0, "layer=2 is out of range: this model has layers 0..1"),
    (-1, 0, "layer=-1 is out of range"),
    (0, 2, "head=2 is out of range: this model has heads 0..1"),
    (None, 7, "head=7 is out of range"),
    (10**9, 0, "out of range"),
])
def test_layer_head_out_of_range(m2, fn, layer, head, match):
    with pytest.raises(ValueError, match=match):
        getattr(circuits, fn)(m2, layer, head)


@pytest.mark.parametrize("fn", CIRCUIT_FNS)
@pytest.mark.parametrize("layer,head", [(1.5, 0), ("0", 0), (0, True), (0, 0.0), ([0], 0), (0, torch.tensor(0.5))])
def test_layer_head_wrong_type(m2, fn, layer, head):
    with pytest.raises(TypeError, match="must be an int"):
        getattr(circuits, fn)(m2, layer, head)


def test_numpy_and_tensor_ints_are_fine(m2):
    import numpy as np

    ref = circuits.ov_circuit(m2, 1, 1).AB
    for layer, head in ((np.int64(1), np.int32(1)), (torch.tensor(1), torch.tensor(1))):
        torch.testing.assert_close(circuits.ov_circuit(m2, layer, head).AB, ref)


@pytest.mark.parametrize("fn", CIRCUIT_FNS)
def test_zero_layer_model_has_no_heads(m0, fn):
    with pytest.raises(ValueError, match="n_layers=0"):
        getattr(circuits, fn)(m0, 0, 0)


@pytest.mark.parametrize("fn", CIRCUIT_FNS + ["copying_scores"])
@pytest.mark.parametrize("thing", ["attn-only-2l", None, 3, torch.zeros(3)])
def test_not_a_model(fn, thing):
    with pytest.raises(TypeError, match="needs a model"):
        getattr(circuits, fn)(thing) if fn == "copying_scores" else getattr(circuits, fn)(thing, 0, 0)


@pytest.mark.parametrize("later,earlier,exc,match", [
    ((1, 9), (0, 0), ValueError, "head=9 is out of range"),
    ((7, 0), (0, 0), ValueError, "layer=7 is out of range"),
    ((0, 0), (1, 0), ValueError, "strictly before"),
    ((1, 0), (1, 1), ValueError, "strictly before"),
    (1, (0, 0), TypeError, "later must be a \\(layer, head\\) pair"),
    ((1, 0), (0, 0, 0), TypeError, "earlier must be a \\(layer, head\\) pair"),
    ((1, "a"), (0, 0), TypeError, "head must be an int"),
])
def test_k_composition_circuit_bad_heads(m2, later, earlier, exc, match):
    with pytest.raises(exc, match=match):
        circuits.k_composition_circuit(m2, later, earlier)


def test_full_qk_positional_needs_a_table():
    from helpers import make_model

    with pytest.raises(ValueError, match="positional table"):
        circuits.full_qk_circuit(make_model(1, positional_embedding_type="rotary"), 0, 0, positional=True)


# --- spectra and rankings ----------------------------------------------------------------------------------
@pytest.mark.parametrize("fn", ["eigenvalues", "copying_score", "positive_eigenvalue_fraction",
                                "diagonal_rank_stats"])
@pytest.mark.parametrize("matrix", [fm(5, 3, k=4), torch.randn(5, 4), torch.randn(2, 3, 4)])
def test_non_square(fn, matrix):
    with pytest.raises(ValueError, match="square matrix") as info:
        getattr(circuits, fn)(matrix)
    assert str(tuple(matrix.shape)) in str(info.value)


@pytest.mark.parametrize("fn", ["eigenvalues", "copying_score", "positive_eigenvalue_fraction",
                                "diagonal_rank_stats"])
@pytest.mark.parametrize("thing,exc", [([[1.0, 2.0], [3.0, 4.0]], TypeError), (None, TypeError),
                                       (torch.randn(4), ValueError), (torch.eye(3, dtype=torch.bool), TypeError),
                                       (torch.eye(3, dtype=torch.complex64), TypeError)])
def test_not_a_matrix(fn, thing, exc):
    with pytest.raises(exc, match="FactoredMatrix or a torch.Tensor|needs a matrix|real-valued"):
        getattr(circuits, fn)(thing)


def test_integer_matrices_are_read_as_float():
    lam = circuits.eigenvalues(torch.tensor([[2, 0], [0, 3]]))
    torch.testing.assert_close(lam.real, torch.tensor([3.0, 2.0], dtype=torch.float64))
    assert circuits.diagonal_rank_stats(torch.eye(4, dtype=torch.long), k=1)[1] == 1.0


@pytest.mark.parametrize("fn", ["eigenvalues", "copying_score", "positive_eigenvalue_fraction",
                                "diagonal_rank_stats"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("where", ["A", "B", "dense"])
def test_non_finite_matrices_are_refused(fn, value, where):
    """LAPACK returns garbage for NaN (and prints to stderr); rankings compare NaN as False. Both refuse."""
    m = fm(6, 3)
    if where == "dense":
        x = m.AB.clone()
        x[2, 3] = value
    else:
        A, B = m.A.clone(), m.B.clone()
        (A if where == "A" else B)[1, 1] = value
        x = FactoredMatrix(A, B)
    with pytest.raises(NonFiniteError, match="non-finite") as info:
        getattr(circuits, fn)(x)
    assert isinstance(info.value, ValueError)
    assert ("factor " + where if where != "dense" else "factor A") in str(info.value) or "matrix" in str(info.value)


@pytest.mark.parametrize("k,exc", [(0, ValueError), (-1, ValueError), ((), ValueError), ((1, 0), ValueError),
                                   (1.5, TypeError), ("5", TypeError), ((1, 2.0), TypeError), (True, TypeError)])
def test_diagonal_rank_stats_bad_k(k, exc):
    with pytest.raises(exc, match="k must be"):
        circuits.diagonal_rank_stats(fm(), k=k)


# --- composition ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["x", "", None, 1, "qk"])
def test_unknown_composition_kind(m2, kind):
    with pytest.raises(ValueError, match="allowed: 'q', 'k', 'v'"):
        circuits.composition_scores(m2, kind)


def test_composition_kind_is_case_insensitive(m2):
    torch.testing.assert_close(circuits.composition_scores(m2, "K"), circuits.composition_scores(m2, "k"))


def test_composition_score_bad_arguments():
    with pytest.raises(TypeError, match="left must be a FactoredMatrix"):
        circuits.composition_score(torch.randn(5, 5), fm())
    with pytest.raises(TypeError, match="right must be a FactoredMatrix"):
        circuits.composition_score(fm(), "x")
    with pytest.raises(ValueError, match="writes 5 dims but right .* reads 6"):
        circuits.composition_score(fm(5, 3), fm(6, 3))
    bad = fm()
    bad.A[0, 0] = float("nan")
    with pytest.raises(NonFiniteError, match="left.A"):
        circuits.composition_score(bad, fm())


@pytest.mark.parametrize("args,exc,match", [
    ((0, 4), ValueError, "d_model must be an int >= 1"),
    ((8, -1), ValueError, "d_head must be an int >= 1"),
    ((8.5, 4), TypeError, "d_model must be an int"),
    ((8, 4, "z"), ValueError, "allowed: 'q', 'k', 'v'"),
    ((8, 4, "k", 0), ValueError, "n_samples must be an int >= 1"),
])
def test_composition_baseline_bad_shapes(args, exc, match):
    with pytest.raises(exc, match=match):
        circuits.composition_baseline(*args)


def test_shallow_models_give_empty_or_zero_tables(m0, m1):
    """Scores over heads of a model without heads are empty; a 1-layer model has no composing pairs."""
    assert circuits.copying_scores(m0).shape == (0, 2)
    assert circuits.composition_scores(m0, "k").shape == (0, 2, 0, 2)
    assert not circuits.composition_scores(m1, "v").any()


# --- paths and decompositions ---------------------------------------------------------------------------------
def test_path_expansion_refuses_mlp_models(mlp):
    with pytest.raises(ValueError, match="attention-only model"):
        circuits.path_expansion(mlp, torch.tensor([[1, 2, 3]]))
    with pytest.raises(ValueError, match="attention-only model"):
        circuits.term_importance(mlp, torch.tensor([[1, 2, 3]]))


@pytest.mark.parametrize("fn", ["path_expansion", "term_importance", "frozen_forward"])
@pytest.mark.parametrize("tokens,match", [
    (torch.tensor([[1, 2, 30]]), "token id 30 is out of range; allowed ids are 0..29"),
    (torch.tensor([[1, -2, 3]]), "token id -2 is out of range"),
    (torch.zeros(1, 0, dtype=torch.long), "empty"),
    ([], "empty"),
    (torch.zeros(1, 25, dtype=torch.long), "longer than n_ctx=24"),
    (torch.tensor([[1.0, 2.0]]), "integer"),
    (torch.zeros(1, 2, 3, dtype=torch.long), r"\[batch, pos\]"),
    ("some text", "no tokenizer"),
])
def test_bad_tokens(m2, fn, tokens, match):
    with pytest.raises(ValueError, match=match):
        getattr(circuits, fn)(m2, tokens)


@pytest.mark.parametrize("order,exc", [(-1, ValueError), (1.5, TypeError), ("2", TypeError)])
def test_path_expansion_bad_max_order(m2, order, exc):
    with pytest.raises(exc, match="max_order must be"):
        circuits.path_expansion(m2, torch.tensor([[1, 2, 3]]), max_order=order)


def test_term_importance_needs_two_tokens(m2):
    with pytest.raises(ValueError, match="at least 2 tokens"):
        circuits.term_importance(m2, torch.tensor([[1]]))


@pytest.mark.parametrize("layer,head", [(9, 0), (1, 9), (-1, 0)])
def test_attention_score_decomposition_bad_head(m2, layer, head):
    with pytest.raises(ValueError, match="is out of range"):
        circuits.attention_score_decomposition(m2, torch.tensor([[1, 2, 3]]), layer, head)


def test_fold_layer_norm_and_tensor_product_bad_input():
    with pytest.raises(TypeError, match="fold_layer_norm needs a models.HookedTransformer"):
        circuits.fold_layer_norm("model")
    with pytest.raises(ValueError, match="stacks of\\) matrices"):
        circuits.TensorProduct(torch.randn(3), torch.randn(3, 3))
    tp = circuits.TensorProduct(torch.randn(4, 4), torch.randn(3, 2))
    with pytest.raises(ValueError, match=r"x must end in \[pos=4, d=3\]"):
        tp.apply(torch.randn(4, 2))


def test_valid_calls_raise_no_warning_beyond_the_documented_one(m2):
    """The checks add no new warnings: a folded/norm-free model runs the circuits silently."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        circuits.full_ov_circuit(m2, 1, 0)
        circuits.copying_scores(m2)
        circuits.composition_scores(m2, "q")

"""Bad input to the public `analyses` functions: a specific exception naming the problem, or (for questions a
model of that depth answers trivially) a documented empty answer. NaN/inf weights: `NonFiniteError` from the
analyses that take spectra, norms or rankings; a forward pass propagates NaN and returns (never hangs)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import analyses
from circuits.checks import NonFiniteError

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


# --- behavioural scores ------------------------------------------------------------------------------------
@pytest.mark.parametrize("fn,kw,match", [
    ("induction_scores", dict(seq_len=50), "101 positions, more than the model's n_ctx=24"),
    ("prefix_matching_scores", dict(seq_len=10), "41 positions, more than the model's n_ctx=24"),
    ("duplicate_token_scores", dict(seq_len=10), "more than the model's n_ctx=24"),
    ("copying_scores_behavioural", dict(seq_len=30), "more than the model's n_ctx=24"),
])
def test_sequences_longer_than_n_ctx(m2, fn, kw, match):
    with pytest.raises(ValueError, match=match) as info:
        getattr(analyses, fn)(m2, **kw)
    assert "shorter seq_len" in str(info.value)


@pytest.mark.parametrize("kw,exc,match", [
    (dict(batch=0), ValueError, "batch must be an int >= 1, got 0"),
    (dict(batch=-3), ValueError, "batch must be an int >= 1"),
    (dict(batch=1.5), TypeError, "batch must be an int"),
    (dict(batch="4"), TypeError, "batch must be an int"),
    (dict(seq_len=0), ValueError, "seq_len must be an int >= 1"),
    (dict(seq_len=2.0), TypeError, "seq_len must be an int"),
    (dict(seq_len=None), TypeError, "seq_len must be an int"),
])
def test_bad_batch_and_length(m2, kw, exc, match):
    kw = {"seq_len": 5, **kw}
    with pytest.raises(exc, match=match):
        analyses.induction_scores(m2, **kw)


@pytest.mark.parametrize("fn", ["previous_token_scores", "current_token_scores", "first_token_scores",
                                "duplicate_token_scores", "prefix_matching_scores"])
@pytest.mark.parametrize("tokens,match", [
    (torch.tensor([[1, 30]]), "token id 30 is out of range; allowed ids are 0..29"),
    (torch.zeros(1, 0, dtype=torch.long), "empty"),
    (torch.zeros(1, 25, dtype=torch.long), "longer than n_ctx=24"),
    (torch.tensor([[1.5, 2.5]]), "integer"),  # was silently truncated to [[1, 2]]
    (np.array([[1.0, 2.0]]), "integer"),
    (torch.zeros(1, 2, 3, dtype=torch.long), r"\[batch, pos\]"),
])
def test_bad_tokens_to_scores(m2, fn, tokens, match):
    with pytest.raises(ValueError, match=match):
        getattr(analyses, fn)(m2, tokens=tokens)


def test_attention_patterns_and_icl_bad_input(m2):
    with pytest.raises(ValueError, match="empty"):
        analyses.attention_patterns(m2, [])
    with pytest.raises(ValueError, match="need 1 <= early < late < sequence length"):
        analyses.in_context_learning_score(m2, torch.zeros(1, 10, dtype=torch.long), early=5, late=50)


@pytest.mark.parametrize("kw,exc", [(dict(seq_len=-1), ValueError), (dict(batch=0), ValueError),
                                    (dict(seed=-1), ValueError), (dict(seed=0.5), TypeError)])
def test_random_tokens_bad_sizes(m2, kw, exc):
    with pytest.raises(exc, match="must be an int"):
        analyses.random_tokens(m2, **{"seq_len": 4, **kw})


def test_random_tokens_need_a_pool(m2):
    with pytest.raises(ValueError, match="at least 2 non-special token ids"):
        analyses.random_tokens(m2, 4, tokens_from=[0, 0, 99])


# --- detection on models of every depth ----------------------------------------------------------------------
def test_detection_on_a_zero_layer_model_is_empty(m0):
    """Documented: no heads → an empty result (not an error), so sweeps over the zoo need no special case."""
    ind = analyses.detect_induction_heads(m0)
    prev = analyses.detect_previous_token_heads(m0)
    assert ind.heads == [] and ind.table == [] and prev.heads == [] and prev.table == []
    assert analyses.attention_patterns(m0, [[1, 2]]).shape[0] == 0


@pytest.mark.parametrize("fn,args", [
    ("composition_study", ()),
    ("find_induction_circuit", ()),
    ("virtual_head_importance", (torch.tensor([[1, 2, 3]]),)),
])
@pytest.mark.parametrize("depth", ["m0", "m1"])
def test_two_layer_studies_refuse_shallow_models(request, fn, args, depth):
    model = request.getfixturevalue(depth)
    with pytest.raises(ValueError, match=f"needs a model with at least 2 layers.*has {model.cfg.n_layers}"):
        getattr(analyses, fn)(model, *args)


def test_two_layer_studies_refuse_mlp_paths(mlp):
    with pytest.raises(ValueError, match="attention-only"):
        analyses.virtual_head_importance(mlp, torch.tensor([[1, 2, 3]]))
    with pytest.raises(ValueError, match="attention-only"):
        analyses.term_importance_by_order(mlp, torch.tensor([[1, 2, 3]]))


@pytest.mark.parametrize("call,exc,match", [
    (lambda m: analyses.skip_trigrams(m, 2, 0), ValueError, "layer=2 is out of range"),
    (lambda m: analyses.skip_trigrams(m, 0, 5), ValueError, "head=5 is out of range"),
    (lambda m: analyses.skip_trigrams(m, 0.0, 0), TypeError, "layer must be an int"),
    (lambda m: analyses.head_ablation_losses(m, [[1, 2, 3]], heads=[(5, 0)]), ValueError, "layer=5 is out of range"),
    (lambda m: analyses.head_ablation_losses(m, [[1, 2, 3]], heads=[0]), TypeError, "\\(layer, head\\) pair"),
    (lambda m: analyses.head_ablation_losses(m, [[1, 2, 99]]), ValueError, "token id 99 is out of range"),
    (lambda m: analyses.head_ablation_losses(m, [[1.5, 2.0]]), ValueError, "integer"),
])
def test_one_layer_bad_heads_and_tokens(m2, call, exc, match):
    with pytest.raises(exc, match=match):
        call(m2)


def test_one_layer_on_a_zero_layer_model(m0):
    with pytest.raises(ValueError, match="n_layers=0"):
        analyses.skip_trigrams(m0, 0, 0)
    t = analyses.copying_heads_table(m0)  # documented: an empty table
    assert t.copying_score.shape == (0, 2) and t.heads == []


# --- zero layers -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("tokens", [[], np.array([], dtype=np.int64), torch.zeros(0, dtype=torch.long), [5],
                                    np.memmap.__new__ and np.zeros(1, dtype=np.uint16)])
def test_zero_layer_with_too_few_tokens(m0, tokens):
    for fn in (analyses.zero_layer_study, analyses.direct_path_fit):
        with pytest.raises(ValueError, match="at least 2 tokens"):
            fn(m0, tokens)


@pytest.mark.parametrize("tokens,match", [
    ([1, 2, 30], "token ids must lie in 0..29"),
    ([-1, 2, 3], "token ids must lie in 0..29"),
    (np.array([1.5, 2.0, 3.0]), "integer ids"),
    (torch.tensor([1.0, 2.0]), "integer ids"),
    (np.array([True, False, True]), "integer ids"),
])
def test_zero_layer_with_bad_ids(m0, tokens, match):
    with pytest.raises(ValueError, match=match):
        analyses.zero_layer_study(m0, tokens)
    with pytest.raises(ValueError, match=match):
        analyses.bigram_table(tokens, 30)


# --- reports and training dynamics ----------------------------------------------------------------------------
def test_report_to_an_unwritable_place(m1, tmp_path):
    """Tests run as root, where chmod 000 does not bite: a file where the folder should be does."""
    f = tmp_path / "file"
    f.write_text("x")
    for out in (f, f / "sub"):
        with pytest.raises(NotADirectoryError, match=str(f)):
            analyses.build_report(m1, out, sections=["overview"], progress=False)
    assert f.read_text() == "x"


def test_report_of_something_not_a_loaded_model(tmp_path):
    for bad in ("no-such-model", tmp_path, 42):
        with pytest.raises(TypeError, match="takes a loaded model"):
            analyses.build_report(bad, tmp_path / "r", progress=False)


def test_training_dynamics_bad_folders(tmp_path):
    with pytest.raises(FileNotFoundError, match="needs a training run's folder"):
        analyses.training_dynamics(tmp_path / "missing")
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileNotFoundError, match="needs a training run's folder"):
        analyses.training_dynamics(tmp_path / "file")
    (tmp_path / "metrics.jsonl").write_bytes(b"{\"step\": 1, \"tokens\": 5, \"val_loss\": 2.0}\n{torn")
    d = analyses.training_dynamics(tmp_path)  # a torn last line (a killed run) is skipped, the good record kept
    assert d.val_loss == [(5, 2.0)] and d.formation_window is None
    from models.errors import CheckpointError

    for bad in (b"\x00\xff\xfe garbage\n", b"[1, 2]\n"):  # anything else is corruption: refused, naming the file
        (tmp_path / "metrics.jsonl").write_bytes(bad + b"{\"step\": 1, \"tokens\": 5, \"val_loss\": 2.0}\n")
        with pytest.raises(CheckpointError, match="metrics.jsonl"):
            analyses.training_dynamics(tmp_path)


# --- NaN / inf weights --------------------------------------------------------------------------------------
@pytest.mark.parametrize("param", ["blocks.0.attn.W_V", "blocks.1.attn.W_Q", "embed.W_E", "unembed.W_U"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_weight_space_analyses_name_the_non_finite_tensor(m2, param, value):
    from helpers import poisoned

    import circuits

    m = poisoned(m2, param, value)
    prop = param.rsplit(".", 1)[1]
    calls = [lambda: analyses.copying_heads_table(m, behavioural=False), lambda: analyses.composition_study(m),
             lambda: analyses.skip_trigrams(m, 1, 0)]
    if prop != "W_Q":  # copying scores read W_E, W_V, W_O, W_U only: a NaN in W_Q leaves them finite and right
        calls.append(lambda: circuits.copying_scores(m))
    if prop in ("W_E", "W_U"):
        calls.append(lambda: analyses.direct_path_fit(m, [1, 2, 3, 4]))
    if prop in ("W_Q", "W_V", "W_K", "W_O"):
        calls.append(lambda: circuits.composition_scores(m, "k"))
    for call in calls:
        with pytest.raises(NonFiniteError, match=f"{prop} holds non-finite values"):
            call()


def test_behavioural_scores_on_nan_weights_say_so(m2):
    from helpers import poisoned

    m = poisoned(m2, "blocks.0.attn.W_K", float("nan"))
    with pytest.raises(NonFiniteError, match="blocks.0.attn.W_K holds non-finite"):
        analyses.induction_scores(m, seq_len=5)
    with pytest.raises(NonFiniteError, match="W_K holds non-finite"):
        analyses.detect_induction_heads(m)


def test_forward_with_nan_weights_propagates_and_returns(m2):
    """Documented: the forward pass does not check weights (that would cost every call); NaN flows through."""
    from helpers import poisoned

    m = poisoned(m2, "blocks.0.attn.W_V", float("nan"))
    logits = m(torch.tensor([[1, 2, 3]]))
    assert torch.isnan(logits).any()
    m = poisoned(m2, "embed.W_E", float("inf"))
    assert not torch.isfinite(m(torch.tensor([[0, 1]]))).all()

"""`analyses.util.weight_view`: the weights the weight-space analyses read — a folded copy where the norms fold, the
model itself where they are trivial or cannot be folded."""

import pytest
import torch
from helpers import randomize

from analyses.util import weight_view
from models import HookedTransformer, HookedTransformerConfig

BASE = dict(n_layers=1, d_model=8, n_heads=2, d_head=4, n_ctx=6, d_vocab=11, d_mlp=16, seed=0)


def _model(**kw):
    return randomize(HookedTransformer(HookedTransformerConfig(**{**BASE, **kw})), 0.3, 1).eval()


def test_foldable_norms_give_a_folded_copy_with_the_same_log_probs():
    model = _model(normalization_type="LN")
    view = weight_view(model)
    assert view is not model and view.cfg.normalization_type == "LNPre"
    tokens = torch.randint(0, 11, (2, 6), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(view(tokens).log_softmax(-1), model(tokens).log_softmax(-1), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kw", [dict(normalization_type=None), dict(normalization_type="LNPre")])
def test_trivial_norms_are_read_as_they_are(kw):
    model = _model(**kw)
    assert weight_view(model) is model


@pytest.mark.parametrize("kw", [dict(normalization_type="LN", normalization_position="post"),
                                dict(normalization_type="LN", positional_embedding_type="shortformer")])
def test_norms_that_cannot_be_folded_leave_the_model_as_it_is(kw):
    """Post-norm blocks and Shortformer's positions after ln1 cannot move the norm into the weights
    (`models.WeightProcessingError`): the analyses read the model unfolded (the circuits warn), not a wrong fold."""
    model = _model(**kw)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert weight_view(model) is model
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())

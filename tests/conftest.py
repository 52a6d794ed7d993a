import pytest
from helpers import randomize  # noqa: F401  (re-exported for older imports)

from models import HookedTransformer, HookedTransformerConfig


@pytest.fixture
def tiny_cfg():
    return HookedTransformerConfig(n_layers=2, d_model=32, n_ctx=16, d_vocab=50, n_heads=4, d_mlp=None,
                                   normalization_type=None, positional_embedding_type="shortformer", seed=0)


@pytest.fixture
def tiny_model(tiny_cfg):
    return HookedTransformer(tiny_cfg)

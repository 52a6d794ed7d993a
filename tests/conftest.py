import pytest
import torch

from models import HookedTransformer, HookedTransformerConfig


@pytest.fixture
def tiny_cfg():
    return HookedTransformerConfig(n_layers=2, d_model=32, n_ctx=16, d_vocab=50, n_heads=4, d_mlp=None,
                                   normalization_type=None, positional_embedding_type="shortformer", seed=0)


@pytest.fixture
def tiny_model(tiny_cfg):
    return HookedTransformer(tiny_cfg)


def randomize(model, scale=0.3, seed=0):
    """Perturb every parameter so that biases and norm weights are non-trivial too."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype) * scale)
    return model

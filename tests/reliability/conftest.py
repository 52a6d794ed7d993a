"""Shared fixtures of the reliability suite: tiny models of every depth, one torch thread (tiny tensors on a
shared CPU stall on OpenMP barriers otherwise)."""

from __future__ import annotations

import pytest
import torch

from models import HookedTransformer, HookedTransformerConfig


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def make_model(n_layers: int = 2, **kw) -> HookedTransformer:
    d = dict(n_layers=n_layers, d_model=16, n_ctx=24, d_vocab=30, n_heads=2, d_mlp=None,
             normalization_type=None, positional_embedding_type="shortformer", seed=0)
    d.update(kw)
    return HookedTransformer(HookedTransformerConfig(**d))


@pytest.fixture(scope="session")
def m2():
    return make_model(2)


@pytest.fixture(scope="session")
def m1():
    return make_model(1)


@pytest.fixture(scope="session")
def m0():
    return make_model(0)


@pytest.fixture(scope="session")
def mlp():
    return make_model(2, d_mlp=32, normalization_type="LN", positional_embedding_type="standard")


def poisoned(model: HookedTransformer, param: str, value: float) -> HookedTransformer:
    """A copy of `model` with one entry of parameter `param` set to `value` (NaN or ±inf)."""
    import copy

    m = copy.deepcopy(model)
    with torch.no_grad():
        dict(m.named_parameters())[param].view(-1)[0] = value
    return m

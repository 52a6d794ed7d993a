"""Shared fixtures of the reliability suite: tiny models of every depth."""

from __future__ import annotations

import pytest
from helpers import make_model, poisoned  # noqa: F401


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



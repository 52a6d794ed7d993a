import os

import pytest
import torch
from hypothesis import settings

from models import HookedTransformer, HookedTransformerConfig

# Property and fuzz tests draw the same examples on every run (a CI run cannot fail by chance); run
# `HYPOTHESIS_PROFILE=explore python -m pytest tests/models/test_fuzz.py tests/reliability` to search new examples.
settings.register_profile("default", derandomize=True)
settings.register_profile("explore", derandomize=False, max_examples=1000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


def pytest_collection_modifyitems(config, items):
    """`tl4` tests need TransformerLens 4.x (its bridge, its logit lens); under 3.x (SAELens' environment) they skip,
    naming the version, and the refusal itself is tested (tests/models/test_tl_compat.py). With
    `TOY_CIRCUITS_ECOSYSTEM=required` (CI's ecosystem job) a missing sae_lens or nnsight stops the run instead of
    letting the `ecosystem` tests skip."""
    from models.arch.tl_compat import TL_VERSION, version_tuple

    if os.environ.get("TOY_CIRCUITS_ECOSYSTEM") == "required":  # CI's ecosystem job: its tests must not skip
        for package in ("sae_lens", "nnsight"):
            try:
                __import__(package)
            except ImportError as e:
                raise pytest.UsageError(f"TOY_CIRCUITS_ECOSYSTEM=required but {package} does not import: {e}") from e
    if version_tuple(TL_VERSION) >= (4, 0):
        return
    skip = pytest.mark.skip(reason=f"needs transformer-lens 4.x; this environment has {TL_VERSION}")
    for item in items:
        if "tl4" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _one_thread():
    """Every test runs with one torch intra-op thread (tiny tensors on a busy shared CPU stall on OpenMP barriers
    otherwise), and the count is restored afterwards (commands run in-process set their own)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def tiny_cfg():
    return HookedTransformerConfig(n_layers=2, d_model=32, n_ctx=16, d_vocab=50, n_heads=4, d_mlp=None,
                                   normalization_type=None, positional_embedding_type="shortformer", seed=0)


@pytest.fixture
def tiny_model(tiny_cfg):
    return HookedTransformer(tiny_cfg)

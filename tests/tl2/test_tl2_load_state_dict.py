"""`HookedTransformer(cfg).load_state_dict(sd)` on TransformerLens 2.18's own state dicts (slow job): the way ARENA
and TransformerLens 2.x notebooks load a saved model. Every case of the legacy grid (tests/tl2/make_references.py,
55 configurations, each state dict saved by the real 2.18 with its `attn.mask` / `IGNORE` / rotary buffers) loads
strictly into a model built from its config, and its logits equal 2.18's to the parity tolerance."""

from __future__ import annotations

import pytest
import torch
from make_references import grid
from safetensors.torch import load_file
from tl2_legacy import TOL, Case, references_or_skip, rel_err

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def folder():
    return references_or_skip()


@pytest.mark.parametrize("name", sorted(grid()))
def test_load_state_dict_of_a_tl2_model(folder, name):
    from models import HookedTransformer
    from models.io.interop import config_from_transformer_lens

    case = Case(folder, name)
    state = load_file(str(case.state_path))
    assert any(k.endswith(".attn.mask") for k in state) and any(k.endswith(".attn.IGNORE") for k in state)
    model = HookedTransformer(config_from_transformer_lens(dict(case.cfg)))
    result = model.load_state_dict(state)  # strict, as nn.Module's default
    assert not result.missing_keys and not result.unexpected_keys
    with torch.no_grad():
        err = rel_err(model.eval()(case.tokens), case.ref["logits"])
    assert err <= TOL, f"{name}: logits rel err {err:.3g}"

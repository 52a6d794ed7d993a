"""The layout of `models/` (issue 38): weight processing, generation and saving as functions that the model classes
call, one reader of a config's JSON for every model type, one definition per concept."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch

import models
from models import EncoderConfig, HookedEncoder, HookedTransformer, HookedTransformerConfig, WeightProcessingError

ROOT = Path(__file__).resolve().parents[2]


def _tiny(**kw) -> HookedTransformerConfig:
    return HookedTransformerConfig(n_layers=1, d_model=8, n_ctx=6, d_head=4, n_heads=2, d_vocab=11, d_mlp=None,
                                   normalization_type="LN", seed=0, **kw)


def test_a_decoder_config_may_name_its_model_type(tmp_path):
    """config.json's `model_type` is read by the registry for every kind; a decoder's `"model_type": "decoder"`
    (the value `models.model_kind` gives) loads as the folder without it (before: `ConfigError` "unknown config
    field(s) ['model_type']" from `HookedTransformerConfig.from_dict`, after the registry had accepted it)."""
    cfg = _tiny()
    d = json.loads(cfg.to_json())
    assert HookedTransformerConfig.from_json(json.dumps({**d, "model_type": "decoder"})) == cfg
    m = HookedTransformer(cfg)
    models.save(m, tmp_path / "m")
    (tmp_path / "m" / "config.json").write_text(json.dumps({**d, "model_type": "decoder"}))
    back = models.load(tmp_path / "m")
    assert back.cfg == cfg and models.model_kind(back) == "decoder"
    with pytest.raises(models.ConfigError, match="model_type must be 'decoder'"):
        HookedTransformerConfig.from_json(json.dumps({**d, "model_type": "encoder"}))


@pytest.mark.parametrize("text, match", [("{", "not valid JSON"), ('{"d_model": 8, "d_model": 9}', "d_model"),
                                         ("[1]", "JSON object"), ('{"nope": 1}', "unknown config field")])
def test_every_config_class_reads_json_alike(text, match):
    """One reader for the three config classes: the same refusals, word for word."""
    messages = set()
    for cls in (HookedTransformerConfig, EncoderConfig, models.EncoderDecoderConfig):
        with pytest.raises(models.ConfigError, match=match) as e:
            cls.from_json(text)
        messages.add(str(e.value).split("allowed fields")[0])
    assert len(messages) == 1, messages


def test_process_weights_refuses_other_kinds_by_kind():
    enc = HookedEncoder(EncoderConfig(n_layers=1, d_model=8, n_ctx=6, d_head=4, n_heads=2, d_vocab=11, d_mlp=None,
                                      normalization_type="LN", seed=0))
    with pytest.raises(WeightProcessingError, match="decoder-only"):
        enc.process_weights_()


def test_model_methods_equal_the_functions_they_call(tmp_path):
    """`process_weights_`, `generate`, `save` of the model are the functions of weight_processing, generation and
    persist (same results)."""
    from models.arch import weight_processing
    from models.generation.generate import generate

    a, b = HookedTransformer(_tiny()), HookedTransformer(_tiny())
    a.process_weights_()
    weight_processing.process_weights_(b)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    tokens = torch.tensor([[1, 2, 3]])
    assert torch.equal(a.generate(tokens, max_new_tokens=3, seed=0, verbose=False),
                       generate(a, tokens, 3, seed=0, verbose=False))
    a.save(tmp_path / "a")
    assert torch.equal(models.load(tmp_path / "a")(tokens), a(tokens))


ALL = ("models", "circuits", "analyses")


@pytest.mark.parametrize("name, packages", [("fold_layer_norm", ALL), ("beam_search", ("models", "circuits")),
                                            ("generate", ("models", "circuits")), ("device_of", ALL)])
def test_one_definition_per_name(name, packages):
    """Each of these names is defined once at the top level of `packages` (before: two `fold_layer_norm`s with
    different signatures, circuits/fold.py and models/arch/weight_processing.py; two `beam_search`es and two
    `generate`s in models/generation; two identical `device_of`s in analyses)."""
    where = [str(p.relative_to(ROOT)) for pkg in packages for p in (ROOT / pkg).rglob("*.py")
             for node in ast.parse(p.read_text()).body
             if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name]
    assert len(where) == 1, where

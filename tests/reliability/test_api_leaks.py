"""Python API inputs that used to escape as IndexError / KeyError / RuntimeError or pass silently (issue 12, "Exit
codes and messages"); each now gets the named error of docs/RELIABILITY.md, or, where the input has one meaning,
the right answer (checked against the batched call or a loop written here)."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
import torch
from helpers import make_model

import models
from analyses.detect import detect_induction_heads, detect_previous_token_heads
from analyses.one_layer import copying_heads_table, positional_vs_content
from analyses.trigrams import skip_trigrams
from analyses.two_layer import term_importance_by_order, virtual_head_importance
from circuits.score_decomposition import attention_score_decomposition
from models import CheckpointError, ConfigError, HookedTransformerConfig
from models.data.tokenizer import ByteTokenizer

TOKENS = torch.tensor([0, 3, 7, 11, 5, 3, 7, 11, 5, 9, 2, 4])


def test_two_layer_importances_take_one_sequence(m2):
    a, b = term_importance_by_order(m2, TOKENS), term_importance_by_order(m2, TOKENS[None])
    assert a.losses == pytest.approx(b.losses, rel=1e-12) and a.by_layer == pytest.approx(b.by_layer, rel=1e-12)
    v, w = virtual_head_importance(m2, TOKENS), virtual_head_importance(m2, TOKENS[None])
    assert [n for n, _ in v.virtual] == [n for n, _ in w.virtual]
    assert [x for _, x in v.virtual] == pytest.approx([x for _, x in w.virtual], rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("kw", [{"n_outs": 0}, {"k": 0}, {"block": 0}, {"n_outs": 1.5}])
def test_skip_trigrams_counts(m2, kw):
    with pytest.raises((ValueError, TypeError), match=next(iter(kw))):
        skip_trigrams(m2, 0, 0, **kw)


@pytest.mark.parametrize("temperature", [math.nan, math.inf, -1.0, "1", True])
def test_generate_temperature(m2, temperature):
    with pytest.raises(ValueError, match="temperature"):
        m2.generate(TOKENS[None, :4], max_new_tokens=2, temperature=temperature)


def test_generate_top_p_nan(m2):
    with pytest.raises(ValueError, match="top_p"):
        m2.generate(TOKENS[None, :4], max_new_tokens=2, top_p=math.nan)


@pytest.mark.parametrize("layer, head", [(True, 0), (0, False), (1.0, 0), ("0", 0)])
def test_score_decomposition_index_types(m2, layer, head):
    with pytest.raises(TypeError, match="layer|head"):
        attention_score_decomposition(m2, TOKENS[None], layer, head)


def test_score_decomposition_range(m2):
    with pytest.raises(ValueError, match="layer=2 is out of range"):
        attention_score_decomposition(m2, TOKENS[None], 2, 0)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    cfg = HookedTransformerConfig(n_layers=1, d_model=16, n_ctx=16, d_vocab=259, n_heads=2, attn_only=True, seed=0)
    path = tmp_path_factory.mktemp("leaks") / "m"
    models.save(models.HookedTransformer(cfg, tokenizer=ByteTokenizer()), path)
    return path


def test_load_dtype_by_name(folder):
    m = models.load(folder, dtype="float16")
    assert m.W_E.dtype == torch.float16 and m.cfg.dtype == torch.float16
    assert torch.equal(m.W_E, models.load(folder).W_E.half())
    with pytest.raises(ConfigError, match="dtype='float8' is not supported"):
        models.load(folder, dtype="float8")


@pytest.mark.parametrize("device", ["banana", 3.5, "cuda:abc"] + ([] if torch.cuda.is_available() else ["cuda"]))
def test_load_device_is_checked(folder, device):
    with pytest.raises(ConfigError, match="device="):
        models.load(folder, device=device)


def test_saved_config_holds_no_device_and_a_stored_one_is_ignored(folder, tmp_path):
    assert "device" not in json.loads((folder / "config.json").read_text())
    old = tmp_path / "gpu-trained"
    shutil.copytree(folder, old)
    cfg = json.loads((old / "config.json").read_text())
    (old / "config.json").write_text(json.dumps(dict(cfg, device="cuda:3")))  # as a GPU run used to store it
    m = models.load(old)
    assert m.W_E.device.type == "cpu" and torch.equal(m.W_E, models.load(folder).W_E)
    assert HookedTransformerConfig.from_json(json.dumps(dict(cfg, device="cuda"))).device == "cpu"


def test_duplicated_config_keys_are_refused(folder, tmp_path):
    bad = tmp_path / "dup"
    shutil.copytree(folder, bad)
    text = (bad / "config.json").read_text()
    (bad / "config.json").write_text(text.replace("{", '{\n  "n_heads": 4,', 1))
    with pytest.raises(CheckpointError, match="key 'n_heads' appears twice"):
        models.load(bad)
    with pytest.raises(ConfigError, match="key 'd_model' appears twice"):
        HookedTransformerConfig.from_json('{"n_layers": 1, "d_model": 8, "d_model": 16, "n_ctx": 4, "d_vocab": 5}')


@pytest.mark.parametrize("name", ["", "   "])
def test_load_empty_name(name):
    with pytest.raises(CheckpointError, match="empty model name"):
        models.load(name)


@pytest.mark.parametrize("ids", [None, 3.5, object(), torch.tensor([1.0, 2.0]), [1.5, 2.5]])
def test_to_string_needs_integer_ids(ids):
    m = make_model(1, d_vocab=259)
    m.tokenizer = ByteTokenizer()
    with pytest.raises(TypeError, match="to_string needs"):
        m.to_string(ids)


def test_to_string_still_takes_ids():
    m = make_model(1, d_vocab=259)
    m.tokenizer = ByteTokenizer()
    ids = m.to_tokens("abc", prepend_bos=False)[0]
    assert m.to_string(ids) == m.to_string(ids.tolist()) == m.to_string(ids.numpy()) == "abc"


@pytest.mark.parametrize("pool, error", [({1: 2, 3: 4}, TypeError), ({1, 2, 3, 4}, TypeError),
                                         ((i for i in range(1, 9)), TypeError), ([1.5, 2.7, 3.2, 4.9], TypeError),
                                         (np.array([1.0, 2.0, 3.0]), TypeError), ("abcd", TypeError)])
def test_tokens_from_is_checked(m2, pool, error):
    with pytest.raises(error, match="tokens_from"):
        detect_induction_heads(m2, seq_len=5, batch=2, tokens_from=pool, mechanistic=False)


def test_tokens_from_array_likes_agree(m2):
    ids = [3, 5, 8, 13, 21, 22, 23, 24]
    runs = [detect_induction_heads(m2, seq_len=5, batch=2, tokens_from=p, mechanistic=False).table
            for p in (ids, tuple(ids), np.array(ids), torch.tensor(ids))]
    assert all([r.induction for r in t] == [r.induction for r in runs[0]] for t in runs)


@pytest.mark.parametrize("value", [math.nan, math.inf, "0.4", None])
def test_thresholds_are_numbers(m2, value):
    error = ValueError if isinstance(value, float) else TypeError
    with pytest.raises(error, match="threshold"):
        detect_induction_heads(m2, seq_len=5, batch=2, threshold=value, mechanistic=False)
    with pytest.raises(error, match="prefix_threshold"):
        detect_induction_heads(m2, seq_len=5, batch=2, prefix_threshold=value, mechanistic=False)
    with pytest.raises(error, match="threshold"):
        detect_previous_token_heads(m2, threshold=value)
    with pytest.raises(error, match="threshold"):
        copying_heads_table(m2, threshold=value, behavioural=False)
    with pytest.raises(error, match="threshold"):
        positional_vs_content(m2, threshold=value)

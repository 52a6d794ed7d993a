"""Untrusted files into every loader: models.load, from_transformer_lens_state_dict, load_tokenizer and the
corpora. Each failure is a CheckpointError / ConfigError / TokenizerError / CorpusError (all ValueErrors) or a
TypeError for a wrong argument type, with the file named; nothing allocates what a config merely claims."""

from __future__ import annotations

import json
import os
import shutil
import struct

import pytest
import torch
from safetensors.torch import load_file, save_file

import models
from models import CheckpointError, ConfigError, HookedTransformer, HookedTransformerConfig
from models.data.corpora import CorpusError, build_token_corpus, folder_source, resolve_source
from models.data.tokenizer import ByteTokenizer, TokenizerError, load_tokenizer, make_tokenizer

CFG = HookedTransformerConfig(n_layers=1, d_model=8, n_ctx=8, d_vocab=20, n_heads=2, seed=0)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    d = tmp_path_factory.mktemp("saved")
    models.save(HookedTransformer(CFG), d / "m")
    return d / "m"


@pytest.fixture
def folder(saved, tmp_path):
    """A fresh copy of a good model folder, to break."""
    return shutil.copytree(saved, tmp_path / "m")


def _edit_config(folder, **changes):
    d = json.loads((folder / "config.json").read_text())
    for k, v in changes.items():
        if v is _DROP:
            d.pop(k)
        else:
            d[k] = v
    (folder / "config.json").write_text(json.dumps(d))


_DROP = object()


@pytest.mark.parametrize("changes,exc,match", [
    (dict(n_heads=_DROP), CheckpointError, "n_key_value_heads=2 must be a positive divisor of n_heads=1"),
    (dict(d_vocab=_DROP), CheckpointError, r"missing required field\(s\) \['d_vocab'\]"),
    (dict(bogus_field=1), CheckpointError, r"unknown config field\(s\) \['bogus_field'\]"),
    (dict(n_layers="1"), CheckpointError, "n_layers must be an int, got '1'"),
    (dict(extra=[1]), CheckpointError, "extra must be a dict"),
    (dict(d_vocab=21), CheckpointError, r"embed.W_E has shape \(20, 8\), the config expects \(21, 8\)"),
    (dict(d_model=10**9), CheckpointError, "the config describes at least .* weights but the checkpoint holds"),
    (dict(d_vocab=10**12), CheckpointError, "the config describes at least"),
    (dict(dtype="int8"), CheckpointError, "dtype='int8' is not supported"),
])
def test_configs_with_missing_extra_or_wrong_fields(folder, changes, exc, match):
    _edit_config(folder, **changes)
    with pytest.raises(exc, match=match) as info:
        models.load(folder)
    assert str(folder) in str(info.value)


@pytest.mark.parametrize("text,match", [
    ("[" * 100_000, "RecursionError"),  # json.loads recursion, not a crash
    ('{"n_layers": 1e400, "d_model": 8, "n_ctx": 8, "d_vocab": 20}', "overflows a float"),
    ("[1, 2]", "must be a JSON object"),
    ("null", "must be a JSON object"),
    ("", "not valid JSON"),
    ('{"n_layers": NaN}', "NaN is not a number"),
])
def test_corrupted_config_json(folder, text, match):
    (folder / "config.json").write_text(text)
    with pytest.raises(CheckpointError, match=match):
        models.load(folder)


def test_binary_config_and_directory_where_a_file_is_expected(folder, tmp_path):
    (folder / "config.json").write_bytes(b"\xff\xfe\x00\x01" * 8)
    with pytest.raises(CheckpointError, match="cannot read"):
        models.load(folder)
    (folder / "config.json").unlink()
    (folder / "config.json").mkdir()
    with pytest.raises(CheckpointError, match="cannot read.*Is a directory"):
        models.load(folder)


def test_weights_file_replaced_by_a_folder_or_a_dangling_link(folder):
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors").mkdir()
    with pytest.raises(CheckpointError, match="model.safetensors: missing or not a file"):
        models.load(folder)
    (folder / "model.safetensors").rmdir()
    os.symlink(folder / "nowhere", folder / "model.safetensors")
    with pytest.raises(CheckpointError, match="model.safetensors: missing or not a file"):
        models.load(folder)


@pytest.mark.parametrize("how", ["huge header length", "header not JSON", "offsets past the end", "wrong dtype name"])
def test_lying_safetensors_headers(folder, how):
    f = folder / "model.safetensors"
    raw = f.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8 : 8 + n])
    if how == "huge header length":
        raw = struct.pack("<Q", 2**62) + raw[8:]
    elif how == "header not JSON":
        raw = raw[:8] + b"\x00" * n + raw[8 + n :]
    else:
        key = next(k for k in header if k != "__metadata__")
        if how == "offsets past the end":
            header[key]["data_offsets"] = [0, 10**12]
        else:
            header[key]["dtype"] = "Q99"
        h = json.dumps(header).encode()
        raw = struct.pack("<Q", len(h)) + h + raw[8 + n :]
    f.write_bytes(raw)
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        models.load(folder)


def test_tokenizer_file_problems(folder):
    (folder / "tokenizer.json").mkdir()
    with pytest.raises(CheckpointError, match="tokenizer.json: not a file"):
        models.load(folder)
    (folder / "tokenizer.json").rmdir()
    (folder / "tokenizer.json").write_bytes(b"\x00garbage")
    with pytest.raises(TokenizerError, match="tokenizer.json: not a readable tokenizer file"):
        models.load(folder)
    ByteTokenizer().save(folder / "tokenizer.json")  # 259 ids, the model has 20
    with pytest.raises(CheckpointError, match="tokenizer has 259 ids but the model's d_vocab is 20"):
        models.load(folder)


@pytest.mark.parametrize("name,exc,match", [
    (42, TypeError, "zoo name or a folder path, got int"),
    (None, TypeError, "got NoneType"),
    ("no/such/folder", CheckpointError, "unknown model 'no/such/folder'"),
])
def test_bad_model_names(name, exc, match):
    with pytest.raises(exc, match=match):
        models.load(name)


def test_empty_folder_and_dangling_folder_link(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="config.json: missing"):
        models.load(tmp_path / "empty")
    os.symlink(tmp_path / "nowhere", tmp_path / "link")
    with pytest.raises(CheckpointError, match="unknown model"):
        models.load(tmp_path / "link")


def test_non_finite_weights_load(folder):
    """Documented: a NaN weight is data, not a format error; analyses then refuse it (NonFiniteError)."""
    st = load_file(str(folder / "model.safetensors"))
    st["embed.W_E"][0, 0] = float("nan")
    save_file(st, str(folder / "model.safetensors"))
    assert torch.isnan(models.load(folder).W_E).any()


# --- legacy state dicts -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sd():
    return HookedTransformer(CFG).state_dict()


@pytest.mark.parametrize("edit,exc,match", [
    (lambda s: {1: torch.zeros(1), **s}, CheckpointError, "tensor names must be strings"),
    (lambda s: {**s, "embed.W_E": "x"}, CheckpointError, "embed.W_E is a str, not a tensor"),
    (lambda s: {**s, "embed.W_E": {"a": 1}}, CheckpointError, "embed.W_E is a dict"),
    (lambda s: {**s, "embed.W_E": s["embed.W_E"].to(torch.complex64)}, CheckpointError, "dtype torch.complex64"),
    (lambda s: {**s, "embed.W_E": s["embed.W_E"].long()}, CheckpointError, "dtype torch.int64"),
    (lambda s: {**s, "embed.W_E": torch.tensor(1.0)}, CheckpointError, r"shape \(\), the config expects \(20, 8\)"),
    (lambda s: {**s, "embed.W_E": torch.empty(20, 8, device="meta")}, CheckpointError, "meta device"),
    (lambda s: {k: v for k, v in s.items() if k != "blocks.0.attn.W_Q"}, CheckpointError, "missing tensor"),
    (lambda s: {**s, "blocks.7.attn.W_Q": torch.zeros(1)}, CheckpointError, "unexpected tensor"),
    (lambda s: [1, 2], CheckpointError, "expected a dict of tensors, got list"),
    (lambda s: b"/x.pth", CheckpointError, "expected a dict of tensors, got bytes"),
])
def test_bad_state_dicts(sd, edit, exc, match):
    with pytest.raises(exc, match=match):
        models.from_transformer_lens_state_dict(edit(dict(sd)), CFG)


@pytest.mark.parametrize("cfg,exc,match", [
    (None, TypeError, "cfg must be a HookedTransformerConfig or a config dict"),
    ("config.json", TypeError, "cfg must be"),
    ({}, ConfigError, "missing required field"),
    ({"n_layers": "x"}, ConfigError, "missing required field"),
    (dict(CFG.to_dict(), use_qk_norm=True), ConfigError, r"\['use_qk_norm'\], which this toolkit does not implement"),
    (dict(CFG.to_dict(), d_model=10**8), CheckpointError, "the config describes at least"),
])
def test_bad_configs_for_state_dicts(sd, cfg, exc, match):
    with pytest.raises(exc, match=match):
        models.from_transformer_lens_state_dict(sd, cfg)


@pytest.mark.parametrize("content,match", [
    (b"", "refused or unreadable"),  # an empty .pth: its error message is empty too
    (b"PK\x03\x04garbage", "refused or unreadable"),
    (b"\x80\x04K\x01.", "refused or unreadable"),  # a bare pickle, not torch's format
])
def test_bad_pth_files(tmp_path, content, match):
    (tmp_path / "x.pth").write_bytes(content)
    with pytest.raises(CheckpointError, match=match):
        models.from_transformer_lens_state_dict(tmp_path / "x.pth", CFG)


def test_pth_holding_a_list(tmp_path):
    torch.save([1, 2, 3], tmp_path / "list.pth")
    with pytest.raises(CheckpointError, match="expected a dict of tensors, got list"):
        models.from_transformer_lens_state_dict(tmp_path / "list.pth", CFG)


def test_state_dict_paths_that_are_not_files(tmp_path):
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling.pth")
    for p in (tmp_path, tmp_path / "dangling.pth", tmp_path / "missing.pth"):
        with pytest.raises(CheckpointError, match="not a state-dict file"):
            models.from_transformer_lens_state_dict(p, CFG)
    (tmp_path / "x.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}")
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        models.from_transformer_lens_state_dict(tmp_path / "x.safetensors", CFG)


# --- tokenizers --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("content,match", [
    (b"{}", "not a valid tokenizer"),
    (b"[]", "not a valid tokenizer"),
    (b'{"toy_circuits_tokenizer": "bpe"}', "not a valid tokenizer"),
    (b"\xff\xfe\x00", "not a readable tokenizer file"),
    (b"[" * 100_000, "RecursionError"),
    (b"", "not a readable tokenizer file"),
])
def test_bad_tokenizer_files(tmp_path, content, match):
    (tmp_path / "t.json").write_bytes(content)
    with pytest.raises(TokenizerError, match=match):
        load_tokenizer(tmp_path / "t.json")


def test_tokenizer_paths_that_are_not_files(tmp_path):
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling.json")
    for p in (tmp_path, tmp_path / "dangling.json", tmp_path / "missing.json"):
        with pytest.raises(TokenizerError, match="not a readable tokenizer file"):
            load_tokenizer(p)


@pytest.mark.parametrize("spec,match", [(None, "got NoneType"), (5, "got int"), ("bpe-abc", "expected 'bpe-<vocab"),
                                        ("bpe-10", "vocab_size must be >= 259"), ("nonsense", "unknown tokenizer")])
def test_bad_tokenizer_specs(spec, match):
    with pytest.raises(TokenizerError, match=match):
        make_tokenizer(spec, ["some text"])


# --- corpora -----------------------------------------------------------------------------------------------
def test_bad_corpora(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(CorpusError, match="has no text files"):
        folder_source(tmp_path / "empty")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "a.bin").write_bytes(b"\x00\x01\x02" * 100)
    with pytest.raises(CorpusError, match="only binary files"):
        folder_source(tmp_path / "bin")
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling")
    with pytest.raises(CorpusError, match="does not exist"):
        folder_source(tmp_path / "dangling")
    with pytest.raises(CorpusError, match="not found"):
        folder_source([tmp_path / "empty"])  # a folder where a file is expected
    with pytest.raises(CorpusError, match="got int"):
        resolve_source(5)
    (tmp_path / "blank").mkdir()
    (tmp_path / "blank" / "a.txt").write_text("")
    with pytest.raises(CorpusError, match="contains no text"):
        build_token_corpus(folder_source(tmp_path / "blank"), ByteTokenizer(), tmp_path / "cache")
    with pytest.raises(CorpusError, match=r"val_fraction must be in \(0, 1\)"):
        folder_source(tmp_path / "blank", val_fraction=0)


def test_corpus_skips_dangling_links_and_binaries_inside_a_folder(tmp_path):
    d = tmp_path / "mixed"
    d.mkdir()
    (d / "text.txt").write_text("hello world " * 20)
    (d / "blob.bin").write_bytes(b"\x00" * 64)
    os.symlink(tmp_path / "nowhere", d / "dangling.txt")
    c = build_token_corpus(folder_source(d), ByteTokenizer(), tmp_path / "cache")
    assert c.train.size + c.val.size == len("hello world " * 20) + 1

"""Files we are pointed at that are not what they claim: a FIFO or a link to /dev/zero where a JSON file is expected
(must not hang or grow), and a config implying far more weights than its file holds (refused before building)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import models
from models import HookedTransformer, HookedTransformerConfig, save
from models.data.tokenizer import ByteTokenizer, load_tokenizer
from models.errors import CheckpointError, TokenizerError

ROOT = Path(__file__).resolve().parents[2]
TINY = dict(n_layers=1, d_model=16, n_ctx=32, d_vocab=259, n_heads=2, d_mlp=None, normalization_type=None,
            positional_embedding_type="standard", seed=0)


def circuits(*argv, timeout=60):
    env = dict(os.environ, PYTHONPATH=os.environ.get("PYTHONPATH") or str(ROOT))
    return subprocess.run([sys.executable, "-m", "analyses.cli", *argv], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=ROOT)


@pytest.fixture()
def folder(tmp_path):
    save(HookedTransformer(HookedTransformerConfig(**TINY), tokenizer=ByteTokenizer()), tmp_path / "m")
    return tmp_path / "m"


def _swap(path: Path, kind: str) -> None:
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    else:
        os.symlink("/dev/zero", path)


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
@pytest.mark.parametrize("name", ["config.json", "tokenizer.json", "model.safetensors"])
def test_special_files_in_a_model_folder_are_refused_at_once(folder, name, kind):
    """Refused before reading: a read of a FIFO with no writer, or of /dev/zero, would never return."""
    _swap(folder / name, kind)
    with pytest.raises(CheckpointError if name != "tokenizer.json" else (CheckpointError, TokenizerError)):
        models.load(folder)


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_tokenizer_and_trainer_state_reads_are_bounded(tmp_path, kind):
    p = tmp_path / "tokenizer.json"
    p.write_text("{}")
    _swap(p, kind)
    with pytest.raises(TokenizerError, match="not a regular file"):
        load_tokenizer(p)


@pytest.mark.e2e
@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_cli_config_json_fifo_or_dev_zero_exits_2(folder, tmp_path, kind):
    _swap(folder / "config.json", kind)
    r = circuits("info", str(folder), timeout=60)
    assert r.returncode == 2, r.stderr
    # a link to /dev/zero leads out of the model folder: refused as such before it is opened (models.io.readers)
    why = "not a regular file" if kind == "fifo" else "symbolic link leading out of its folder"
    assert why in r.stderr and len(r.stderr.strip().splitlines()) == 1
    cfg = tmp_path / "cfg.json"
    cfg.write_text("{}")
    _swap(cfg, kind)
    r = circuits("train", "--config", str(cfg), "--out", str(tmp_path / "run"), timeout=60)
    assert r.returncode == 2 and "not a regular file" in r.stderr, r.stderr
    assert not (tmp_path / "run").exists()


@contextlib.contextmanager
def _nothing_built():
    """Fails if a model or a positional table is built inside: the refusal must come from the config alone."""
    from models.arch.positions import PositionalScheme

    built = []
    real_init, real_table = HookedTransformer.__init__, PositionalScheme.fixed_table
    HookedTransformer.__init__ = lambda self, *a, **k: (built.append("model"), real_init(self, *a, **k))[1]
    PositionalScheme.fixed_table = lambda self, *a, **k: (built.append("table"), real_table(self, *a, **k))[1]
    try:
        yield
    finally:
        HookedTransformer.__init__, PositionalScheme.fixed_table = real_init, real_table
    assert built == []


@pytest.mark.parametrize("field,value", [("n_ctx", 10**8), ("n_layers", 20_000), ("d_vocab", 10**9)])
def test_config_implying_more_weights_than_the_file_is_refused_before_building(folder, field, value):
    d = json.loads((folder / "config.json").read_text())
    d[field] = value
    (folder / "config.json").write_text(json.dumps(d))
    with _nothing_built(), pytest.raises(CheckpointError, match="describes at least"):
        models.load(folder)  # before: n_layers 20 000 built for ~29 s, n_ctx 1e8 allocated 6.4 GB


def test_fixed_table_config_far_beyond_its_weights_is_refused_before_building(tmp_path):
    """A sinusoidal table is built from the config, never saved: n_ctx 1e8 would allocate 6.4 GB (d_model 16)."""
    save(HookedTransformer(HookedTransformerConfig(**dict(TINY, positional_embedding_type="sinusoidal"))),
         tmp_path / "m")
    d = json.loads((tmp_path / "m" / "config.json").read_text())
    d["n_ctx"] = 10**8
    (tmp_path / "m" / "config.json").write_text(json.dumps(d))
    with _nothing_built(), pytest.raises(CheckpointError, match="fixed positional table"):
        models.load(tmp_path / "m")


def test_implied_weights_is_a_lower_bound_of_real_models():
    from models.io.checkpoint import implied_weights

    for kw in [TINY, dict(TINY, n_layers=3, d_mlp=24, attn_only=False, normalization_type="LN"),
               dict(TINY, positional_embedding_type="rotary", n_key_value_heads=1, n_heads=2),
               dict(TINY, positional_embedding_type="shortformer", n_layers=0)]:
        cfg = HookedTransformerConfig(**kw)
        held = sum(t.numel() for t in HookedTransformer(cfg).state_dict().values())
        assert implied_weights(cfg) <= held

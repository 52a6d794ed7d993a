"""The `circuits train` / `circuits zoo` commands: fast help, exit codes, one-line errors, a tiny run."""

import json
import subprocess
import sys

import pytest

from analyses.cli import main

pytestmark = pytest.mark.e2e  # `circuits train` end to end

TEXT = "".join(f"def g{i}(y):\n    return y - {i % 11}\n\n" for i in range(400))



def test_help_runs_as_a_module():
    r = subprocess.run([sys.executable, "-m", "analyses.cli", "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "train" in r.stdout and "zoo" in r.stdout


@pytest.mark.parametrize("argv, message", [
    (["train", "--preset", "nope", "--out", "x"], "unknown preset"),
    (["train", "--config", "/nonexistent.json", "--out", "x"], "cannot read config"),
    (["train", "--preset", "attn-only-2l", "--out", "x", "--steps", "0"], "steps must be"),
    (["train", "--preset", "attn-only-2l", "--out", "x", "--lr", "-1"], "lr must be"),
    (["train", "--preset", "attn-only-2l", "--out", "x", "--train-config", '{"steps": }'], "is not valid JSON"),
    (["train", "--preset", "attn-only-2l", "--out", "x", "--train-config", '{"stepz": 3}'], "stepz"),
    (["train", "--preset", "attn-only-2l", "--out", "x", "--train-config", '{"steps": 0}'], "steps must be"),
])
def test_bad_input_exits_2_with_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_bad_usage_exits_2(capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", "--preset", "attn-only-2l"])  # --out missing
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        main(["frobnicate"])
    assert e.value.code == 2


def test_bad_config_and_corpus(tmp_path, capsys):
    (tmp_path / "c.json").write_text(json.dumps({"n_layers": 1, "d_model": 16, "n_ctx": 16, "d_vocab": 259,
                                                 "n_heads": 3}))
    assert main(["train", "--config", str(tmp_path / "c.json"), "--out", str(tmp_path / "o")]) == 2
    assert "d_head" in capsys.readouterr().err
    (tmp_path / "ok.json").write_text(json.dumps({"n_layers": 1, "d_model": 16, "n_ctx": 16, "d_vocab": 259,
                                                  "n_heads": 2}))
    (tmp_path / "empty").mkdir()
    argv = ["train", "--config", str(tmp_path / "ok.json"), "--out", str(tmp_path / "o"), "--data",
            str(tmp_path / "empty"), "--tokenizer", "bytes"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "no text files" in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_tiny_training_run_writes_a_card(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CIRCUITS_CACHE", str(tmp_path / "cache"))
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.py").write_text(TEXT)
    cfg = {"model": {"n_layers": 2, "d_model": 32, "n_ctx": 48, "d_vocab": 259, "n_heads": 2,
                     "normalization_type": None, "positional_embedding_type": "shortformer", "use_bias": False},
           "train": {"steps": 12, "batch_size": 4, "tokenizer": "bytes", "checkpoint_every": 6,
                     "log_checkpoints": 0, "eval_every": 6, "num_threads": 1, "repeat_fraction": 0.5,
                     "repeat_min_len": 3, "repeat_max_len": 10}}
    (tmp_path / "m.json").write_text(json.dumps(cfg))
    out = tmp_path / "run"
    assert main(["train", "--config", str(tmp_path / "m.json"), "--data", str(tmp_path / "data"),
                 "--out", str(out), "--json", "--train-config", '{"steps": 10}']) == 0  # inline, over the file's
    summary = json.loads(capsys.readouterr().out)
    assert summary["steps"] == 10 and summary["out"] == str(out)
    card = (out / "card.md").read_text()
    assert "circuits train --config" in card and "validation loss" in card
    assert (out / "training_curve.png").read_bytes()[:4] == b"\x89PNG"
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert any("induction_scores_50" not in r and "previous_token_scores" in r for r in records)
    # resuming a finished run returns at once
    assert main(["train", "--config", str(tmp_path / "m.json"), "--data", str(tmp_path / "data"),
                 "--out", str(out), "--resume", "--json", "--train-config", '{"steps": 10}']) == 0


def test_zoo_lists_models(capsys):
    assert main(["zoo", "--json"]) == 0
    models = json.loads(capsys.readouterr().out)["models"]
    assert isinstance(models, list)
    for m in models:
        assert {"name", "about", "n_layers", "val_loss"} <= set(m)
    assert main(["zoo"]) == 0

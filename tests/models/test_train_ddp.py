"""Data-parallel training: 2 CPU processes (gloo, under torchrun) follow the single-process trajectory."""

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from models import load
from models.training.state import read_metrics

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    from pathlib import Path
    from tests.models.test_train import tiny_model, tiny_train
    from models.training.loop import train
    cfg = tiny_train(Path({corpus!r}), {out!r}, steps=16, log_every=1, eval_every=8, checkpoint_every=8,
                     log_checkpoints=0, batch_size=8, lr=2e-2)
    train(tiny_model(), cfg)
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(cmd, tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]


@pytest.mark.slow
def test_two_process_gloo_matches_single_process(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "code.py").write_text("".join(f"def f{i}(x):\n    return x * {i % 13}\n\n" for i in range(600)))
    single, double = tmp_path / "single", tmp_path / "double"
    (tmp_path / "one.py").write_text(SCRIPT.format(root=str(ROOT), corpus=str(corpus), out=str(single)))
    (tmp_path / "two.py").write_text(SCRIPT.format(root=str(ROOT), corpus=str(corpus), out=str(double)))
    _run([sys.executable, "one.py"], tmp_path)
    _run([sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
          "--master_addr", "127.0.0.1", "--master_port", str(_free_port()), "two.py"], tmp_path)
    a = [r["train_loss"] for r in read_metrics(single / "metrics.jsonl") if "train_loss" in r]
    b = [r["train_loss"] for r in read_metrics(double / "metrics.jsonl") if "train_loss" in r]
    assert len(a) == len(b) == 16
    assert a[-1] < a[0] - 0.5, a  # it learned
    assert torch.allclose(torch.tensor(a), torch.tensor(b), rtol=0, atol=1e-3), (a, b)
    assert (load(single).W_E - load(double).W_E).abs().max() < 1e-3
    summary = (double / "summary.json").read_text()
    assert '"world_size": 2' in summary

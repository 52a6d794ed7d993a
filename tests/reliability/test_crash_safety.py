"""Crash safety: SIGKILL at random moments of training and of `models.save`, and a full disk during a save.

After any of these, every model folder loads either as its previous or its new state (never half-written), a
killed training run resumes to bitwise the same weights as an uninterrupted one, and failed saves leave no
temporary folders. The kill trials are real subprocesses killed with SIGKILL (seeded random delays): slow job."""

from __future__ import annotations

import errno
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import models
from models import HookedTransformer, HookedTransformerConfig
from models.files import atomic
from models.training import state as ts

ROOT = Path(__file__).resolve().parents[2]


# --- training killed at random moments -------------------------------------------------------------------------
def tiny_run(out, steps=40):
    from models.training.loop import TrainConfig

    cfg = HookedTransformerConfig(n_layers=1, d_model=16, n_ctx=16, d_vocab=259, n_heads=2, d_mlp=None,
                                  normalization_type=None, positional_embedding_type="shortformer", use_bias=False)
    tc = TrainConfig(steps=steps, batch_size=4, lr=3e-3, warmup_steps=2, data="synthetic:repeat", tokenizer="bytes",
                     out_dir=str(out), checkpoint_every=4, log_checkpoints=0, eval_every=10, log_every=5,
                     progress=False, num_threads=1, val_sequences=4)
    return cfg, tc


TRAIN_CHILD = textwrap.dedent("""
    import sys
    sys.path.insert(0, {here!r})
    from test_crash_safety import tiny_run
    from models.training.loop import train
    cfg, tc = tiny_run({out!r})
    print("go", flush=True)
    train(cfg, tc, resume=True)
""")


def _spawn(script: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONHASHSEED="0", OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "go"  # imports done: the delay below is spent in the real work
    return proc


def _kill_after(proc: subprocess.Popen, delay: float) -> bool:
    """SIGKILL `proc` after `delay` s; True when it was still running (the kill landed)."""
    try:
        proc.wait(timeout=delay)
        return False
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        return True


def _check_checkpoints_load(out: Path) -> None:
    """Every visible checkpoint folder is complete and loads; hidden .tmp folders are the only debris."""
    root = out / ts.CHECKPOINTS
    for d in sorted(root.iterdir()) if root.is_dir() else []:
        if d.name.startswith("."):
            continue
        assert (d / ts.STATE_FILE).is_file() and (d / ts.OPTIMIZER_FILE).is_file(), d
        models.load(d)
        json.loads((d / ts.STATE_FILE).read_text())


@pytest.mark.slow
def test_training_killed_at_random_moments_resumes_bitwise(tmp_path):
    from models.training.loop import train

    t0 = time.perf_counter()
    straight, _ = train(*tiny_run(tmp_path / "straight"))
    t_run = time.perf_counter() - t0
    rng = random.Random(1234)
    landed = 0
    for trial in range(4):
        out = tmp_path / f"killed-{trial}"
        for _ in range(2):  # two kills per run, each at a random moment of the (resumed) run
            proc = _spawn(TRAIN_CHILD.format(here=str(Path(__file__).parent), out=str(out)))
            landed += _kill_after(proc, rng.uniform(0.0, 1.2 * t_run))
            _check_checkpoints_load(out)
            found = ts.resumable_checkpoints(out)
            if found:
                models.load(found[-1])  # the newest checkpoint is a loadable model
        resumed, summary = train(*tiny_run(out), resume=True)
        a, b = straight.state_dict(), resumed.state_dict()
        assert all(torch.equal(a[k], b[k]) for k in a), f"trial {trial}: resumed weights differ"
        steps = [r["step"] for r in ts.read_metrics(out / ts.METRICS_FILE)]
        assert steps == sorted(set(steps)), f"trial {trial}: duplicated metrics records"
        assert models.load(out).cfg == straight.cfg
    assert landed >= 4, f"only {landed} of 8 kills landed while training ran"


# --- models.save killed at random moments ---------------------------------------------------------------------
BIG = dict(n_layers=1, d_model=128, n_ctx=16, d_vocab=50257, n_heads=2, d_mlp=None, normalization_type=None)

SAVE_CHILD = textwrap.dedent("""
    import torch
    from models import HookedTransformer, HookedTransformerConfig, save
    from models.files import atomic
    if {fallback}:
        atomic._exchange = lambda a, b: False  # the two-rename path of platforms without renameat2
    cfg = HookedTransformerConfig(**{big!r}, model_name="s{seed}")
    m = HookedTransformer(cfg)
    with torch.no_grad():
        for p in m.parameters():
            p.fill_({seed})
    print("go", flush=True)
    save(m, {path!r})
    print("done", flush=True)
""")


def _state_of(path: Path) -> int:
    """The seed of the model at `path`, checking that config and weights come from the same save."""
    m = models.load(path)
    seed = int(m.cfg.model_name[1:])
    assert bool((m.W_E == seed).all()) and bool((m.W_U == seed).all()), "config and weights of different saves"
    return seed


@pytest.mark.slow
@pytest.mark.parametrize("fallback", [False, True], ids=["atomic-exchange", "two-rename-fallback"])
def test_save_killed_at_random_moments_leaves_old_or_new(tmp_path, fallback):
    path = tmp_path / "m"
    first = HookedTransformer(HookedTransformerConfig(**BIG, model_name="s0"))
    with torch.no_grad():
        for p in first.parameters():
            p.fill_(0)
    t0 = time.perf_counter()
    models.save(first, path)
    t_save = time.perf_counter() - t0
    rng = random.Random(7 + fallback)
    current, outcomes = 0, []
    for seed in range(1, 7):
        proc = _spawn(SAVE_CHILD.format(big=BIG, seed=seed, path=str(path), fallback=fallback))
        killed = _kill_after(proc, rng.uniform(0.0, 1.5 * t_save))
        now = _state_of(path)  # load() repairs an interrupted two-rename swap first
        assert now in (current, seed), f"after kill {seed}: model s{now}"
        outcomes.append((killed, now == seed))
        current = now
        visible = [p.name for p in tmp_path.iterdir() if not p.name.startswith(".")]
        assert visible == ["m"], visible
    assert any(k for k, _ in outcomes), "no kill landed during a save"


def test_interrupted_two_rename_swap_is_repaired(tmp_path):
    """A crash between the fallback's two renames leaves only `.m.old-PID`: the next load (or save) puts it back."""
    m = HookedTransformer(HookedTransformerConfig(n_layers=1, d_model=8, n_ctx=8, d_vocab=20, n_heads=2, seed=0))
    models.save(m, tmp_path / "m")
    os.replace(tmp_path / "m", tmp_path / ".m.old-12345")
    assert torch.equal(models.load(tmp_path / "m").W_E, m.W_E)
    os.replace(tmp_path / "m", tmp_path / ".m.old-12345")
    models.save(m, tmp_path / "m")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


# --- disk full during a save ------------------------------------------------------------------------------------
def _small(seed):
    return HookedTransformer(HookedTransformerConfig(n_layers=1, d_model=16, n_ctx=8, d_vocab=300, n_heads=2,
                                                     seed=seed))


def _enospc(*_a, **_k):
    raise OSError(errno.ENOSPC, "No space left on device")


def _half_then_enospc(state, filename, metadata=None):
    from safetensors.torch import save as st_save

    data = st_save(state, metadata=metadata)
    with open(filename, "wb") as f:
        f.write(data[: len(data) // 2])
    _enospc()


@pytest.mark.parametrize("where", ["weights half written", "config write", "fsync", "tokenizer save"])
def test_disk_full_during_save_keeps_the_previous_model(tmp_path, monkeypatch, where):
    from pathlib import Path as P

    from models.data.tokenizer import ByteTokenizer

    path = tmp_path / "m"
    old = _small(0)
    models.save(old, path)
    new = _small(1)
    new.tokenizer = ByteTokenizer()
    if where == "weights half written":
        monkeypatch.setattr("safetensors.torch.save_file", _half_then_enospc)
    elif where == "config write":
        real = P.write_text
        monkeypatch.setattr(P, "write_text", lambda self, *a, **k: (real(self, "{\"n_la"), _enospc()))
    elif where == "fsync":
        monkeypatch.setattr(os, "fsync", _enospc)
    else:
        monkeypatch.setattr(ByteTokenizer, "save", lambda self, p: _enospc())
    with pytest.raises(OSError) as info:
        models.save(new, path)
    assert info.value.errno == errno.ENOSPC
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"], "temporary folders left behind"
    back = models.load(path)
    assert torch.equal(back.W_E, old.W_E) and back.cfg == old.cfg


def test_disk_full_during_a_training_checkpoint(tmp_path, monkeypatch):
    """The resumable checkpoints already written stay intact and resumable; the failed one leaves nothing."""
    model = _small(0)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.tensor([[1, 2, 3]]), return_type="loss").backward()
    opt.step()
    ts.save_checkpoint(tmp_path, 4, model, opt, {"tokens_seen": 4, "wall_time": 0.0})
    monkeypatch.setattr("safetensors.torch.save_file", _half_then_enospc)
    with pytest.raises(OSError):
        ts.save_checkpoint(tmp_path, 8, model, opt, {"tokens_seen": 8, "wall_time": 0.0})
    monkeypatch.undo()
    assert [p.name for p in (tmp_path / ts.CHECKPOINTS).iterdir()] == ["step-000004"]
    found = ts.resumable_checkpoints(tmp_path)
    assert [p.name for p in found] == ["step-000004"]
    fresh = _small(5)
    state = ts.load_checkpoint(found[-1], fresh, torch.optim.AdamW(fresh.parameters()))
    assert state["step"] == 4 and torch.equal(fresh.W_E, model.W_E)


def test_atomic_exchange_is_used_here(tmp_path):
    """On Linux the swap is one renameat2(RENAME_EXCHANGE); elsewhere the repaired two-rename fallback runs."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "x").write_text("a")
    ok = atomic._exchange(a, b)
    if not sys.platform.startswith("linux"):
        pytest.skip("no renameat2 here")
    assert ok and (b / "x").read_text() == "a" and not (a / "x").exists()

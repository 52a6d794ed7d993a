"""The training run folder must never lose a user's files: foreign files, two runs on one folder, `--out .`, a link,
resuming with another model, a torn newest checkpoint, and the modes of what is saved."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import models
from models import HookedTransformerConfig
from models.errors import FolderError, TrainConfigError

pytestmark = pytest.mark.e2e  # run folders through the command line in subprocesses

ROOT = Path(__file__).resolve().parents[2]
MODEL = dict(n_layers=1, d_model=16, n_ctx=16, d_vocab=259, n_heads=2, d_mlp=None, normalization_type=None,
             positional_embedding_type="shortformer", use_bias=False)
TRAIN = dict(steps=8, batch_size=4, lr=3e-3, warmup_steps=2, data="synthetic:repeat", tokenizer="bytes",
             checkpoint_every=4, log_checkpoints=0, eval_every=4, log_every=4, progress=False, num_threads=1,
             val_sequences=4)


def run(out, resume=False, model=None, **train):
    from models.training.loop import TrainConfig
    from models.training.loop import train as train_fn

    cfg = TrainConfig(**dict(TRAIN, **train), out_dir=str(out))
    return train_fn(HookedTransformerConfig(**(model or MODEL)), cfg, resume=resume)


def circuits(*argv, cwd=ROOT, timeout=120):
    env = dict(os.environ, PYTHONPATH=os.environ.get("PYTHONPATH") or str(ROOT))
    return subprocess.run([sys.executable, "-m", "analyses.cli", *argv], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=cwd)


def cli_train(out, *extra, cwd=ROOT):
    spec = json.dumps({"model": MODEL, "train": TRAIN})
    return circuits("train", "--config", spec, "--out", str(out), "--no-scores", *extra, cwd=cwd)


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_cli_refuses_a_folder_of_foreign_files_before_any_work(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("years of work")
    (out / "data").mkdir()
    (out / "data" / "x.bin").write_bytes(os.urandom(100))
    before = snapshot(out)
    r = cli_train(out)
    assert r.returncode == 2, r.stderr
    assert "not a training run" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert snapshot(out) == before and sorted(os.listdir(tmp_path)) == ["mine"]


def test_user_files_added_to_a_run_folder_survive_a_rerun(tmp_path):
    out = tmp_path / "run"
    run(out)
    (out / "notes.md").write_text("my notes")
    run(out, steps=4)
    assert (out / "notes.md").read_text() == "my notes"
    assert json.loads((out / "summary.json").read_text())["steps"] == 4


def test_second_run_on_a_locked_folder_exits_2_naming_the_holder(tmp_path):
    out = tmp_path / "run"
    run(out)
    before = snapshot(out)
    from models.io.run_folder import lock

    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; sys.path.insert(0, sys.argv[1]);"
                               "from pathlib import Path; from models.io.run_folder import lock\n"
                               "with lock(Path(sys.argv[2])):\n print('locked', flush=True); time.sleep(60)",
                               str(ROOT), str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        r = cli_train(out)
        assert r.returncode == 2, r.stderr
        assert f"PID {holder.pid}" in r.stderr and len(r.stderr.strip().splitlines()) == 1
        with pytest.raises(FolderError, match=f"in use by another process \\(PID {holder.pid}\\)"):
            with lock(out):
                pass
    finally:
        holder.kill()
        holder.wait()
    assert snapshot(out) == before  # the first run's checkpoints and metrics are untouched


def test_two_runs_in_one_process_contend_for_the_lock(tmp_path):
    from models.io.run_folder import lock

    out = tmp_path / "run"
    errors = []
    with lock(out):
        t = threading.Thread(target=lambda: errors.append(pytest.raises(FolderError, run, out)))
        t.start()
        t.join()
    assert errors and not out.exists()
    with lock(out):  # released: it can be taken again
        pass
    assert not (tmp_path / ".run.lock").exists()


def test_out_dot_is_refused_up_front_and_nothing_is_left(tmp_path):
    (tmp_path / "keep.txt").write_text("x")
    r = cli_train(".", cwd=tmp_path)
    assert r.returncode == 2 and "current folder" in r.stderr, r.stderr
    assert sorted(os.listdir(tmp_path)) == ["keep.txt"]


def test_out_link_trains_into_the_target_and_keeps_the_link(tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    link = tmp_path / "LINK"
    link.symlink_to(target, target_is_directory=True)
    run(link)
    assert link.is_symlink() and Path(os.readlink(link)) == target
    assert models.load(target).cfg.n_layers == 1
    assert sorted(os.listdir(tmp_path)) == ["LINK", "target"]  # no hidden .LINK.tmp-* / .lock left


@pytest.mark.parametrize("change,field", [({"n_heads": 4}, "n_heads"), ({"d_model": 32}, "d_model"),
                                          ({"positional_embedding_type": "standard"}, "positional_embedding_type")])
def test_resume_with_another_model_is_refused_naming_the_fields(tmp_path, change, field):
    out = tmp_path / "run"
    run(out, steps=4)
    before = snapshot(out)
    with pytest.raises(TrainConfigError, match=f"model config differs.*{field}"):
        run(out, resume=True, model=dict(MODEL, **change), steps=8)
    assert snapshot(out) == before


def test_resume_with_a_new_schedule_is_allowed_and_recorded(tmp_path):
    out = tmp_path / "run"
    run(out, steps=4)
    _, summary = run(out, resume=True, steps=8, lr=1e-3)
    assert summary["steps"] == 8
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    changed = [r for r in recs if "resumed_with" in r]
    assert changed == [{"step": 4, "resumed_with": {"steps": [4, 8], "lr": [3e-3, 1e-3]}}]
    with pytest.raises(TrainConfigError, match="batch_size"):
        run(out, resume=True, steps=12, batch_size=8)


def test_torn_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, capfd):
    from models.training.state import resumable_checkpoints

    out = tmp_path / "run"
    run(out, steps=8, keep_checkpoints=None)
    ckpt = out / "checkpoints"
    (out / "summary.json").unlink()  # as if killed after its last checkpoint
    st = ckpt / "step-000008" / "trainer_state.json"
    st.write_bytes(st.read_bytes()[:40])  # torn
    assert [p.name for p in resumable_checkpoints(out)][-1] == "step-000008"
    model, summary = run(out, resume=True, steps=8)
    err = capfd.readouterr().err
    assert "step-000008 is damaged" in err and "resuming from step-000004" in err
    assert summary["steps"] == 8
    ref, _ = run(tmp_path / "ref", steps=8)
    for a, b in zip(model.parameters(), ref.parameters()):
        assert (a - b).abs().max() < 1e-5  # resumed from step 4, the same weights as an uninterrupted run


@pytest.mark.parametrize("umask,dir_mode,file_mode", [(0o022, 0o755, 0o644), (0o077, 0o700, 0o600)])
def test_saved_modes_follow_the_umask(tmp_path, umask, dir_mode, file_mode):
    code = ("import os, sys; os.umask(int(sys.argv[1], 8)); import models;"
            "from models import HookedTransformer, HookedTransformerConfig;"
            "models.save(HookedTransformer(HookedTransformerConfig(n_layers=1, d_model=8, n_ctx=8, d_vocab=10, "
            "n_heads=1)), sys.argv[2])")
    env = dict(os.environ, PYTHONPATH=os.environ.get("PYTHONPATH") or str(ROOT))
    subprocess.run([sys.executable, "-c", code, oct(umask), str(tmp_path / "m")], check=True, env=env)
    assert (tmp_path / "m").stat().st_mode & 0o777 == dir_mode
    for name in ("config.json", "model.safetensors"):
        assert (tmp_path / "m" / name).stat().st_mode & 0o777 == file_mode

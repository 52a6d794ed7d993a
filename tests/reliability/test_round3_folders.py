"""Round three (issue 32), a model folder someone hands you: its train_config.json's `data` never makes us read
outside it (row 3). Each test failed on the code before the change (docs/RELIABILITY.md, round three)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import models
from models import HookedTransformer, HookedTransformerConfig, save
from models.data.tokenizer import ByteTokenizer

ROOT = Path(__file__).resolve().parents[2]
SECRET = "password=hunter2-round3"


def circuits(*argv, timeout=120) -> subprocess.CompletedProcess:
    """`circuits ARGV` in a subprocess; `timeout` is the hang guard (a FIFO opened for reading blocks forever)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "analyses.cli", *map(str, argv)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=env)


def main(capsys, *argv) -> subprocess.CompletedProcess:
    """`circuits ARGV` in this process (cases that cannot hang)."""
    from analyses import cli

    capsys.readouterr()
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(argv, code, out, err)


HANGS = ("fifo", "device", "a FIFO elsewhere")  # run in a subprocess with a timeout


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    cfg = HookedTransformerConfig(n_layers=1, d_model=16, n_ctx=16, d_vocab=259, n_heads=2, attn_only=True,
                                  normalization_type=None, seed=0)
    d = tmp_path_factory.mktemp("handed")
    save(HookedTransformer(cfg, tokenizer=ByteTokenizer()), d / "model")
    (d / "private.txt").write_text((SECRET + "\n") * 200)
    os.mkfifo(d / "outside.fifo")
    return d


def _folder(base: Path, tmp_path: Path, data, extra=None) -> Path:
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(base / "model", folder)
    for name, make in (extra or {}).items():
        make(folder / name)
    (folder / "train_config.json").write_text(json.dumps({"data": data, "tokenizer": "bytes"}))
    return folder


HOSTILE = {
    "private file elsewhere": lambda base: str(base / "private.txt"),
    "relative escape": lambda base: "../../" + "/".join((base / "private.txt").parts[1:]),
    "a directory (/etc)": lambda base: "/etc",
    "a FIFO elsewhere": lambda base: str(base / "outside.fifo"),
    "a list with a file elsewhere": lambda base: [str(base / "private.txt")],
}


def _cases(names):  # the ones that could hang run in a subprocess with a timeout: the e2e job
    return [pytest.param(n, marks=pytest.mark.e2e) if n in HANGS else n for n in names]


@pytest.mark.parametrize("case", _cases(HOSTILE))
@pytest.mark.parametrize("command", ["report", "heads"])
def test_a_folders_data_outside_it_is_refused_by_name(base, tmp_path, case, command, capsys):
    data = HOSTILE[case](base)
    folder = _folder(base, tmp_path, data)
    argv = [command, folder, "--no-progress"] + (["--out", tmp_path / "out", "--html"] if command == "report" else [])
    r = circuits(*argv) if case in HANGS else main(capsys, *argv)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    shown = data[0] if isinstance(data, list) else data
    assert repr(shown) in lines[0] and "outside the model folder" in lines[0], lines
    assert SECRET not in r.stdout + r.stderr
    written = [p for p in (tmp_path / "out").rglob("*") if p.is_file()] if (tmp_path / "out").exists() else []
    assert not written and not any(SECRET in p.read_text(errors="replace") for p in written)


@pytest.mark.parametrize("case", _cases(["fifo", "link out", "subfolder", "device"]))
def test_a_folders_data_inside_it_must_be_a_regular_file(base, tmp_path, case, capsys):
    extra = {"fifo": {"corpus": os.mkfifo},
             "link out": {"corpus": lambda p: p.symlink_to(base / "private.txt")},
             "subfolder": {"corpus": lambda p: p.mkdir()},
             "device": {"corpus": lambda p: p.symlink_to("/dev/zero")}}[case]
    folder = _folder(base, tmp_path, "corpus", extra)
    r = circuits("heads", folder, "--no-progress", timeout=60) if case in HANGS else main(capsys, "heads", folder,
                                                                                         "--no-progress")
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert "'corpus'" in lines[0] and ("outside" in lines[0] or "not a regular file" in lines[0]), lines
    assert SECRET not in r.stdout + r.stderr


def test_a_regular_file_inside_the_folder_and_built_in_names_are_read(base, tmp_path):
    from analyses.report import training_corpus
    from models import load
    from models.data.corpora import recorded_data

    text = "def inside(x):\n    return x + 1\n" * 400
    folder = _folder(base, tmp_path, ["a.txt"], {"a.txt": lambda p: p.write_text(text)})
    assert recorded_data(folder, ["a.txt"]) == [(folder / "a.txt").resolve()]
    for name in ("stdlib", "synthetic:repeat", "seq2seq:reverse", None):
        assert recorded_data(folder, name) == (name or "stdlib")
    model = load(folder)
    corpus = training_corpus(model, folder)
    decoded = ByteTokenizer().decode([int(i) for i in corpus.train[:200]])
    assert decoded == text[:200]


# --- row 4: resuming a finished run with another model ---------------------------------------------------------------
MODEL = dict(n_layers=1, d_model=16, n_ctx=16, d_vocab=259, n_heads=2, d_mlp=None, normalization_type=None,
             use_bias=False)
TRAIN = dict(steps=4, batch_size=4, lr=3e-3, warmup_steps=1, data="synthetic:repeat", tokenizer="bytes",
             checkpoint_every=2, log_checkpoints=0, eval_every=2, log_every=2, progress=False, num_threads=1,
             val_sequences=4)


def _train(out, resume=False, **model):
    from models.training.loop import TrainConfig, train

    return train(HookedTransformerConfig(**dict(MODEL, **model)), TrainConfig(**TRAIN, out_dir=str(out)),
                 resume=resume)


def _snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_resuming_a_finished_run_with_another_model_is_refused(tmp_path):
    from models.errors import TrainConfigError

    out = tmp_path / "run"
    _train(out)
    before = _snapshot(out)
    with pytest.raises(TrainConfigError, match=r"model config differs.*d_model.*16 -> 32"):
        _train(out, resume=True, d_model=32)
    assert _snapshot(out) == before
    model, summary = _train(out, resume=True)  # the same model: nothing to do, the finished model comes back
    assert model.cfg.d_model == 16 and summary["steps"] == 4
    assert _snapshot(out) == before


def test_resuming_a_finished_run_with_another_model_exits_2(tmp_path, capsys):
    out = tmp_path / "run"
    _train(out)
    before = _snapshot(out)
    spec = json.dumps({"model": dict(MODEL, d_model=32), "train": TRAIN})
    r = main(capsys, "train", "--config", spec, "--out", out, "--resume", "--no-scores")
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "d_model" in lines[0], r.stderr
    assert _snapshot(out) == before


# --- row 5: a config claiming many more layers than its weights ------------------------------------------------------
PROBE = r"""
import json, resource, sys
import models.arch.model as arch
from models import load
from models.errors import CheckpointError

built = []
init = arch.HookedTransformer.__init__
arch.HookedTransformer.__init__ = lambda self, *a, **k: (built.append(1), init(self, *a, **k))[1]
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    load(sys.argv[1])
    outcome = "loaded"
except CheckpointError as e:
    outcome = str(e)
extra = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(json.dumps({"outcome": outcome, "built": len(built), "extra_kib": extra}))
"""


@pytest.mark.e2e  # peak memory of a fresh interpreter
@pytest.mark.parametrize("claim", [{"n_layers": 6000, "d_head": 1}, {"n_layers": 2}])
def test_a_config_claiming_more_layers_is_refused_before_building(base, tmp_path, claim):
    folder = _folder(base, tmp_path, "stdlib")
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(cfg, **claim)))
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-c", PROBE, str(folder)], capture_output=True, text=True, timeout=300,
                       cwd=ROOT, env=env)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.splitlines()[-1])
    assert f"{claim['n_layers']:,} layers" in got["outcome"], got
    assert got["built"] == 0, got  # refused from the header, before any module was built
    assert got["extra_kib"] < 150 * 1024, got


# --- row 14: staging folders of killed reports ------------------------------------------------------------------------
KILLED = ("import os, signal, sys\nimport analyses.report.build as R\n"
          "R._write = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)\n"
          "from analyses.cli import main\nsys.exit(main())")
LIVE = ("import sys\nfrom pathlib import Path\nfrom models.io.run_folder import staged\n"
        "with staged(Path(sys.argv[1]), 'report') as stage:\n    print(stage, flush=True)\n    sys.stdin.read()")


@pytest.mark.e2e  # SIGKILLed reports in subprocesses
def test_the_next_report_removes_staging_folders_of_killed_runs_only(base, tmp_path):
    """Reports stage beside their folder (`models.io.run_folder.staged`) holding the folder's lock: a killed run's
    stage is removed by the next run, which holds the lock; while a run lives, a second one is refused."""
    from analyses import build_report
    from models.errors import FolderError

    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    seen = []
    for _ in range(2):  # two SIGKILLed reports: each leaves its staging folder, the second removes the first's
        r = subprocess.run([sys.executable, "-c", KILLED, "report", str(base / "model"), "--out", str(out),
                            "--sections", "overview", "--no-progress"], capture_output=True, timeout=300, env=env)
        assert r.returncode == -9, r.stderr
        seen.append(sorted(tmp_path.glob(".out.stage-*")))
    assert len(seen[0]) == 1 and len(seen[1]) == 1 and seen[0] != seen[1], seen
    foreign = tmp_path / ".out.stage-notours"
    foreign.mkdir()
    live = subprocess.Popen([sys.executable, "-c", LIVE, str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=env)
    try:
        live_stage = Path(live.stdout.readline().strip())
        assert live_stage.is_dir() and set(tmp_path.glob(".out.stage-*")) == {live_stage, foreign}
        with pytest.raises(FolderError, match=f"in use by another process \\(PID {live.pid}\\)"):
            build_report(models.load(base / "model"), out, folder=base / "model", sections=["overview"],
                         progress=False, parallel=False)
        assert live_stage.is_dir()  # the refused run touched nothing
    finally:
        live.communicate("", timeout=60)
    assert not live_stage.exists()  # removed by its own run at the end
    build_report(models.load(base / "model"), out, folder=base / "model", sections=["overview"], progress=False,
                 parallel=False)
    assert (out / "report.md").is_file() and set(tmp_path.glob(".out.stage-*")) == {foreign}

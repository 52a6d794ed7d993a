"""`python -m analyses.exposure_bias_experiment` (issue 38): every bad argument is one line and exit 2 with nothing
written (`--seeds 0` used to write results.json and results.md, then crash), a foreign --out is refused, the results
are published through the run-folder module, and no library module imports the command line."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from analyses import exposure_bias_experiment as ex

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("argv, message", [
    (["--seeds", "0"], "--seeds 0"),
    (["--seeds", "-3"], "--seeds -3"),
    (["--seeds", "12345678901234567890"], "--seeds 12345678901234567890"),
    (["--seeds", "²"], "invalid int value"),
    (["--seeds", "x"], "invalid int value"),
    (["--schedules", "bogus"], "invalid choice: 'bogus'"),
    (["--steps", "0"], "--steps 0"),
    (["--seeds", "2", "--held-out-seeds", "0", "--first-seed", "2"], "--first-seed 2"),
    (["--held-out-seeds", "-1"], "--held-out-seeds -1"),
    (["--tasks", "bogus"], "invalid choice: 'bogus'"),
])
def test_bad_arguments_exit_2_with_one_line_and_write_nothing(tmp_path, capsys, argv, message):
    out = tmp_path / "eb"
    with pytest.raises(SystemExit) as e:
        ex.run_experiment(["--out", str(out), *argv])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and message in err and len(err.splitlines()) == 1, err
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_a_foreign_out_folder_is_refused_before_any_training(tmp_path, capsys, monkeypatch):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("keep")
    monkeypatch.setattr(ex, "run_one", lambda *a: pytest.fail("trained into a foreign folder"))
    assert ex.run_experiment(["--out", str(out), "--seeds", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "not exposure-bias results" in err and len(err.splitlines()) == 1
    assert [p.name for p in out.iterdir()] == ["thesis.tex"]


def fake_run(schedule: str, seed: int, steps: int = 2000, task: str = "cumsum") -> dict:
    """A run's record with the experiment's keys and made-up numbers (the statistics are tested elsewhere)."""
    n = ex.MAX_LEN
    base = 0.1 + 0.01 * seed + 0.02 * list(ex.SCHEDULES).index(schedule)
    r = {"task": task, "schedule": schedule, "seed": seed, "steps": 100 + seed, "budget": steps, "reached": True,
         "stop_accuracy": 0.95, "history_tail": [0.9, 0.92, 0.95],
         "measured_teacher_forced_accuracy": 0.94 - 0.01 * seed}
    for t in ex.TARGETS:
        r.update({f"{m}_{t}": base + 0.01 * i for i, m in enumerate(ex.BASE_SCALARS)})
    r.update({key: [base] * (n if key.endswith("by_position") else n - 1) for key in ex.PER_POSITION})
    return r


def test_results_are_published_into_a_marked_folder_and_reruns_keep_the_runs(tmp_path, monkeypatch):
    from models.io.run_folder import MARK_FILE, read_mark

    monkeypatch.setattr(ex, "run_one", fake_run)
    out = tmp_path / "eb"
    argv = ["--out", str(out), "--seeds", "2", "--held-out-seeds", "0", "--tasks", "cumsum", "--schedules",
            "teacher forcing", "linear"]
    assert ex.run_experiment(argv) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted([MARK_FILE, "runs", "results.json", "results.md",
                                                                 *ex.FIGURES["cumsum"]])
    assert read_mark(out).kind == "exposure-bias"
    result = json.loads((out / "results.json").read_text())
    assert [r["seed"] for r in result["runs"]] == [0, 1, 0, 1]
    assert (out / "results.md").read_text().endswith(ex.results_markdown(result))
    runs = {p.name: p.read_bytes() for p in (out / "runs").iterdir()}
    (out / "notes.md").write_text("mine")
    monkeypatch.setattr(ex, "run_one", lambda *a: pytest.fail("a run already there was trained again"))
    assert ex.run_experiment(argv) == 0
    assert {p.name: p.read_bytes() for p in (out / "runs").iterdir()} == runs
    assert (out / "notes.md").read_text() == "mine"  # a file the user added survives the publication
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eb"]  # no staging folder, no lock left


def test_no_library_module_imports_the_command_line():
    """analyses/ outside analyses/cli/ never imports analyses.cli, at module level or inside a function."""
    offenders = []
    for path in sorted((ROOT / "analyses").rglob("*.py")):
        if "cli" in path.relative_to(ROOT / "analyses").parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1 if path.name != "__init__.py"
                                                                                  else None])
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                names = [node.module or ""] if node.level == 0 else [f"{base}.{node.module or ''}".rstrip(".")]
            offenders += [f"{path.relative_to(ROOT)}:{node.lineno}" for n in names
                          if n == "analyses.cli" or n.startswith("analyses.cli.")]
    assert offenders == []


def test_summarise_only_trains_nothing_and_names_the_missing_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(ex, "run_one", fake_run)
    out = tmp_path / "eb"
    base = ["--out", str(out), "--tasks", "cumsum", "--schedules", "teacher forcing", "linear"]
    assert ex.run_experiment([*base, "--seeds", "2", "--held-out-seeds", "0"]) == 0
    monkeypatch.setattr(ex, "run_one", lambda *a: pytest.fail("--summarise-only trained a run"))
    assert ex.run_experiment([*base, "--seeds", "2", "--held-out-seeds", "1", "--summarise-only"]) == 0
    result = json.loads((out / "results.json").read_text())
    assert result["missing_runs"] == ["cumsum teacher forcing seed 2", "cumsum linear seed 2"]
    md = (out / "results.md").read_text()
    assert "--summarise-only" in md and "Not trained (cut for CPU time): cumsum teacher forcing seed 2" in md

"""A seed sweep's folders are its own (issue 38): a single `train` into a member is refused while the sweep runs and
after it, a `sweep.json` of another tool is not overwritten, and a resume that finds the sweep changed (a member
folder missing, a member without checkpoints, other settings in one member) refuses with one line and changes
nothing. Each test failed on the code before the run-folder module."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from analyses.cli import main
from models.io.checkpoint import read_safetensors
from models.training.loop import train
from models.training.sweep import member_dir, sweep_json, train_sweep
from tests.models.test_sweep import Killed, run_cfg
from tests.models.test_train import TEXT, tiny_model, tiny_train

SEEDS = [1, 2]


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    (d / "code.py").write_text(TEXT)
    return d


def snapshot(folder: Path) -> dict:
    """Every file under `folder` (hidden ones too) with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def killed_sweep(corpus_dir, out: Path) -> None:
    """A sweep of `SEEDS` killed after its second checkpoint (members hold checkpoints at steps 0 and 6)."""
    calls = []

    def dies(model):
        calls.append(1)
        if len(calls) == 2 * len(SEEDS) + 1:
            raise Killed
        return {}

    with pytest.raises(Killed):
        train_sweep(tiny_model(), run_cfg(corpus_dir, out), SEEDS, eval_fn=dies)
    assert sweep_json(out)["status"] == "running"


# --- a single run into a member ------------------------------------------------------------------------------
def test_train_into_a_member_of_a_running_sweep_is_refused(corpus_dir, tmp_path):
    out = tmp_path / "sweep"
    outcome = []

    def intruder(model):  # runs inside the sweep, while it holds its folder
        if not outcome:
            try:
                train(tiny_model(), tiny_train(corpus_dir, member_dir(out, SEEDS[0]), steps=4))
                outcome.append("trained into the member")
            except ValueError as e:
                outcome.append(str(e))
        return {}

    train_sweep(tiny_model(), run_cfg(corpus_dir, out), SEEDS, eval_fn=intruder)
    assert "member of a seed sweep" in outcome[0], outcome
    member = member_dir(out, SEEDS[0])
    assert json.loads((member / "summary.json").read_text())["steps"] == 16  # the sweep's, not a 4-step run
    assert (member / "checkpoints" / "step-000016").is_dir()


def test_train_into_a_member_of_a_finished_sweep_exits_2_and_changes_nothing(corpus_dir, tmp_path, capsys):
    out = tmp_path / "sweep"
    train_sweep(tiny_model(), run_cfg(corpus_dir, out), SEEDS)
    before = snapshot(out)
    member = member_dir(out, SEEDS[0])
    with pytest.raises(ValueError, match="member of a seed sweep"):
        train(tiny_model(), tiny_train(corpus_dir, member, steps=4))
    spec = json.dumps({"model": tiny_model().to_dict(), "train": {"steps": 4, "data": str(corpus_dir),
                                                                  "tokenizer": "bytes"}})
    capsys.readouterr()
    assert main(["train", "--config", spec, "--out", str(member), "--no-scores", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert "member of a seed sweep" in err and len(err.splitlines()) == 1
    # a new folder inside the sweep is refused too: a sweep's sub-folders are its members and reports on it
    with pytest.raises(ValueError, match="inside a seed sweep"):
        train(tiny_model(), tiny_train(corpus_dir, out / "seed-9", steps=4))
    assert snapshot(out) == before
    for mark in out.rglob(".toy-circuits.json"):  # a sweep written before folders carried marks: known by its files
        mark.unlink()
    before = snapshot(out)
    with pytest.raises(ValueError, match="member of a seed sweep"):
        train(tiny_model(), tiny_train(corpus_dir, member, steps=4))
    assert snapshot(out) == before
    train_sweep(tiny_model(), run_cfg(corpus_dir, out), SEEDS, resume=True)  # and the sweep itself still resumes it


# --- a foreign sweep.json ------------------------------------------------------------------------------------
def test_a_sweep_json_of_another_tool_is_not_overwritten(corpus_dir, tmp_path):
    out = tmp_path / "theirs"
    out.mkdir()
    (out / "sweep.json").write_text(json.dumps({"method": "bayes", "parameters": {"lr": {"min": 0.0001}}}))
    before = snapshot(out)
    with pytest.raises(ValueError, match="not a seed sweep"):
        train_sweep(tiny_model(), run_cfg(corpus_dir, out), SEEDS)
    assert snapshot(out) == before and sorted(p.name for p in tmp_path.iterdir()) == ["theirs"]


# --- resuming a sweep that changed ---------------------------------------------------------------------------
def test_resume_with_a_member_folder_missing_refuses_and_changes_nothing(corpus_dir, tmp_path):
    out = tmp_path / "sweep"
    killed_sweep(corpus_dir, out)
    shutil.rmtree(member_dir(out, SEEDS[1]))
    before = snapshot(out)
    with pytest.raises(ValueError, match="seed-2 missing") as e:
        train_sweep(tiny_model(), run_cfg(corpus_dir, out), SEEDS, resume=True)
    assert len(str(e.value).splitlines()) == 1
    assert snapshot(out) == before  # the other member's checkpoints and metrics are all there
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep"]


def test_resume_with_a_member_without_checkpoints_refuses_and_changes_nothing(corpus_dir, tmp_path):
    out = tmp_path / "sweep"
    killed_sweep(corpus_dir, out)
    shutil.rmtree(member_dir(out, SEEDS[0]) / "checkpoints")
    before = snapshot(out)
    with pytest.raises(ValueError, match="no common checkpoint"):
        train_sweep(tiny_model(), run_cfg(corpus_dir, out), SEEDS, resume=True)
    assert snapshot(out) == before


def test_resume_with_one_members_settings_changed_refuses_and_changes_nothing(corpus_dir, tmp_path):
    out = tmp_path / "sweep"
    killed_sweep(corpus_dir, out)
    config = member_dir(out, SEEDS[1]) / "train_config.json"  # the second member: the first is checked first
    config.write_text(json.dumps(dict(json.loads(config.read_text()), batch_size=3)))
    before = snapshot(out)
    with pytest.raises(ValueError, match="batch_size"):
        train_sweep(tiny_model(), run_cfg(corpus_dir, out), SEEDS, resume=True)
    assert snapshot(out) == before  # the first member's metrics were not cut back to the resumed step


def test_resume_of_an_intact_sweep_still_resumes(corpus_dir, tmp_path):
    """The refusals above are not refusals of every resume: an untouched killed sweep ends as an uninterrupted one."""
    killed_sweep(corpus_dir, tmp_path / "b")
    train_sweep(tiny_model(), run_cfg(corpus_dir, tmp_path / "b"), SEEDS, resume=True)
    train_sweep(tiny_model(), run_cfg(corpus_dir, tmp_path / "a"), SEEDS)
    for s in SEEDS:
        a, b = (read_safetensors(member_dir(tmp_path / x, s) / "model.safetensors") for x in "ab")
        assert all(torch.equal(a[k], b[k]) for k in a)
    assert sweep_json(tmp_path / "b")["status"] == "finished"


def test_a_sweep_that_fails_before_training_leaves_no_folder(corpus_dir, tmp_path):
    """The sweep marks a new folder at once (a `train` inside it is refused from the start); failing before it wrote
    anything (here: a corpus folder that does not exist), it leaves no folder and no lock behind."""
    with pytest.raises(ValueError):
        train_sweep(tiny_model(), run_cfg(corpus_dir, tmp_path / "sweep", data=str(tmp_path / "nowhere")), SEEDS)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("damage", [b"", b"{\"members\": 3", b"[1, 2]"])
def test_resume_over_a_corrupt_sweep_json_refuses_and_changes_nothing(corpus_dir, tmp_path, damage):
    out = tmp_path / "sweep"
    killed_sweep(corpus_dir, out)
    (out / "sweep.json").write_bytes(damage)
    before = snapshot(out)
    with pytest.raises(ValueError) as e:
        train_sweep(tiny_model(), run_cfg(corpus_dir, out), SEEDS, resume=True)
    assert "sweep.json" in str(e.value) and len(str(e.value).splitlines()) == 1
    assert snapshot(out) == before and sorted(p.name for p in tmp_path.iterdir()) == ["sweep"]

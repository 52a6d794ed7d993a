"""`models.io.run_folder`, the one home of every folder a command writes: marks and who may write a folder (against
an independent table of the rule), the lock (a live holder refused by PID, a dead one's lock taken over), staging and
the atomic publish (new files in, other files kept, byte for byte), never deleting what it did not write, a crash or
an error at any point leaving the old folder, and a full disk as `DiskFullError`."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from helpers import fail_fsync_of
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from models.errors import DiskFullError, FolderError
from models.files import atomic
from models.io import run_folder as rf
from models.io.run_folder import KINDS, MARK_FILE, Mark, check_folder, claim, lock, read_mark, staged

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def snapshot(root: Path) -> dict:
    """Every entry under `root` (hidden ones too): a file's bytes, a folder as None."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


names = st.text(alphabet="abcdefghij_0123456789.", min_size=1, max_size=8).filter(
    lambda n: n not in (".", "..") and not n.startswith(".") and n != MARK_FILE)
contents = st.binary(max_size=64)
trees = st.dictionaries(names, st.one_of(contents, st.dictionaries(names, contents, max_size=3)), max_size=5)


def build(root: Path, tree: dict) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for name, value in tree.items():
        if isinstance(value, dict):
            build(root / name, value)
        else:
            (root / name).write_bytes(value)


# --- who may write a folder --------------------------------------------------------------------------------------
STATES = ("new", "empty", "foreign", "marked", "legacy")


@SETTINGS
@given(kind=st.sampled_from(sorted(KINDS)), state=st.sampled_from(STATES), owner=st.sampled_from(sorted(KINDS)),
       tree=trees.filter(bool))
def test_a_folder_is_written_only_when_new_empty_or_of_the_same_kind(kind, state, owner, tree):
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "out"
        if state != "new":
            out.mkdir()
        if state in ("foreign", "marked", "legacy"):
            build(out, tree)
        if state == "marked":
            (out / MARK_FILE).write_text(json.dumps(Mark(owner).to_dict()))
        # what the caller recognises: this folder only (a recogniser that takes every folder for a sweep would make
        # the temporary folder above it a sweep too, and `out` a sub-folder of it)
        legacy = (lambda f: Mark(owner) if f == out.resolve() else None) if state == "legacy" else None
        allowed = state in ("new", "empty") or (state in ("marked", "legacy") and owner == kind)  # the rule, as a table
        before = snapshot(Path(d))
        if allowed:
            assert check_folder(out, kind, legacy) == out.resolve()
        else:
            with pytest.raises(FolderError, match="not " + KINDS[kind]):
                check_folder(out, kind, legacy)
        assert snapshot(Path(d)) == before  # checking writes nothing


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_inside_a_sweep_only_its_members_and_reports(tmp_path, kind):
    claim(tmp_path / "sweep", "sweep")
    if kind in rf.NESTED["sweep"]:
        check_folder(tmp_path / "sweep" / "x", kind)
    else:
        with pytest.raises(FolderError, match="inside a seed sweep"):
            check_folder(tmp_path / "sweep" / "x", kind)


def test_a_member_names_its_sweep_and_the_mark_round_trips(tmp_path):
    member = claim(tmp_path / "sweep" / "seed-3", "sweep-member", "..")
    assert read_mark(member) == Mark("sweep-member", "..")
    with pytest.raises(FolderError, match=f"member of a seed sweep \\(the one in {tmp_path / 'sweep'}\\)"):
        check_folder(member, "train")
    (member / MARK_FILE).write_text("{not json")
    with pytest.raises(FolderError, match="not valid JSON"):
        check_folder(member, "sweep-member")
    (member / MARK_FILE).write_text(json.dumps({"kind": "wandb"}))
    with pytest.raises(FolderError, match="not a toy-circuits folder mark"):
        read_mark(member)


def test_a_file_in_the_way_and_the_current_folder_are_refused(tmp_path, monkeypatch):
    (tmp_path / "f").write_text("x")
    for out in (tmp_path / "f", tmp_path / "f" / "sub"):
        with pytest.raises(NotADirectoryError, match=str(tmp_path / "f")):
            check_folder(out, "report")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FolderError, match="current folder"):
        check_folder(".", "report")


# --- the lock ------------------------------------------------------------------------------------------------------
HOLD = ("import sys, time\nfrom pathlib import Path\nfrom models.io.run_folder import lock\n"
        "with lock(Path(sys.argv[1])):\n    print('locked', flush=True)\n    sys.stdin.read()")


def test_a_live_holder_is_refused_by_pid_and_a_killed_ones_lock_is_taken_over(tmp_path):
    out = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env=ENV)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(FolderError, match=f"in use by another process \\(PID {holder.pid}\\)"):
            with lock(out):
                pass
        with pytest.raises(FolderError, match=f"PID {holder.pid}"):
            with staged(out, "report"):
                pytest.fail("staged while another process held the folder")
    finally:
        holder.send_signal(signal.SIGKILL)  # dies holding it: the lock file stays, the kernel drops the lock
        holder.wait()
    assert (tmp_path / ".run.lock").read_text() == str(holder.pid)
    with lock(out):  # a stale lock of a dead process is taken over
        assert (tmp_path / ".run.lock").read_text() == str(os.getpid())
    assert not (tmp_path / ".run.lock").exists()


def test_waiting_for_the_lock(tmp_path):
    """`wait=True` (processes sharing a folder) waits for the holder instead of refusing."""
    out = tmp_path / "eb"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env=ENV)
    assert holder.stdout.readline().strip() == "locked"
    waiter = subprocess.Popen([sys.executable, "-c", "import sys\nfrom pathlib import Path\n"
                               "from models.io.run_folder import lock\nwith lock(Path(sys.argv[1]), wait=True):\n"
                               "    print('got it', flush=True)", str(out)], stdout=subprocess.PIPE, text=True, env=ENV)
    holder.communicate("")  # the holder lets go; only then can the waiter print
    assert waiter.communicate(timeout=120)[0].strip() == "got it" and waiter.returncode == 0


# --- staging and publishing ----------------------------------------------------------------------------------------
@SETTINGS
@given(old=trees, new=st.dictionaries(names, contents, min_size=1, max_size=4))
def test_publish_puts_the_new_files_in_and_keeps_every_other_file(old, new):
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "rep"
        if old:
            build(out, old)
            (out / MARK_FILE).write_text(json.dumps(Mark("report").to_dict()))
        before = snapshot(out) if out.exists() else {}
        with staged(out, "report") as stage:
            for name, data in new.items():
                (stage / name).write_bytes(data)
        after = snapshot(out)
        expect = {k: v for k, v in before.items() if k.split("/")[0] not in new}  # old entries not replaced
        expect.update(new)
        expect[MARK_FILE] = (json.dumps(Mark("report").to_dict(), indent=1) + "\n").encode()
        assert after == expect
        assert sorted(p.name for p in Path(d).iterdir()) == ["rep"]  # no stage, no lock, no swap leftovers


@SETTINGS
@given(old=trees.filter(bool), new=st.lists(contents, min_size=1, max_size=5), fail_at=st.integers(0, 5))
def test_an_error_at_any_point_leaves_the_old_folder(old, new, fail_at):
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "rep"
        build(out, old)
        (out / MARK_FILE).write_text(json.dumps(Mark("report").to_dict()))
        before = snapshot(out)
        with pytest.raises(RuntimeError, match="crash"):
            with staged(out, "report") as stage:
                for i, data in enumerate(new):
                    if i == fail_at:
                        raise RuntimeError("crash")
                    (stage / f"f{i}.bin").write_bytes(data)
                raise RuntimeError("crash")  # or after the last file, before the publish
        assert snapshot(out) == before
        assert sorted(p.name for p in Path(d).iterdir()) == ["rep"]


KILLED = ("import os, signal, sys\nfrom pathlib import Path\nimport models.io.run_folder as rf\n"
          "out = Path(sys.argv[1])\n"
          "if sys.argv[2] == 'writing':\n"
          "    with rf.staged(out, 'report') as stage:\n"
          "        (stage / 'report.md').write_text('new')\n"
          "        os.kill(os.getpid(), signal.SIGKILL)\n"
          "else:  # killed inside the publish, with the new folder half filled\n"
          "    def carry(src, dst):\n"
          "        os.kill(os.getpid(), signal.SIGKILL)\n"
          "    rf.carry_over = carry\n"
          "    with rf.staged(out, 'report') as stage:\n"
          "        (stage / 'report.md').write_text('new')\n")


@pytest.mark.parametrize("when", ["writing", "publishing"])
def test_a_crash_mid_write_leaves_the_old_folder_and_the_next_run_cleans_up(tmp_path, when):
    out = tmp_path / "rep"
    with staged(out, "report") as stage:
        (stage / "report.md").write_text("old")
        (stage / "fig.png").write_bytes(b"old png")
    (out / "notes.txt").write_text("the user's")
    before = snapshot(out)
    r = subprocess.run([sys.executable, "-c", KILLED, str(out), when], env=ENV, capture_output=True, timeout=120)
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert snapshot(out) == before
    assert any(p.name.startswith(".rep.") for p in tmp_path.iterdir())  # what the killed run left beside it
    with staged(out, "report") as stage:
        (stage / "report.md").write_text("new")
    assert (out / "report.md").read_text() == "new" and (out / "notes.txt").read_text() == "the user's"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rep"]  # what the killed run left was removed


def test_a_refused_folder_is_never_touched(tmp_path):
    """A foreign folder, and one of another kind, stay as they were: nothing of theirs is deleted or added."""
    foreign, other = tmp_path / "foreign", tmp_path / "other"
    build(foreign, {"thesis.tex": b"years", "data": {"x.bin": b"\x00\x01"}})
    claim(other, "train")
    (other / "model.safetensors").write_bytes(b"weights")
    before = snapshot(tmp_path)
    for out in (foreign, other):
        with pytest.raises(FolderError):
            with staged(out, "report") as stage:
                (stage / "report.md").write_text("x")
    assert snapshot(tmp_path) == before


# --- a full disk ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EDQUOT])
def test_a_full_disk_while_publishing_is_a_disk_full_error_and_the_old_folder_stays(tmp_path, monkeypatch, err):
    out = tmp_path / "rep"
    with staged(out, "report") as stage:
        (stage / "report.md").write_text("old")
    before = snapshot(out)
    real = atomic.sync_file

    def full(path, mask=None):
        if Path(path).name == "report.md":
            raise OSError(err, os.strerror(err))
        return real(path, mask)

    monkeypatch.setattr(atomic, "sync_file", full)
    with pytest.raises(DiskFullError, match="disk is full") as e:
        with staged(out, "report") as stage:
            (stage / "report.md").write_text("new")
    assert e.value.errno == err and isinstance(e.value, OSError)
    assert snapshot(out) == before and sorted(p.name for p in tmp_path.iterdir()) == ["rep"]


def test_the_command_line_exits_1_on_a_full_disk(tmp_path, monkeypatch, capsys):
    """`DiskFullError` is an environment error: one line and exit 1 (a named error of bad input exits 2)."""
    from analyses.cli import main

    fail_fsync_of(monkeypatch, "report.md")
    code = main(["report", "attn-only-2l", "--out", str(tmp_path / "r"), "--sections", "overview", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 1 and "disk is full" in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "r").exists() or list((tmp_path / "r").iterdir()) == []

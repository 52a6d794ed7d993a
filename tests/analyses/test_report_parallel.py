"""`build_report(parallel=True)` (sections split over this process and a forked child) writes the same report as
the sequential run, byte for byte; a child that fails in any way is replaced by running its sections here, so a
section error, a crash and a full disk surface as in a sequential run."""

import errno
import os
import sys

import pytest
import torch

from analyses.report import SECOND_PROCESS, SECTIONS, build_report
from analyses.report import run as report_run
from analyses.report.run import Progress, run_sections
from models import load
from models.io.checkpoint import resolve

pytestmark = [pytest.mark.e2e,  # whole reports over two processes
              pytest.mark.skipif(sys.platform != "linux" or len(os.sched_getaffinity(0)) < 2,
                                reason="the forked child runs on Linux with two CPUs or more")]
DISK = (errno.ENOSPC,)


@pytest.fixture
def forks(monkeypatch):
    """Counts the forks made by `analyses.report.run` (counted in this, the parent, process)."""
    n = {"forks": 0}
    real = os.fork

    def fork():
        n["forks"] += 1
        return real()

    monkeypatch.setattr(report_run.os, "fork", fork)
    return n


def test_parallel_report_is_the_sequential_report(tmp_path, forks):
    keys = ["overview", "direct_path", "attention", "detection", "skip_trigrams", "ablation", "icl", "dynamics"]
    assert {k for k, *_ in SECTIONS} >= set(keys) and SECOND_PROCESS & set(keys) and set(keys) - SECOND_PROCESS
    kw = dict(sections=keys, n_windows=16, progress=False, folder=resolve("attn-only-2l"))
    seq = build_report(load("attn-only-2l"), tmp_path / "seq", parallel=False, **kw)
    assert forks["forks"] == 0
    par = build_report(load("attn-only-2l"), tmp_path / "par", parallel=True, **kw)
    assert forks["forks"] == 1
    assert seq.failed == par.failed == {} and seq.sections == par.sections == keys
    assert [f.name for f in seq.files] == [f.name for f in par.files]  # report order, whichever process wrote them
    assert set(seq.seconds) == set(par.seconds)
    for f in seq.files:
        assert f.read_bytes() == (tmp_path / "par" / f.name).read_bytes(), f.name
    assert not any(p.name.startswith(".report-tmp") for p in (tmp_path / "par").iterdir())


class Ctx:
    def __init__(self, out):
        self.files, self.model, self.out = [], torch.nn.Linear(2, 2), out


def _jobs(parent: int, child_behaviour):
    def own(ctx):
        (ctx.out / "own.png").write_bytes(b"own")
        ctx.files.append(ctx.out / "own.png")
        return "own text"

    def theirs(ctx):
        if os.getpid() != parent:
            child_behaviour()
        (ctx.out / f"theirs-{os.getpid() == parent}.png").write_bytes(b"theirs")
        ctx.files.append(ctx.out / f"theirs-{os.getpid() == parent}.png")
        return "their text"

    def broken(ctx):
        raise ValueError("broken section")

    return [("a", own), ("b", theirs), ("c", broken)]


def _run(tmp_path, behaviour, parallel=True):
    ctx = Ctx(tmp_path)
    out = run_sections(ctx, _jobs(os.getpid(), behaviour), {"b", "c"}, DISK, parallel, Progress(3, "t", False))
    return {k: (o.text, o.failure, [f.name for f in o.files]) for k, o in out.items()}


def test_child_outcomes_match_sequential_ones(tmp_path, forks):
    want = {"a": ("own text", None, ["own.png"]), "b": ("their text", None, ["theirs-True.png"]),
            "c": ("*This section failed: ValueError: broken section*", "ValueError: broken section", [])}
    assert _run(tmp_path, lambda: None, parallel=False) == want and forks["forks"] == 0
    got = _run(tmp_path, lambda: None)
    assert forks["forks"] == 1
    assert got == {**want, "b": ("their text", None, ["theirs-False.png"])}  # written by the child


@pytest.mark.parametrize("crash", [lambda: os._exit(3), lambda: os.kill(os.getpid(), 9),
                                   lambda: (_ for _ in ()).throw(KeyboardInterrupt())])
def test_a_failed_child_is_replaced_by_running_its_sections_here(tmp_path, forks, crash):
    got = _run(tmp_path, crash)
    assert forks["forks"] == 1
    assert got["b"] == ("their text", None, ["theirs-True.png"])  # run again in this process
    assert got["c"][1] == "ValueError: broken section"


def test_a_full_disk_in_the_child_raises_here(tmp_path, forks):
    def full():
        raise OSError(errno.ENOSPC, "No space left on device")

    ctx = Ctx(tmp_path)
    jobs = _jobs(os.getpid(), full)
    jobs[1] = ("b", lambda c: full())
    with pytest.raises(OSError) as e:
        run_sections(ctx, jobs, {"b", "c"}, DISK, True, Progress(3, "t", False))
    assert e.value.errno == errno.ENOSPC and forks["forks"] == 1


def test_no_fork_with_another_thread_running(tmp_path, forks):
    import threading

    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        assert _run(tmp_path, lambda: None)["b"][2] == ["theirs-True.png"]
    finally:
        stop.set()
        t.join()
    assert forks["forks"] == 0


def test_no_fork_with_several_torch_threads(tmp_path, forks):
    """GNU OpenMP's pool does not survive a fork: a child's first parallel region would hang (it did, with
    `circuits report --threads 2`); with more than one torch thread the sections run here."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        torch.randn(256, 256) @ torch.randn(256, 256)  # the pool is up
        assert _run(tmp_path, lambda: None)["b"][2] == ["theirs-True.png"]  # (a child here: no torch op, no hang)
    finally:
        torch.set_num_threads(before)
    assert forks["forks"] == 0


def test_a_memo_both_processes_use_is_computed_once_before_the_fork(tmp_path, forks, monkeypatch):
    """attention (this process) and ablation (the child) both read the head detections: one detection, made before
    the fork, serves both (each process made its own before), and the report is the sequential one."""
    import analyses.detect as detect
    from analyses.report.run import shared_memos

    keys = ["attention", "ablation"]
    assert shared_memos([s for s in SECTIONS if s[0] in keys], SECOND_PROCESS) == {"detect"}
    calls = tmp_path / "calls"
    real = detect.detect_induction_heads

    def counted(*a, **k):
        with open(calls, "a") as f:
            f.write(f"{os.getpid()}\n")
        return real(*a, **k)

    monkeypatch.setattr(detect, "detect_induction_heads", counted)
    kw = dict(sections=keys, n_windows=8, progress=False, folder=resolve("attn-only-2l"))
    par = build_report(load("attn-only-2l"), tmp_path / "par", parallel=True, **kw)
    assert forks["forks"] == 1 and par.failed == {}
    assert calls.read_text().split() == [str(os.getpid())]
    seq = build_report(load("attn-only-2l"), tmp_path / "seq", parallel=False, **kw)
    for f in seq.files:
        assert f.read_bytes() == (tmp_path / "par" / f.name).read_bytes(), f.name

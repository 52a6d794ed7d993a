"""Running the report's sections: one at a time, or split over this process and one forked child.

A section's outcome is `Outcome(text, failure, seconds, files)`: the markdown it returned (or the line saying it
failed), the failure message or None, its wall seconds, and the figures it wrote. `run_sections` gives the same
outcomes either way; with `parallel` the sections in `second` run in a child process made by `os.fork()` (a copy of
this one: same model, windows and seed) while this process runs the rest, and the child sends its outcomes back as
JSON through a pipe. Each section's numbers depend only on the model, the context and its seed, never on what ran
before it in the same process, so the report is byte for byte the same (tests/analyses/test_report_parallel.py).
The child is used only where forking is safe: Linux, the model on the CPU, at least two CPUs for this process, no
other Python thread running and torch on one thread (`circuits report`'s default; with more, the sections run here).
If the child fails in any way (a disk error, a crash, a signal), this process runs its sections itself, so errors
surface exactly as in a sequential run.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch


class Section(NamedTuple):
    """One row of the report's section tables, in report order: its key, its title, `fits(ctx)` (whether it applies
    to this model), `run(ctx) -> markdown`, and the `ctx.cache` keys it `reads` (values other sections write) and
    `writes`. A value a `Context` method computes on first use from the model and the context alone
    (`Context.memos`, e.g. the head detections) belongs to no section: any process may compute it; `memos` lists
    those the section uses, so that one wanted on both sides of a split is computed once, before the fork.
    `check_split` reads these declarations."""

    key: str
    title: str
    fits: Callable
    run: Callable
    reads: frozenset = frozenset()
    writes: frozenset = frozenset()
    memos: frozenset = frozenset()


def check_split(sections, second: set[str]) -> None:
    """`ValueError` unless the sections whose keys are in `second` can run in another process beside the rest:
    every `ctx.cache` key a section reads is written only by sections of its own process, earlier in report order
    (a value written in one process is not seen in the other)."""
    sections = [Section(*s) for s in sections]
    order = {s.key: i for i, s in enumerate(sections)}
    for s in sections:
        for key in s.reads:
            for w in (t for t in sections if key in t.writes):
                if (w.key in second) != (s.key in second):
                    raise ValueError(f"section {s.key} reads ctx.cache[{key!r}], which {w.key} writes in the other "
                                     "process: list both in the second process or neither")
                if order[w.key] > order[s.key]:
                    raise ValueError(f"section {s.key} reads ctx.cache[{key!r}], which {w.key} writes after it")


@dataclass
class Outcome:
    text: str
    failure: str | None
    seconds: float
    files: list[Path]


def run_section(ctx, fn, disk_errors) -> Outcome:
    """Run one section; an exception other than a disk error becomes a failure line in the report."""
    n_files, t0 = len(ctx.files), time.perf_counter()
    failure = None
    try:
        with torch.no_grad():
            text = fn(ctx)
    except OSError as e:
        if e.errno in disk_errors:  # the disk, not the section: stop, keep the previous report
            raise
        failure = f"{type(e).__name__}: {e}"
    except Exception as e:  # one broken section must not sink the report
        failure = f"{type(e).__name__}: {e}"
    if failure is not None:
        text = f"*This section failed: {failure}*"
    return Outcome(text, failure, round(time.perf_counter() - t0, 2), ctx.files[n_files:])


def can_fork(model) -> bool:
    """Whether a forked child can run sections here: Linux, the model's weights on the CPU, two or more CPUs
    available to this process, this the only Python thread (a lock held by another thread at the fork would stay
    locked in the child) and torch on one thread (GNU OpenMP's thread pool does not survive a fork: a child of a
    process that ran parallel regions hangs at its first one)."""
    if sys.platform != "linux" or not hasattr(os, "fork") or threading.active_count() != 1:
        return False
    if torch.get_num_threads() != 1:
        return False
    if len(os.sched_getaffinity(0)) < 2:
        return False
    return all(p.device.type == "cpu" for p in model.parameters()) if hasattr(model, "parameters") else False


class Progress:
    """A progress bar over the sections (tqdm on stderr), started after any fork so the child has no bar thread."""

    def __init__(self, total: int, desc: str, enabled: bool):
        self.total, self.desc, self.enabled, self.bar = total, desc, enabled, None

    def start(self) -> None:
        if self.enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=self.total, desc=self.desc, unit="section")

    def __call__(self, key: str) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(key)
            self.bar.update()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def run_sections(ctx, jobs: list[tuple[str, object]], second: set[str], disk_errors, parallel: bool,
                 progress: Progress, shared: Callable | None = None) -> dict[str, Outcome]:
    """`{key: Outcome}` for `jobs` (`(key, function)` in report order); `progress(key)` as each finishes.
    `shared()`, when given, runs before a fork: what it computes into the context (memos both processes use) is
    then computed once (an exception there is left for the section that needs the value to meet)."""
    try:
        return _run_sections(ctx, jobs, second, disk_errors, parallel, progress, shared)
    finally:
        progress.close()


def shared_memos(sections, second: set[str]) -> frozenset:
    """The `Context.memos` that sections on both sides of the split use (`Section.memos`)."""
    sections = [Section(*s) for s in sections]
    side = lambda inside: frozenset().union(*(s.memos for s in sections if (s.key in second) == inside))
    return side(True) & side(False)


def _run_sections(ctx, jobs, second, disk_errors, parallel, tick, shared) -> dict[str, Outcome]:
    child_jobs = [(k, f) for k, f in jobs if k in second]
    own_jobs = [(k, f) for k, f in jobs if k not in second]
    if parallel and child_jobs and own_jobs:
        _stop_tqdm_monitors()
    if not (parallel and child_jobs and own_jobs and can_fork(ctx.model)):
        tick.start()
        return {k: _run_ticked(ctx, k, f, disk_errors, tick) for k, f in jobs}
    _warm_up()
    if shared is not None:
        try:
            with torch.no_grad():
                shared()
        except Exception:  # the sections that use the value raise it again, each in its own section
            pass
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        _child(ctx, child_jobs, write_end, disk_errors)
    os.close(write_end)
    try:
        tick.start()
        out = {k: _run_ticked(ctx, k, f, disk_errors, tick) for k, f in own_jobs}
        with os.fdopen(read_end, "rb") as pipe:
            data = pipe.read()
        _, status = os.waitpid(pid, 0)
    except BaseException:  # Ctrl-C, SIGTERM or an error here: the child goes too
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise
    theirs = _parse(data) if os.waitstatus_to_exitcode(status) == 0 else None
    if theirs is None or set(theirs) != {k for k, _ in child_jobs}:  # the child failed: run its sections here
        theirs = {}
        for k, f in child_jobs:
            theirs[k] = run_section(ctx, f, disk_errors)
    for k, _ in child_jobs:
        tick(k)
    return {k: out[k] if k in out else theirs[k] for k, _ in jobs}


#: Modules both processes use, imported once before the fork instead of once in each.
SHARED_MODULES = ("matplotlib.pyplot", "analyses.plots", "analyses.scores", "analyses.one_layer", "circuits.factored",
                  "circuits.eigen")


def _warm_up() -> None:
    """Import `SHARED_MODULES`, and run `torch.broadcast_shapes` once: its first call (in every `FactoredMatrix`)
    imports `torch.fx.experimental.symbolic_shapes` and sympy, 0.25 s of CPU."""
    import importlib

    for name in SHARED_MODULES:
        importlib.import_module(name)
    torch.broadcast_shapes((1, 2), (2,))


def _stop_tqdm_monitors() -> None:
    """End tqdm's monitor threads (each bar class starts one, and a disabled bar never ends it); the next bar starts
    a new one. The thread only refreshes bars that have not printed for 10 s."""
    monitor = sys.modules.get("tqdm._monitor")
    if monitor is not None:
        for t in threading.enumerate():
            if isinstance(t, monitor.TMonitor):
                t.exit()


def _run_ticked(ctx, key, fn, disk_errors, tick) -> Outcome:
    o = run_section(ctx, fn, disk_errors)
    tick(key)
    return o


def _child(ctx, jobs, fd: int, disk_errors) -> None:
    """The forked child: run `jobs`, write their outcomes as JSON to `fd`, and leave without running this
    process's clean-up (`os._exit`); any exception means exit status 1 and nothing sent."""
    code = 1
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        ctx.files = []
        sent = {}
        for key, fn in jobs:
            o = run_section(ctx, fn, disk_errors)
            sent[key] = [o.text, o.failure, o.seconds, [str(f) for f in o.files]]
        view = memoryview(json.dumps(sent).encode())
        while view:
            view = view[os.write(fd, view):]
        code = 0
    except BaseException:
        pass
    finally:
        os._exit(code)


def _parse(data: bytes) -> dict[str, Outcome] | None:
    try:
        raw = json.loads(data.decode())
        return {k: Outcome(t, f, s, [Path(p) for p in files]) for k, (t, f, s, files) in raw.items()}
    except (ValueError, TypeError):
        return None

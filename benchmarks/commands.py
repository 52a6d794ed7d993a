"""The cost of whole `circuits` commands, as a user meets them: the report (`circuits report attn-only-2l`) and a short
training run (`circuits train --preset attn-only-2l --steps 60`), each in fresh processes, alternating between
checkouts when several are given (`--repo A --repo B`: e.g. a `git worktree` of the commit before a change and this
one), so both meet the same load.

CPU time is user + system of every process the command runs (its forked child included), read with
`resource.getrusage(RUSAGE_CHILDREN)` around each run; wall is the command's own. Medians over `--repeats` runs.
`OMP_NUM_THREADS=1` (torch's intra-op threads: one; the report runs at one thread anyway). On a shared, loaded
machine CPU time is the figure to read: wall grows with the load, and with fewer than two idle CPUs the report's
two processes cannot overlap. The first run of each checkout is a warm-up (page cache, corpus cache), not counted;
for the report, its report.md is compared byte for byte across the checkouts (every number the same).

    python benchmarks/commands.py report --repeats 5 --repo /path/before --repo .
    python benchmarks/commands.py train --repeats 5 --repo /path/before --repo .
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import cpu  # noqa: E402

COMMANDS = {
    "report": ["report", "attn-only-2l", "--out", "{out}", "--no-progress"],
    "train": ["train", "--preset", "attn-only-2l", "--steps", "60", "--out", "{out}", "--no-progress",
              "--train-config", '{"num_threads": 1}'],
}


def run_once(repo: Path, argv: list[str], scratch: Path, keep: Path | None = None) -> tuple[float, float]:
    """(CPU seconds of every process, wall seconds) of one fresh `python -m analyses.cli ...` in `repo`; its output
    folder is moved to `keep` when given."""
    out = scratch / "out"
    shutil.rmtree(out, ignore_errors=True)
    env = dict(os.environ, PYTHONPATH=str(repo), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "analyses.cli"] + [a.replace("{out}", str(out)) for a in argv]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-2000:]}")
    if keep is not None:
        shutil.move(out, keep)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=sorted(COMMANDS))
    p.add_argument("--repo", action="append", help="a checkout to run (default: this one); repeat to compare")
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args()
    repos = [Path(r).resolve() for r in (a.repo or [Path(__file__).resolve().parents[1]])]
    info = cpu()
    print(f"CPU {info['model']} ({info['cpu_count']} CPUs), Python {info['python']}, torch {info['torch']}; "
          f"`circuits {' '.join(COMMANDS[a.command])}`; OMP_NUM_THREADS=1")
    load0 = os.getloadavg()[0]
    times: dict[Path, list[tuple[float, float]]] = {r: [] for r in repos}
    with tempfile.TemporaryDirectory() as tmp:
        kept = [Path(tmp) / f"first-{i}" for i in range(len(repos))]
        for r, k in zip(repos, kept):
            run_once(r, COMMANDS[a.command], Path(tmp), keep=k)  # warm-up
        if a.command == "report" and len(repos) > 1:  # every number of the report, whichever checkout wrote it
            same = [(k / "report.md").read_bytes() == (kept[0] / "report.md").read_bytes() for k in kept]
            print(f"report.md byte for byte the same in every checkout: {all(same)}")
        for _ in range(a.repeats):
            for r in repos:
                times[r].append(run_once(r, COMMANDS[a.command], Path(tmp)))
    for r, t in times.items():
        cpu_s, wall = [x[0] for x in t], [x[1] for x in t]
        print(f"{r}: CPU median {statistics.median(cpu_s):.2f} s (min {min(cpu_s):.2f}, max {max(cpu_s):.2f}); "
              f"wall median {statistics.median(wall):.2f} s (min {min(wall):.2f}, max {max(wall):.2f}); "
              f"{len(t)} runs")
    print(f"1-min load average {load0:.1f} before, {os.getloadavg()[0]:.1f} after (shared machine)")


if __name__ == "__main__":
    main()

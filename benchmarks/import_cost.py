"""What `import models` and the first model use cost, against `import torch` alone (issue 33, "Lighter").

Each configuration runs in a fresh Python process, alternating configuration by configuration for `--rounds` rounds,
and is measured by the child's CPU time (user + system, `resource.getrusage(RUSAGE_CHILDREN)`, less sensitive to a
busy machine than wall time) and wall time; medians and the ratio to `import torch` are printed with the CPU model.

    python benchmarks/import_cost.py [--rounds 7] [--model attn-only-1l]

- torch: `import torch`;
- models: `import models`, load the zoo's `--model` (default attn-only-1l) and run it on a short text (plain imports:
  TransformerLens' package `__init__` runs, with the Hugging Face packages it imports).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

from machine import cpu as machine_info  # benchmarks/machine.py (run as a script: its folder is on sys.path)

HEAVY = "('transformers', 'datasets', 'pandas', 'pyarrow')"
USE = ("import models, sys; m = models.load({model!r}); m(m.to_tokens('def f(x): return x')); "
       f"print(len(sys.modules), sorted(k for k in {HEAVY} if k in sys.modules))")


def configs(model: str) -> dict:
    use = USE.format(model=model)
    return {"torch": ("import torch, sys; print(len(sys.modules), [])", {}),
            "models": (use, {})}


def run(code: str, env: dict) -> tuple[float, float, str]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True,
                         check=True, timeout=600)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall, out.stdout.strip()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--model", default="attn-only-1l")
    args = ap.parse_args()
    runs = configs(args.model)
    results = {name: [] for name in runs}
    seen = {}
    for _ in range(args.rounds):
        for name, (code, env) in runs.items():
            cpu, wall, out = run(code, env)
            results[name].append((cpu, wall))
            seen[name] = out
    print(f"CPU: {machine_info()['model']}; load average {os.getloadavg()[0]:.2f}; {args.rounds} rounds, "
          "alternating")
    base = statistics.median(c for c, _ in results["torch"])
    for name, rows in results.items():
        cpu, wall = statistics.median(c for c, _ in rows), statistics.median(w for _, w in rows)
        print(f"{name:15s} CPU {cpu:6.2f} s ({cpu / base:4.2f}x torch)   wall {wall:6.2f} s   modules, heavy ones "
              f"imported: {seen[name]}")


if __name__ == "__main__":
    main()

"""Generation speed: `generate` with and without the key/value cache (`use_past_kv_cache`), CPU, one process.

    python benchmarks/generate.py [--json] [--threads 1] [--repeats 5] [--new 256] [--budget 60]
    python benchmarks/generate.py --threads 1,2     # a table per thread count

Models: the zoo's `attn-only-2l` (2 layers, d_model 128, 4 heads of 32, d_vocab 512, Shortformer positions with a
learned table of n_ctx = 128 rows: a prompt of one BOS token plus at most 127 new tokens fit, so its rows generate
127), and the same architecture with n_ctx = 1024 and random weights (`attn-only-2l, n_ctx 1024`), which generates
`--new` tokens (issue 15's row: 256). Batch 1 and 8, greedy (`do_sample=False`), a one-token prompt. Every row runs
at each thread count of `--threads` (default one: one to two minutes on the shared 2-core machine).

Every number is the median of the timed runs after one warm-up run of each path; the two paths alternate run by run,
so load from other processes hits both alike. A row stops repeating once it has spent `--budget` seconds (at least
one timed run each; the table says how many it got), so the script ends in minutes even on a loaded machine, where
two threads can be many times slower than one (every small op waits at an OpenMP barrier for a descheduled thread).
Wall time and CPU time (`time.process_time`, this process only) are both reported: with one thread the CPU time is
what a quiet machine's wall time would be. tokens/s counts new tokens over all sequences of the batch. Both paths
must produce the same tokens (checked; a mismatch stops the script).

FLOPs (2 per multiply-add) of what each path computes: the cached path one position per step against every key so
far, the cache-free path the whole context every step (`forward.model_flops`, its pos × pos attention counted
dense); "× floor" is a path's CPU time over the time those FLOPs take at the GEMM floor (`machine.gemm_floor`, the
CPU clock): how far a row is from the machine's limit. The plain default path.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from forward import model_flops  # noqa: E402
from machine import best_floor, cpu, gemm_floor, header  # noqa: E402

import models  # noqa: E402
from models import HookedTransformer  # noqa: E402


def contenders() -> dict:
    """{label: (model, new tokens or None for `--new`)}."""
    zoo = models.load("attn-only-2l").eval()
    long_cfg = zoo.cfg.to_dict() | {"n_ctx": 1024, "model_name": "attn-only-2l-ctx1024"}
    long = HookedTransformer(long_cfg).eval()
    return {"attn-only-2l (zoo)": (zoo, 127), "attn-only-2l, n_ctx 1024": (long, None)}


def path_flops(cfg, batch: int, prompt: int, new: int) -> dict:
    """FLOPs of `new` greedy steps after a `prompt`-token prompt: {True: cached, False: cache-free}."""
    cached, free = 0.0, 0.0
    for t in range(new):
        ctx = prompt + t  # positions the step's forward sees (the last is the newest token)
        n_q = prompt if t == 0 else 1
        # model_flops counts n_q x n_q attention; a cached step's n_q queries attend to all ctx keys
        cached += model_flops(cfg, batch, n_q) + cfg.n_layers * 4 * batch * cfg.n_heads * cfg.d_head * n_q * (ctx - n_q)
        free += model_flops(cfg, batch, ctx)
    return {True: cached, False: free}


def bench(model, batch: int, new: int, repeats: int, budget: float) -> dict:
    bos = model.tokenizer.bos_token_id if model.tokenizer else 0
    prompt = torch.full((batch, 1), bos, dtype=torch.long)

    def run(kv: bool):
        w0, c0 = time.perf_counter(), time.process_time()
        out = model.generate(prompt, max_new_tokens=new, do_sample=False, use_past_kv_cache=kv)
        return (time.perf_counter() - w0, time.process_time() - c0), out

    (_, a), (_, b) = run(True), run(False)  # warm-up; the two paths must agree
    if not torch.equal(a, b):
        raise SystemExit(f"batch {batch}: the cached and cache-free paths generated different tokens")
    times = {True: [], False: []}
    start = time.perf_counter()
    while len(times[True]) < repeats and (not times[True] or time.perf_counter() - start < budget):
        for kv in (True, False):
            times[kv].append(run(kv)[0])
    med = {(kv, i): statistics.median(t[i] for t in times[kv]) for kv in (True, False) for i in (0, 1)}
    flops = path_flops(model.cfg, batch, prompt.shape[1], new)
    row = {"batch": batch, "new_tokens": new, "runs": len(times[True]),
           "gflop": {"kv": flops[True] / 1e9, "nokv": flops[False] / 1e9}}
    for kv, key in ((True, "kv"), (False, "nokv")):
        row[f"{key}_s"], row[f"{key}_cpu_s"] = med[kv, 0], med[kv, 1]
        row[f"{key}_tokens_per_s"] = batch * new / med[kv, 0]
        row[f"{key}_tokens_per_cpu_s"] = batch * new / med[kv, 1]
        row[f"{key}_ms_per_step_cpu"] = med[kv, 1] / new * 1e3
    row["speedup"], row["speedup_cpu"] = med[False, 0] / med[True, 0], med[False, 1] / med[True, 1]
    return row


def run_threads(threads: int, repeats: int, new: int, budget: float, models_: dict) -> dict:
    torch.set_num_threads(threads)
    load_before = os.getloadavg()
    floor_before = gemm_floor()
    rows = [{"model": label, **bench(model, batch, cap or new, repeats, budget)}
            for label, (model, cap) in models_.items() for batch in (1, 8)]
    floor = best_floor(floor_before, gemm_floor())
    best = max(floor["cpu"].values())
    for r in rows:
        for key in ("kv", "nokv"):
            r[f"{key}_x_floor_cpu"] = r[f"{key}_cpu_s"] / (r["gflop"][key] / best)
    return {"machine": cpu(), "threads": threads, "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
            "gemm_floor_gflops": floor, "results": rows}


def table(run: dict, repeats: int) -> str:
    lines = [header(run["machine"], run["gemm_floor_gflops"], run["loadavg_before"]), "",
             f"greedy, one-token prompt; median of up to "
             f"{repeats} alternated runs (column 'runs')", "",
             "| model | batch | new tokens | runs | KV cache tok/s | no cache tok/s | speed-up | KV tok/CPU s | "
             "no cache tok/CPU s | speed-up (CPU) | KV CPU ms / step | KV × floor | no cache × floor |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in run["results"]:
        lines.append(f"| {r['model']} | {r['batch']} | {r['new_tokens']} | {r['runs']} | {r['kv_tokens_per_s']:.0f} | "
                     f"{r['nokv_tokens_per_s']:.0f} | {r['speedup']:.1f}× | {r['kv_tokens_per_cpu_s']:.0f} | "
                     f"{r['nokv_tokens_per_cpu_s']:.0f} | **{r['speedup_cpu']:.1f}×** | "
                     f"{r['kv_ms_per_step_cpu']:.3f} | {r['kv_x_floor_cpu']:.0f} | {r['nokv_x_floor_cpu']:.0f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--threads", default="1", help="comma-separated torch thread counts, a table each (default 1)")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs per path and row, at most")
    ap.add_argument("--new", type=int, default=256, help="new tokens for the n_ctx 1024 model")
    ap.add_argument("--budget", type=float, default=60.0, help="seconds a row may spend repeating (default 60)")
    args = ap.parse_args()
    try:
        threads = [int(t) for t in args.threads.split(",")]
    except ValueError:
        ap.error(f"--threads takes comma-separated integers, got {args.threads!r}")
    if any(t < 1 for t in threads) or args.repeats < 1 or args.new < 1:
        ap.error("--threads, --repeats and --new must be at least 1")
    models_ = contenders()
    runs = [run_threads(t, args.repeats, args.new, args.budget, models_) for t in threads]
    out = {"repeats": args.repeats, "runs": runs}
    print(json.dumps(out, indent=2) if args.json else "\n\n".join(table(r, args.repeats) for r in runs))


if __name__ == "__main__":
    main()

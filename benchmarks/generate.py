"""Generation speed: `generate` with and without the key/value cache (`use_past_kv_cache`), CPU, one process.

    python benchmarks/generate.py [--json] [--threads 2] [--repeats 5] [--new 256]

Models: the zoo's `attn-only-2l` (2 layers, d_model 128, 4 heads, d_vocab 512, Shortformer positions with a learned
table of n_ctx = 128 rows: a prompt of one BOS token plus at most 127 new tokens fit, so its rows generate 127), and
the same architecture with n_ctx = 1024 and random weights (`attn-only-2l, n_ctx 1024`), which generates `--new`
tokens. Batch 1 and 8, greedy (`do_sample=False`), one-token prompt (BOS). Every number is the median of `--repeats`
timed runs after a warm-up; the two paths alternate run by run, so load from other processes hits both alike.
tokens/s counts new tokens over all sequences of the batch. Both paths produce the same tokens (checked here).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import models  # noqa: E402
from models import HookedTransformer  # noqa: E402


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def contenders() -> dict:
    zoo = models.load("attn-only-2l").eval()
    long_cfg = zoo.cfg.to_dict() | {"n_ctx": 1024, "model_name": "attn-only-2l-ctx1024"}
    long = HookedTransformer(long_cfg).eval()
    return {"attn-only-2l (zoo)": (zoo, 127), "attn-only-2l, n_ctx 1024": (long, None)}


def bench(model, batch: int, new: int, repeats: int) -> dict:
    prompt = torch.full((batch, 1), model.tokenizer.bos_token_id if model.tokenizer else 0, dtype=torch.long)

    def run(kv: bool):
        t0 = time.perf_counter()
        out = model.generate(prompt, max_new_tokens=new, do_sample=False, use_past_kv_cache=kv)
        return time.perf_counter() - t0, out

    _, a = run(True)
    _, b = run(False)  # warm-up, and the two paths must agree
    if not torch.equal(a, b):
        raise SystemExit("the cached and cache-free paths generated different tokens")
    times = {True: [], False: []}
    for _ in range(repeats):
        for kv in (True, False):
            times[kv].append(run(kv)[0])
    kv_s, nokv_s = statistics.median(times[True]), statistics.median(times[False])
    return {"batch": batch, "new_tokens": new, "kv_s": kv_s, "nokv_s": nokv_s,
            "kv_tokens_per_s": batch * new / kv_s, "nokv_tokens_per_s": batch * new / nokv_s,
            "speedup": nokv_s / kv_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--new", type=int, default=256, help="new tokens for the n_ctx 1024 model")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    rows = []
    for label, (model, cap) in contenders().items():
        for batch in (1, 8):
            rows.append({"model": label, **bench(model, batch, cap or args.new, args.repeats)})
    out = {"machine": {"cpu": cpu_model(), "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                       "torch": torch.__version__, "loadavg_before": load_before, "loadavg_after": os.getloadavg()},
           "repeats": args.repeats, "results": rows}
    if args.json:
        print(json.dumps(out, indent=2))
        return
    m = out["machine"]
    print(f"{m['cpu']}, {m['cpu_count']} CPUs, torch {m['torch']}, {m['torch_threads']} threads, 1-min load "
          f"average {m['loadavg_before'][0]:.1f} before, {m['loadavg_after'][0]:.1f} after; median of {args.repeats}\n")
    print("| model | batch | new tokens | KV cache tok/s | no cache tok/s | speed-up |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['batch']} | {r['new_tokens']} | {r['kv_tokens_per_s']:.0f} | "
              f"{r['nokv_tokens_per_s']:.0f} | {r['speedup']:.1f}x |")


if __name__ == "__main__":
    main()

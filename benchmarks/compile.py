"""The bar for speed code beyond plain torch: the plain default path vs `torch.compile` of the same work, on the
training step and the forward pass, alternated round by round, one fresh process per configuration and round.

    python benchmarks/compile.py [--rounds 5] [--threads 1,2] [--device cpu|cuda] [--json]

Work: the `attn-only-2l` preset's training step (forward, loss, backward, clipping at 1.0, AdamW as the trainer
builds it; batch 32 × 128) and forward.py's model b forward (no grad; 2 layers, d_model 512, MLP, LayerNorm; batch 8 ×
256). Configurations:
- `plain`: the default path;
- `compile`: the same work under `torch.compile` (inductor, default mode; the model's forward and loss for the step,
  the forward for the forward), its compile time excluded and reported (first call).
Each process times `--steps` runs after warm-up and reports the median; the table gives, per configuration, the
median over rounds (min–max) and the ratio plain / configuration (> 1: faster than plain). Speed code that is not
plain torch (an opt-in `models/accel` piece: none today) stays only if it beats plain by ≥ 1.2× on the work it
targets and beats `compile` too, on both CPU generations we run on (benchmarks/README.md, "Speed code that went").
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def worker(config: str, work: str, threads: int, steps: int, device: str) -> dict:
    import warnings

    import torch

    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from forward import MODELS
    from forward import config as forward_config
    from train import make_step

    from models import HookedTransformer
    from models.training.presets import get_preset

    warnings.filterwarnings("ignore")
    torch.set_num_threads(threads)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    if work == "train":
        cfg, train_cfg, _ = get_preset("attn-only-2l")
        model = HookedTransformer(cfg.replace(seed=0)).train().to(device)
        tokens = torch.randint(0, cfg.d_vocab, (train_cfg.batch_size, cfg.n_ctx),
                               generator=torch.Generator().manual_seed(0)).to(device)
        run = make_step(model, tokens, compiled=config == "compile")
    else:
        model = HookedTransformer(forward_config(list(MODELS.values())[1])).eval().to(device)  # forward.py's b
        tokens = torch.randint(0, model.cfg.d_vocab, (8, 256), generator=torch.Generator().manual_seed(0)).to(device)
        fwd = torch.compile(model) if config == "compile" else model

        def run() -> None:
            with torch.no_grad():
                fwd(tokens)
    t0 = time.perf_counter()
    run()
    sync()
    first_s = time.perf_counter() - t0
    for _ in range(3):
        run()
    times = []
    for _ in range(steps):
        sync()
        t0 = time.perf_counter()
        run()
        sync()
        times.append(time.perf_counter() - t0)
    return {"config": config, "work": work, "threads": threads, "median_ms": statistics.median(times) * 1e3,
            "first_call_s": first_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=9)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--work", default="train,forward")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--worker", nargs=3, metavar=("CONFIG", "WORK", "THREADS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        config, work, threads = args.worker
        print(json.dumps(worker(config, work, int(threads), args.steps, args.device)))
        return
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from machine import cpu

    configs = ["plain", "compile"]
    runs: list[dict] = []
    load_before = os.getloadavg()
    for r in range(args.rounds):
        for work in args.work.split(","):
            for threads in args.threads.split(","):
                for config in configs:
                    out = subprocess.run([sys.executable, __file__, "--worker", config, work, threads, "--steps",
                                          str(args.steps), "--device", args.device], capture_output=True, text=True,
                                         timeout=1200)
                    if out.returncode:
                        raise SystemExit(f"{config} {work} {threads}: {out.stderr[-2000:]}")
                    runs.append(dict(json.loads(out.stdout.splitlines()[-1]), round=r))
    table = []
    for work in args.work.split(","):
        for threads in map(int, args.threads.split(",")):
            got = {c: [x["median_ms"] for x in runs if x["config"] == c and x["work"] == work
                       and x["threads"] == threads] for c in configs}
            plain = statistics.median(got["plain"])
            for c in configs:
                first = [x["first_call_s"] for x in runs if x["config"] == c and x["work"] == work
                         and x["threads"] == threads]
                med = statistics.median(got[c])
                table.append({"work": work, "threads": threads, "config": c, "median_ms": med, "min_ms": min(got[c]),
                              "max_ms": max(got[c]), "vs_plain": plain / med, "first_call_s": statistics.median(first)})
    result = {"machine": cpu(), "device": args.device, "rounds": args.rounds, "steps": args.steps,
              "load_before": load_before, "load_after": os.getloadavg(), "table": table}
    if args.device == "cuda":
        import torch

        result["gpu"] = torch.cuda.get_device_name()
    if args.json:
        print(json.dumps(result, indent=2))
        return
    m = result["machine"]
    print(f"CPU {m['model']} ({m['cpu_count']} CPUs; {' '.join(m['avx512']) or 'no AVX-512'}), torch {m['torch']}, "
          f"device {result.get('gpu', args.device)}; {args.rounds} rounds × {args.steps} timed runs, one process each; "
          f"load {load_before[0]:.1f} before, {result['load_after'][0]:.1f} after")
    print("| work | threads | configuration | median ms (min–max over rounds) | plain / this | first call s |")
    print("|---|---:|---|---|---:|---:|")
    for row in table:
        print(f"| {row['work']} | {row['threads']} | {row['config']} | {row['median_ms']:.1f} ({row['min_ms']:.1f}–"
              f"{row['max_ms']:.1f}) | {row['vs_plain']:.2f}× | {row['first_call_s']:.2f} |")


if __name__ == "__main__":
    main()

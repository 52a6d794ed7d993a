"""Forward-pass speed: our `HookedTransformer` vs TransformerLens 4.x (`models.to_transformer_lens`, a
`TransformerBridge.boot_native` carrying the same weights), on the same tokens, CPU, one process.

    python benchmarks/forward.py [--json] [--threads 2] [--repeats 7] [--dtype float32]

Models: (a) 2-layer attention-only, d_model 128, 4 heads, d_vocab 2048, standard positions, no LayerNorm;
(b) 2-layer, d_model 512, 8 heads, d_mlp 2048, LayerNorm, d_vocab 2048. Batch 8 x 256 tokens.
Rows: plain forward (no grad), `run_with_cache` of every hook, of every hook but the per-head `hook_result`
(a `names_filter`; since `cfg.use_attn_result` defaults to False, as in TransformerLens, `hook_result` does not fire
and the two rows measure the same set of activations), and of the attention patterns only. Every number is the
median of `--repeats` timed runs after warm-up; ours and TransformerLens alternate run by run so that load from other
processes hits both alike. Both wall time and CPU time (`time.process_time`: this process's user + system time,
which other processes on a shared machine disturb far less; with one thread it is the quiet machine's wall time)
are reported, each with its ratio.

Ours runs the plain default path.

The floor is a dense 2048³ float32 product (`machine.gemm_floor`) on torch's kernel, timed before and after: "GFLOP/s"
of our forward counts the dense model FLOPs (2·m·n·k per matmul; attention scores and pattern·v over the full pos ×
pos square even where the causal mask lets a kernel skip work), and "vs floor" is the forward's time over the time the
fastest floor would need for those FLOPs (1.0 = as fast as the big product), by wall time and by CPU time (each
against the floor on the same clock). """

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import best_floor, cpu, gemm_floor, header  # noqa: E402

from models import HookedTransformer, HookedTransformerConfig, to_transformer_lens  # noqa: E402

BATCH, POS, VOCAB = 8, 256, 2048
MODELS = {
    "a: attn-only 2L d128 h4": dict(n_layers=2, d_model=128, n_heads=4, d_mlp=None, normalization_type=None),
    "b: 2L d512 h8 mlp2048 LN": dict(n_layers=2, d_model=512, n_heads=8, d_mlp=2048, normalization_type="LN"),
}


def model_flops(cfg: HookedTransformerConfig, batch: int, pos: int) -> float:
    """Dense FLOPs of one forward: QKV, scores, pattern·v, W_O, MLP, unembed (2 per multiply-add)."""
    t, d, h, dh = batch * pos, cfg.d_model, cfg.n_heads, cfg.d_head
    per_layer = 2 * t * d * (h + 2 * cfg.n_key_value_heads) * dh  # Q, K, V
    per_layer += 2 * 2 * batch * h * pos * pos * dh  # q kᵀ and pattern v
    per_layer += 2 * t * h * dh * d  # W_O
    if not cfg.attn_only:
        per_layer += 2 * 2 * t * d * cfg.d_mlp
    return cfg.n_layers * per_layer + 2 * t * d * cfg.d_vocab


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure_pair(ours, theirs, repeats: int, warmup: int = 2, sync=None) -> dict:
    """Median wall and CPU seconds of two callables (`theirs` None: of `ours` alone), alternating them run by run:
    `{"ours_wall", "ours_cpu", "tl_wall", "tl_cpu"}`. `sync` (a GPU's `synchronize`) runs before and after each timed
    call, so that a run is timed from an idle device to an idle device."""
    sides = {"ours": ours} if theirs is None else {"ours": ours, "tl": theirs}
    wait = sync or (lambda: None)
    for _ in range(warmup):
        for fn in sides.values():
            fn()
    runs = {key: [] for key in sides}
    for _ in range(repeats):
        for key, fn in sides.items():
            wait()
            w0, c0 = time.perf_counter(), time.process_time()
            fn()
            wait()
            runs[key].append((time.perf_counter() - w0, time.process_time() - c0))
    return {f"{key}_{clock}": statistics.median(r[i] for r in runs[key])
            for key in runs for i, clock in enumerate(("wall", "cpu"))}


def bench_pair(ours, theirs, repeats: int, warmup: int = 2) -> tuple[float, float]:
    """Median wall seconds of two callables, alternating them run by run."""
    m = measure_pair(ours, theirs, repeats, warmup)
    return m["ours_wall"], m["tl_wall"]


def config(arch: dict, pos: int = POS, dtype: str = "float32") -> HookedTransformerConfig:
    """The config of a model of `MODELS` for sequences of `pos` tokens."""
    return HookedTransformerConfig(n_ctx=pos, d_vocab=VOCAB, positional_embedding_type="standard", seed=0,
                                   dtype=dtype, **arch)


def bench_model(label: str, arch: dict, repeats: int, dtype: str = "float32") -> list[dict]:
    cfg = config(arch, dtype=dtype)
    ours = HookedTransformer(cfg).eval()
    theirs = to_transformer_lens(ours).eval()
    tokens = torch.randint(0, VOCAB, (BATCH, POS), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        err = float((ours(tokens) - theirs(tokens)).abs().max())
    patterns = lambda name: name.endswith("hook_pattern")
    no_result = lambda name: not name.endswith("hook_result")
    rows = {
        "forward (no grad)": (lambda: ours(tokens), lambda: theirs(tokens)),
        "run_with_cache (all hooks)": (lambda: ours.run_with_cache(tokens), lambda: theirs.run_with_cache(tokens)),
        "run_with_cache (all but hook_result)": (lambda: ours.run_with_cache(tokens, names_filter=no_result),
                                                 lambda: theirs.run_with_cache(tokens, names_filter=no_result)),
        "run_with_cache (patterns only)": (lambda: ours.run_with_cache(tokens, names_filter=patterns),
                                           lambda: theirs.run_with_cache(tokens, names_filter=patterns)),
    }
    flops = model_flops(cfg, BATCH, POS)
    results = []
    for row, (fo, ft) in rows.items():
        with torch.no_grad():
            m = measure_pair(fo, ft, repeats)
        results.append({"model": label, "row": row, "ours_ms": m["ours_wall"] * 1e3, "tl_ms": m["tl_wall"] * 1e3,
                        "ratio": m["ours_wall"] / m["tl_wall"], "ours_cpu_ms": m["ours_cpu"] * 1e3,
                        "tl_cpu_ms": m["tl_cpu"] * 1e3, "cpu_ratio": m["ours_cpu"] / m["tl_cpu"],
                        "gflop": flops / 1e9, "ours_gflops": flops / m["ours_wall"] / 1e9,
                        "max_abs_logit_diff": err})
    return results


def run(repeats: int, dtype: str = "float32") -> dict:
    warnings.filterwarnings("ignore")
    load_before = os.getloadavg()
    floor_before = gemm_floor()
    results = [r for label, arch in MODELS.items() for r in bench_model(label, arch, repeats, dtype)]
    floor_after = gemm_floor()
    floor = best_floor(floor_before, floor_after)
    for r in results:
        r["vs_floor"] = max(floor["wall"].values()) / r["ours_gflops"]
        r["vs_floor_cpu"] = max(floor["cpu"].values()) / (r["gflop"] / r["ours_cpu_ms"] * 1e3)
    return {"machine": cpu(), "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
            "gemm_floor_gflops": floor,
            "batch": BATCH, "pos": POS, "repeats": repeats, "dtype": dtype, "results": results}


def table(out: dict) -> str:
    lines = [
        header(out["machine"], out["gemm_floor_gflops"], out["loadavg_before"]),
        f"batch {out['batch']} × "
        f"{out['pos']}, {out['dtype']}, median of {out['repeats']}",
        "",
        "| model | row | ours ms | TL ms | ours/TL | ours CPU ms | TL CPU ms | ours/TL (CPU) | ours GFLOP/s "
        "| vs floor | vs floor (CPU) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in out["results"]:
        lines.append(f"| {r['model']} | {r['row']} | {r['ours_ms']:.1f} | {r['tl_ms']:.1f} | {r['ratio']:.2f} | "
                     f"{r['ours_cpu_ms']:.1f} | {r['tl_cpu_ms']:.1f} | {r['cpu_ratio']:.2f} | "
                     f"{r['ours_gflops']:.1f} | {r['vs_floor']:.2f}x | {r['vs_floor_cpu']:.2f}x |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                    help="the models' dtype (the GEMM floor stays float32)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    out = run(args.repeats, args.dtype)
    print(json.dumps(out, indent=2) if args.json else table(out))


if __name__ == "__main__":
    main()

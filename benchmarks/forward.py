"""Forward-pass speed: our `HookedTransformer` vs TransformerLens 4.x (`models.to_transformer_lens`, a
`TransformerBridge.boot_native` carrying the same weights), on the same tokens, CPU, one process.

    python benchmarks/forward.py [--json] [--threads 2] [--repeats 7]

Models: (a) 2-layer attention-only, d_model 128, 4 heads, d_vocab 2048, standard positions, no LayerNorm;
(b) 2-layer, d_model 512, 8 heads, d_mlp 2048, LayerNorm, d_vocab 2048. Batch 8 x 256 tokens.
Rows: plain forward (no grad), `run_with_cache` of every hook, `run_with_cache` of the attention patterns
only (`names_filter`), and every hook with `use_attn_result=False`: our default also caches the per-head
`hook_result [batch, pos, head, d_model]` (33 MB a layer for model b), which the bridge does not offer, so
this last row compares the same set of activations. Every number is the median of `--repeats` timed runs
after warm-up; ours and TransformerLens alternate run by run so that load from other processes hits both alike.

The floor is a dense 2048 x 2048 @ 2048 x 2048 float32 matmul timed in the same run: "GFLOP/s" of our
forward counts the dense model FLOPs (2·m·n·k per matmul; attention scores and pattern·v over the full
pos × pos square even where the causal mask lets a kernel skip work), and "vs floor" is the forward's
time over the time the floor rate would need for those FLOPs (1.0 = as fast as the big matmul).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

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


def bench_pair(ours, theirs, repeats: int, warmup: int = 2) -> tuple[float, float]:
    """Median seconds of two callables, alternating them run by run."""
    for _ in range(warmup):
        ours()
        theirs()
    a, b = [], []
    for _ in range(repeats):
        a.append(timed(ours))
        b.append(timed(theirs))
    return statistics.median(a), statistics.median(b)


def matmul_floor(repeats: int) -> float:
    """GFLOP/s of a 2048³ float32 matmul (median)."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(2048, 2048, generator=g), torch.randn(2048, 2048, generator=g)
    for _ in range(2):
        x @ y
    t = statistics.median(timed(lambda: x @ y) for _ in range(repeats))
    return 2 * 2048**3 / t / 1e9


def bench_model(label: str, arch: dict, repeats: int) -> list[dict]:
    cfg = HookedTransformerConfig(n_ctx=POS, d_vocab=VOCAB, positional_embedding_type="standard", seed=0, **arch)
    ours = HookedTransformer(cfg).eval()
    theirs = to_transformer_lens(ours).eval()
    tokens = torch.randint(0, VOCAB, (BATCH, POS), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        err = float((ours(tokens) - theirs(tokens)).abs().max())
    patterns = lambda name: name.endswith("hook_pattern")
    lean = HookedTransformer(cfg.replace(use_attn_result=False)).eval()  # the hooks TransformerLens' bridge has
    lean.load_state_dict(ours.state_dict())
    rows = {
        "forward (no grad)": (lambda: ours(tokens), lambda: theirs(tokens)),
        "run_with_cache (all hooks)": (lambda: ours.run_with_cache(tokens), lambda: theirs.run_with_cache(tokens)),
        "run_with_cache (patterns only)": (lambda: ours.run_with_cache(tokens, names_filter=patterns),
                                           lambda: theirs.run_with_cache(tokens, names_filter=patterns)),
        "run_with_cache (all, use_attn_result=False)": (lambda: lean.run_with_cache(tokens),
                                                        lambda: theirs.run_with_cache(tokens)),
    }
    flops = model_flops(cfg, BATCH, POS)
    results = []
    for row, (fo, ft) in rows.items():
        with torch.no_grad():
            t_ours, t_tl = bench_pair(fo, ft, repeats)
        results.append({"model": label, "row": row, "ours_ms": t_ours * 1e3, "tl_ms": t_tl * 1e3,
                        "ratio": t_ours / t_tl, "gflop": flops / 1e9, "ours_gflops": flops / t_ours / 1e9,
                        "max_abs_logit_diff": err})
    return results


def run(repeats: int) -> dict:
    warnings.filterwarnings("ignore")
    load_before = os.getloadavg()
    floor_before = matmul_floor(repeats)
    results = [r for label, arch in MODELS.items() for r in bench_model(label, arch, repeats)]
    floor_after = matmul_floor(repeats)
    floor = max(floor_before, floor_after)
    for r in results:
        r["vs_floor"] = floor / r["ours_gflops"]
    return {
        "machine": {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
                    "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "torch": torch.__version__, "python": platform.python_version(),
                    "loadavg_before": load_before, "loadavg_after": os.getloadavg()},
        "matmul_floor_gflops": {"before": floor_before, "after": floor_after, "used": floor},
        "batch": BATCH, "pos": POS, "repeats": repeats, "results": results,
    }


def table(out: dict) -> str:
    lines = [
        f"torch {out['machine']['torch']}, {out['machine']['torch_threads']} threads, "
        f"{out['machine']['cpu_count']} CPUs, 1-min load average {out['machine']['loadavg_before'][0]:.1f} before, "
        f"{out['machine']['loadavg_after'][0]:.1f} after",
        f"matmul floor (2048³ float32): {out['matmul_floor_gflops']['used']:.1f} GFLOP/s "
        f"(before {out['matmul_floor_gflops']['before']:.1f}, after {out['matmul_floor_gflops']['after']:.1f})",
        "",
        "| model | row | ours ms | TL ms | ours/TL | ours GFLOP/s | ours vs floor |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in out["results"]:
        lines.append(f"| {r['model']} | {r['row']} | {r['ours_ms']:.1f} | {r['tl_ms']:.1f} | {r['ratio']:.2f} | "
                     f"{r['ours_gflops']:.1f} | {r['vs_floor']:.2f}x |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    out = run(args.repeats)
    print(json.dumps(out, indent=2) if args.json else table(out))


if __name__ == "__main__":
    main()

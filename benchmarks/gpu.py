"""GPU speed: forward, `run_with_cache` and a training step, ours vs TransformerLens 4.x, float32 and bfloat16, one
process, on a CUDA GPU.

    python benchmarks/gpu.py [--json] [--repeats 20] [--dtypes float32,bfloat16]

Rows (for each dtype):
- forward.py's models a (2-layer attention-only, d_model 128) and b (2-layer d_model 512, MLP, LayerNorm), forward
  (no grad) and `run_with_cache` of every hook, at forward.py's batch (8 × 256) and at a GPU-sized one (64 × 1024);
  in bfloat16 the weights are bfloat16;
- a training step of the `attn-only-2l` preset (forward, each library's own loss, backward, clipping, AdamW as our
  trainer builds it), at its batch (32 × 128) and at 8× and 64× that batch; in bfloat16 under `torch.autocast` with
  float32 weights, as `circuits train` runs on CUDA. TransformerLens' side is `models.to_transformer_lens` of the
  same weights with standard positions (it has no shortformer), as benchmarks/train.py.
Each number is the median of `--repeats` runs after warm-up, ours and TransformerLens alternated run by run, each
run timed from a synchronised start to a synchronised end (host work included). Where TransformerLens cannot be
imported, its columns are empty.

The fraction of peak counts the dense FLOPs of `forward.model_flops` (3× for a training step) against two peaks of
the same dtype: the best of an 8192³ product measured here (`torch.matmul`, float32 in IEEE float32: torch's
default, no TF32), and the data-sheet dense peak where the GPU is one we know (H100 / H200 SXM: 67 TFLOP/s float32,
989 bfloat16).
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from forward import MODELS, config, measure_pair, model_flops  # noqa: E402
from train import contenders, make_step  # noqa: E402

from models import HookedTransformer  # noqa: E402
from models.training.presets import get_preset  # noqa: E402

#: dense data-sheet peaks, TFLOP/s (NVIDIA H100 / H200 SXM data sheets: FP32 67, BF16 Tensor Core 989 without
#: sparsity); matched on the device name
PEAKS = {"H100": {"float32": 67.0, "bfloat16": 989.0}, "H200": {"float32": 67.0, "bfloat16": 989.0}}
FORWARD_SHAPES = ((8, 256), (64, 1024))
TRAIN_SCALES = (1, 8, 64)


def pair(ours, theirs, repeats: int) -> dict:
    """Median seconds of `ours` and `theirs` (None: ours alone), alternated run by run, each from an idle GPU to an
    idle GPU: `{"ours": s, "tl": s}`."""
    m = measure_pair(ours, theirs, repeats, warmup=3, sync=torch.cuda.synchronize)
    return {key: m[f"{key}_wall"] for key in ("ours", "tl") if f"{key}_wall" in m}


def matmul_peak(dtype: torch.dtype, n: int = 8192, repeats: int = 10) -> float:
    """TFLOP/s of the best of `repeats` n³ products in `dtype`."""
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(n, n, device="cuda", generator=g).to(dtype)
    b = torch.randn(n, n, device="cuda", generator=g).to(dtype)
    for _ in range(3):
        a @ b
    best = float("inf")
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return 2 * n**3 / best / 1e12


def transformer_lens(model):
    """TransformerLens' bridge of `model`, or None where TransformerLens cannot be imported here."""
    try:
        from models import to_transformer_lens

        return to_transformer_lens(model).eval()
    except ImportError:  # not installed, or a dependency of it missing or broken here
        return None


def row(kind: str, label: str, dtype: str, shape: tuple, t: dict, flops: float, peaks: dict) -> dict:
    tokens, tflops = shape[0] * shape[1], flops / t["ours"] / 1e12
    out = {"kind": kind, "model": label, "dtype": dtype, "batch": shape[0], "pos": shape[1],
           "ours_ms": t["ours"] * 1e3, "ours_tokens_per_s": tokens / t["ours"], "ours_tflops": tflops,
           "of_measured_peak": tflops / peaks["measured"],
           "of_datasheet_peak": tflops / peaks["datasheet"] if peaks["datasheet"] else None}
    if "tl" in t:
        out |= {"tl_ms": t["tl"] * 1e3, "tl_tokens_per_s": tokens / t["tl"], "ratio": t["ours"] / t["tl"]}
    return out


def forward_calls(ours, theirs, tokens: torch.Tensor) -> dict:
    """{row: (our call, TransformerLens' call or None)}."""
    return {"forward (no grad)": (lambda: ours(tokens), None if theirs is None else lambda: theirs(tokens)),
            "run_with_cache (all hooks)": (lambda: ours.run_with_cache(tokens),
                                           None if theirs is None else lambda: theirs.run_with_cache(tokens))}


def forward_rows(dtype: str, peaks: dict, repeats: int) -> list[dict]:
    rows = []
    for label, arch in MODELS.items():
        for batch, pos in FORWARD_SHAPES:
            cfg = config(arch, pos, dtype)
            ours = HookedTransformer(cfg).eval().to("cuda")
            theirs = transformer_lens(ours)
            tokens = torch.randint(0, cfg.d_vocab, (batch, pos), device="cuda",
                                   generator=torch.Generator(device="cuda").manual_seed(0))
            flops = model_flops(cfg, batch, pos)
            with torch.no_grad():
                err = None if theirs is None else float((ours(tokens) - theirs(tokens)).abs().max())
                for kind, (fo, ft) in forward_calls(ours, theirs, tokens).items():
                    rows.append(row(kind, label, dtype, (batch, pos), pair(fo, ft, repeats), flops, peaks)
                                | {"max_abs_logit_diff": err})
            del ours, theirs
            torch.cuda.empty_cache()
    return rows


def train_rows(dtype: str, peaks: dict, repeats: int) -> list[dict]:
    rows = []
    model_cfg, train_cfg, _ = get_preset("attn-only-2l")
    model_cfg = model_cfg.replace(seed=0)
    amp = "cuda" if dtype == "bfloat16" else None  # bfloat16: autocast over float32 weights, as `circuits train`
    for scale in TRAIN_SCALES:
        batch, pos = train_cfg.batch_size * scale, model_cfg.n_ctx
        try:
            ours, theirs = contenders(model_cfg, "cuda")
        except ImportError:
            ours, theirs = HookedTransformer(model_cfg).train().to("cuda"), None
        tokens = torch.randint(0, model_cfg.d_vocab, (batch, pos), device="cuda",
                               generator=torch.Generator(device="cuda").manual_seed(0))
        t = pair(make_step(ours, tokens, autocast=amp),
                 None if theirs is None else make_step(theirs, tokens, autocast=amp), repeats)
        rows.append(row("training step", "attn-only-2l", dtype, (batch, pos), t, 3 * model_flops(model_cfg, batch, pos),
                        peaks))
        del ours, theirs
        torch.cuda.empty_cache()
    return rows


def run(repeats: int, dtypes: list[str]) -> dict:
    warnings.filterwarnings("ignore")
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/gpu.py: no CUDA GPU here")
    name = torch.cuda.get_device_name()
    sheet = next((p for key, p in PEAKS.items() if key in name), {})
    try:
        from models.arch.tl_compat import TL_VERSION as tl_version
    except ImportError as e:
        tl_version = f"not importable ({e})"
    out = {"device": name, "torch": torch.__version__, "cuda": torch.version.cuda, "transformer_lens": tl_version,
           "tf32": torch.backends.cuda.matmul.allow_tf32, "repeats": repeats, "peaks_tflops": {}, "results": []}
    for dtype in dtypes:
        peaks = {"measured": matmul_peak(getattr(torch, dtype)), "datasheet": sheet.get(dtype)}
        out["peaks_tflops"][dtype] = peaks
        out["results"] += forward_rows(dtype, peaks, repeats) + train_rows(dtype, peaks, repeats)
    return out


def table(out: dict) -> str:
    peaks = "; ".join(f"{d}: {p['measured']:.0f} measured (8192³ matmul), {p['datasheet'] or '?'} data sheet"
                      for d, p in out["peaks_tflops"].items())
    lines = [f"GPU {out['device']}, torch {out['torch']} (CUDA {out['cuda']}), TransformerLens "
             f"{out['transformer_lens']}, "
             f"TF32 {'on' if out['tf32'] else 'off'}; dense peaks TFLOP/s: {peaks}; median of {out['repeats']}", "",
             "| dtype | row | model | batch × pos | ours ms | TL ms | ours/TL | ours tokens/s | TL tokens/s | "
             "ours TFLOP/s | of measured peak | of data-sheet peak |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in out["results"]:
        tl = (f"{r['tl_ms']:.2f} | {r['ratio']:.2f} |" if "tl_ms" in r else " | |")
        tl_tok = f"{r['tl_tokens_per_s']:.3g}" if "tl_ms" in r else ""
        sheet = f"{r['of_datasheet_peak']:.1%}" if r["of_datasheet_peak"] is not None else ""
        lines.append(f"| {r['dtype']} | {r['kind']} | {r['model']} | {r['batch']} × {r['pos']} | {r['ours_ms']:.2f} | "
                     f"{tl} {r['ours_tokens_per_s']:.3g} | {tl_tok} | {r['ours_tflops']:.2f} | "
                     f"{r['of_measured_peak']:.1%} | {sheet} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated: float32, bfloat16")
    args = ap.parse_args()
    dtypes = args.dtypes.split(",")
    bad = [d for d in dtypes if d not in ("float32", "bfloat16")]
    if bad:
        ap.error(f"--dtypes: {bad} not allowed; allowed: float32, bfloat16")
    out = run(args.repeats, dtypes)
    print(json.dumps(out, indent=2) if args.json else table(out))


if __name__ == "__main__":
    main()

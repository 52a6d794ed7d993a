"""Training speed: tokens/s of the attn-only-2l zoo configuration, ours vs TransformerLens 4.x, CPU, one process.

    python benchmarks/train.py [--json] [--threads 2] [--steps 12]

Ours: `HookedTransformer` with the `attn-only-2l` preset config (shortformer positions, no LayerNorm, no
biases; its sizes are printed with the table). TransformerLens cannot build shortformer
models any more, so its side is `TransformerBridge.boot_native` with the closest configuration it supports
(`models.to_transformer_lens` of the same model with standard positions: same sizes, same weights). Both run
the same hand-written step: forward and next-token loss, backward, gradient clipping at 1.0, AdamW (lr 1e-3,
foreach) on the preset's batch (batch_size × n_ctx tokens). The loss is taken two ways, each measured:
- own (the headline): `model(tokens, return_type="loss")`, each library's own loss, as in
  `transformer_lens.tools.training.train` and `circuits train`;
- shared: `models.lm_cross_entropy` applied to either model's logits, so only the models differ.
Steps alternate between the two models, so load from other processes hits both alike; every number is the
median over `--steps` timed steps after warm-up.

Achieved FLOP/s counts 3 × the dense forward FLOPs (forward + backward) of `benchmarks/forward.model_flops`,
against a 2048³ float32 matmul timed in the same run (the floor).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from forward import bench_pair, matmul_floor, model_flops  # noqa: E402

from models import HookedTransformer, lm_cross_entropy, to_transformer_lens  # noqa: E402
from models.train_presets import get_preset  # noqa: E402


def make_step(model, tokens: torch.Tensor, loss_kind: str = "own"):
    """One training step of `model` on `tokens` with its own loss (`loss_kind="own"`) or
    `models.lm_cross_entropy` on its logits (`"shared"`); returns a zero-argument callable."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    shared = loss_kind == "shared"

    def step() -> float:
        loss = lm_cross_entropy(model(tokens), tokens) if shared else model(tokens, return_type="loss")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return float(loss)

    return step


def run(steps: int, warmup: int = 3) -> dict:
    warnings.filterwarnings("ignore")
    model_cfg, train_cfg, _ = get_preset("attn-only-2l")
    model_cfg = model_cfg.replace(seed=0)
    B, T = train_cfg.batch_size, model_cfg.n_ctx
    tokens = torch.randint(0, model_cfg.d_vocab, (B, T), generator=torch.Generator().manual_seed(0))
    ours = HookedTransformer(model_cfg).train()
    standard = HookedTransformer(model_cfg.replace(positional_embedding_type="standard"))
    standard.load_state_dict(ours.state_dict(), strict=False)
    theirs = to_transformer_lens(standard).train()
    load_before = os.getloadavg()
    floor_before = matmul_floor(5)
    times = {mode: bench_pair(make_step(ours, tokens, mode), make_step(theirs, tokens, mode), steps, warmup)
             for mode in ("own", "shared")}
    floor_after = matmul_floor(5)
    t_ours, t_tl = times["own"]
    flops = 3 * model_flops(model_cfg, B, T)
    floor = max(floor_before, floor_after)
    return {
        "machine": {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
                    "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "torch": torch.__version__, "python": platform.python_version(),
                    "loadavg_before": load_before, "loadavg_after": os.getloadavg()},
        "config": {"batch": B, "seq_len": T, "n_layers": model_cfg.n_layers, "n_heads": model_cfg.n_heads,
                   "d_model": model_cfg.d_model, "d_vocab": model_cfg.d_vocab},
        "steps": steps,
        "ours": {"positions": "shortformer", "step_ms": t_ours * 1e3, "tokens_per_s": B * T / t_ours,
                 "gflops": flops / t_ours / 1e9},
        "transformer_lens": {"positions": "standard (no shortformer in TL 4.x)", "step_ms": t_tl * 1e3,
                             "tokens_per_s": B * T / t_tl, "gflops": flops / t_tl / 1e9},
        "ratio_tokens_per_s": t_tl / t_ours,
        "shared_loss": {"ours_step_ms": times["shared"][0] * 1e3, "transformer_lens_step_ms": times["shared"][1] * 1e3,
                        "ratio_tokens_per_s": times["shared"][1] / times["shared"][0]},
        "train_step_gflop": flops / 1e9,
        "matmul_floor_gflops": {"before": floor_before, "after": floor_after, "used": floor},
        "ours_fraction_of_floor": flops / t_ours / 1e9 / floor,
    }


def table(out: dict) -> str:
    m, c = out["machine"], out["config"]
    lines = [
        f"torch {m['torch']}, {m['torch_threads']} threads, {m['cpu_count']} CPUs, 1-min load average "
        f"{m['loadavg_before'][0]:.1f} before, {m['loadavg_after'][0]:.1f} after; batch {c['batch']} × {c['seq_len']}"
        f" tokens, {c['n_layers']}L × {c['n_heads']}H, d_model {c['d_model']}, d_vocab {c['d_vocab']}",
        f"matmul floor (2048³ float32): {out['matmul_floor_gflops']['used']:.1f} GFLOP/s; one training step = "
        f"{out['train_step_gflop']:.1f} GFLOP (3 × dense forward)",
        "",
        "| model | positions | ms / step | tokens/s | GFLOP/s | vs matmul floor |",
        "|---|---|---:|---:|---:|---:|",
    ]
    floor = out["matmul_floor_gflops"]["used"]
    for name, key in (("ours (HookedTransformer)", "ours"), ("TransformerLens 4.x bridge", "transformer_lens")):
        r = out[key]
        lines.append(f"| {name} | {r['positions']} | {r['step_ms']:.0f} | {r['tokens_per_s']:.0f} | "
                     f"{r['gflops']:.1f} | {r['gflops'] / floor:.0%} |")
    sh = out["shared_loss"]
    lines += ["", f"ours / TransformerLens tokens/s: **{out['ratio_tokens_per_s']:.2f}×** (each library's own loss, "
              "as in transformer_lens.tools.training.train)",
              f"with one shared loss (models.lm_cross_entropy on either model's logits): {sh['ours_step_ms']:.0f} vs "
              f"{sh['transformer_lens_step_ms']:.0f} ms / step, {sh['ratio_tokens_per_s']:.2f}×"]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=12)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    out = run(args.steps)
    print(json.dumps(out, indent=2) if args.json else table(out))


if __name__ == "__main__":
    main()

"""Training speed: tokens/s of the attn-only-2l zoo configuration, ours vs TransformerLens 4.x, CPU, one process.

    python benchmarks/train.py [--json] [--threads 2] [--steps 12] [--compile]

Ours: `HookedTransformer` with the `attn-only-2l` preset config (shortformer positions, no LayerNorm, no
biases; its sizes are printed with the table). TransformerLens cannot build shortformer
models any more, so its side is `TransformerBridge.boot_native` with the closest configuration it supports
(`models.to_transformer_lens` of the same model with standard positions: same sizes, same weights). Both run
the same hand-written step: forward and next-token loss, backward, gradient clipping at 1.0, AdamW (lr 1e-3) as
our trainer builds it (`models.training.loop.adamw`: torch's fused kernel where it has one), on the preset's batch
(batch_size × n_ctx tokens). The loss is taken two ways, each measured:
- own (the headline): `model(tokens, return_type="loss")`, each library's own loss, as in
  `transformer_lens.tools.training.train` and `circuits train`;
- shared: `models.lm_cross_entropy` applied to either model's logits, so only the models differ.
Steps alternate between the two models, so load from other processes hits both alike; every number is the
median over `--steps` timed steps after warm-up.

Achieved FLOP/s counts 3 × the dense forward FLOPs (forward + backward) of `benchmarks/forward.model_flops`,
against the GEMM floor (a 2048³ float32 product on torch's kernel, `machine.gemm_floor`), timed before and after, by
wall time and by CPU time, each row's rate against the floor on the same clock. Wall and CPU time
(`time.process_time`) are both reported (forward.py explains why). Our side runs the plain default path.

`--compile` adds a row of our plain step against the same step with the model's forward and loss under
`torch.compile` (inductor, default mode; its compile time excluded and printed), alternated step by step: the bar any
speed code beyond plain torch must beat (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from forward import measure_pair, model_flops  # noqa: E402
from machine import best_floor, cpu, gemm_floor, header  # noqa: E402

from models import HookedTransformer, lm_cross_entropy, to_transformer_lens  # noqa: E402
from models.training.loop import adamw  # noqa: E402
from models.training.presets import get_preset  # noqa: E402


def make_step(model, tokens: torch.Tensor, loss_kind: str = "own", autocast: str | None = None,
              compiled: bool = False):
    """One training step of `model` on `tokens` with its own loss (`loss_kind="own"`) or
    `models.lm_cross_entropy` on its logits (`"shared"`), its forward under bfloat16 autocast on the device type
    `autocast` if given (as `circuits train` on CUDA), forward and loss under `torch.compile` with `compiled`; returns a
    zero-argument callable."""
    opt = adamw(model.parameters(), lr=1e-3)
    shared = loss_kind == "shared"
    amp = (lambda: torch.autocast(autocast, dtype=torch.bfloat16)) if autocast else contextlib.nullcontext
    loss_of = (lambda t: lm_cross_entropy(model(t), t)) if shared else (lambda t: model(t, return_type="loss"))
    loss_of = torch.compile(loss_of) if compiled else loss_of

    def step() -> float:
        with amp():
            loss = loss_of(tokens)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return float(loss)

    return step


def compile_ab(model, tokens: torch.Tensor, steps: int, warmup: int) -> dict:
    """Median ms per step of `model`'s plain step against the same with its forward and loss under `torch.compile`
    (`--compile`), alternated; the compile time (the first compiled step) is measured apart."""
    import time

    plain_step, compiled_step = make_step(model, tokens), make_step(model, tokens, compiled=True)
    t0 = time.perf_counter()
    compiled_step()
    compile_s = time.perf_counter() - t0
    t = measure_pair(plain_step, compiled_step, steps, warmup)
    return {"plain_ms": t["ours_wall"] * 1e3, "compiled_ms": t["tl_wall"] * 1e3, "plain_cpu_ms": t["ours_cpu"] * 1e3,
            "compiled_cpu_ms": t["tl_cpu"] * 1e3, "compile_s": compile_s}


def contenders(model_cfg, device: str = "cpu") -> tuple:
    """Ours with `model_cfg` (training mode, on `device`) and TransformerLens' bridge of the same weights with
    standard positions (TransformerLens 4.x has no shortformer); `ImportError` where it cannot be imported."""
    ours = HookedTransformer(model_cfg).train().to(device)
    standard = HookedTransformer(model_cfg.replace(positional_embedding_type="standard"))
    standard.load_state_dict(ours.state_dict(), strict=False)
    return ours, to_transformer_lens(standard.to(device)).train()


def run(steps: int, warmup: int = 3, compile_ab_too: bool = False) -> dict:
    warnings.filterwarnings("ignore")
    model_cfg, train_cfg, _ = get_preset("attn-only-2l")
    model_cfg = model_cfg.replace(seed=0)
    B, T = train_cfg.batch_size, model_cfg.n_ctx
    tokens = torch.randint(0, model_cfg.d_vocab, (B, T), generator=torch.Generator().manual_seed(0))
    ours, theirs = contenders(model_cfg)
    load_before = os.getloadavg()
    floor_before = gemm_floor()
    times = {mode: measure_pair(make_step(ours, tokens, mode), make_step(theirs, tokens, mode), steps, warmup)
             for mode in ("own", "shared")}
    ab_row = compile_ab(ours, tokens, steps, warmup) if compile_ab_too else None
    floor_after = gemm_floor()
    flops = 3 * model_flops(model_cfg, B, T)
    floor = best_floor(floor_before, floor_after)
    wall_floor, cpu_floor = max(floor["wall"].values()), max(floor["cpu"].values())
    own = times["own"]
    side = lambda key, positions: {"positions": positions, "step_ms": own[f"{key}_wall"] * 1e3,
                                   "cpu_ms": own[f"{key}_cpu"] * 1e3, "tokens_per_s": B * T / own[f"{key}_wall"],
                                   "tokens_per_cpu_s": B * T / own[f"{key}_cpu"],
                                   "gflops": flops / own[f"{key}_wall"] / 1e9,
                                   "cpu_gflops": flops / own[f"{key}_cpu"] / 1e9}
    return {
        "machine": cpu(), "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
        "config": {"batch": B, "seq_len": T, "n_layers": model_cfg.n_layers, "n_heads": model_cfg.n_heads,
                   "d_model": model_cfg.d_model, "d_vocab": model_cfg.d_vocab},
        "steps": steps,
        "ours": side("ours", "shortformer"),
        "transformer_lens": side("tl", "standard (no shortformer in TL 4.x)"),
        "ratio_tokens_per_s": own["tl_wall"] / own["ours_wall"],
        "ratio_tokens_per_cpu_s": own["tl_cpu"] / own["ours_cpu"],
        "shared_loss": {"ours_step_ms": times["shared"]["ours_wall"] * 1e3,
                        "transformer_lens_step_ms": times["shared"]["tl_wall"] * 1e3,
                        "ratio_tokens_per_s": times["shared"]["tl_wall"] / times["shared"]["ours_wall"],
                        "ratio_tokens_per_cpu_s": times["shared"]["tl_cpu"] / times["shared"]["ours_cpu"]},
        "train_step_gflop": flops / 1e9,
        "gemm_floor_gflops": floor,
        "ours_fraction_of_floor": flops / own["ours_wall"] / 1e9 / wall_floor,
        "ours_cpu_fraction_of_floor": flops / own["ours_cpu"] / 1e9 / cpu_floor,
        "compile_ab": ab_row,
    }


def table(out: dict) -> str:
    c = out["config"]
    floor = out["gemm_floor_gflops"]
    lines = [
        header(out["machine"], floor, out["loadavg_before"]),
        f"batch {c['batch']} × {c['seq_len']} tokens, "
        f"{c['n_layers']}L × {c['n_heads']}H, d_model {c['d_model']}, d_vocab {c['d_vocab']}; one training step = "
        f"{out['train_step_gflop']:.1f} GFLOP (3 × dense forward); median of {out['steps']} steps",
        "",
        "| model | positions | ms / step | CPU ms / step | tokens/s | GFLOP/s | of floor | of floor (CPU time) |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    wall_floor, cpu_floor = max(floor["wall"].values()), max(floor["cpu"].values())
    for name, key in (("ours (HookedTransformer)", "ours"), ("TransformerLens 4.x bridge", "transformer_lens")):
        r = out[key]
        lines.append(f"| {name} | {r['positions']} | {r['step_ms']:.0f} | {r['cpu_ms']:.0f} | "
                     f"{r['tokens_per_s']:.0f} | {r['gflops']:.1f} | {r['gflops'] / wall_floor:.0%} | "
                     f"{r['cpu_gflops'] / cpu_floor:.0%} |")
    sh = out["shared_loss"]
    lines += ["", f"ours / TransformerLens tokens/s: **{out['ratio_tokens_per_s']:.2f}×** wall, "
              f"{out['ratio_tokens_per_cpu_s']:.2f}× per CPU second (each library's own loss, as in "
              "transformer_lens.tools.training.train)",
              f"with one shared loss (models.lm_cross_entropy on either model's logits): {sh['ours_step_ms']:.0f} vs "
              f"{sh['transformer_lens_step_ms']:.0f} ms / step, {sh['ratio_tokens_per_s']:.2f}× "
              f"({sh['ratio_tokens_per_cpu_s']:.2f}× per CPU second)"]
    ab = out.get("compile_ab")
    if ab:
        lines.append(f"our plain step vs the same under torch.compile: {ab['plain_ms']:.1f} vs "
                     f"{ab['compiled_ms']:.1f} ms / step ({ab['plain_ms'] / ab['compiled_ms']:.2f}× from compiling), "
                     f"{ab['plain_cpu_ms']:.1f} vs {ab['compiled_cpu_ms']:.1f} CPU ms; compile time "
                     f"{ab['compile_s']:.0f} s")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--compile", action="store_true", help="also time our step against the same under torch.compile")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    out = run(args.steps, compile_ab_too=args.compile)
    print(json.dumps(out, indent=2) if args.json else table(out))


if __name__ == "__main__":
    main()

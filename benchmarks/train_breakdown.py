"""Where a training step's time goes: the attn-only-2l step of `train.py`, split by what runs it, CPU, one process.

    python benchmarks/train_breakdown.py [--threads 1] [--steps 20] [--batch 32] [--json]

Times (`time.perf_counter`, no profiler: torch.profiler's per-op bookkeeping inflates the short kernels) around
the oneDNN linears' forward and backward (`models.accel.gemm._OneDNNAffine`), the training attention's forward and
backward (`models.accel.train_attention`'s `_FusedAttention` or `_BmmAttention`, whichever runs), the loss's forward
(`models.accel.fused_loss`'s kernel, or `F.cross_entropy`) and its backward (the kernel's; torch's is not separable and
counts in "other"), gradient clipping and AdamW; the linears, the attention and the loss's backward read 0 where this
CPU keeps torch's kernels. "other" is the rest of the forward or backward pass (embedding, residual adds, the
autograd engine, Python). Each part with FLOPs is also given against the machine's GEMM rate (`machine.gemm_floor`,
best kernel). Means over `--steps` steps after 5 warm-up steps. `--batch 1` shows the step's fixed cost (Python,
autograd, the optimizer).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from forward import model_flops  # noqa: E402
from machine import best_floor, cpu, gemm_floor, header  # noqa: E402

from models import HookedTransformer, fused_loss, gemm, train_attention  # noqa: E402
from models.accel.allocator import keep_freed_memory  # noqa: E402
from models.training.loop import adamw  # noqa: E402
from models.training.presets import get_preset  # noqa: E402


def _timed(spent: dict, names: tuple[str, ...], fn):
    """`fn`, its time added to `spent` under each of `names`."""
    def run(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            for name in names:
                spent[name] += time.perf_counter() - t0
    return run


def run(steps: int, batch: int) -> dict:
    warnings.filterwarnings("ignore")
    spent: dict[str, float] = collections.defaultdict(float)
    # each part's time, and the attention's also under its class's name (which of the two ran)
    wrapped = [(gemm._OneDNNAffine, "forward", ("linears forward",)),
               (gemm._OneDNNAffine, "backward", ("linears backward",)),
               (fused_loss._FusedCrossEntropy, "forward", ("loss forward",)),
               (fused_loss._FusedCrossEntropy, "backward", ("loss backward",)),
               *((cls, attr, (f"attention {attr}", cls.__name__)) for cls in (train_attention._BmmAttention,
                                                                             train_attention._FusedAttention)
                 for attr in ("forward", "backward"))]
    saved = [(cls, attr, cls.__dict__[attr]) for cls, attr, _ in wrapped]
    for cls, attr, names in wrapped:
        setattr(cls, attr, staticmethod(_timed(spent, names, getattr(cls, attr))))
    cross_entropy, clip = F.cross_entropy, torch.nn.utils.clip_grad_norm_
    F.cross_entropy = _timed(spent, ("loss forward",), cross_entropy)
    try:
        model_cfg = get_preset("attn-only-2l")[0].replace(seed=0)
        tokens = torch.randint(0, model_cfg.d_vocab, (batch, model_cfg.n_ctx),
                               generator=torch.Generator().manual_seed(0))
        model = HookedTransformer(model_cfg).train()
        opt = adamw(model.parameters(), lr=1e-3)
        phases = collections.defaultdict(float)
        for i in range(steps + 5):
            if i == 5:
                spent.clear()
                phases.clear()
            t0 = time.perf_counter()
            loss = model(tokens, return_type="loss")
            t1 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            t2 = time.perf_counter()
            clip(model.parameters(), 1.0)
            t3 = time.perf_counter()
            opt.step()
            float(loss)
            t4 = time.perf_counter()
            for name, a, b in (("forward", t0, t1), ("backward", t1, t2), ("clipping", t2, t3), ("AdamW", t3, t4)):
                phases[name] += b - a
    finally:
        for cls, attr, fn in saved:
            setattr(cls, attr, fn)
        F.cross_entropy = cross_entropy
    # 0 where a part does not run here (plain kernels)
    names = list(dict.fromkeys(names[0] for _, _, names in wrapped))
    ms = {name: 1e3 * t / steps for name, t in {**{n: spent[n] for n in names}, **phases}.items()}
    ms["forward, other"] = ms["forward"] - ms["linears forward"] - ms["attention forward"] - ms["loss forward"]
    ms["backward, other"] = ms["backward"] - ms["linears backward"] - ms["attention backward"] - ms["loss backward"]
    T, c = model_cfg.n_ctx, model_cfg
    squares = c.n_layers * 2 * 2 * batch * c.n_heads * T * T * c.d_head  # q kᵀ and P v, whole squares
    linear = model_flops(c, batch, T) - squares  # the rest of a dense forward: q, k, v, o and the unembedding
    attention = ("fused" if spent["_FusedAttention"] else "batched" if spent["_BmmAttention"] else "torch")
    if attention == "fused":  # the fused kernel: the causal half (with the diagonal), and in the backward
        square, backward = squares * (T + 1) / (2 * T), 2.5  # q kᵀ again beside dP, dq, dk, dv
    else:  # the batched products' causal halves form 3/4 of each square
        square, backward = squares * 3 / 4, 2
    flops = {"linears forward": linear, "linears backward": 2 * linear,
             "attention forward": square, "attention backward": backward * square}
    return {"machine": cpu(), "loadavg": os.getloadavg(), "threads": torch.get_num_threads(), "batch": batch,
            "seq_len": T, "steps": steps, "ms": ms, "attention": attention,
            "flops": flops, "gemm_floor_gflops": best_floor(gemm_floor(), gemm_floor())}


def table(out: dict) -> str:
    floor = max(out["gemm_floor_gflops"]["wall"].values())
    ms, flops = out["ms"], out["flops"]
    lines = [header(out["machine"], out["gemm_floor_gflops"], out["loadavg"]),
             f"batch {out['batch']} × {out['seq_len']} tokens, mean of {out['steps']} steps; attention: "
             f"{out['attention']} (FLOPs: the products it forms); floor below: the best wall rate",
             "", "| part | ms / step | of the step | GFLOP/s | ms at the floor |", "|---|---:|---:|---:|---:|"]
    step = ms["forward"] + ms["backward"] + ms["clipping"] + ms["AdamW"]
    for name in ("linears forward", "attention forward", "loss forward", "forward, other", "linears backward",
                 "attention backward", "loss backward", "backward, other", "clipping", "AdamW"):
        f = flops.get(name)
        rate = f"{f / ms[name] / 1e6:.0f}" if f and ms[name] else ""
        at_floor = f"{f / floor / 1e6:.2f}" if f else ""
        lines.append(f"| {name} | {ms[name]:.2f} | {ms[name] / step:.0%} | {rate} | {at_floor} |")
    lines.append(f"| **step** | **{step:.2f}** | | | |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    keep_freed_memory()
    out = run(args.steps, args.batch)
    print(json.dumps(out, indent=2) if args.json else table(out))


if __name__ == "__main__":
    main()

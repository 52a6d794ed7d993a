"""Seed sweeps: tokens/s of N `attn-only-2l` models trained as one stack against N sequential single steps, CPU.

    python benchmarks/sweep.py [--json] [--members 8] [--threads 1 2] [--steps 5] [--vmap] [--compile] [--ceiling]

Both sides run the trainer's own steps on the preset's batch (32 × 128 tokens per model) with every member's own
tokens: sequential = for each of N models, `circuits train`'s step (forward, `lm_cross_entropy`, backward,
`clip_grad_norm_` at 1.0, AdamW from `make_optimizer`); stacked = `models.training.sweep`'s step (the
`StackedDecoder` forward and per-member losses, backward of their sum, `clip_per_member`, AdamW over the stacked
weights with the same groups). The two alternate run by run (`forward.measure_pair`), so other processes' load hits
both alike; each number is the median over `--steps` timed runs after one warm-up, tokens/s = N × 32 × 128 / time.

`--vmap` adds the other way to stack, `torch.func` (`stack_module_state` + `functional_call` + `vmap` over the
unmodified `HookedTransformer`): its token check reads values (`.item()`, which `vmap` refuses) so it is skipped for
that contender, and torch has no batching rule for the CPU flash-attention kernel, so `vmap` falls back to a loop
over the members there.

`--compile` adds `torch.compile` (inductor, default mode) of the stacked forward and loss (`StackedDecoder.losses`,
so its backward is compiled too), the optimiser step left eager; compilation happens in the warm-up, outside the
timed runs. It is a measurement only: nothing in the package compiles.

`--ceiling` profiles one sequential step of the N models (`torch.profiler`, CPU time of each operator's own work)
and reports the share spent in the arithmetic that a stack must do all the same: the products (`mm`, `bmm`,
`addmm`), the attention kernel and the loss's log-softmax and its backward. Stacking can save only the rest
(per-operation overhead, small elementwise ops, the optimiser's per-tensor loop), so 1 / that share bounds what any
stacking can gain over sequential steps at the same kernels' speed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from forward import measure_pair  # noqa: E402
from machine import cpu  # noqa: E402

from models import HookedTransformer, lm_cross_entropy  # noqa: E402
from models.training.loop import adamw, make_optimizer, optimizer_groups  # noqa: E402
from models.training.presets import get_preset  # noqa: E402
from models.training.stacked import StackedDecoder, clip_per_member  # noqa: E402


def sequential_step(models, opts, tokens):
    def step():
        for m, opt, t in zip(models, opts, tokens, strict=True):
            loss = lm_cross_entropy(m(t), t)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
            opt.step()

    return step


def stacked_step(stack, opt, tokens, losses_of=None):
    params = [p for _, p in stack.named_stacked()]
    losses_of = losses_of or stack.losses

    def step():
        losses = losses_of(tokens)
        opt.zero_grad(set_to_none=True)
        losses.sum().backward()
        clip_per_member(params, 1.0)
        opt.step()

    return step


def vmap_step(models, cfg, tokens):
    from torch.func import functional_call, stack_module_state, vmap

    base = HookedTransformer(models[0].cfg)
    base.validate_tokens = lambda t, check_length=True: t  # vmap cannot read token values (module docstring)
    params, _ = stack_module_state(models)
    params = {k: torch.nn.Parameter(v.detach().clone()) for k, v in params.items()}
    buffers = dict(base.named_buffers())
    opt = adamw(optimizer_groups(params.items(), cfg), lr=cfg.lr, betas=tuple(cfg.betas))
    losses_of = vmap(lambda p, t: lm_cross_entropy(functional_call(base, (p, buffers), (t,)), t), in_dims=(0, 0))

    def step():
        losses = losses_of(params, tokens)
        opt.zero_grad(set_to_none=True)
        losses.sum().backward()
        clip_per_member(list(params.values()), 1.0)
        opt.step()

    return step


ARITHMETIC = ("aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm", "aten::_log_softmax",
              "aten::_log_softmax_backward_data")


def arithmetic_share(step) -> dict:
    """The CPU-time share of one call of `step` in `ARITHMETIC` and the attention kernels (see the docstring)."""
    from torch.profiler import ProfilerActivity, profile

    step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    rows = prof.key_averages()
    total = sum(r.self_cpu_time_total for r in rows)
    core = sum(r.self_cpu_time_total for r in rows
               if r.key in ARITHMETIC or r.key.startswith("aten::_scaled_dot_product_flash_attention"))
    return {"arithmetic_share": core / total, "ceiling": total / core}


def run(members: int, threads: list[int], steps: int, with_vmap: bool, with_compile: bool = False,
        with_ceiling: bool = False) -> dict:
    warnings.filterwarnings("ignore")
    model_cfg, cfg, _ = get_preset("attn-only-2l")
    B, T = cfg.batch_size, model_cfg.n_ctx
    tokens = torch.randint(0, model_cfg.d_vocab, (members, B, T), generator=torch.Generator().manual_seed(0))
    rows = []
    for n_threads in threads:
        torch.set_num_threads(n_threads)
        load_before = os.getloadavg()[0]
        models = [HookedTransformer(model_cfg.replace(seed=k)).train() for k in range(members)]
        stack = StackedDecoder(models).train()
        opt = adamw(optimizer_groups(stack.named_stacked(), cfg), lr=cfg.lr, betas=tuple(cfg.betas))
        seq = sequential_step(models, [make_optimizer(m, cfg) for m in models], tokens)
        t = measure_pair(stacked_step(stack, opt, tokens), seq, steps, warmup=1)
        row = {"threads": n_threads, "members": members, "tokens_per_step": members * B * T,
               "stacked_s": t["ours_wall"], "sequential_s": t["tl_wall"], "stacked_cpu_s": t["ours_cpu"],
               "sequential_cpu_s": t["tl_cpu"], "stacked_tokens_per_s": members * B * T / t["ours_wall"],
               "sequential_tokens_per_s": members * B * T / t["tl_wall"], "ratio": t["tl_wall"] / t["ours_wall"],
               "ratio_cpu_time": t["tl_cpu"] / t["ours_cpu"]}
        if with_vmap:
            v = measure_pair(vmap_step(models, cfg, tokens), seq, steps, warmup=1)
            row.update(vmap_s=v["ours_wall"], vmap_sequential_s=v["tl_wall"], vmap_ratio=v["tl_wall"] / v["ours_wall"])
        if with_compile:
            cstack = StackedDecoder(models).train()
            copt = adamw(optimizer_groups(cstack.named_stacked(), cfg), lr=cfg.lr, betas=tuple(cfg.betas))
            c = measure_pair(stacked_step(cstack, copt, tokens, torch.compile(cstack.losses)), seq, steps, warmup=2)
            row.update(compile_s=c["ours_wall"], compile_sequential_s=c["tl_wall"],
                       compile_ratio=c["tl_wall"] / c["ours_wall"])
        if with_ceiling:
            row.update(arithmetic_share(seq))
        row["load_before"], row["load_after"] = load_before, os.getloadavg()[0]
        rows.append(row)
    return {"cpu": cpu(), "torch": torch.__version__, "rows": rows, "steps": steps}


def table(res: dict) -> str:
    c = res["cpu"]
    lines = [f"CPU {c['model']} ({c['cpu_count']} CPUs), torch {res['torch']}; medians of {res['steps']} alternated "
             "runs", "", "| threads | N | sequential tok/s | stacked tok/s | stacked / sequential (wall) | (CPU time) "
             "| vmap / sequential | compiled stack / sequential | arithmetic share of sequential (ceiling) "
             "| 1-min load before → after |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        vm = f"{r['vmap_ratio']:.2f}×" if "vmap_ratio" in r else "–"
        co = f"{r['compile_ratio']:.2f}×" if "compile_ratio" in r else "–"
        ce = f"{r['arithmetic_share']:.1%} ({r['ceiling']:.2f}×)" if "ceiling" in r else "–"
        lines.append(f"| {r['threads']} | {r['members']} | {r['sequential_tokens_per_s']:,.0f} | "
                     f"{r['stacked_tokens_per_s']:,.0f} | **{r['ratio']:.2f}×** | {r['ratio_cpu_time']:.2f}× | "
                     f"{vm} | {co} | {ce} | "
                     f"{r['load_before']:.1f} → {r['load_after']:.1f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--members", type=int, default=8)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--vmap", action="store_true")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--ceiling", action="store_true")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    res = run(a.members, a.threads, a.steps, a.vmap, a.compile, a.ceiling)
    print(json.dumps(res, indent=1) if a.json else table(res))


if __name__ == "__main__":
    main()

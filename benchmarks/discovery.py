"""Circuit discovery's cost: passes and CPU time of EAP, EAP-IG and ACDC, and of the faithfulness curve, on a zoo
model's task (default: attn-only-2l induction, 20 prompts, |R| = 20), beside exact single-edge patching and path
patching of the hand-found K path.

    python benchmarks/discovery.py [--model attn-only-2l] [--task induction] [--n-prompts 20] [--threads 1]
                                   [--device cpu] [--json]
    python benchmarks/discovery.py --model enc-dec-reverse --task reversal   # an encoder–decoder's own task

CPU time is `time.process_time` of the method alone (scores and, for ACDC, its sweep) and of the faithfulness
curve that `discover` adds (every k from 0 to the edge count, the top-k and its complement, batched); wall time
beside it. Passes: the model's forward and backward passes and the prompt rows the forward passes ran (a batched
pass over E edge sets of N prompts runs E·N rows). On CUDA the times are wall times after synchronising.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks.machine import cpu  # noqa: E402


def _timed(fn, device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return out, time.process_time() - c, time.perf_counter() - w


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="attn-only-2l")
    p.add_argument("--task", default="induction")
    p.add_argument("--n-prompts", type=int, default=20)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)

    import models
    from analyses.discovery import EdgePatcher, acdc, discovery_task, edge_scores, faithfulness_curve
    from analyses.discovery.faithfulness import single_edge_effects
    from analyses.patching import metric, path_patching

    model = models.load(args.model).to(args.device).eval()
    task = discovery_task(model, args.task, n_prompts=args.n_prompts)
    rows = []
    for method in ("eap", "eap-ig", "acdc", "exact single edges"):
        patcher = EdgePatcher(model, task.clean, task.corrupt, target=task.target)  # its corrupted run: one pass

        def run(method=method, patcher=patcher):
            if method == "acdc":
                return acdc(patcher, task, 0.01)[1]
            if method == "exact single edges":
                return single_edge_effects(patcher, task)
            return edge_scores(patcher, task, args.steps if method == "eap-ig" else None)

        scores, c, w = _timed(run, args.device)
        passes = {"forward": patcher.forwards, "backward": patcher.backwards, "rows": patcher.rows}
        order = sorted(range(len(patcher.graph)), key=lambda i: (-abs(float(scores[i])), i))
        before = patcher.forwards
        _, cc, cw = _timed(lambda p=patcher, o=order: faithfulness_curve(p, task, o), args.device)
        rows.append({"method": method, "cpu_s": c, "wall_s": w, "passes": passes, "curve_cpu_s": cc,
                     "curve_wall_s": cw, "curve_forward": patcher.forwards - before})
    if task.name == "induction":
        _, c, w = _timed(lambda: path_patching(model, task.clean, task.corrupt, metric(task.metric, task.answers),
                                               ["L0H1"], ["L1H1", "L1H2"], "k"), args.device)
        rows.append({"method": "path patching, one path (L0H1 -> L1H1+L1H2 via K)", "cpu_s": c, "wall_s": w,
                     "passes": {"forward": 4, "backward": 0}})
    info = {"cpu": cpu(), "device": args.device, "model": args.model, "task": task.to_json(),
            "edges": len(patcher.graph), "load": os.getloadavg(), "rows": rows}
    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    print(f"{args.model}, {task.name} ({task.clean.shape[0]} prompts x {task.clean.shape[1]} tokens), "
          f"{info['edges']} edges; CPU {info['cpu']['model']}, {args.threads} thread(s), device {args.device}, "
          f"1-min load {info['load'][0]:.1f}")
    print("| method | forward | backward | prompt rows | CPU s | wall s | curve: forward, CPU s |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for r in rows:
        ps = r["passes"]
        curve = f"{r['curve_forward']}, {r['curve_cpu_s']:.1f}" if "curve_forward" in r else "—"
        print(f"| {r['method']} | {ps['forward']} | {ps['backward']} | {ps.get('rows', '')} | {r['cpu_s']:.2f} | "
              f"{r['wall_s']:.2f} | {curve} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

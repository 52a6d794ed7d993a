"""Peak memory of long-context forwards and of `run_with_cache` with a names filter.

Each case runs in a fresh subprocess and reports its peak RSS (VmHWM, reset through /proc/self/clear_refs
after the model is built) minus the RSS at that point, so the numbers are the activations' cost alone. Usage:

    python benchmarks/memory.py [--json]

Cases: a 2-layer attention-only model (d_model 128, 4 heads) over contexts 1024 / 2048 / 4096,
(a) plain forward, where no hook needs the pattern so the fused scaled-dot-product path runs and memory
grows linearly with context; (b) `run_with_cache` of every hook, which stores the [head, pos, pos]
patterns and grows quadratically; (c) `run_with_cache(names_filter="blocks.1.hook_resid_post",
device="cpu")`, which keeps one activation and stays linear.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = r"""
import sys, torch
torch.set_num_threads(2)
from models import HookedTransformer, HookedTransformerConfig
n_ctx, mode = int(sys.argv[1]), sys.argv[2]
cfg = HookedTransformerConfig(n_layers=2, d_model=128, n_heads=4, d_vocab=2048, n_ctx=n_ctx, d_mlp=None,
                              normalization_type=None, positional_embedding_type="rotary", seed=0)
model = HookedTransformer(cfg).eval()
tokens = torch.randint(0, 2048, (1, n_ctx), generator=torch.Generator().manual_seed(0))
with torch.no_grad():
    model(tokens[:, :8])
def rss_kib(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1])
open("/proc/self/clear_refs", "w").write("5")  # reset the high-water mark (VmHWM) to the current RSS
base = rss_kib("VmRSS")
with torch.no_grad():
    if mode == "forward":
        model(tokens)
    elif mode == "cache_all":
        model.run_with_cache(tokens)
    else:
        model.run_with_cache(tokens, names_filter="blocks.1.hook_resid_post", device="cpu")
print((rss_kib("VmHWM") - base) / 1024)
"""


def measure(n_ctx: int, mode: str) -> float:
    out = subprocess.run([sys.executable, "-c", CHILD, str(n_ctx), mode], capture_output=True, text=True,
                         check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    for mode in ("forward", "cache_all", "cache_filtered"):
        for n_ctx in (1024, 2048, 4096):
            rows.append({"mode": mode, "n_ctx": n_ctx, "peak_extra_mib": round(measure(n_ctx, mode), 1)})
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{'mode':<16}{'n_ctx':>7}{'peak extra MiB':>16}")
    for r in rows:
        print(f"{r['mode']:<16}{r['n_ctx']:>7}{r['peak_extra_mib']:>16.1f}")


if __name__ == "__main__":
    main()

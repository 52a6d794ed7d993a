"""Member k of a seed sweep against `--seed k` trained alone, through the CLI (issue 31's item 1):

    python benchmarks/sweep_agreement.py [--seeds 4] [--steps 40] [--preset attn-only-2l]

Trains `circuits train --preset P --seeds 0-(N-1) --steps S` once and `--seed k` alone for each k, in a temporary
folder, and prints per seed: whether the initial weights are bitwise equal, the largest relative difference of the
training loss (every logged step after 0) and of the validation loss, and the largest absolute difference of the
final weights. The stack's batched products sum in another order than a single model's products, so these are
float32 rounding, not zero.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models.io.checkpoint import WEIGHTS_FILE, read_safetensors  # noqa: E402
from models.training.state import METRICS_FILE, read_metrics, step_dir  # noqa: E402


def train(preset: str, steps: int, *args: str) -> None:
    subprocess.run([sys.executable, "-m", "analyses.cli", "train", "--preset", preset, "--steps", str(steps),
                    "--no-scores", "--no-progress", *args], check=True, capture_output=True)


def compare(member: Path, alone: Path) -> dict:
    a, b = (read_safetensors(step_dir(f, 0) / WEIGHTS_FILE) for f in (member, alone))
    fa, fb = (read_safetensors(f / WEIGHTS_FILE) for f in (member, alone))
    ma, mb = (read_metrics(f / METRICS_FILE) for f in (member, alone))
    rel = lambda key: max(abs(x[key] - y[key]) / abs(y[key]) for x, y in zip(ma, mb, strict=True)  # noqa: E731
                          if key in x and x["step"] > 0)
    return {"init_bitwise": all(torch.equal(a[n], b[n]) for n in a), "max_rel_train_loss": rel("train_loss"),
            "max_rel_val_loss": rel("val_loss"), "final_weights_max_abs": max(float((fa[n] - fb[n]).abs().max())
                                                                               for n in fa)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--preset", default="attn-only-2l")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        train(a.preset, a.steps, "--seeds", f"0-{a.seeds - 1}", "--out", str(d / "sweep"))
        rows = []
        for k in range(a.seeds):
            train(a.preset, a.steps, "--seed", str(k), "--out", str(d / f"alone-{k}"))
            rows.append({"seed": k, **compare(d / "sweep" / f"seed-{k}", d / f"alone-{k}")})
    print(json.dumps({"preset": a.preset, "steps": a.steps, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()

"""Determinism on the plain default path, measured over fresh processes.

    python benchmarks/determinism.py [--processes 5] [--kills 20] [--threads 1,2] [--json]

1. One training step of the `attn-only-2l` preset (forward, loss, backward, gradient clipping, AdamW) in
   `--processes` fresh interpreters per thread count: the SHA-256 of the loss and of every gradient and updated
   weight, and how many distinct results came out (1 = bitwise the same in every process; compare the printed digest
   between a quiet and a loaded run).
2. `--kills` repeats of a small training run killed with SIGKILL after its second checkpoint and resumed, each against
   the uninterrupted run: how many ended with bitwise the same weights.

Run it on a busy machine too: nothing on the default path decides by timing, so load must not change a bit.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from models.training.state import resumable_checkpoints  # noqa: E402

STEP = """
import hashlib, sys, torch
sys.path.insert(0, {root!r})
torch.set_num_threads({threads})
from models import HookedTransformer
from models.training.loop import adamw
from models.training.presets import get_preset
cfg, train_cfg, _ = get_preset("attn-only-2l")
model = HookedTransformer(cfg.replace(seed=0)).train()
tokens = torch.randint(0, cfg.d_vocab, (train_cfg.batch_size, cfg.n_ctx), generator=torch.Generator().manual_seed(0))
opt = adamw(model.parameters(), lr=1e-3)
loss = model(tokens, return_type="loss")
loss.backward()
torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
h = hashlib.sha256(loss.detach().numpy().tobytes())
for p in model.parameters():
    h.update(p.grad.numpy().tobytes())
opt.step()
for p in model.parameters():
    h.update(p.detach().numpy().tobytes())
print(h.hexdigest())
"""

RUN = """
import sys
sys.path.insert(0, {root!r})
from models import HookedTransformerConfig
from models.training.config import TrainConfig
from models.training.loop import train
cfg = HookedTransformerConfig(n_layers=2, d_model=32, n_ctx=32, d_vocab=259, n_heads=2, d_mlp=None,
                              normalization_type=None, positional_embedding_type="shortformer", seed=0)
tc = TrainConfig(data={corpus!r}, cache_dir={corpus!r} + "/.cache", tokenizer="bytes", steps={steps}, batch_size=8,
                 lr=3e-3, warmup_steps=5, repeat_fraction=0.25,
                 checkpoint_every=7, log_checkpoints=0, eval_every=10**6, out_dir={out!r}, num_threads=1,
                 progress=False, device="cpu")
train(cfg, tc, resume={resume})
"""


def one_step(threads: int, processes: int) -> dict:
    hashes = []
    for _ in range(processes):
        r = subprocess.run([sys.executable, "-c", STEP.format(root=str(ROOT), threads=threads)], capture_output=True,
                           text=True, timeout=600, check=True)
        hashes.append(r.stdout.strip())
    return {"threads": threads, "processes": processes, "distinct": len(set(hashes)), "sha256": sorted(set(hashes))}


def _weights_hash(folder: Path) -> str:
    from safetensors.torch import load_file

    h = hashlib.sha256()
    for name, t in sorted(load_file(folder / "model.safetensors").items()):
        h.update(name.encode() + t.numpy().tobytes())
    return h.hexdigest()


def kill_and_resume(kills: int, steps: int = 40) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        corpus = tmp / "corpus"
        corpus.mkdir()
        (corpus / "a.py").write_text("".join(f"def f{i}(x):\n    return x * {i % 7} + {i}\n\n" for i in range(3000)))
        straight = tmp / "straight"
        subprocess.run([sys.executable, "-c", RUN.format(root=str(ROOT), corpus=str(corpus), steps=steps,
                                                         out=str(straight), resume=False)], check=True, timeout=600)
        want, equal, killed = _weights_hash(straight), 0, 0
        for k in range(kills):
            out = tmp / f"killed-{k}"
            code = RUN.format(root=str(ROOT), corpus=str(corpus), steps=steps, out=str(out), resume=False)
            proc = subprocess.Popen([sys.executable, "-c", code])
            deadline = time.monotonic() + 300
            while proc.poll() is None and time.monotonic() < deadline:
                if len(resumable_checkpoints(out)) >= 2:
                    break
                time.sleep(0.01)
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                killed += 1
            proc.wait()
            subprocess.run([sys.executable, "-c", RUN.format(root=str(ROOT), corpus=str(corpus), steps=steps,
                                                             out=str(out), resume=True)], check=True, timeout=600)
            equal += _weights_hash(out) == want
    return {"kills": kills, "killed_mid_run": killed, "bitwise_equal": equal}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--processes", type=int, default=5)
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out = {"load_before": os.getloadavg(),
           "one_step": [one_step(int(t), args.processes) for t in args.threads.split(",")],
           "kill_and_resume": kill_and_resume(args.kills) if args.kills else None, "load_after": os.getloadavg()}
    if args.json:
        print(json.dumps(out, indent=2))
        return
    for r in out["one_step"]:
        print(f"one training step, {r['threads']} thread(s): {r['distinct']} distinct result(s) in {r['processes']} "
              f"fresh processes (SHA-256 {', '.join(h[:16] for h in r['sha256'])})")
    k = out["kill_and_resume"]
    if k:
        print(f"SIGKILL + --resume: {k['bitwise_equal']} of {k['kills']} bitwise equal to the uninterrupted run "
              f"({k['killed_mid_run']} killed mid-run)")
    print(f"load average {out['load_before'][0]:.1f} before, {out['load_after'][0]:.1f} after")


if __name__ == "__main__":
    main()

"""Bounded memory: filtered caches keep only what is named, full-circuit statistics of a 50k vocabulary stay
within 1 GB, and a long-context forward grows linearly (the fused attention path). Peak RSS is measured in fresh
subprocesses (`ru_maxrss` after the work minus before it); figures in docs/RELIABILITY.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from models import HookedTransformer, HookedTransformerConfig

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("names_filter", [
    "blocks.1.hook_resid_post",
    ["blocks.0.attn.hook_pattern", "ln_final.hook_normalized"],
    lambda n: n.endswith("hook_z"),
])
def test_run_with_cache_keeps_only_the_named_activations(names_filter):
    cfg = HookedTransformerConfig(n_layers=2, d_model=16, n_ctx=32, d_vocab=40, n_heads=2, d_mlp=32, seed=0)
    model = HookedTransformer(cfg)
    tokens = torch.randint(0, 40, (2, 32), generator=torch.Generator().manual_seed(0))
    logits, cache = model.run_with_cache(tokens, names_filter=names_filter, device="cpu")
    every = set(model.hook_dict)
    if callable(names_filter):
        want = {n for n in every if names_filter(n)}
    else:
        want = {names_filter} if isinstance(names_filter, str) else set(names_filter)
    assert set(cache.keys()) == want
    assert all(v.device.type == "cpu" for v in cache.values())
    torch.testing.assert_close(logits, model(tokens))
    assert not model._forward_hooks and all(not h._forward_hooks for h in model.hook_dict.values())  # cleaned up


#: Peak-RSS probe for the children: Linux resets the high-water mark (VmHWM) when "5" is written to clear_refs, so
#: the figure is the work's own peak over the RSS just before it (model building's temporaries excluded).
PROBE = r"""
import resource
def _status(key):
    try:
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) for l in f if l.startswith(key)) / 1024
    except (OSError, StopIteration):
        return None
def start():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    return _status("VmRSS:") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
def peak():
    return _status("VmHWM:") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
"""

DIAG_CHILD = PROBE + r"""
import torch
torch.set_num_threads(2)
from models.arch.tl_compat import FactoredMatrix
import circuits
V, dh = 50257, 64
g = torch.Generator().manual_seed(0)
A, B = torch.randn(V, dh, generator=g), torch.randn(dh, V, generator=g)
circuits.diagonal_rank_stats(FactoredMatrix(A[:300], B[:, :300]), k=(1, 5))  # warm-up: threads, allocator
base = start()
stats = circuits.diagonal_rank_stats(FactoredMatrix(A, B), k=(1, 5))
print({"extra_mib": peak() - base, "top1": float(stats[1]), "full_matrix_mib": V * V * 4 / 2**20})
"""


def _child(code: str, *args) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="2")
    out = subprocess.run([sys.executable, "-c", code, *map(str, args)], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600, check=True)
    import ast

    return ast.literal_eval(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_diagonal_rank_stats_of_a_50k_vocabulary_stay_under_1_gb():
    r = _child(DIAG_CHILD)
    print(f"\ndiagonal_rank_stats d_vocab 50257 x d_head 64: peak extra {r['extra_mib']:.0f} MiB "
          f"(the dense matrix would be {r['full_matrix_mib']:.0f} MiB)")
    assert r["extra_mib"] < 1024
    assert 0 <= r["top1"] <= 1


COPY_CHILD = PROBE + r"""
import warnings, torch
warnings.simplefilter("ignore")
torch.set_num_threads(2)
import circuits
from models import HookedTransformer, HookedTransformerConfig
cfg = HookedTransformerConfig(n_layers=2, d_model=256, n_ctx=64, d_vocab=50257, n_heads=4, d_mlp=None,
                              normalization_type=None, seed=0)
m = HookedTransformer(cfg)
base = start()
s = circuits.copying_scores(m)
lam = circuits.eigenvalues(circuits.full_ov_circuit(m, 1))
print({"extra_mib": peak() - base, "finite": bool(torch.isfinite(s).all() and torch.isfinite(lam).all())})
"""


@pytest.mark.slow
def test_copying_scores_and_eigenvalues_of_a_50k_vocabulary_stay_small():
    r = _child(COPY_CHILD)
    print(f"\ncopying_scores + eigenvalues, d_vocab 50257, d_model 256: peak extra {r['extra_mib']:.0f} MiB")
    assert r["finite"] and r["extra_mib"] < 1024


#: benchmarks/memory.py's model (2 layers, d_model 128, 4 heads, rotary, d_vocab 2048), peak measured as above.
FORWARD_CHILD = PROBE + r"""
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
    base = start()
    if mode == "forward":
        model(tokens)
    elif mode == "cache_all":
        model.run_with_cache(tokens)
    else:
        model.run_with_cache(tokens, names_filter="blocks.1.hook_resid_post", device="cpu")
print({"extra_mib": peak() - base})
"""


def forward_mib(n_ctx: int, mode: str) -> float:
    return _child(FORWARD_CHILD, n_ctx, mode)["extra_mib"]


@pytest.mark.slow
def test_long_context_forward_is_linear_in_memory():
    """A plain forward (nothing watching): fused scaled-dot-product attention, no [pos, pos] tensor, memory linear in
    the context. Any hook, a cache of one name too, runs the hooked path (`models.arch.watch`): each layer's scores and
    pattern exist while it runs, as in TransformerLens, but the cache keeps only the name asked for."""
    m2k, m4k = forward_mib(2048, "forward"), forward_mib(4096, "forward")
    f4k, a2k = forward_mib(4096, "cache_filtered"), forward_mib(2048, "cache_all")
    print(f"\npeak extra MiB: forward n_ctx 2048 {m2k:.1f}, 4096 {m4k:.1f}; run_with_cache one name at 4096 "
          f"{f4k:.1f}; run_with_cache all hooks at 2048 {a2k:.1f}")
    assert m4k < 3 * m2k + 16, (m2k, m4k)
    pattern_mib = 4 * 4096 * 4096 * 4 / 2**20  # one layer's [head, pos, pos] float32 pattern at 4096: 256 MiB
    assert m4k < pattern_mib / 2, json.dumps({"forward": m4k})
    assert f4k < 3 * pattern_mib, json.dumps({"filtered": f4k})  # one layer's squares at a time, none kept
    assert a2k > pattern_mib / 4  # the probe sees the quadratic case: 2 layers of [4, 2048, 2048] patterns

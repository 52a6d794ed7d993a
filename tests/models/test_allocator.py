"""`models.allocator.keep_freed_memory`: once applied, repeated `run_with_cache` calls stop faulting pages in; its
switch turns it off; importing the toolkit does not apply it. Each case runs in a fresh interpreter (the setting is
process-wide)."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROBE = """
import json, resource, sys, torch
from models import HookedTransformer, HookedTransformerConfig
from models.allocator import keep_freed_memory
applied = keep_freed_memory() if sys.argv[1] == "apply" else None
torch.set_num_threads(1)
cfg = HookedTransformerConfig(n_layers=2, d_model=128, n_heads=4, d_mlp=None, normalization_type=None, n_ctx=256,
                              d_vocab=2048, positional_embedding_type="standard", use_attn_result=False, seed=0)
model, tokens = HookedTransformer(cfg), torch.randint(0, 2048, (8, 256), generator=torch.Generator().manual_seed(0))
def faults():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    with torch.no_grad():
        for _ in range(3):
            model.run_with_cache(tokens)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
faults()
print(json.dumps({"applied": applied, "faults": faults()}))
"""


def _run(mode: str, **env) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": ROOT, **env})
    return json.loads(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc settings")
def test_applied_setting_stops_the_faults_and_import_does_not_apply_it():
    applied = _run("apply")
    if not applied["applied"]:
        pytest.skip("not glibc")
    assert applied["faults"] < 1000  # run_with_cache of model a of benchmarks/forward.py reuses the freed heap
    assert _run("import")["faults"] > 5000  # glibc's default: ~10k faults a call (blocks mapped afresh, heap trimmed)


def test_switch_turns_it_off():
    assert _run("apply", TOY_CIRCUITS_MALLOC="default")["applied"] is False

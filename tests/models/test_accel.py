"""`models.accel`, the opt-in speed pieces: importing and running the toolkit switches none on; `enable` and
`TOY_CIRCUITS_ACCEL` do, and refuse unknown names; the `malloc` piece (`keep_freed_memory`) once applied stops repeated
`run_with_cache` calls faulting pages in. The probe runs in a fresh interpreter (the setting is process-wide)."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROBE = """
import json, resource, sys, torch
from models import HookedTransformer, HookedTransformerConfig
torch.set_num_threads(1)
cfg = HookedTransformerConfig(n_layers=2, d_model=128, n_heads=4, d_mlp=None, normalization_type=None, n_ctx=256,
                              d_vocab=2048, positional_embedding_type="standard", use_attn_result=False, seed=0)
model, tokens = HookedTransformer(cfg), torch.randint(0, 2048, (8, 256), generator=torch.Generator().manual_seed(0))
def faults():  # page faults of one call
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    with torch.no_grad():
        model.run_with_cache(tokens)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
default = [faults() for _ in range(4)]
loaded_by_toolkit = any(m.startswith("models.accel") for m in sys.modules)
from models import accel
applied = accel.enable("malloc")["malloc"]
for _ in range(3):
    faults()
print(json.dumps({"loaded_by_toolkit": loaded_by_toolkit, "applied": applied, "default": default,
                  "after": min(faults() for _ in range(3))}))
"""


@pytest.mark.e2e
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc settings")
def test_not_applied_on_import_and_stops_the_faults_once_applied():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": ROOT})
    got = json.loads(out.stdout)
    assert got["loaded_by_toolkit"] is False  # nothing in the toolkit calls it on import or in a forward pass
    if not got["applied"]:
        pytest.skip("not glibc")
    # glibc's defaults fault ~10k pages a call here on most calls (how many varies with its dynamic thresholds);
    # with the setting, a call of model a of benchmarks/forward.py reuses the freed heap
    assert got["after"] < 500, got


def test_pieces_are_named_and_checked(monkeypatch):
    from models import ConfigError, accel

    monkeypatch.delenv(accel.ENV, raising=False)
    assert accel.requested() == ()
    assert accel.requested("all") == accel.PIECES == ("malloc",)
    assert accel.requested(" malloc, malloc ") == ("malloc",)
    monkeypatch.setenv(accel.ENV, "malloc")
    assert accel.requested() == ("malloc",)
    with pytest.raises(ConfigError, match="unknown piece.*allowed: malloc"):
        accel.requested("fused-loss")


def test_cli_accel_flag_switches_the_pieces_on(monkeypatch):
    from analyses.cli.common import apply_accel
    from models import accel

    monkeypatch.delenv(accel.ENV, raising=False)
    calls = []
    monkeypatch.setattr(accel, "enable", lambda *pieces: calls.append(pieces) or {})

    class Args:
        accel = None

    assert apply_accel(Args()) == () and calls == []
    Args.accel = "all"
    assert apply_accel(Args()) == ("malloc",) and calls == [("malloc",)]

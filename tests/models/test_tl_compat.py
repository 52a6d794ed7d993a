"""`models.arch.tl_compat`: the one module importing TransformerLens, on 3.9 to 4.x; what needs 4.x refuses by name."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from circuits.testing import random_model
from models.arch import tl_compat
from models.errors import UnsupportedByTransformerLens

ROOT = Path(__file__).resolve().parents[2]
#: Where `transformer_lens` may be imported directly: the compatibility module; the legacy 2.18 tests (their own
#: venv); this one, which tests TransformerLens' package itself;
#: AutoCircuit's side of a benchmark, which runs in AutoCircuit's venv (TransformerLens 2.18) and never imports ours.
ALLOWED = {"models/arch/tl_compat.py", "tests/models/test_tl_compat.py",
           "tests/models/test_migration.py",  # checks that models.utils & co. ARE TransformerLens' objects
           "benchmarks/autocircuit_side.py"}


def test_every_transformer_lens_import_goes_through_the_compatibility_module():
    bad = []
    for folder in ("models", "circuits", "analyses", "benchmarks", "notebooks", "tests"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel in ALLOWED or rel.startswith("tests/tl2/"):
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
                bad += [f"{rel}:{node.lineno}" for n in names if n.split(".")[0] == "transformer_lens"]
    assert bad == []


@pytest.mark.parametrize("text,expected", [("4.3.0", (4, 3)), ("3.9.0", (3, 9)), ("3.10.0rc1", (3, 10)),
                                           ("4", (0, 0)), ("dev", (0, 0))])
def test_version_tuple(text, expected):
    assert tl_compat.version_tuple(text) == expected


def test_classes_are_transformer_lens_own():
    import transformer_lens

    assert tl_compat.FactoredMatrix is transformer_lens.FactoredMatrix
    assert tl_compat.ActivationCache is transformer_lens.ActivationCache
    assert tl_compat.HookedRootModule is transformer_lens.HookedRootModule
    assert tl_compat.utilities().get_act_name("z", 1) == "blocks.1.attn.hook_z"


def test_the_bridge_refuses_by_name_before_4(monkeypatch):
    import models

    monkeypatch.setattr(tl_compat, "TL_VERSION", "3.9.0")
    with pytest.raises(UnsupportedByTransformerLens, match=r"to_transformer_lens\) needs transformer-lens>=4\.0; "
                                                             r"this environment has 3\.9\.0"):
        models.to_transformer_lens(random_model(n_layers=1, n_heads=2, positional="standard"))


def test_a_missing_analysis_tool_refuses_by_name():
    with pytest.raises(UnsupportedByTransformerLens, match=r"no_such_tool needs transformer-lens>=4\.0"):
        tl_compat.analysis_tool("no_such_tool")
    if tl_compat.version_tuple(tl_compat.TL_VERSION) < (4, 0):
        from analyses import patching as P

        m = random_model(n_layers=1, n_heads=2, positional="standard").eval()
        with pytest.raises(UnsupportedByTransformerLens, match="logit_lens needs transformer-lens>=4.0"):
            P.logit_lens(m, torch.zeros(1, 4, dtype=torch.long))


def test_per_prompt_sweep_without_reduce_equals_the_kept_values(monkeypatch):
    """3.x's sweeps have no `reduce`: one run per prompt, each measuring that prompt, gives what 4.x's
    `reduce="none"` keeps (on 3.x both sides run the per-prompt path, against the batch-mean property below)."""
    m = random_model(n_layers=2, n_heads=2, positional="standard").eval()
    g = torch.Generator().manual_seed(0)
    clean, corrupt = (torch.randint(0, m.cfg.d_vocab, (3, 5), generator=g) for _ in range(2))
    _, cache = m.run_with_cache(clean)
    metric = lambda logits: logits[:, -1, 1] - logits[:, -1, 2]  # [batch]
    name = "get_act_patch_resid_pre"
    with torch.no_grad():
        kept = tl_compat.patching_sweep(name, m, corrupt, cache, metric)
        real = getattr(tl_compat.patching(), name)
        monkeypatch.setattr(tl_compat.patching(), name,
                            lambda model, tokens, cache, metric: real(model, tokens, cache, metric))
        per_prompt = tl_compat.patching_sweep(name, m, corrupt, cache, metric)
        mean = real(m, corrupt, cache, lambda logits: metric(logits).mean())
    assert kept.shape == (2, 5, 3)
    torch.testing.assert_close(per_prompt, kept)
    torch.testing.assert_close(kept.mean(-1), mean, atol=1e-5, rtol=0)

"""docs/migration/rerun.py, the re-run of TransformerLens 2.x code on the zoo (issue 33): its adaptation and its
counting, on a small synthetic source run in a real kernel (slow tier: a kernel start). The real sources (ARENA 1.2,
four TransformerLens 2.18 demos) are not in this repository; docs/migration/README.md says how to run them."""

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def rerun():
    spec = importlib.util.spec_from_file_location("rerun", ROOT / "docs" / "migration" / "rerun.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_adaptation_is_the_documented_rename_and_loading(rerun):
    cell = 'import transformer_lens.utils as utils\nm = transformer_lens.HookedTransformer.from_pretrained(\n' \
           '    "gpt2-small", fold_ln=True)\na = HookedTransformer.from_pretrained("attn-only-2l")'
    out = rerun.adapt_loading(rerun.rename_imports(cell))
    assert out == 'import models.utils as utils\nm = models.load("gelu-2l", fold_ln=True)\n' \
                  'a = models.load("attn-only-2l")'
    text = "# %%\nimport os\n# %% section\n# only a comment\n\n# %%\nif MAIN:\n\tx = 1\n"
    assert rerun.split_cells(text, "percent") == ["import os\n", "if MAIN:\n\tx = 1\n"]


def test_counts_unchanged_edited_failed_in_one_kernel(rerun, tmp_path, monkeypatch):
    monkeypatch.setitem(rerun.EDITS, "toy", {
        1: {"subs": [("head = 11", "head = 3")], "why": "12 heads in GPT-2", "whose": "inherent"},
        3: {"subs": [("n = 5", "n = 2")], "why": "read by cell 4", "whose": "inherent", "always": True},
    })
    monkeypatch.setitem(rerun.FAILS, "toy", {5: {"why": "a hub module", "whose": "inherent"}})
    originals = [
        'from transformer_lens import HookedTransformer\nmodel = HookedTransformer.from_pretrained("attn-only-2l")',
        "head = 11\nw = model.W_Q[0, head]",
        'toks = model.to_tokens("ab")',
        "n = 5",
        "assert n == model.cfg.n_layers, n",
        "import hub_only_module_that_is_not_installed",
        "y = name_defined_nowhere",
    ]
    cells = rerun.adapt_cells("toy", originals)
    rerun.kernel_environment()
    prelude = rerun.PRELUDE.format(zoo=str(rerun.ZOO), tl2={}, extra="")
    rows = rerun.run_cells("toy", cells, prelude, tmp_path, cell_timeout=120)
    status = [r["status"] for r in rows]
    assert status == ["unchanged", "edited", "unchanged", "edited", "unchanged", "failed", "failed"]
    assert rows[0]["adapted"] and not rows[2]["adapted"]
    assert rows[1]["error_unedited"].startswith("IndexError") and rows[1]["whose"] == "inherent"
    assert rows[5]["why"] == "a hub module" and rows[5]["error"].startswith("ModuleNotFoundError")
    assert rows[6]["why"] is None and rows[6]["error"].startswith("NameError")

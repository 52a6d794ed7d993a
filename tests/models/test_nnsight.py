"""nnsight as a way in (issue 33): reading and patching `hook_pattern`, `hook_z`, `hook_resid_post` and an LayerNorm
scale through `nnsight.NNsight(model)` gives exactly what `run_with_cache` records and what `run_with_hooks` computes
with the same edit. nnsight is in the dev extra; the module skips, saying so, where it is not installed."""

from __future__ import annotations

import pytest
import torch

import models

nnsight = pytest.importorskip("nnsight", reason="nnsight is not installed (pip install -e '.[dev]')")

READ = ["blocks.1.attn.hook_pattern", "blocks.0.attn.hook_z", "blocks.0.hook_resid_post", "blocks.1.ln2.hook_scale"]


def _module(wrapped, name: str):
    node = wrapped
    for part in name.split("."):
        node = node[int(part)] if part.isdigit() else getattr(node, part)
    return node


@pytest.fixture(scope="module")
def model():
    return models.load("gelu-2l")


@pytest.fixture(scope="module")
def tokens(model):
    return model.to_tokens(["def add(a, b):\n    return a + b\n", "for i in range(10):\n    print(i)\n"])


@pytest.mark.parametrize("name", READ)
def test_nnsight_reads_what_run_with_cache_records(model, tokens, name):
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens)
        wrapped = nnsight.NNsight(model)
        with wrapped.trace(tokens):
            value = _module(wrapped, name).output.save()
            out = wrapped.output.save()
    assert torch.equal(value, cache[name])
    assert torch.equal(out, logits)


def _edits():
    """(hook name, what nnsight writes into its output in place, the same edit as a TransformerLens hook)."""
    def z(x):
        x[:, 3, 1] = 0.0  # head 1's output at position 3

    def pattern(x):
        x[:, 2, 5:, :] = x[:, 2, 5:, :].flip(-1)  # head 2 reads its keys in reverse order after position 5

    def resid(x):
        x[:, 4:] *= 0.5

    def scale(x):
        x[:, -1] *= 2.0

    return [("blocks.0.attn.hook_z", z), ("blocks.1.attn.hook_pattern", pattern),
            ("blocks.0.hook_resid_post", resid), ("blocks.1.ln2.hook_scale", scale)]


@pytest.mark.parametrize("name, edit", _edits(), ids=[e[0] for e in _edits()])
def test_nnsight_patches_as_run_with_hooks(model, tokens, name, edit):
    def hook(x, hook):
        x = x.clone()
        edit(x)
        return x

    # the clean logits on the fully hooked path (run_with_cache takes it always): once nnsight has wrapped the model
    # its forward stays replaced on the instance, so later plain calls take that path too (models.arch.watch), and a
    # clean run on the fast path, before any trace, would differ in the last bits whatever nnsight leaves behind
    hooked_logits = lambda: model.run_with_cache(tokens, names_filter=lambda n: False)[0]
    with torch.no_grad():
        clean = hooked_logits()
        want = model.run_with_hooks(tokens, fwd_hooks=[(name, hook)])
        wrapped = nnsight.NNsight(model)
        with wrapped.trace(tokens):
            edit(_module(wrapped, name).output)
            got = wrapped.output.save()
    assert not torch.equal(want, clean)  # the edit changes the logits
    assert torch.equal(got, want)
    with torch.no_grad():
        assert torch.equal(hooked_logits(), clean)  # and leaves nothing behind


def test_lazy_exports_survive_nnsight_save(tmp_path):
    """nnsight gives every object a `save` method; `models.save` is still ours (bound in models/__init__.py)."""
    import subprocess
    import sys

    code = ("import nnsight, models; assert models.save.__module__ == 'models.arch.persist', models.save; "
            "m = models.load('attn-only-1l'); models.save(m, {!r}); print(models.load({!r}).cfg.n_layers)")
    out = subprocess.run([sys.executable, "-c", code.format(str(tmp_path / "m"), str(tmp_path / "m"))],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and out.stdout.strip() == "1", out.stderr[-2000:]

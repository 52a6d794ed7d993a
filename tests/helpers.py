"""Helpers shared by the test modules (import as `from helpers import ...`; conftest modules are not importable
unambiguously once several folders have one)."""

from __future__ import annotations

import contextlib
import errno
import os

import pytest
import torch

from models import HookedTransformer, HookedTransformerConfig


def randomize(model, scale=0.3, seed=0):
    """Perturb every parameter so that biases and norm weights are non-trivial too."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype) * scale)
    return model


def in_dtype(model: HookedTransformer, dtype: str) -> HookedTransformer:
    """A model of `model`'s config in `dtype` ("float64", "bfloat16", ...) carrying its weights, on the CPU."""
    twin = HookedTransformer(model.cfg.replace(dtype=dtype))
    twin.load_state_dict({k: v.detach().to("cpu", twin.cfg.dtype) for k, v in model.state_dict().items()})
    return twin


def make_model(n_layers: int = 2, **kw) -> HookedTransformer:
    d = dict(n_layers=n_layers, d_model=16, n_ctx=24, d_vocab=30, n_heads=2, d_mlp=None,
             normalization_type=None, positional_embedding_type="shortformer", seed=0)
    d.update(kw)
    return HookedTransformer(HookedTransformerConfig(**d))


def byte_model(kind: str = "standard", n_kv: int | None = None, attn_only: bool = False,
               n_ctx: int = 64) -> HookedTransformer:
    """The key/value-cache and decoding tests' model: 2 LayerNorm layers × 4 heads (`n_kv` key/value heads), GELU
    MLPs unless `attn_only`, positions `kind`, the byte tokenizer, every parameter perturbed (scale 0.5, seed 1)."""
    from models.data.tokenizer import ByteTokenizer

    cfg = HookedTransformerConfig(n_layers=2, d_model=16, n_ctx=n_ctx, d_vocab=259, n_heads=4, d_mlp=32, seed=0,
                                  positional_embedding_type=kind, normalization_type="LN", n_key_value_heads=n_kv,
                                  attn_only=attn_only, init_mode="gpt2_scaled")  # the scale its tests were sized for
    return randomize(HookedTransformer(cfg, tokenizer=ByteTokenizer()), scale=0.5, seed=1).eval()


def poisoned(model: HookedTransformer, param: str, value: float) -> HookedTransformer:
    """A copy of `model` with one entry of parameter `param` set to `value` (NaN or ±inf)."""
    import copy

    m = copy.deepcopy(model)
    with torch.no_grad():
        dict(m.named_parameters())[param].view(-1)[0] = value
    return m


def checked_report(monkeypatch, model, out, **kw) -> tuple[dict, object]:
    """`build_report(model, out, **kw)` on one thread with every figure checked by `analyses.figure_checks` as it is
    saved: `({figure name: its problems}, the Report)`; asserts no section failed."""
    from analyses import build_report
    from analyses.figure_checks import figure_problems
    from analyses.report import sections as S

    found = {}
    figure = S.Context.figure

    def checked(self, fig, name, caption):
        found[name] = figure_problems(fig)
        return figure(self, fig, name, caption)

    monkeypatch.setattr(S.Context, "figure", checked)
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        r = build_report(model, out, progress=False, parallel=False, **kw)  # every figure saved in this process
    finally:
        torch.set_num_threads(n)
    assert r.failed == {}, r.failed
    return found, r


def pairwise(*axes: list) -> list[tuple]:
    """A covering array of strength 2: rows (one value per axis) such that every pair of values of every two axes
    appears in some row. For axes whose effects are independent this keeps each interaction of two settings under
    test at a fraction of the full product (7 × 3 × 2 × 2 = 84 rows → 21). Deterministic: greedy over the product of
    the two largest axes, then one row per pair still uncovered."""
    import itertools

    if len(axes) < 3:
        return list(itertools.product(*axes))
    uncovered = {((i, a), (j, b)) for i, j in itertools.combinations(range(len(axes)), 2)
                 for a in range(len(axes[i])) for b in range(len(axes[j]))}

    def new_pairs(row: dict, k: int, v: int) -> int:
        return sum(((min(m, k), row[m] if m < k else v), (max(m, k), v if m < k else row[m])) in uncovered
                   for m in row)

    def cover(row: dict) -> None:
        for (i, a), (j, b) in itertools.combinations(sorted(row.items()), 2):
            uncovered.discard(((i, a), (j, b)))

    order = sorted(range(len(axes)), key=lambda i: -len(axes[i]))
    rows = []
    for a, b in itertools.product(range(len(axes[order[0]])), range(len(axes[order[1]]))):
        row = {order[0]: a, order[1]: b}
        for k in order[2:]:
            row[k] = max(range(len(axes[k])), key=lambda v: new_pairs(row, k, v))
        cover(row)
        rows.append(row)
    while uncovered:
        (i, a), (j, b) = min(uncovered)
        row = {k: 0 for k in range(len(axes))} | {i: a, j: b}
        cover(row)
        rows.append(row)
    return [tuple(axes[i][row[i]] for i in range(len(axes))) for row in rows]


def fail_fsync_of(monkeypatch, suffix: str, code: int = errno.ENOSPC) -> None:
    """Make `os.fsync` of any file whose name ends with `suffix` raise `OSError(code)`: a disk that fills up (or a
    quota reached) while that file is written (Linux: the descriptor's path read from /proc)."""
    real = os.fsync

    def fsync(fd):
        if os.readlink(f"/proc/self/fd/{fd}").endswith(suffix):
            raise OSError(code, os.strerror(code))
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)


@contextlib.contextmanager
def offline_page(chromium: str, flags: list, url: str):
    """A headless Chromium page opened on `url` that may load only file: and data: URLs (any other request is
    aborted and recorded): yields `(page, requests, errors, dialogs)`, page errors and dialogs recorded too (dialogs
    dismissed); the browser is closed on exit."""
    from playwright import sync_api

    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=flags)
        try:
            ctx = browser.new_context(offline=True, viewport={"width": 1280, "height": 1000})
            requests, errors, dialogs = [], [], []
            ctx.route("**/*", lambda route: route.continue_() if route.request.url.startswith(("file:", "data:"))
                      else (requests.append(route.request.url), route.abort()))
            page = ctx.new_page()
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            page.goto(url)
            yield page, requests, errors, dialogs
        finally:
            browser.close()


def _sae_lens_missing() -> str:
    """Why `sae_lens` does not import here ("" where it does)."""
    try:
        import sae_lens  # noqa: F401
    except ImportError as e:
        return f"sae_lens is not importable here ({e}); CI's ecosystem job installs it"
    return ""


WHY_NO_SAE_LENS = _sae_lens_missing()
#: Marks a test that needs SAELens (the ecosystem job's environment): skipped elsewhere, saying why.
needs_sae_lens = pytest.mark.skipif(bool(WHY_NO_SAE_LENS), reason=WHY_NO_SAE_LENS)

"""Activation patching (Heimersheim & Nanda 2024, "How to use and interpret activation patching"; the technique of
Meng et al. 2022, ROME, and Wang et al. 2022, IOI): run one prompt, replace one activation with its value on the
other prompt, and measure the metric.

Every kind is TransformerLens 4.3's own sweep (`transformer_lens.patching.get_act_patch_*`); this module adds the
direction (denoising: TransformerLens' corrupted run with clean activations; noising: the clean run with corrupted
ones, by swapping the two prompts), checked inputs, the unpatched baselines and a labelled `PatchResult`.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from .inputs import PatchingError, check_choice, check_direction, has_mlps, prepare, token_pair
from .metrics import Metric, evaluate, metric_name
from .result import PatchResult

#: kind → (TransformerLens activation name, cell axes with by_pos False, with by_pos True); None: not offered.
KINDS = {
    "resid_pre": ("resid_pre", None, ("layer", "pos")),
    "resid_mid": ("resid_mid", None, ("layer", "pos")),
    "attn_out": ("attn_out", None, ("layer", "pos")),
    "mlp_out": ("mlp_out", None, ("layer", "pos")),
    "z": ("z", ("layer", "head"), ("layer", "pos", "head")),
    "q": ("q", ("layer", "head"), ("layer", "pos", "head")),
    "k": ("k", ("layer", "head"), ("layer", "pos", "head")),
    "v": ("v", ("layer", "head"), ("layer", "pos", "head")),
    "pattern": ("pattern", ("layer", "head"), ("layer", "head", "pos")),
}
HEAD_KINDS = ("z", "q", "k", "v", "pattern")
_TL_SWEEPS = {  # (kind, by_pos) → the name of TransformerLens' sweep
    **{(k, True): f"get_act_patch_{k}" for k in ("resid_pre", "resid_mid", "attn_out", "mlp_out")},
    **{(k, False): f"get_act_patch_attn_head_{'out' if k == 'z' else k}_all_pos" for k in HEAD_KINDS},
    **{(k, True): f"get_act_patch_attn_head_{'out' if k == 'z' else k}_by_pos" for k in HEAD_KINDS},
}


def check_kind(model, kind: str, by_pos: bool | None) -> tuple[bool, tuple[str, ...]]:
    """`(by_pos, axes)` for `kind`, refusing kinds the model lacks (MLP kinds on attention-only models)."""
    check_choice(kind, KINDS, "kind")
    if kind in ("resid_mid", "mlp_out") and not has_mlps(model):
        raise PatchingError(f"kind {kind!r} needs a model with MLPs; this one is attention-only (use resid_pre, "
                            "attn_out or a head kind)")
    _, all_pos, per_pos = KINDS[kind]
    by_pos = all_pos is None if by_pos is None else bool(by_pos)
    if not by_pos and all_pos is None:
        raise PatchingError(f"kind {kind!r} is patched by (layer, position); by_pos=False is for head kinds "
                            f"({', '.join(HEAD_KINDS)})")
    return by_pos, per_pos if by_pos else all_pos


def axis_labels(model, axes, n_pos: int, tokens: list[str] | None, n_kv: int | None = None):
    heads = n_kv or model.cfg.n_heads
    out = {"layer": [str(l) for l in range(model.cfg.n_layers)], "head": [f"H{h}" for h in range(heads)],
           "pos": [f"{p}" if tokens is None else f"{p} {tokens[p]!r}" for p in range(n_pos)]}
    return tuple(tuple(out[a]) for a in axes)


def token_strings(model, tokens: torch.Tensor) -> list[str] | None:
    tok = getattr(model, "tokenizer", None)
    if tok is None:
        return None
    try:
        return [tok.decode([int(i)]) for i in tokens[0]]
    except Exception:  # a tokenizer that cannot decode a single id: positions go unlabelled
        return None


def baseline_runs(model, clean: torch.Tensor, corrupt: torch.Tensor, metric, names):
    """Run both prompts once, caching the hooks in `names` (a collection or predicate): `(clean cache, corrupt
    cache, clean metric [batch], corrupt metric [batch])`."""
    if isinstance(metric, Metric):
        metric.answers.check(clean.shape[1], clean.shape[0])
    keep = names if callable(names) else (lambda n: n in names)
    with torch.no_grad():
        lc, cc = model.run_with_cache(clean, names_filter=keep)
        lx, cx = model.run_with_cache(corrupt, names_filter=keep)
        return cc, cx, evaluate(metric, lc, clean.shape[0]), evaluate(metric, lx, clean.shape[0])


@contextmanager
def tl_progress(show: bool):
    """TransformerLens' sweeps draw a tqdm bar of their own with no switch; silence it when `show` is False by
    handing its module a disabled tqdm for the duration of the call."""
    import functools

    from models.arch.tl_compat import patching

    tlp = patching()

    saved = tlp.tqdm
    if not show:
        tlp.tqdm = functools.partial(saved, disable=True)
    try:
        yield
    finally:
        tlp.tqdm = saved


def activation_patching(model, clean, corrupt, metric, kind: str = "resid_pre", by_pos: bool | None = None,
                        direction: str = "denoising", progress: bool = True) -> PatchResult:
    """Patch one activation at a time between the clean and the corrupted prompts and measure `metric`.

    `clean`, `corrupt`: `[batch, pos]` ids (or text) of the same shape. `metric`: a `patching.Metric` or any
    function logits → `[batch]`. `kind`: `resid_pre`, `resid_mid`, `attn_out`, `mlp_out` (cells: layer × position),
    or a head kind `z` (head output), `q`, `k`, `v`, `pattern` (cells: layer × head over all positions, or with
    `by_pos=True` layer × position × head; for `pattern`, layer × head × destination position). `direction`:
    "denoising" runs the corrupted prompt and patches in the clean activation (what suffices to restore the clean
    behaviour); "noising" runs the clean prompt and patches in the corrupted activation (what is necessary).
    Puts the model in eval mode. Returns a `PatchResult` (metric per cell and prompt, and both baselines)."""
    from models.arch.tl_compat import patching_sweep

    prepare(model)
    check_direction(direction)
    by_pos, axes = check_kind(model, kind, by_pos)
    clean, corrupt = token_pair(model, clean, corrupt)
    act = KINDS[kind][0]
    cc, cx, m_clean, m_corrupt = baseline_runs(model, clean, corrupt, metric, lambda n: n.endswith(f".hook_{act}"))
    base_tokens, source_cache, base = (corrupt, cc, m_corrupt) if direction == "denoising" else (clean, cx, m_clean)
    # TransformerLens stores patched metrics in float32 (its default dtype); it is handed the change from the base
    # run, so what it rounds is the effect, not the metric.
    shifted = lambda logits: evaluate(metric, logits, base.shape[0]) - base.to(logits.device)
    with tl_progress(progress), torch.no_grad():
        values = patching_sweep(_TL_SWEEPS[(kind, by_pos)], model, base_tokens, source_cache, shifted)
    per_prompt = values.double().cpu() + base.double().cpu()
    toks = token_strings(model, clean)
    n_kv = per_prompt.shape[axes.index("head")] if "head" in axes else None
    return PatchResult(kind, direction, metric_name(metric), axes, axis_labels(model, axes, clean.shape[1], toks, n_kv),
                       per_prompt, m_clean.double().cpu(), m_corrupt.double().cpu(), toks)

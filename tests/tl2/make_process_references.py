"""Weight-processing references of the legacy TransformerLens 2.18 `HookedTransformer`, for
tests/tl2/test_legacy_processing.py.

Run INSIDE the legacy environment (tests/tl2/make_legacy_venv.sh builds it):

    .venv-tl2/bin/python tests/tl2/make_process_references.py OUT_DIR

For every case of make_references.grid() (the same random-weight models as make_references.py) and every recipe of
`RECIPES`, it processes a copy of the model the way a TransformerLens 2.18 user does and writes, under OUT_DIR:
- `NAME.json`: the TransformerLens config dict, and per recipe either the error TransformerLens raised or
  `changed`, the relative error of the processed model's log-probs against the unprocessed model's (0 up to
  rounding when the processing keeps the outputs), and `norms`, the processed `cfg.normalization_type` and the
  class of `ln_final`;
- `NAME.safetensors`: `tokens`, the unprocessed `state/…` and `logits`, and per recipe `RECIPE/state/…` (the
  processed `state_dict()`), `RECIPE/logits` and `RECIPE/cache/…` (every activation of `run_with_cache`).
Recipes: `process-*` call `model.process_weights_(**flags)` (which always folds value biases); `load-*` build a model
as `HookedTransformer.from_pretrained` does (its Shortformer / soft-cap guards on the flags, LN → LNPre and RMS →
RMSPre in the config when folding) and call `load_and_process_state_dict(state_dict, **flags)`.
`manifest.json` (the case and recipe names) is written last. Only torch, transformer_lens and safetensors are used.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import sys
from pathlib import Path

import torch
from make_references import grid, json_safe, make_model
from safetensors.torch import save_file

FLAGS = ("fold_ln", "center_writing_weights", "center_unembed", "fold_value_biases", "refactor_factored_attn_matrices")
_NO_CENTRE = dict(center_writing_weights=False, center_unembed=False)
RECIPES = {
    "process-default": ("process", {}),
    "process-fold": ("process", dict(fold_ln=True, **_NO_CENTRE)),
    "process-center": ("process", dict(fold_ln=False)),
    "process-refactor": ("process", dict(refactor_factored_attn_matrices=True)),
    "process-refactor-only": ("process", dict(fold_ln=False, refactor_factored_attn_matrices=True, **_NO_CENTRE)),
    "load-default": ("load", dict(fold_ln=True, center_writing_weights=True, center_unembed=True,
                                  fold_value_biases=True, refactor_factored_attn_matrices=False)),
    "load-fold-only": ("load", dict(fold_ln=True, fold_value_biases=False, refactor_factored_attn_matrices=False,
                                    **_NO_CENTRE)),
}


def from_pretrained_flags(cfg, flags: dict) -> dict:
    """The flags `HookedTransformer.from_pretrained` (TransformerLens 2.18) passes on: off for Shortformer models
    (fold_ln, center_writing_weights, center_unembed) and center_unembed off under a logit soft cap."""
    flags = dict(flags)
    if cfg.positional_embedding_type == "shortformer":
        flags.update(fold_ln=False, center_writing_weights=False, center_unembed=False)
    if flags["center_unembed"] and cfg.output_logits_soft_cap > 0.0:
        flags["center_unembed"] = False
    return flags


def process(cfg, model, route: str, flags: dict):
    """The processed copy of `model`, TransformerLens' way (see the module docstring)."""
    from transformer_lens import HookedTransformer

    if route == "process":
        new = copy.deepcopy(model)
        new.process_weights_(**flags)
        return new
    flags = from_pretrained_flags(cfg, flags)
    cfg = copy.deepcopy(cfg)
    if flags["fold_ln"] and cfg.normalization_type in ("LN", "LNPre"):  # loading_from_pretrained.py, get_pretrained_
        cfg.normalization_type = "LNPre"                                 # model_config
    elif flags["fold_ln"] and cfg.normalization_type in ("RMS", "RMSPre"):
        cfg.normalization_type = "RMSPre"
    new = HookedTransformer(cfg)
    new.load_and_process_state_dict({k: v.clone() for k, v in model.state_dict().items()}, **flags)
    return new.eval()


def build_case(name: str, overrides: dict, seed: int):
    import logging

    logging.disable(logging.WARNING)  # TransformerLens' "Skipping" warnings
    cfg, model, tokens = make_model(overrides, seed)
    out = {"tokens": tokens}
    with torch.no_grad():
        out["logits"] = model(tokens)
    out.update({f"state/{k}": v for k, v in model.state_dict().items()})
    ref = out["logits"].double().log_softmax(-1)
    results = {}
    for recipe, (route, flags) in RECIPES.items():
        try:
            new = process(cfg, model, route, flags)
        except Exception as e:  # noqa: BLE001 - TransformerLens refuses: record what it raised
            results[recipe] = {"error": f"{type(e).__name__}: {e}"[:300]}
            continue
        with torch.no_grad():
            logits, cache = new.run_with_cache(tokens)
        lp = logits.double().log_softmax(-1)
        final = type(getattr(new, "ln_final", None)).__name__
        results[recipe] = {"changed": float((lp - ref).norm() / ref.norm()),
                           "norms": {"normalization_type": new.cfg.normalization_type, "ln_final": final}}
        out[f"{recipe}/logits"] = logits
        out.update({f"{recipe}/state/{k}": v for k, v in new.state_dict().items()})
        out.update({f"{recipe}/cache/{k}": v for k, v in cache.items()})
    meta = dict(name=name, seed=seed, cfg=json_safe(dataclasses.asdict(cfg)), recipes=results)
    return meta, {k: v.detach().contiguous().clone() for k, v in out.items()}


def main(out_dir: str) -> None:
    torch.set_num_threads(1)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "manifest.json").unlink(missing_ok=True)
    cases = grid()
    for seed, (name, overrides) in enumerate(cases.items()):
        meta, tensors = build_case(name, overrides, 1000 + 10 * seed)  # the seeds of make_references.py
        save_file(tensors, str(out / f"{name}.safetensors"))
        (out / f"{name}.json").write_text(json.dumps(meta, indent=1))
    tmp = out / f".manifest.{os.getpid()}"
    tmp.write_text(json.dumps({"cases": list(cases), "recipes": {k: [r, f] for k, (r, f) in RECIPES.items()}}))
    os.replace(tmp, out / "manifest.json")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: .venv-tl2/bin/python tests/tl2/make_process_references.py OUT_DIR")
    main(sys.argv[1])

"""Known gaps between our `HookedTransformer` and TransformerLens 2.18 (issue 14), as rules over a reference case.

Each `Gap` names what is missing (with issue 14's bug number), the checks of tests/tl2/test_legacy_parity.py it
breaks and the configurations it applies to. A parity check whose configuration meets any gap is marked
`xfail(strict=True)` with every applicable gap as the reason. When a gap is fixed, its checks XPASS and fail:
delete the gap here. `cfg` is the TransformerLens config dict of the case (make_references.BASE + overrides).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# the checks of test_legacy_parity.py
CHECKS = ("load", "logits", "loss", "cache", "grad", "grad_bwd_only", "cache_split", "cache_attn_in", "eigen",
          "edit_inplace", "edit_replace", "generate_kv", "generate_nokv", "generate_embeds", "generate_pad0")
ALL = frozenset(CHECKS)
CACHES = frozenset({"cache", "grad", "grad_bwd_only", "cache_split", "cache_attn_in"})  # compare names and values
OUTPUTS = ALL - {"load", "eigen"}  # everything computed by a forward pass


@dataclass(frozen=True)
class Gap:
    reason: str
    checks: frozenset
    applies: Callable[[dict], bool]


def _norm(cfg):
    return cfg.get("normalization_type")


def _is(field, value=True):
    return lambda cfg: cfg.get(field) == value


GAPS = [
    # --- hooks ------------------------------------------------------------------------------------------------
    Gap("ln1 backward hooks (kept on purpose, issue 14 bug 1: ln1 runs once per block): TL 2.18 calls ln1 three "
        "times per block (query, key and value inputs); the gradient its hooks leave in ln1.hook_normalized / "
        "ln1.hook_scale is the query path's only, ours is the sum over q, k and v, the gradient of the activation",
        {"grad", "grad_bwd_only"}, lambda cfg: _norm(cfg) is not None),
]


def expected_gap(cfg: dict, check: str) -> str | None:
    """Every known gap that breaks `check` for this configuration, joined; None when the check should pass."""
    reasons = [g.reason for g in GAPS if check in g.checks and g.applies(cfg)]
    return " | ".join(reasons) or None


def not_in_tl(cfg: dict, check: str) -> bool:
    """TransformerLens 2.18 itself refuses the variant, so there is no reference: use_attn_in with grouped-query
    attention (its assertion), split QKV input with GQA and shortformer positions (it raises a shape error), and
    the key/value cache with ungroup_grouped_query_attention (a shape error)."""
    gqa = cfg.get("n_key_value_heads") is not None
    if check == "cache_attn_in" and gqa:
        return True
    if check == "generate_kv" and cfg.get("ungroup_grouped_query_attention"):  # its KV cache: a shape error
        return True
    return check == "cache_split" and gqa and cfg["positional_embedding_type"] == "shortformer"

"""Known gaps between our `HookedTransformer` and TransformerLens 2.18 (issue 14), as rules over a reference case.

Each `Gap` names what is missing (with issue 14's bug number), the checks of tests/tl2/test_legacy_parity.py it
breaks and the configurations it applies to. A parity check whose configuration meets any gap is marked
`xfail(strict=True)` with every applicable gap as the reason. When a gap is fixed, its checks XPASS and fail:
delete the gap here. `cfg` is the TransformerLens config dict of the case (make_references.BASE + overrides).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

CHECKS = ("load", "logits", "loss", "cache", "grad", "grad_bwd_only", "cache_split", "cache_attn_in", "eigen",
          "edit_inplace", "edit_replace", "generate_kv", "generate_nokv")  # the checks of test_legacy_parity.py
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


UNSUPPORTED_ACTS = ("solu", "gelu_fast", "gelu_pytorch_tanh")

GAPS = [
    # --- configurations that do not load at all ---------------------------------------------------------------
    Gap("issue 14 bug 6: gated_mlp is refused (ConfigError); TL 2.18 GatedMLP: W_gate, hook_pre_linear",
        ALL, _is("gated_mlp")),
    Gap("issue 14 bug 6: parallel_attn_mlp is refused (ConfigError); TL 2.18: resid_post = resid_pre + attn_out + "
        "mlp_out(ln2(resid_pre)), no hook_resid_mid", ALL, _is("parallel_attn_mlp")),
    Gap("issue 14 bug 6: final_rms is refused (ConfigError); TL 2.18: ln_final is RMSNorm (RMSNormPre for LNPre)",
        ALL, _is("final_rms")),
    Gap("issue 14 bug 6: act_fn='solu_ln' refused (ConfigError); TL 2.18: mlp.hook_pre -> solu -> mlp.hook_mid -> "
        "mlp.ln (LN or LNPre) -> mlp.hook_post", ALL, _is("act_fn", "solu_ln")),
    Gap("act_fn solu / gelu_fast / gelu_pytorch_tanh (TL 2.18 SUPPORTED_ACTIVATIONS) refused by our config "
        "(ConfigError): implement, or keep refusing by name (issue 14 bug 6: nothing silently ignored)",
        ALL, lambda cfg: cfg.get("act_fn") in UNSUPPORTED_ACTS),
    Gap("issue 14 bug 6: d_vocab_out ignored: W_U [d_model, d_vocab_out] is refused as a shape mismatch",
        ALL, lambda cfg: cfg.get("d_vocab_out", -1) not in (-1, cfg["d_vocab"])),
    Gap("issue 14 bug 2: ALiBi state dicts carry TL 2.x's unused pos_embed.W_pos, refused as an unexpected tensor "
        "(and bidirectional ALiBi must give future keys a zero bias, as TL)",
        ALL, _is("positional_embedding_type", "alibi")),
    # --- numerics ---------------------------------------------------------------------------------------------
    Gap("issue 14 bug 1: shortformer + norm: TL 2.18 adds positions after ln1 (ln1(resid) + pos for Q and K), "
        "we normalise resid + pos", OUTPUTS,
        lambda cfg: cfg["positional_embedding_type"] == "shortformer" and _norm(cfg) is not None),
    Gap("issue 14 bug 6: use_attn_scale=False ignored (TL: scores not divided by sqrt(d_head))",
        OUTPUTS, _is("use_attn_scale", False)),
    Gap("issue 14 bug 6: attn_scale ignored (TL divides scores by cfg.attn_scale)",
        OUTPUTS, lambda cfg: cfg.get("attn_scale", -1.0) not in (-1.0, None)),
    Gap("issue 14 bug 6: scale_attn_by_inverse_layer_idx ignored (TL divides layer l's scores by l + 1 as well)",
        OUTPUTS, _is("scale_attn_by_inverse_layer_idx")),
    Gap("issue 14 bug 6: attn_scores_soft_cap ignored (TL: scores = cap * tanh(scores / cap) before the mask)",
        OUTPUTS, lambda cfg: cfg.get("attn_scores_soft_cap", -1.0) > 0),
    Gap("issue 14 bug 6: output_logits_soft_cap ignored (TL: logits = cap * tanh(logits / cap))",
        OUTPUTS - {"cache", "cache_split", "cache_attn_in"}, lambda cfg: cfg.get("output_logits_soft_cap", -1.0) > 0),
    # --- hooks ------------------------------------------------------------------------------------------------
    Gap("hook names: with normalization_type=None we fire ln1/ln2/ln_final.hook_normalized; TL 2.18 has no ln "
        "modules, so no such hooks", CACHES, lambda cfg: _norm(cfg) is None),
    Gap("issue 14 bug 4: RMS hook_normalized: TL 2.18 hooks x / scale before the weight, we hook it after "
        "(an in-place edit there lands before the weight in TL)", CACHES | {"edit_inplace"},
        lambda cfg: _norm(cfg) == "RMS"),
    Gap("ln1 backward hooks: TL 2.18 calls ln1 three times per block (query, key and value inputs); the gradient "
        "its hooks leave in ln1.hook_normalized / ln1.hook_scale is the query path's only, ours is the sum over "
        "q, k and v", {"grad", "grad_bwd_only"}, lambda cfg: _norm(cfg) is not None),
    Gap("issue 14 bug 5: backward hooks alone never fire on hook points computed only when forward-hooked "
        "(attn.hook_attn_scores, attn.hook_pattern, ln*.hook_scale, ...)", {"grad_bwd_only"}, lambda cfg: True),
    Gap("issue 14 bug 3: hook_pos_embed hands hooks an expanded view of W_pos: an in-place edit raises "
        "(batch > 1) or overwrites the parameter", {"edit_inplace"},
        lambda cfg: cfg["positional_embedding_type"] in ("standard", "shortformer")),
    Gap("issue 14 opt-in hooks: set_use_attn_result / set_use_split_qkv_input / set_use_hook_mlp_in and "
        "hook_q_input, hook_k_input, hook_v_input, hook_mlp_in, hook_result missing", {"cache_split"},
        lambda cfg: True),
    Gap("issue 14 opt-in hooks: set_use_attn_in and blocks.{l}.hook_attn_in missing", {"cache_attn_in"},
        lambda cfg: True),
    Gap("issue 14 opt-in hooks: use_hook_tokens / hook_tokens missing", CACHES, _is("use_hook_tokens")),
    # --- generation -------------------------------------------------------------------------------------------
    Gap("issue 14 generation: generate() lacks TL 2.x's arguments (do_sample, use_past_kv_cache, stop_at_eos with "
        "eos from the tokenizer, verbose, ...) and the key/value cache", {"generate_kv", "generate_nokv"},
        lambda cfg: True),
]


def expected_gap(cfg: dict, check: str) -> str | None:
    """Every known gap that breaks `check` for this configuration, joined; None when the check should pass."""
    reasons = [g.reason for g in GAPS if check in g.checks and g.applies(cfg)]
    return " | ".join(reasons) or None


def not_in_tl(cfg: dict, check: str) -> bool:
    """TransformerLens 2.18 itself refuses the variant, so there is no reference: use_attn_in with grouped-query
    attention (its assertion), and split QKV input with GQA and shortformer positions (it raises a shape error)."""
    gqa = cfg.get("n_key_value_heads") is not None
    if check == "cache_attn_in" and gqa:
        return True
    return check == "cache_split" and gqa and cfg["positional_embedding_type"] == "shortformer"

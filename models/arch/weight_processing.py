"""TransformerLens 2.18's weight processing for our decoder-only `HookedTransformer`, as functions of a model (the
model's methods of the same names call them; nothing here imports the model class): `process_weights_`,
`load_and_process_state_dict` and the processing flags of the loaders.

Each step is TransformerLens 2.18's method of the same name (transformer_lens/HookedTransformer.py, v2.18.0:
`fold_layer_norm`, `center_writing_weights`, `center_unembed`, `fold_value_biases`, `refactor_factored_attn_matrices`,
run in that order by `load_and_process_state_dict`), applied to our state dict, whose names are TransformerLens' (with
grouped-query attention our `attn.W_K` / `W_V` / `b_K` / `b_V` are its `attn._W_K`, …, `[n_key_value_heads, …]`).
After folding, the norms become TransformerLens' parameter-free `LNPre` / `RMSPre` (`cfg.normalization_type` too,
and `ln_final`, and a SoLU-LN MLP's `mlp.ln`), as its `process_weights_` does.

Where TransformerLens 2.18 skips a step with a warning, so do we (`warnings.warn`, its wording). Where it raises
(rotary or grouped-query `refactor_factored_attn_matrices`, folding an `LNPre` / `RMSPre` model again, plain SoLU) or
where its result would compute something else (it does not check), `WeightProcessingError` names the step and the
setting: Shortformer positions with norms (they join after ln1), LayerNorm with a gated MLP (W_gate has no bias to
take ln2's), SoLU-LN with RMS, `center_unembed` under a logit soft cap, post-norm blocks. With `final_rms` after LN
blocks we fold exactly (W_U uncentred, ln_final RMSPre) where TransformerLens 2.18 changes the outputs.
The loaders (`loading_flags`) first apply `HookedTransformer.from_pretrained`'s own rule: Shortformer models load with
fold_ln, center_writing_weights and center_unembed off, soft-capped logits with center_unembed off (a warning each).
"""

from __future__ import annotations

import warnings

import torch

from ..errors import WeightProcessingError
from .components import final_norm, norm_of_kind
from .config import HookedTransformerConfig
from .kind import DECODER, model_kind
from .state_dict import load_state_dict, tl_state_to_ours
from .tl_compat import FactoredMatrix

FLAGS = ("fold_ln", "center_writing_weights", "center_unembed", "fold_value_biases", "refactor_factored_attn_matrices")


# --- the steps, on a state dict (TransformerLens 2.18, HookedTransformer.py) ------------------------------------------
def _fold_norm(sd: dict, norm: str, readers: list[tuple[str, str | None, bool]], fold_bias: bool, centre: bool) -> None:
    """Fold `norm.w` (and `norm.b` with `fold_bias`) into each reader `(W [..., d, out], b [..., out] or None,
    centred)`: b ← b + Σ_d W·norm.b, then W ← diag(norm.w) W, then (with `centre` and `centred`) W ← W − mean_d W."""
    w, b = sd.pop(f"{norm}.w"), sd.pop(f"{norm}.b", None) if fold_bias else None
    for W, bias, centred in readers:
        if b is not None and bias is not None:
            sd[bias] = sd[bias] + (sd[W] * b[:, None]).sum(-2)
        sd[W] = sd[W] * w[:, None]
        if centre and centred:
            sd[W] = sd[W] - sd[W].mean(-2, keepdim=True)


def fold_norms(cfg, sd: dict, fold_biases: bool = True, center_weights: bool = True) -> dict:
    """TransformerLens' `fold_layer_norm`, on a state dict (`circuits.fold_layer_norm` folds a copy of a model with
    it; RMS: `fold_biases=False, center_weights=False`): ln1 into W_Q, W_K, W_V (b_Q, b_K, b_V), ln2 into W_in
    (b_in) and a gated MLP's W_gate (weight only, not centred), a SoLU-LN MLP's `mlp.ln` into W_out (b_out, centred
    over d_mlp), ln_final into W_U (b_U unless `final_rms`); readers are centred over d_model, since LNPre's output
    has zero mean. One difference: with `final_rms` W_U is not centred (ln_final is an RMSNorm, whose output keeps
    its mean; TransformerLens 2.18 centres it and changes the outputs)."""
    for l in range(cfg.n_layers):
        a, m = f"blocks.{l}.attn.", f"blocks.{l}.mlp."
        _fold_norm(sd, f"blocks.{l}.ln1", [(a + "W_Q", a + "b_Q", True), (a + "W_K", a + "b_K", True),
                                           (a + "W_V", a + "b_V", True)], fold_biases, center_weights)
        if not cfg.attn_only:
            gate = [(m + "W_gate", None, False)] if cfg.gated_mlp else []
            _fold_norm(sd, f"blocks.{l}.ln2", [(m + "W_in", m + "b_in", True), *gate], fold_biases, center_weights)
            if cfg.act_fn == "solu_ln":
                _fold_norm(sd, m + "ln", [(m + "W_out", m + "b_out", True)], fold_biases, center_weights)
    _fold_norm(sd, "ln_final", [("unembed.W_U", "unembed.b_U", not cfg.final_rms)], fold_biases and not cfg.final_rms,
               center_weights)
    return sd


def center_writing_weights(cfg, sd: dict) -> dict:
    """TransformerLens' `center_writing_weights`: W_E, a learned W_pos, W_O, b_O, W_out, b_out minus their mean over
    d_model (every reader sits behind a centring LayerNorm)."""
    names = ["embed.W_E", "pos_embed.W_pos"]
    for l in range(cfg.n_layers):
        names += [f"blocks.{l}.attn.W_O", f"blocks.{l}.attn.b_O"]
        if not cfg.attn_only:
            names += [f"blocks.{l}.mlp.W_out", f"blocks.{l}.mlp.b_out"]
    for name in names:
        if name in sd:  # a fixed positional table is a buffer outside the state dict (nothing to centre)
            sd[name] = sd[name] - sd[name].mean(-1, keepdim=True)
    return sd


def center_unembed(cfg, sd: dict) -> dict:
    """TransformerLens' `center_unembed`: W_U and b_U minus their mean over the vocabulary (log-probs unchanged)."""
    sd["unembed.W_U"] = sd["unembed.W_U"] - sd["unembed.W_U"].mean(-1, keepdim=True)
    sd["unembed.b_U"] = sd["unembed.b_U"] - sd["unembed.b_U"].mean()
    return sd


def fold_value_biases(cfg, sd: dict) -> dict:
    """TransformerLens' `fold_value_biases`: b_O ← b_O + Σ_head b_V W_O, b_V ← 0 (pattern rows sum to 1; grouped
    value heads are repeated to the query heads first)."""
    for l in range(cfg.n_layers):
        a = f"blocks.{l}.attn."
        b_V = sd[a + "b_V"].repeat_interleave(cfg.n_heads // cfg.n_key_value_heads, dim=0)
        sd[a + "b_O"] = sd[a + "b_O"] + (b_V[:, :, None] * sd[a + "W_O"]).sum([0, 1])
        sd[a + "b_V"] = torch.zeros_like(sd[a + "b_V"])
    return sd


def refactor_factored_attn_matrices(cfg, sd: dict) -> dict:
    """TransformerLens' `refactor_factored_attn_matrices`: [W_Q; b_Q] [W_K; b_K]ᵀ (the biases as a (d_model+1)-th
    input row) re-factored evenly by its SVD (`FactoredMatrix.make_even`: U√S, √S Vᵀ); value biases folded into b_O;
    W_V W_O = U S Vᵀ re-factored as W_V = U S, W_O = Vᵀ (orthonormal rows)."""
    fold_value_biases(cfg, sd)  # its b_V handling: b_O' = b_O + Σ_head b_V W_O, b_V' = 0
    for l in range(cfg.n_layers):
        a = f"blocks.{l}.attn."
        W_Q = torch.cat([sd[a + "W_Q"], sd[a + "b_Q"][:, None, :]], dim=1)
        W_K = torch.cat([sd[a + "W_K"], sd[a + "b_K"][:, None, :]], dim=1)
        Q, K_T = FactoredMatrix(W_Q, W_K.transpose(-1, -2)).make_even().pair
        K = K_T.transpose(-1, -2)
        sd[a + "W_Q"], sd[a + "b_Q"], sd[a + "W_K"], sd[a + "b_K"] = Q[:, :-1], Q[:, -1], K[:, :-1], K[:, -1]
        U, S, Vh = FactoredMatrix(sd[a + "W_V"], sd[a + "W_O"]).svd()
        sd[a + "W_V"], sd[a + "W_O"] = U @ S.diag_embed(), Vh.transpose(-1, -2)
    return sd


# --- which steps run --------------------------------------------------------------------------------------------------
def loading_flags(cfg, flags: dict) -> dict:
    """The flags a loader applies: TransformerLens 2.18's `HookedTransformer.from_pretrained` turns fold_ln,
    center_writing_weights and center_unembed off for Shortformer models and center_unembed off under a logit soft
    cap, with a warning each (HookedTransformer.py, `from_pretrained`); the rest go to `process_weights_`."""
    flags = dict(flags)
    off = []
    if cfg.positions.adds_to == "query_key":  # Shortformer
        off = ["fold_ln", "center_writing_weights", "center_unembed"]
    elif cfg.output_logits_soft_cap is not None:
        off = ["center_unembed"]
    what = "shortformer model" if len(off) > 1 else "model using logit softcap"
    for name in off:
        if flags.get(name):
            warnings.warn(f"You tried to specify {name}=True for a {what}, but this can't be done! Setting "
                          f"{name}=False instead.", stacklevel=3)
            flags[name] = False
    return flags


def _refuse(step: str, why: str, instead: str) -> None:
    raise WeightProcessingError(f"{step}: {why}; {instead}")


def check(model, fold_ln: bool, center_writing_weights: bool, center_unembed: bool,
          refactor_factored_attn_matrices: bool) -> tuple[bool, bool]:
    """Refuse (`WeightProcessingError`) what TransformerLens 2.18 refuses or would compute wrongly; return the
    `(fold_ln, center_writing_weights)` that run, after TransformerLens' warn-and-skip cases."""
    cfg, kind = model.cfg, model.cfg.normalization_type
    shortformer = cfg.positions.adds_to == "query_key"
    keep = "pass fold_ln=False"
    if kind is not None and cfg.normalization_position != "pre" and (fold_ln or center_writing_weights):
        _refuse("fold_ln / center_writing_weights", "post-norm blocks (normalization_position='post') normalise the "
                "residual stream itself; TransformerLens has no post-norm model", "pass both False")
    if fold_ln and kind is None:
        warnings.warn("You are not using LayerNorm or RMSNorm, so the layer norm weights can't be folded! Skipping",
                      stacklevel=3)
        fold_ln = False
    if fold_ln:
        if kind in ("LNPre", "RMSPre"):
            _refuse("fold_ln", f"normalization_type={kind!r} has no norm weights left to fold (already processed; "
                    "TransformerLens 2.18 raises KeyError 'blocks.0.ln1…')", keep)
        if shortformer:
            _refuse("fold_ln", "shortformer positions are added after ln1 (ln1(x) + pos), so ln1's weight cannot move "
                    "into W_Q / W_K (TransformerLens 2.18's process_weights_ changes the outputs; its from_pretrained "
                    "turns fold_ln off)", keep + ", or load with fold_ln=True, which skips it with a warning")
        if cfg.act_fn == "solu":
            _refuse("fold_ln", "act_fn='solu' has no mlp.ln, which TransformerLens 2.18 folds for every act_fn "
                    "starting with 'solu' (KeyError 'blocks.0.mlp.ln.b')", keep)
        if cfg.act_fn == "solu_ln" and kind == "RMS":
            _refuse("fold_ln", "SoLU-LN with RMS: TransformerLens 2.18 swaps the MLP's LayerNorm for RMSNormPre, "
                    "which computes something else", keep)
        if cfg.gated_mlp and kind == "LN":
            _refuse("fold_ln", "a gated MLP with LayerNorm: x W_gate has no bias to take ln2.b W_gate "
                    "(TransformerLens 2.18 drops it, changing the outputs)", keep)
    if center_writing_weights and (kind not in ("LN", "LNPre")):
        warnings.warn("You are not using LayerNorm, so the writing weights can't be centered! Skipping", stacklevel=3)
        center_writing_weights = False
    elif center_writing_weights and cfg.final_rms:
        warnings.warn("This model is using final RMS normalization, so the writing weights can't be centered! "
                      "Skipping", stacklevel=3)
        center_writing_weights = False
    if center_writing_weights and shortformer:
        _refuse("center_writing_weights", "shortformer positions reach queries and keys without a norm, so centring "
                "W_pos changes them (TransformerLens 2.18's process_weights_ does it anyway)",
                "pass center_writing_weights=False")
    if center_unembed and cfg.output_logits_soft_cap is not None:
        _refuse("center_unembed", "a logit soft cap is not invariant to adding a constant to the logits "
                "(TransformerLens 2.18's from_pretrained turns it off; its process_weights_ changes the outputs)",
                "pass center_unembed=False")
    if refactor_factored_attn_matrices and cfg.positions.rotates_qk:
        _refuse("refactor_factored_attn_matrices", "You can't refactor the QK circuit when using rotary embeddings "
                "(as the QK matrix depends on the position of the query and key)", "pass it False")
    if refactor_factored_attn_matrices and cfg.n_key_value_heads != cfg.n_heads:
        _refuse("refactor_factored_attn_matrices", "grouped-query attention shares W_K / W_V between query heads, "
                "which per-head factors cannot keep (TransformerLens 2.18: KeyError 'blocks.0.attn.W_K')",
                "pass it False")
    return fold_ln, center_writing_weights


#: the steps after fold_norms, in TransformerLens' order (the flags of `process_weights_` shadow their names there)
_STEPS = (center_writing_weights, center_unembed, fold_value_biases, refactor_factored_attn_matrices)


# --- applying them to a model -----------------------------------------------------------------------------------------
def set_norms(model, kind: str | None) -> None:
    """Rebuild every norm of `model` as `kind` (`cfg.normalization_type` too, in place, as TransformerLens'
    `process_weights_` does): ln1, ln2, a SoLU-LN MLP's `mlp.ln` (LNPre when `kind` ends in "Pre"), ln_final."""
    cfg = model.cfg
    cfg.normalization_type = kind
    for block in model.blocks:
        block.ln1 = norm_of_kind(cfg)
        if hasattr(block, "ln2"):
            block.ln2 = norm_of_kind(cfg)
        if hasattr(block, "mlp") and hasattr(block.mlp, "ln"):
            block.mlp.ln = norm_of_kind(cfg, cfg.d_mlp, "LNPre" if kind.endswith("Pre") else "LN")
    model.ln_final = final_norm(cfg)
    model.to(model.W_E.device)
    model.setup()  # the new modules' hook points


def process_weights_(model, fold_ln: bool = True, center_writing_weights: bool = True, center_unembed: bool = True,
                     fold_value_biases: bool = True, refactor_factored_attn_matrices: bool = False):
    """TransformerLens 2.18's `process_weights_` (with its `load_and_process_state_dict`'s `fold_value_biases` as a
    flag, default True as there), in place; returns the model. See the module docstring for what is refused. A
    `use_bias=False` model whose norm biases fold into its (zero) biases becomes `use_bias=True` (ours only:
    TransformerLens always has biases)."""
    if not isinstance(getattr(model, "cfg", None), HookedTransformerConfig) or model_kind(model) != DECODER:
        raise WeightProcessingError(f"process_weights_ handles the decoder-only models.HookedTransformer, got "
                                    f"{type(model).__name__}")
    fold, centre = check(model, fold_ln, center_writing_weights, center_unembed, refactor_factored_attn_matrices)
    cfg, kind = model.cfg, model.cfg.normalization_type
    with torch.no_grad():
        sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
        if fold:
            fold_norms(cfg, sd, fold_biases=kind == "LN", center_weights=kind == "LN")
        run = (centre, center_unembed, fold_value_biases, refactor_factored_attn_matrices)
        for on, step in zip(run, _STEPS):  # TransformerLens' order (load_and_process_state_dict)
            if on:
                step(cfg, sd)
        if fold:
            set_norms(model, kind + "Pre")
        if not cfg.use_bias and any(sd[n].ne(0).any() for n, _ in model.named_buffers() if _is_bias(n)):
            _biases_to_parameters(model)  # norm biases folded into zero-bias buffers: they become real biases
        model.load_state_dict(sd, strict=True)
    return model


def _is_bias(name: str) -> bool:
    return name.rsplit(".", 1)[-1].startswith("b_")


def _biases_to_parameters(model) -> None:
    """`use_bias=False` → True: every zero-bias buffer becomes a parameter (what a `use_bias=True` model has)."""
    model.cfg.use_bias = True
    for module in model.modules():
        for name in [n for n in module._buffers if _is_bias(n)]:
            module.register_parameter(name, torch.nn.Parameter(module._buffers.pop(name)))


def process_loaded(model, flags: dict):
    """A loader's processing flags (`models.load(..., fold_ln=True)`, `from_transformer_lens_state_dict`), checked
    by name. None given: no processing (TransformerLens' `from_pretrained_no_processing`). Any given: the others take
    `from_pretrained`'s defaults (all True but refactor_factored_attn_matrices), `loading_flags` is applied, then
    `process_weights_` (which refuses `fold_ln` on LNPre / RMSPre norms, as TransformerLens 2.18 cannot fold them:
    KeyError 'blocks.0.ln1.b')."""
    unknown = sorted(set(flags) - set(FLAGS))
    if unknown:
        raise WeightProcessingError(f"unknown processing flag(s) {unknown}; allowed: {', '.join(FLAGS)}")
    if not flags:
        return model
    flags = loading_flags(model.cfg, {**{f: f != "refactor_factored_attn_matrices" for f in FLAGS}, **flags})
    return process_weights_(model, **{name: bool(flags[name]) for name in FLAGS})


def load_and_process_state_dict(model, state_dict: dict, fold_ln: bool = True, center_writing_weights: bool = True,
                                center_unembed: bool = True, fold_value_biases: bool = True,
                                refactor_factored_attn_matrices: bool = False):
    """TransformerLens 2.18's `load_and_process_state_dict`: load `state_dict` (its layout, as
    `models.from_transformer_lens_state_dict` reads it) into `model`, then `process_weights_` with these flags. A
    model built with LNPre / RMSPre norms (as `from_pretrained` prepares one) takes a state dict that still has its
    norm weights when `fold_ln` is set. Returns the model."""
    kind = model.cfg.normalization_type
    if fold_ln and kind in ("LNPre", "RMSPre") and any(k.endswith(".ln1.w") or k == "ln_final.w" for k in state_dict):
        set_norms(model, kind[: -len("Pre")])
    load_state_dict(model, tl_state_to_ours(state_dict, model, "state dict"))
    return process_weights_(model, fold_ln, center_writing_weights, center_unembed, fold_value_biases,
                            refactor_factored_attn_matrices)

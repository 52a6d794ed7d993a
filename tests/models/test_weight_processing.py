"""`process_weights_` (TransformerLens 2.18's weight processing, models/arch/weight_processing.py) on float64 models
with random weights, biases and norm weights: every step keeps the outputs (log-probs; logits up to a per-position
constant with center_unembed) and the attention patterns, processing is idempotent, `refactor_factored_attn_matrices`
keeps the W_Q W_Kᵀ and W_V W_O products, and what TransformerLens refuses or would compute wrongly raises
WeightProcessingError.
Parity of the processed weights with the real TransformerLens 2.18: tests/tl2/test_legacy_processing.py (slow)."""

from __future__ import annotations

import warnings

import pytest
import torch
from helpers import randomize

import models
from models import HookedTransformer, HookedTransformerConfig, WeightProcessingError
from models.arch.weight_processing import FLAGS

BASE = dict(n_layers=2, d_model=12, n_heads=3, d_head=4, n_ctx=10, d_vocab=17, d_mlp=20, dtype="float64", seed=0)
CASES = {
    "ln-gelu": dict(),
    "ln-attn-alibi": dict(attn_only=True, positional_embedding_type="alibi"),
    "ln-parallel-rotary": dict(parallel_attn_mlp=True, positional_embedding_type="rotary"),
    "ln-solu-ln-sinusoidal": dict(act_fn="solu_ln", positional_embedding_type="sinusoidal"),
    "ln-final-rms": dict(final_rms=True),
    "ln-d-vocab-out": dict(d_vocab_out=11, scale_attn_by_inverse_layer_idx=True),
    "ln-gqa": dict(n_heads=4, d_head=3, n_key_value_heads=2),
    "lnpre-gelu": dict(normalization_type="LNPre"),
    "rms-gated": dict(normalization_type="RMS", gated_mlp=True, act_fn="silu"),
    "rms-attn-none-pos": dict(normalization_type="RMS", attn_only=True, positional_embedding_type="none"),
    "rmspre-parallel": dict(normalization_type="RMSPre", parallel_attn_mlp=True),
    "none-shortformer": dict(normalization_type=None, positional_embedding_type="shortformer"),
    "none-bidirectional": dict(normalization_type=None, attention_dir="bidirectional"),
}
ONE_FLAG = {flag: {f: f == flag for f in FLAGS} for flag in FLAGS}
RECIPES = {**ONE_FLAG, "default": {}, "all": {f: True for f in FLAGS}}


def make(seed: int = 0, **overrides) -> HookedTransformer:
    return randomize(HookedTransformer(HookedTransformerConfig(**{**BASE, **overrides})), 0.3, seed).eval()


def tokens(model) -> torch.Tensor:
    return torch.randint(0, model.cfg.d_vocab, (2, 9), generator=torch.Generator().manual_seed(1))


def run(model, toks):
    with torch.no_grad():
        logits, cache = model.run_with_cache(toks, names_filter=lambda n: n.endswith("hook_pattern"))
    return logits, dict(cache.items())


def _allowed(name: str, flags: dict) -> bool:
    cfg = {**BASE, **CASES[name]}
    rotary = cfg.get("positional_embedding_type") == "rotary"
    gqa = cfg.get("n_key_value_heads") not in (None, cfg["n_heads"])
    refactor = flags.get("refactor_factored_attn_matrices", False)
    fold_pre = flags.get("fold_ln", True) and cfg.get("normalization_type") in ("LNPre", "RMSPre")
    return not (refactor and (rotary or gqa)) and not fold_pre


def _grid() -> list[tuple[str, str]]:
    """Every case with no flag and with every flag, and each single flag on at least five cases (rotated)."""
    singles = list(ONE_FLAG)
    rows = [(n, r) for i, n in enumerate(CASES)
            for r in ("default", "all", singles[i % len(singles)], singles[(i + 2) % len(singles)])]
    return [(n, r) for n, r in dict.fromkeys(rows) if _allowed(n, RECIPES[r])]


@pytest.mark.parametrize("name, recipe", _grid())
def test_processing_keeps_outputs(name, recipe):  # the refused combinations: test_refusals
    flags = RECIPES[recipe]
    model = make(**CASES[name])
    toks = tokens(model)
    logits, patterns = run(model, toks)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TransformerLens' "can't be folded / centered! Skipping"
        out = model.process_weights_(**flags)
    assert out is model
    new_logits, new_patterns = run(model, toks)
    shift = (new_logits - logits).mean(-1, keepdim=True)  # center_unembed: a constant per position, nothing else
    assert torch.allclose(new_logits, logits + shift, atol=1e-10, rtol=0), (new_logits - logits - shift).abs().max()
    if not flags.get("center_unembed", True):
        assert shift.abs().max() < 1e-10
    for k, v in patterns.items():
        assert torch.allclose(new_patterns[k], v, atol=1e-12, rtol=0), k


@pytest.mark.parametrize("name", ["ln-gelu", "ln-solu-ln-sinusoidal", "ln-final-rms", "rms-gated", "none-shortformer"])
def test_norm_kinds_after_folding_and_idempotence(name, tmp_path):
    model = make(**CASES[name])
    kind = model.cfg.normalization_type
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.process_weights_(fold_ln=kind is not None)
    expect = None if kind is None else kind + "Pre"
    assert model.cfg.normalization_type == expect
    assert not any(".ln" in k or k.startswith("ln_final") for k in model.state_dict())  # no norm weights left
    assert model.blocks[0].ln1.kind == expect
    if kind is not None:
        assert model.ln_final.kind == ("RMSPre" if model.cfg.final_rms else expect)
        assert "blocks.0.ln1.hook_normalized" in model.hook_dict  # the new norms' hook points are registered
    if model.cfg.act_fn == "solu_ln":
        assert model.blocks[0].mlp.ln.kind == "LNPre"
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.process_weights_(fold_ln=False, refactor_factored_attn_matrices=False)  # the rest again: no change
    for k, v in model.state_dict().items():
        assert torch.allclose(v, before[k], atol=1e-12, rtol=0), k
    if kind is not None:
        with pytest.raises(WeightProcessingError, match="already processed"):
            model.process_weights_()
    models.save(model, tmp_path / "m")  # a processed model round-trips with its LNPre / RMSPre config
    back = models.load(tmp_path / "m")
    assert back.cfg.normalization_type == expect
    toks = tokens(model)
    assert torch.equal(back(toks), model(toks))


@pytest.mark.parametrize("name", ["ln-gelu", "ln-attn-alibi", "rms-gated", "none-bidirectional"])
def test_refactor_keeps_the_factored_products(name):
    model = make(**CASES[name])
    a = model.blocks[1].attn
    Q = torch.cat([a.W_Q, a.b_Q[:, None]], 1).detach().clone()
    K = torch.cat([a.W_K, a.b_K[:, None]], 1).detach().clone()
    OV = (a.W_V @ a.W_O).detach().clone()
    b_out = (a.b_O + (a.b_V[:, :, None] * a.W_O).sum([0, 1])).detach().clone()  # what the value biases add
    model.process_weights_(fold_ln=False, center_writing_weights=False, center_unembed=False, fold_value_biases=False,
                           refactor_factored_attn_matrices=True)
    Q2, K2 = torch.cat([a.W_Q, a.b_Q[:, None]], 1), torch.cat([a.W_K, a.b_K[:, None]], 1)
    assert torch.allclose(Q2 @ K2.transpose(-1, -2), Q @ K.transpose(-1, -2), atol=1e-10, rtol=0)
    assert torch.allclose(a.W_V @ a.W_O, OV, atol=1e-10, rtol=0)
    assert torch.allclose(a.b_O, b_out, atol=1e-12, rtol=0) and torch.all(a.b_V == 0)
    eye = torch.eye(model.cfg.d_head, dtype=torch.float64).expand(model.cfg.n_heads, -1, -1)
    assert torch.allclose(a.W_O @ a.W_O.transpose(-1, -2), eye, atol=1e-10)  # W_O = Vᵀ: orthonormal rows
    assert torch.allclose(Q2.norm(dim=-2), K2.norm(dim=-2), atol=1e-10)  # split evenly: columns of equal norm


@pytest.mark.parametrize("overrides, flags, match", [
    (dict(positional_embedding_type="shortformer"), dict(), "shortformer positions are added after ln1"),
    (dict(positional_embedding_type="shortformer", normalization_type="LNPre"), dict(fold_ln=False), "W_pos"),
    (dict(act_fn="solu"), dict(), "act_fn='solu'"),
    (dict(act_fn="solu_ln", normalization_type="RMS"), dict(), "SoLU-LN with RMS"),
    (dict(gated_mlp=True), dict(), "gated MLP with LayerNorm"),
    (dict(output_logits_soft_cap=3.0), dict(fold_ln=False), "logit soft cap"),
    (dict(positional_embedding_type="rotary"), dict(refactor_factored_attn_matrices=True), "rotary"),
    (dict(n_key_value_heads=1), dict(refactor_factored_attn_matrices=True), "grouped-query"),
    (dict(normalization_position="post"), dict(), "post-norm"),
    (dict(normalization_type="RMSPre"), dict(), "already processed"),
])
def test_refusals(overrides, flags, match):
    model = make(**overrides)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(WeightProcessingError, match=match):
        model.process_weights_(**flags)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # refused before touching anything


def test_use_bias_false_and_other_models(tmp_path):
    model = make(use_bias=False)  # LN biases are parameters, the model's own biases zero buffers, which take them
    toks = tokens(model)
    lp = model(toks).log_softmax(-1)
    model.process_weights_(refactor_factored_attn_matrices=True)
    assert torch.allclose(model(toks).log_softmax(-1), lp, atol=1e-10, rtol=0)
    assert model.cfg.use_bias and model.blocks[0].attn.b_Q.abs().max() > 0.1  # LN biases folded: real biases now
    assert isinstance(model.blocks[0].attn.b_Q, torch.nn.Parameter)
    models.save(model, tmp_path / "m")
    assert torch.equal(models.load(tmp_path / "m")(toks), model(toks))
    encoder = models.HookedEncoder(models.EncoderConfig(n_layers=1, d_model=8, n_ctx=6, d_vocab=9, n_heads=2, d_mlp=8))
    with pytest.raises(WeightProcessingError, match="decoder-only"):
        encoder.process_weights_()


def test_skips_warn_as_transformer_lens():
    model = make(normalization_type=None)
    with pytest.warns(UserWarning, match="can't be folded! Skipping"):
        model.process_weights_(center_writing_weights=False)
    model = make(normalization_type="RMS")
    W_E = model.W_E.detach().clone()
    with pytest.warns(UserWarning, match="writing weights can't be centered! Skipping"):
        model.process_weights_()
    assert torch.equal(model.W_E, W_E)


def test_loaders_take_the_flags(tmp_path):
    model = make()
    toks = tokens(model)
    models.save(model, tmp_path / "m")
    loaded = models.load(tmp_path / "m", fold_ln=True, center_writing_weights=True, center_unembed=True)
    expect = make().process_weights_()
    assert loaded.cfg.normalization_type == "LNPre"
    for k, v in expect.state_dict().items():
        assert torch.allclose(loaded.state_dict()[k], v, atol=1e-12, rtol=0), k
    with pytest.raises(WeightProcessingError, match="unknown processing flag"):
        models.load(tmp_path / "m", fold_layernorm=True)
    # from_pretrained's rule: a Shortformer model loads with fold_ln / centring off, and says so
    short = make(positional_embedding_type="shortformer")
    sd = {k: v.detach() for k, v in short.state_dict().items()}
    with pytest.warns(UserWarning, match="shortformer"):
        back = models.from_transformer_lens_state_dict(sd, short.cfg, fold_ln=True, center_unembed=True)
    assert back.cfg.normalization_type == "LN" and torch.allclose(back(toks), short(toks), atol=1e-12, rtol=0)
    # load_and_process_state_dict into a model built LNPre (as from_pretrained builds it) from an LN state dict
    pre = HookedTransformer(model.cfg.replace(normalization_type="LNPre"))
    pre.load_and_process_state_dict({k: v.detach() for k, v in model.state_dict().items()})
    assert torch.allclose(pre(toks).log_softmax(-1), model(toks).log_softmax(-1), atol=1e-10, rtol=0)

"""The fast forward against a float64 reference written loop by loop from the formulas.

The reference shares nothing with `models/` except the parameter tensors it reads: positions (sinusoidal,
rotary rotation matrices, ALiBi slopes), norms, activations, attention and the masking are all written out
here from the papers' formulas (Vaswani et al. 2017: attention and the sinusoidal table; Su et al. 2021: RoPE,
here pairing i with i + d/2 as GPT-NeoX or 2i with 2i + 1; Press et al. 2021: ALiBi slopes 2^(-8i/n)).
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from helpers import pairwise, randomize
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from models import HookedTransformer, HookedTransformerConfig

POS_TYPES = ["standard", "sinusoidal", "shortformer", "rotary-half", "rotary-adjacent", "alibi", "none"]
RTOL = 1e-6


# --- the reference -----------------------------------------------------------------------------------
def ref_sinusoidal(n_pos: int, d: int) -> torch.Tensor:
    """P[p, j] = sin(p / 10000^(j/d)) for even j, cos(p / 10000^((j-1)/d)) for odd j (Vaswani et al. 2017)."""
    table = torch.zeros(n_pos, d, dtype=torch.float64)
    for p in range(n_pos):
        for j in range(d):
            if j % 2 == 0:
                table[p, j] = math.sin(p / 10000 ** (j / d))
            else:
                table[p, j] = math.cos(p / 10000 ** ((j - 1) / d))
    return table


def ref_rotation(m: int, d_head: int, rotary_dim: int, base: float, adjacent: bool) -> torch.Tensor:
    """The RoPE matrix R_m [d_head, d_head] acting on a column vector: pair k (θ_k = base^(-2k/rotary_dim))
    rotates features (i, j) = (2k, 2k+1) (adjacent) or (k, k + rotary_dim/2) (half split) by angle m·θ_k;
    features past rotary_dim are left alone."""
    R = torch.eye(d_head, dtype=torch.float64)
    for k in range(rotary_dim // 2):
        theta = base ** (-2 * k / rotary_dim)
        i, j = (2 * k, 2 * k + 1) if adjacent else (k, k + rotary_dim // 2)
        c, s = math.cos(m * theta), math.sin(m * theta)
        R[i, i], R[i, j] = c, -s
        R[j, i], R[j, j] = s, c
    return R


def ref_norm(x: torch.Tensor, kind, w, b, eps) -> torch.Tensor:
    if kind is None:
        return x
    if kind == "LN":
        mu = x.mean(-1, keepdim=True)
        var = ((x - mu) ** 2).mean(-1, keepdim=True)
        return (x - mu) / torch.sqrt(var + eps) * w + b
    return x / torch.sqrt((x**2).mean(-1, keepdim=True) + eps) * w  # RMS


def ref_act(x: torch.Tensor, name: str) -> torch.Tensor:
    if name == "gelu":
        return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))
    if name == "gelu_new":
        return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    if name == "relu":
        return torch.where(x > 0, x, torch.zeros_like(x))
    if name == "silu":
        return x / (1 + torch.exp(-x))
    raise AssertionError(name)


def reference_forward(model: HookedTransformer, tokens: torch.Tensor) -> torch.Tensor:
    """Logits [batch, pos, d_vocab] in float64, one layer and one head at a time."""
    cfg = model.cfg
    sd = {k: v.detach().to(torch.float64) for k, v in model.state_dict().items()}
    kind = cfg.positional_embedding_type
    H, Hkv, dh = cfg.n_heads, cfg.n_key_value_heads, cfg.d_head
    group = H // Hkv
    P = tokens.shape[1]
    resid = sd["embed.W_E"][tokens]  # [batch, pos, d_model]
    pos = None
    if kind in ("standard", "shortformer"):
        pos = sd["pos_embed.W_pos"][:P]
    elif kind == "sinusoidal":
        pos = ref_sinusoidal(P, cfg.d_model)
    if kind in ("standard", "sinusoidal"):
        resid = resid + pos
    rot = torch.stack([ref_rotation(m, dh, cfg.rotary_dim, cfg.rotary_base, cfg.rotary_adjacent_pairs)
                       for m in range(P)])  # [pos, d_head, d_head]
    dist = torch.tensor([[abs(i - j) for j in range(P)] for i in range(P)], dtype=torch.float64)
    future = torch.tensor([[j > i for j in range(P)] for i in range(P)])
    for l in range(cfg.n_layers):
        p = f"blocks.{l}."
        ln = lambda x, name, p=p: ref_norm(x, cfg.normalization_type, sd.get(p + name + ".w"),
                                           sd.get(p + name + ".b"), cfg.eps)
        x_v = ln(resid, "ln1")
        x_qk = x_v + pos if kind == "shortformer" else x_v  # positions after the norm (TransformerLens 2.x)
        attn_out = sd[p + "attn.b_O"].clone()
        for h in range(H):
            g = h // group  # the key/value head this query head reads
            q = x_qk @ sd[p + "attn.W_Q"][h] + sd[p + "attn.b_Q"][h]  # [batch, pos, d_head]
            k = x_qk @ sd[p + "attn.W_K"][g] + sd[p + "attn.b_K"][g]
            v = x_v @ sd[p + "attn.W_V"][g] + sd[p + "attn.b_V"][g]
            if kind == "rotary":  # q_m <- R_m q_m (column vectors)
                q = torch.einsum("pij,bpj->bpi", rot, q)
                k = torch.einsum("pij,bpj->bpi", rot, k)
            scores = q @ k.transpose(-1, -2) / math.sqrt(dh)  # [batch, query, key]
            if kind == "alibi":
                scores = scores - 2.0 ** (-8.0 * (h + 1) / H) * dist
            if cfg.attention_dir == "causal":
                scores = scores.masked_fill(future, float("-inf"))
            pattern = torch.exp(scores - scores.max(-1, keepdim=True).values)
            pattern = pattern / pattern.sum(-1, keepdim=True)
            attn_out = attn_out + (pattern @ v) @ sd[p + "attn.W_O"][h]
        resid = resid + attn_out
        if not cfg.attn_only:
            x = ln(resid, "ln2")
            pre = x @ sd[p + "mlp.W_in"] + sd[p + "mlp.b_in"]
            resid = resid + ref_act(pre, cfg.act_fn) @ sd[p + "mlp.W_out"] + sd[p + "mlp.b_out"]
    final = ref_norm(resid, cfg.normalization_type, sd.get("ln_final.w"), sd.get("ln_final.b"), cfg.eps)
    return final @ sd["unembed.W_U"] + sd["unembed.b_U"]


# --- helpers -----------------------------------------------------------------------------------------
def make(pos: str, norm=None, mlp=False, attention_dir="causal", gqa=False, use_bias=True, **kw):
    kind = "rotary" if pos.startswith("rotary") else pos
    cfg = HookedTransformerConfig(
        n_layers=kw.pop("n_layers", 2), d_model=16, n_ctx=8, d_vocab=11, n_heads=4,
        n_key_value_heads=2 if gqa else None, d_mlp=24 if mlp else None, normalization_type=norm,
        positional_embedding_type=kind, rotary_adjacent_pairs=pos == "rotary-adjacent", attention_dir=attention_dir,
        use_bias=use_bias, dtype="float64", seed=1, **kw,
    )
    return randomize(HookedTransformer(cfg), scale=0.5, seed=2)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach(), b.detach()
    return float((a - b).norm() / b.norm())


def assert_matches_reference(model: HookedTransformer, n_pos: int = 7, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, model.cfg.d_vocab, (2, n_pos), generator=g)
    expected = reference_forward(model, tokens)
    fused = model(tokens)
    explicit, cache = model.run_with_cache(tokens)
    assert fused.dtype == torch.float64
    assert rel_err(fused, expected) < RTOL, "fused path (scaled_dot_product_attention) disagrees"
    assert rel_err(explicit, expected) < RTOL, "explicit path (run_with_cache) disagrees"
    with torch.no_grad():  # the explicit path's inference-only fast path (models.arch.attention.Attention._explicit)
        for names_filter in (None, lambda name: name.endswith("hook_pattern")):
            fast, _ = model.run_with_cache(tokens, names_filter=names_filter)
            assert rel_err(fast, expected) < RTOL, "explicit path without autograd disagrees"
    if model.cfg.n_layers:
        assert "blocks.0.attn.hook_pattern" in cache  # the explicit path really ran
    return tokens


# --- tests -------------------------------------------------------------------------------------------
# every pair of settings of two axes in some row (the axes act on separate parts of the model)
GRID = pairwise(POS_TYPES, [None, "LN", "RMS"], [False, True], ["causal", "bidirectional"])


@pytest.mark.parametrize("pos,norm,mlp,attention_dir", GRID)
def test_matches_reference(pos, norm, mlp, attention_dir):
    assert_matches_reference(make(pos, norm, mlp, attention_dir))


@pytest.mark.parametrize("pos", POS_TYPES)
@pytest.mark.parametrize("attention_dir", ["causal", "bidirectional"])
def test_matches_reference_gqa(pos, attention_dir):
    model = make(pos, "LN", True, attention_dir, gqa=True)
    assert model.blocks[0].attn.W_K.shape[0] == 2
    assert_matches_reference(model)


@pytest.mark.parametrize("pos", POS_TYPES)
def test_matches_reference_without_bias(pos):
    model = make(pos, "RMS", True, use_bias=False)
    assert not any(n.rsplit(".", 1)[-1].startswith("b_") for n, _ in model.named_parameters())
    assert_matches_reference(model)


@pytest.mark.parametrize("act_fn", ["gelu", "gelu_new", "relu", "silu"])
def test_matches_reference_activations(act_fn):
    assert_matches_reference(make("standard", "LN", True, act_fn=act_fn))


@pytest.mark.parametrize("adjacent", [False, True])
def test_matches_reference_partial_rotary(adjacent):
    pos = "rotary-adjacent" if adjacent else "rotary-half"
    assert_matches_reference(make(pos, "LN", True, rotary_dim=2, rotary_base=100.0))


def test_matches_reference_explicit_d_head_and_single_position():
    model = make("shortformer", "LN", True, d_head=3)
    assert model.blocks[0].attn.W_Q.shape == (4, 16, 3)
    assert_matches_reference(model)
    assert_matches_reference(model, n_pos=1)


@pytest.mark.parametrize("pos", ["standard", "none"])
def test_matches_reference_zero_layers(pos):
    assert_matches_reference(make(pos, "LN", n_layers=0))


@pytest.mark.parametrize("pos", ["rotary-half", "alibi", "shortformer"])
def test_per_head_result_path_matches_reference(pos):
    """Hooking only `hook_result` takes the per-head einsum path with the fused attention."""
    model = make(pos, "LN", True, gqa=True, use_attn_result=True)
    tokens = torch.randint(0, 11, (2, 6), generator=torch.Generator().manual_seed(3))
    seen = []
    out = model.run_with_hooks(tokens, fwd_hooks=[("blocks.1.attn.hook_result", lambda t, hook: seen.append(t))])
    assert seen and seen[0].shape == (2, 6, 4, 16)
    assert rel_err(out, reference_forward(model, tokens)) < RTOL


def test_reference_detects_a_wrong_model():
    """The comparison can fail: perturb one weight after computing the reference."""
    model = make("rotary-half", "LN", True)
    tokens = torch.randint(0, 11, (2, 6), generator=torch.Generator().manual_seed(4))
    expected = reference_forward(model, tokens)
    with torch.no_grad():
        model.blocks[1].attn.W_K[0, 0, 0] += 1e-3
    assert rel_err(model(tokens), expected) > RTOL


def test_reference_rotary_pairings_differ():
    """The two rotary pairings are different functions (so testing both is meaningful)."""
    half, adj = make("rotary-half"), make("rotary-adjacent")
    adj.load_state_dict(half.state_dict())
    tokens = torch.arange(7)[None] % 11
    assert rel_err(half(tokens), adj(tokens)) > 1e-3


# --- slow: random configurations ----------------------------------------------------------------------
@pytest.mark.slow
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pos=st.sampled_from(POS_TYPES), norm=st.sampled_from([None, "LN", "RMS"]), mlp=st.booleans(),
       attention_dir=st.sampled_from(["causal", "bidirectional"]), n_layers=st.integers(0, 3),
       gqa=st.booleans(), use_bias=st.booleans(), n_pos=st.integers(1, 12),
       act_fn=st.sampled_from(["gelu", "gelu_new", "relu", "silu"]), seed=st.integers(0, 1000))
def test_random_configs_match_reference(pos, norm, mlp, attention_dir, n_layers, gqa, use_bias, n_pos, act_fn, seed):
    model = make(pos, norm, mlp, attention_dir, gqa=gqa, use_bias=use_bias, n_layers=n_layers, act_fn=act_fn)
    if model.cfg.positional_embedding_type in ("standard", "shortformer"):  # learned positions end at n_ctx
        n_pos = min(n_pos, model.cfg.n_ctx)
    randomize(model, scale=0.5, seed=seed)
    assert_matches_reference(model, n_pos=n_pos, seed=seed)


# --- the loss -------------------------------------------------------------------------------------------
def ref_loss(logits: torch.Tensor, tokens: torch.Tensor, eps: float = 0.0) -> torch.Tensor:
    """Per prediction, −(1−ε) log p(tokens[i+1]) − ε mean_v log p(v), p = softmax(logits[i]), in float64."""
    B, P, V = logits.shape
    out = torch.zeros(B, P - 1, dtype=torch.float64)
    for b, i in itertools.product(range(B), range(P - 1)):
        row = [float(x) for x in logits[b, i]]
        top = max(row)
        log_z = top + math.log(sum(math.exp(x - top) for x in row))
        out[b, i] = -(1 - eps) * (row[int(tokens[b, i + 1])] - log_z) - eps * sum(x - log_z for x in row) / V
    return out


@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_loss_matches_reference(eps, dtype):
    from models import lm_cross_entropy

    logits = torch.randn(3, 7, 11, generator=torch.Generator().manual_seed(5)).to(dtype)
    tokens = torch.randint(0, 11, (3, 7), generator=torch.Generator().manual_seed(6))
    ref = ref_loss(logits, tokens, eps)
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    per = lm_cross_entropy(logits, tokens, per_token=True, label_smoothing=eps)
    assert per.shape == (3, 6) and per.dtype != torch.bfloat16
    assert float((per.double() - ref).abs().max()) < tol
    assert float(lm_cross_entropy(logits, tokens, label_smoothing=eps)) == pytest.approx(float(ref.mean()), abs=tol)


def test_model_loss_matches_reference():
    model = make("shortformer", None, False)
    tokens = torch.randint(0, 11, (2, 6), generator=torch.Generator().manual_seed(7))
    ref = ref_loss(reference_forward(model, tokens), tokens)
    assert float((model(tokens, return_type="loss", loss_per_token=True).double() - ref).abs().max()) < 1e-5
    assert float(model(tokens, return_type="loss")) == pytest.approx(float(ref.mean()), abs=1e-5)


@pytest.mark.parametrize("mlp", [False, True])
def test_bias_buffers_written_later_still_count(mlp):
    """use_bias=False keeps zero bias buffers, which the forward skips while they are zero (`affine`); a value
    written into them afterwards (as `circuits.fold_layer_norm` does) must still be added."""
    model = make("shortformer", None, mlp, use_bias=False)
    randomize(model, scale=0.5, seed=8)
    assert not any(b.any() for n, b in model.named_buffers() if n.rsplit(".", 1)[-1].startswith("b_"))
    assert_matches_reference(model)
    with torch.no_grad():
        for name in ("blocks.0.attn.b_Q", "blocks.1.attn.b_V", "blocks.1.attn.b_O", "unembed.b_U") + (
                ("blocks.0.mlp.b_in", "blocks.1.mlp.b_out") if mlp else ()):
            model.get_buffer(name).normal_(generator=torch.Generator().manual_seed(9))
    assert_matches_reference(model)

"""Attribution patching (`analyses.patching.attribution_patching`): exact on a linear path (attention-only, patterns
frozen) in both directions and for every kind that path is linear in; equal to TransformerLens 4.3's node
attribution where both apply; the comparison it reports; our model vs its bridge."""

from __future__ import annotations

import pytest
import torch

import models
from analyses import patching as P
from circuits.testing import random_model


def _frozen_patterns(model, tokens):
    """Permanent hooks holding every attention pattern at its value on `tokens`: with no norm and no MLP, the logits
    are then affine in every activation the patching kinds below touch."""
    _, cache = model.run_with_cache(tokens)
    for l in range(model.cfg.n_layers):
        name = f"blocks.{l}.attn.hook_pattern"
        model.add_hook(name, lambda p, hook, name=name: cache[name], is_permanent=True)


@pytest.fixture
def linear_model():
    m = random_model(n_layers=2, n_heads=3, positional="standard", normalization=None, attn_only=True).eval()
    g = torch.Generator().manual_seed(0)
    clean = torch.randint(0, m.cfg.d_vocab, (3, 8), generator=g)
    corrupt = torch.randint(0, m.cfg.d_vocab, (3, 8), generator=g)
    _frozen_patterns(m, clean)
    yield m, clean, corrupt
    m.reset_hooks(including_permanent=True)


@pytest.mark.parametrize("kind,by_pos", [("z", False), ("z", True), ("v", False), ("v", True), ("resid_pre", None),
                                         ("attn_out", None)])
@pytest.mark.parametrize("direction", ["denoising", "noising"])
def test_attribution_is_exact_on_a_linear_path(linear_model, kind, by_pos, direction):
    m, clean, corrupt = linear_model
    met = P.metric("logit_diff", P.answers(m, 3, correct=[1, 2, 3], wrong=[4, 5, 6], positions=[-1, -3]))
    r = P.attribution_patching(m, clean, corrupt, met, kind=kind, by_pos=by_pos, direction=direction, progress=False)
    assert r.exact is not None and r.estimate.axes == r.exact.axes
    assert float(r.estimate.share().abs().max()) > 0.05  # the patches move the metric
    torch.testing.assert_close(r.estimate.values, r.exact.values, atol=1e-6, rtol=0)
    assert r.max_error < 1e-6 and r.correlation > 1 - 1e-9


def test_denoising_head_outputs_equal_transformer_lens_node_attribution():
    """TransformerLens' `attribution_patch` scores each head's output at each position (denoising); ours by
    position is the same number, averaged over the prompt pairs."""
    from models.arch.tl_compat import analysis_tool

    attribution_patch = analysis_tool("attribution_patching").attribution_patch

    m = random_model(n_layers=2, n_heads=3, positional="standard", normalization="LN", attn_only=False).eval()
    g = torch.Generator().manual_seed(0)
    clean = torch.randint(0, m.cfg.d_vocab, (2, 7), generator=g)
    corrupt = torch.randint(0, m.cfg.d_vocab, (2, 7), generator=g)
    met = P.metric("logit_diff", P.answers(m, 2, correct=3, wrong=4))
    ours = P.attribution_patching(m, clean, corrupt, met, kind="z", by_pos=True, compare=False)
    assert ours.exact is None
    effect = ours.estimate.values - ours.estimate.corrupt_value  # [layer, pos, head]
    one = P.metric("logit_diff", P.answers(m, 1, correct=3, wrong=4))  # TransformerLens runs one pair at a time
    ref = attribution_patch(m, clean, corrupt, lambda logits: one(logits).sum())
    nodes = {(n.layer, n.position, n.head): v for n, v in ref.node_scores.items() if n.kind == "attn_head_out"}
    assert len(nodes) == effect.numel()
    for (l, p, h), v in nodes.items():
        assert abs(float(effect[l, p, h]) - v) < 1e-9 * max(1.0, abs(v))


def test_comparison_on_the_zoo_model_is_reported():
    from analyses.sequences import random_tokens, repeated_tokens

    m = models.load("attn-only-2l")
    clean = repeated_tokens(m, 10, 2, batch=2, seed=0)
    corrupt = clean.clone()
    corrupt[:, 1:11] = random_tokens(m, 10, 2, seed=1)
    met = P.metric("loss", P.next_token_answers(clean, range(11, 20)))
    r = P.attribution_patching(m, clean, corrupt, met, kind="z", progress=False)
    exact = P.activation_patching(m, clean, corrupt, met, kind="z", progress=False)
    torch.testing.assert_close(r.exact.values, exact.values)
    a, b = (r.estimate.values - exact.corrupt_value).flatten(), (exact.values - exact.corrupt_value).flatten()
    assert abs(r.correlation - float(torch.corrcoef(torch.stack([a, b]))[0, 1])) < 1e-12
    assert -1 <= r.correlation <= 1 and r.max_error == pytest.approx(float((a - b).abs().max()))
    assert "r = " in str(r)
    rows = r.errors()  # per head: estimate and exact effect, largest error first, where the linear estimate fails
    assert len(rows) == 8 and [abs(e - x) for _, e, x, _ in rows] == sorted((abs(e - x) for _, e, x, _ in rows),
                                                                             reverse=True)
    by_label = {lab: (e, x, note) for lab, e, x, note in rows}
    tiny = 0.01 * float(b.abs().max())
    for i, lab in enumerate(f"L{l}H{h}" for l in range(2) for h in range(4)):
        e, x, note = by_label[lab]
        assert (e, x) == pytest.approx((float(a[i]), float(b[i])))
        wrong = abs(e) > tiny and abs(x) > tiny and e * x < 0
        assert (note == "wrong sign") == wrong
        assert note.startswith("off by") == (not wrong and abs(x) > tiny and not 0.5 <= e / x <= 2)
    assert "linear estimate" in r.error_table() and "per cell against exact activation patching" in str(r)
    pat = P.attribution_patching(m, clean, corrupt, met, kind="pattern", by_pos=True, progress=False)
    assert pat.estimate.axes == pat.exact.axes == ("layer", "head", "pos")
    assert pat.estimate.values.shape == pat.exact.values.shape == (2, 4, 21)


@pytest.mark.tl4
def test_our_model_and_its_bridge_agree():
    m = random_model(n_layers=2, n_heads=3, positional="standard", normalization="LN", attn_only=False,
                     dtype="float32").eval()
    bridge = models.to_transformer_lens(m)
    g = torch.Generator().manual_seed(0)
    clean = torch.randint(0, m.cfg.d_vocab, (2, 7), generator=g)
    corrupt = torch.randint(0, m.cfg.d_vocab, (2, 7), generator=g)
    met = P.metric("loss", P.answers(m, 2, correct=3))
    for kind in ("z", "q", "k", "v", "resid_pre", "mlp_out", "pattern"):
        a = P.attribution_patching(m, clean, corrupt, met, kind=kind, compare=False)
        b = P.attribution_patching(bridge, clean, corrupt, met, kind=kind, compare=False)
        torch.testing.assert_close(a.estimate.values, b.estimate.values, atol=1e-4, rtol=1e-4)


def test_bad_input(linear_model):
    m, clean, corrupt = linear_model
    met = P.metric("loss", P.answers(m, 3, correct=1))
    with pytest.raises(P.PatchingError, match="same number of tokens"):
        P.attribution_patching(m, clean, corrupt[:, :5], met)
    with pytest.raises(P.PatchingError, match="unknown kind"):
        P.attribution_patching(m, clean, corrupt, met, kind="hook_z")
    with pytest.raises(P.PatchingError, match="one value per prompt"):
        P.attribution_patching(m, clean, corrupt, lambda logits: logits.sum())
    with pytest.raises(P.PatchingError, match="gradient at every pattern activation"):  # frozen: constants
        P.attribution_patching(m, clean, corrupt, met, kind="pattern")

"""Direct logit attribution, the logit lens and ablations (`analyses.patching`): components sum to the logit
(difference), our model equals a TransformerLens bridge in compatibility mode, the lens' last entry is the model's
own prediction, zero ablation with patterns preserved equals `analyses.one_layer.head_ablation_losses`, mean and
resample ablations against hand-computed replacements, and bad input."""

from __future__ import annotations

import pytest
import torch

import models
from analyses import patching as P
from analyses.one_layer import head_ablation_losses
from circuits.testing import random_model


@pytest.mark.parametrize("norm", [None, "LN", "RMS"])
def test_dla_components_sum_to_the_logit_difference(norm):
    m = random_model(n_layers=2, n_heads=3, positional="standard", normalization=norm, attn_only=False).eval()
    t = torch.randint(0, m.cfg.d_vocab, (2, 6), generator=torch.Generator().manual_seed(0))
    logits = m(t)
    folded = P.lens._readable(m)
    bias = folded.b_U[3] - folded.b_U[4]  # the unembedding bias is no component's
    for by in ("head", "layer"):
        d = P.direct_logit_attribution(m, t, answer=3, wrong=4, by=by)
        torch.testing.assert_close(d.attribution.sum(0), logits[:, -1, 3] - logits[:, -1, 4] - bias)
    following = torch.cat([t[:, 1:], t[:, :1]], 1)  # an answer per position: [batch, pos]
    every = P.direct_logit_attribution(m, t, answer=following, by="layer", pos=None)
    assert every.attribution.shape == (len(every.labels), 2, 6)
    target = logits.gather(-1, following[..., None])[..., 0] - folded.b_U[following]
    torch.testing.assert_close(every.attribution.sum(0), target)


@pytest.mark.tl4
@pytest.mark.parametrize("norm,biases", [(None, True), ("LN", False), ("RMS", True)])
def test_dla_equals_transformer_lens_on_a_bridge_in_compatibility_mode(norm, biases):
    m = random_model(n_layers=2, n_heads=3, positional="standard", normalization=norm, attn_only=False,
                     biases=biases, dtype="float32").eval()
    bridge = models.to_transformer_lens(m)
    t = torch.randint(0, m.cfg.d_vocab, (2, 6), generator=torch.Generator().manual_seed(0))
    with pytest.raises(P.PatchingError, match="compatibility mode"):
        P.direct_logit_attribution(bridge, t, answer=3)
    bridge.enable_compatibility_mode()
    for by in ("head", "layer"):
        a = P.direct_logit_attribution(m, t, answer=3, wrong=4, by=by)
        b = P.direct_logit_attribution(bridge, t, answer=3, wrong=4, by=by)
        assert a.labels == b.labels
        torch.testing.assert_close(a.attribution, b.attribution, atol=1e-5, rtol=1e-5)


@pytest.mark.tl4
@pytest.mark.parametrize("name", ["attn-only-2l", "gelu-2l"])
def test_logit_lens_ends_at_the_models_prediction(name):
    m = models.load(name)
    text = "def add(a, b):\n    return a + b\n"
    lens = P.logit_lens(m, text, top_k=2)
    t = m.to_tokens(text)
    probs = m(t).softmax(-1)[0].detach()
    assert lens.labels == ["0_pre", "1_pre", "final_post"]
    torch.testing.assert_close(lens.next_prob[-1], probs[:-1].gather(-1, t[0, 1:, None])[:, 0], atol=1e-6, rtol=0)
    torch.testing.assert_close(lens.top_ids[-1, :, 0], probs.argmax(-1))
    assert lens.top_strings[-1][0][0] == m.tokenizer.decode([int(probs[0].argmax())])
    # the first entry reads the embeddings alone: for an attention-only model without norms, W_E W_U (+ b_U)
    if name == "attn-only-2l":
        direct = (m.W_E[t[0]] @ m.W_U + m.b_U).softmax(-1).detach()
        torch.testing.assert_close(lens.next_prob[0], direct[:-1].gather(-1, t[0, 1:, None])[:, 0], atol=1e-6, rtol=0)


@pytest.mark.tl4
def test_logit_lens_on_a_bridge_equals_our_model():
    m = random_model(n_layers=2, n_heads=3, positional="standard", normalization="LN", dtype="float32").eval()
    bridge = models.to_transformer_lens(m)
    t = torch.randint(0, m.cfg.d_vocab, (1, 8), generator=torch.Generator().manual_seed(0))
    a, b = P.logit_lens(m, t), P.logit_lens(bridge, t)
    torch.testing.assert_close(a.next_prob, b.next_prob, atol=1e-5, rtol=1e-5)


def test_zero_ablation_with_patterns_preserved_is_head_ablation_losses():
    m = models.load("attn-only-2l")
    from analyses.sequences import repeated_tokens

    t = repeated_tokens(m, 15, 2, batch=3, seed=0)
    ours = P.ablate_heads(m, t, preserve_patterns=True)
    ref = head_ablation_losses(m, t)
    torch.testing.assert_close(ours.delta.float(), ref.delta, atol=2e-5, rtol=0)
    assert abs(float(ours.clean.mean()) - ref.clean_loss) < 1e-5


def test_mean_and_resample_ablation_replace_with_the_reference():
    """Mean (resample) ablation of a head equals patching in, by hand, the reference batch's mean (a reference
    prompt's) hook_z for that head."""
    m = random_model(n_layers=2, n_heads=3, positional="standard", normalization="LN", attn_only=False).eval()
    g = torch.Generator().manual_seed(0)
    t = torch.randint(0, m.cfg.d_vocab, (2, 6), generator=g)
    ref = torch.randint(0, m.cfg.d_vocab, (5, 8), generator=g)
    _, rc = m.run_with_cache(ref[:, :6])
    z = rc["blocks.0.attn.hook_z"]
    pick = torch.randint(0, 5, (2,), generator=torch.Generator().manual_seed(7))
    for method, value in (("mean", z.mean(0, keepdim=True).expand(2, -1, -1, -1)), ("resample", z[pick])):
        def hook(x, hook, value=value):
            x = x.clone()
            x[:, 2:4, 1] = value[:, 2:4, 1]
            return x

        loss = P.ablation.next_token_loss(m.run_with_hooks(t, fwd_hooks=[("blocks.0.attn.hook_z", hook)]), t)
        r = P.ablate_heads(m, t, heads=["L0H1"], method=method, reference=ref, positions=[2, 3], seed=7)
        torch.testing.assert_close(r.per_prompt[0, 1], loss)
        assert torch.isnan(r.per_prompt[1, 0]).all()
    together = P.ablate_heads(m, t, heads=["L0H1", "L1H2"], together=True)
    assert together.per_prompt.shape == (1, 1, 2) and together.together == "L0H1+L1H2"


@pytest.mark.tl4
def test_ablation_on_a_bridge_equals_our_model():
    m = random_model(n_layers=2, n_heads=3, positional="standard", normalization=None, dtype="float32").eval()
    bridge = models.to_transformer_lens(m)
    t = torch.randint(0, m.cfg.d_vocab, (2, 6), generator=torch.Generator().manual_seed(0))
    for kw in ({"preserve_patterns": True}, {"method": "mean", "reference": t}):
        torch.testing.assert_close(P.ablate_heads(m, t, **kw).per_prompt, P.ablate_heads(bridge, t, **kw).per_prompt,
                                   atol=1e-5, rtol=1e-5)


def test_bad_input():
    m = random_model(n_layers=2, n_heads=3, positional="standard").eval()
    t = torch.randint(0, m.cfg.d_vocab, (2, 6))
    cases = [
        (lambda: P.ablate_heads(m, t, method="mean"), "needs a reference batch"),
        (lambda: P.ablate_heads(m, t, method="mean", reference=t[:, :3]), "at least as long"),
        (lambda: P.ablate_heads(m, t, method="noise"), "unknown ablation method 'noise'"),
        (lambda: P.ablate_heads(m, t, heads=["L5H0"]), "out of range"),
        (lambda: P.ablate_heads(m, t, positions=[9]), "positions must lie"),
        (lambda: P.direct_logit_attribution(m, t, answer=3, by="neuron"), "unknown unit 'neuron'"),
        (lambda: P.direct_logit_attribution(m, t, answer=999), "out of range"),
        (lambda: P.logit_lens(m, t), "one prompt"),
        (lambda: P.logit_lens(m, t[:1], top_k=0), "top_k"),
    ]
    for call, match in cases:
        with pytest.raises(P.PatchingError, match=match):
            call()

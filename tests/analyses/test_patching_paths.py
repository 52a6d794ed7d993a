"""Path patching (`analyses.patching.path_patching*`): the hand-built induction circuit (the whole effect through the
previous-token head → induction head's keys, exactly zero through its queries and values and for heads that read
nothing relevant), agreement with TransformerLens 4.3's exact direct-path patching on a bridge that has split Q/K/V
inputs, our model vs its TransformerLens bridge, the zoo's attn-only-2l, and bad input."""

from __future__ import annotations

import pytest
import torch

import models
from analyses import patching as P
from analyses.resume import resumable
from circuits.testing import build_induction_model, random_model


def _derangement(r: torch.Tensor, seed: int) -> torch.Tensor:
    """A reordering r' of r with r'[i] ≠ r[i] for every i and no bigram of r kept (r'[k] = r[i] ⇒ r'[k+1] ≠ r[i+1]):
    the induction head of the corrupted run then looks at a wrong position and copies a wrong token."""
    g = torch.Generator().manual_seed(seed)
    pairs = set(zip(r[:-1].tolist(), r[1:].tolist()))
    while True:
        c = r[torch.randperm(len(r), generator=g)]
        if (c != r).all() and not pairs & set(zip(c[:-1].tolist(), c[1:].tolist())):
            return c


def _induction_setup(positional="shortformer", batch=3, n=15):
    """Clean `[BOS] + R + R` and corrupted `[BOS] + R' + R` (R' a derangement of R), and the loss on the second
    copy (each position predicting the next token)."""
    model, info = build_induction_model(d_vocab=16, n_ctx=32, positional=positional)
    g = torch.Generator().manual_seed(1)
    rs = [torch.randperm(15, generator=g)[:n] + 1 for _ in range(batch)]
    clean = torch.stack([torch.cat([torch.tensor([0]), r, r]) for r in rs])
    corrupt = torch.stack([torch.cat([torch.tensor([0]), _derangement(r, i), r]) for i, r in enumerate(rs)])
    met = P.metric("loss", P.next_token_answers(clean, range(n + 1, 2 * n)))
    return model, info, clean, corrupt, met


@pytest.mark.parametrize("positional", ["shortformer", "standard"])
def test_hand_built_induction_circuit_runs_through_the_keys_only(positional):
    model, info, clean, corrupt, met = _induction_setup(positional)
    (prev,), (ind,) = info.previous_token_heads, info.induction_heads
    r = P.path_patching_matrix(model, clean, corrupt, met, progress=False)
    assert r.corrupt_value - r.clean_value > 9  # the corruption breaks the induction head
    share = r.share()
    k, s, t = r.labels[0].index("k"), r.labels[1].index(f"L{prev[0]}H{prev[1]}"), r.labels[2].index(
        f"L{ind[0]}H{ind[1]}")
    assert abs(float(share[k, s, t]) - 1) < 1e-5  # the whole effect, through the keys
    others = r.values.clone()
    others[k, s, t] = r.clean_value
    # through Q and V, and every path from the current-token head or into the first-token head: exactly nothing
    assert float((others - r.clean_value).abs().max()) < 1e-12
    # all of the induction head's key input comes from the previous-token head: patching its keys whole agrees
    keys = P.activation_patching(model, clean, corrupt, met, kind="k", direction="noising", progress=False)
    assert abs(float(keys.values[ind]) - float(r.values[k, s, t])) < 1e-5 * r.corrupt_value


def test_hand_built_denoising_through_the_keys_alone_restores_nothing():
    """Induction is an AND of keys (where to look) and values (what is there): clean keys in the corrupted run look
    at the right place but copy the corrupted token."""
    model, info, clean, corrupt, met = _induction_setup()
    r = P.path_patching(model, clean, corrupt, met, info.previous_token_heads, info.induction_heads, "k",
                        direction="denoising")
    assert r.values.shape == (1, 1, 1) and abs(float(r.share().squeeze())) < 1e-3
    assert r.labels == (("k",), ("L0H0",), ("L1H0",))


def test_path_patching_sender_and_receiver_sets():
    """Patching the previous-token head together with the irrelevant current-token head into both layer-1 heads
    equals the single relevant path; a set of receivers is one path."""
    model, info, clean, corrupt, met = _induction_setup()
    one = P.path_patching(model, clean, corrupt, met, ["L0H0"], ["L1H0"], "k")
    both = P.path_patching(model, clean, corrupt, met, ["L0H0", "L0H1"], ["L1H0", "L1H1"], "k")
    torch.testing.assert_close(one.per_prompt, both.per_prompt, atol=1e-12, rtol=0)
    assert both.labels[1:] == (("L0H0+L0H1",), ("L1H0+L1H1",))


@pytest.mark.tl4
def test_our_model_and_its_bridge_agree():
    model, _, clean, corrupt, met = _induction_setup("standard")
    bridge = models.to_transformer_lens(model)
    a = P.path_patching_matrix(model, clean, corrupt, met, progress=False)
    b = P.path_patching_matrix(bridge, clean, corrupt, met, progress=False)
    assert torch.equal(a.values.isnan(), b.values.isnan())
    torch.testing.assert_close(a.values.nan_to_num(), b.values.nan_to_num(), atol=1e-9, rtol=1e-9)


def _gpt2_bridge():
    """A small randomly initialised GPT-2 as a TransformerLens bridge, built offline: its joint-QKV attention has
    the split Q/K/V input hooks that TransformerLens' direct path patching needs."""
    import tempfile

    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    from models.arch.tl_compat import transformer_bridge

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=40, n_positions=16, n_embd=32, n_layer=3, n_head=4, attn_implementation="eager",
                     initializer_range=0.3)
    hf = GPT2LMHeadModel(cfg).eval()
    words = Tokenizer(WordLevel({f"t{i}": i for i in range(40)}, unk_token="t0"))
    with tempfile.TemporaryDirectory() as d:  # TransformerLens reloads the tokenizer by its path
        PreTrainedTokenizerFast(tokenizer_object=words, bos_token="t0", eos_token="t0", unk_token="t0"
                                ).save_pretrained(d)
        tok = PreTrainedTokenizerFast.from_pretrained(d)
        bridge = transformer_bridge()[0].boot_transformers("gpt2", hf_model=hf, tokenizer=tok, device="cpu")
    return bridge.eval()


@pytest.mark.tl4
def test_denoising_path_equals_transformer_lens_direct_path_patching():
    from models.arch.tl_compat import patching

    tlp = patching()

    bridge = _gpt2_bridge()
    g = torch.Generator().manual_seed(0)
    clean = torch.randint(1, 40, (2, 9), generator=g)
    corrupt = clean.clone()
    corrupt[:, 1:5] = torch.randint(1, 40, (2, 4), generator=g)
    met = P.metric("logit_diff", P.answers(bridge, 2, correct=[3, 5], wrong=[4, 6], positions=[-1, -3]))
    _, cc = bridge.run_with_cache(clean)
    _, cx = bridge.run_with_cache(corrupt)
    senders = [(0, 1), (1, 2)]
    r = P.path_patching_matrix(bridge, clean, corrupt, met, senders=senders, direction="denoising", progress=False)
    checked = 0
    for j, (sl, sh) in enumerate(senders):
        for i, c in enumerate(P.COMPONENTS):
            ref = tlp.get_act_patch_direct_path(bridge, corrupt, cc, cx, lambda lg: met(lg).mean(), sl, sh, c,
                                                verbose=False)
            for k, rec in enumerate(r.labels[2]):
                rl, rh = int(rec[1]), int(rec[3])
                if rl > sl:
                    assert abs(float(r.values[i, j, k]) - float(ref[rl, rh])) < 1e-5, (c, sl, sh, rec)
                    checked += 1
                else:
                    assert torch.isnan(r.values[i, j, k])
    assert checked == 3 * (8 + 4)
    assert float(r.share().nan_to_num().abs().max()) > 0.01  # the paths do something here


def test_zoo_attn_only_2l_singles_out_previous_token_to_induction_keys():
    """On repeated random sequences against the first copy resampled, the two largest paths are the previous-token
    head L0H1 into the induction heads L1H1 and L1H2 through their keys."""
    from analyses.sequences import random_tokens, repeated_tokens

    m = models.load("attn-only-2l")
    n = 20
    clean = repeated_tokens(m, n, 2, batch=8, seed=0)
    corrupt = clean.clone()
    corrupt[:, 1:n + 1] = random_tokens(m, n, 8, seed=1)
    met = P.metric("loss", P.next_token_answers(clean, range(n + 1, 2 * n)))
    r = P.path_patching_matrix(m, clean, corrupt, met, progress=False)
    top = [lab for lab, _, _ in r.top(2)]
    assert sorted(top) == ["k: L0H1 → L1H1", "k: L0H1 → L1H2"], r.markdown()


def test_bad_input():
    model, _, clean, corrupt, met = _induction_setup()
    cases = [
        (lambda: P.path_patching(model, clean, corrupt, met, ["L1H0"], ["L0H0"]), "later layer"),
        (lambda: P.path_patching(model, clean, corrupt, met, ["L0H0"], ["L1H0"], "o"), "unknown component 'o'"),
        (lambda: P.path_patching(model, clean, corrupt, met, ["L0H9"], ["L1H0"]), "out of range"),
        (lambda: P.path_patching(model, clean, corrupt, met, [(0,)], ["L1H0"]), "a .layer, head. pair"),
        (lambda: P.path_patching(model, clean, corrupt, met, [], ["L1H0"]), "at least one sender"),
        (lambda: P.path_patching(model, clean, corrupt[:, :-1], met, ["L0H0"], ["L1H0"]), "same number of tokens"),
        (lambda: P.path_patching(model, clean, corrupt, met, ["L0H0"], ["L1H0"], direction="up"), "direction"),
    ]
    for call, match in cases:
        with pytest.raises(P.PatchingError, match=match):
            call()
    gqa = random_model(n_layers=2, n_heads=4, n_key_value_heads=2, d_head=4).eval()
    t = torch.randint(0, 23, (1, 6))
    m = P.metric("loss", P.answers(gqa, 1, correct=1))
    with pytest.raises(P.PatchingError, match="grouped-query"):
        P.path_patching(gqa, t, t, m, ["L0H0"], ["L1H0"], "k")
    P.path_patching(gqa, t, t, m, ["L0H0"], ["L1H0"], "q")  # queries stay per head
    rot = random_model(n_layers=2, positional="rotary").eval()
    with pytest.raises(P.PatchingError, match="no hook_pos_embed"):
        P.path_patching(rot, t, t, m, ["pos_embed"], ["L1H0"], "q")
    same = P.path_patching(rot, t, t, m, ["embed"], ["L0H0"], "v")  # an embedding reaches layer 0 too
    assert torch.allclose(same.per_prompt.reshape(-1), same.clean, atol=1e-12)  # identical prompts: nothing moves


def test_unfrozen_mlps_let_the_sender_reach_the_receiver_through_them():
    """With `freeze_mlps=False` (Wang et al.'s treatment) a layer-0 sender reaches a layer-1 receiver directly and
    through the layer-0 MLP: the receiver's key is then simply its key in the run with the sender patched; with
    MLPs frozen the MLP path is cut, and the two differ."""
    m = random_model(n_layers=2, n_heads=3, positional="standard", normalization="LN", attn_only=False).eval()
    g = torch.Generator().manual_seed(0)
    clean = torch.randint(0, m.cfg.d_vocab, (2, 7), generator=g)
    corrupt = torch.randint(0, m.cfg.d_vocab, (2, 7), generator=g)
    met = P.metric("loss", P.answers(m, 2, correct=[1, 2]))
    _, cx = m.run_with_cache(corrupt)
    keys = {}

    def sender(z, hook):
        z = z.clone()
        z[:, :, 2] = cx["blocks.0.attn.hook_z"][:, :, 2]
        return z

    m.run_with_hooks(clean, fwd_hooks=[("blocks.0.attn.hook_z", sender),
                                       ("blocks.1.attn.hook_k", lambda k, hook: keys.setdefault("k", k.clone()))])

    def receiver(k, hook):
        k = k.clone()
        k[:, :, 1] = keys["k"][:, :, 1]
        return k

    by_hand = met(m.run_with_hooks(clean, fwd_hooks=[("blocks.1.attn.hook_k", receiver)]))
    free = P.path_patching(m, clean, corrupt, met, ["L0H2"], ["L1H1"], "k", freeze_mlps=False)
    frozen = P.path_patching(m, clean, corrupt, met, ["L0H2"], ["L1H1"], "k")
    torch.testing.assert_close(free.per_prompt.reshape(-1), by_hand.double(), atol=1e-12, rtol=0)
    assert float((free.per_prompt - frozen.per_prompt).abs().max()) > 1e-6


def test_heads_carry_their_hook_prefix():
    h = P.Head(1, 2)
    assert h.hook("k") == "blocks.1.attn.hook_k" and str(h) == "L1H2"
    cross = P.Head(1, 2, stack="decoder", attn="cross_attn")  # how an encoder–decoder model would name one
    assert cross.hook("k") == "decoder.1.cross_attn.hook_k" and str(cross) == "decoder.cross_attn.L1H2"


def _whole_run_paths(model, clean, corrupt, met, senders, receivers, component):
    """Path patching as two whole hooked runs per path, written out (no cached block input, no early stop): the
    sender heads' `hook_z` from the corrupted run, every other head (and MLP) frozen to the clean run, the
    receivers' `hook_{component}` recorded; then the clean run with only those patched in."""
    _, cc = model.run_with_cache(clean)
    _, cx = model.run_with_cache(corrupt)
    L = model.cfg.n_layers
    recorded = {}

    def freeze(z, hook):
        out = cc[hook.name].clone()
        for sl, sh in senders:
            if hook.name == f"blocks.{sl}.attn.hook_z":
                out[:, :, sh] = cx[hook.name][:, :, sh]
        return out

    hooks = [(f"blocks.{l}.attn.hook_z", freeze) for l in range(L)]
    hooks += [(f"blocks.{l}.hook_mlp_out", lambda x, hook: cc[hook.name]) for l in range(L) if not model.cfg.attn_only]
    hooks += [(f"blocks.{l}.attn.hook_{component}", lambda x, hook: recorded.__setitem__(hook.name, x.clone()))
              for l in range(L)]
    model.run_with_hooks(clean, fwd_hooks=hooks)

    def patch(x, hook):
        x = x.clone()
        for rl, rh in receivers:
            if hook.name == f"blocks.{rl}.attn.hook_{component}":
                x[:, :, rh] = recorded[hook.name][:, :, rh]
        return x

    return met(model.run_with_hooks(clean, fwd_hooks=[(f"blocks.{l}.attn.hook_{component}", patch)
                                                      for l in range(L)]))


@pytest.mark.parametrize("positional,attn_only", [("standard", True), ("shortformer", True), ("rotary", False)])
def test_path_patching_equals_whole_runs_bitwise(positional, attn_only):
    """Our models' step-2 runs start at the receivers' layer from the cached block input and step-1 runs stop
    before the unembedding; shared baselines (`path_baselines`) replace each call's own runs. The values are
    bitwise those of whole runs written out by hand, in float32 as the zoo runs."""
    m = random_model(n_layers=3, n_heads=3, positional=positional, normalization="LN", attn_only=attn_only,
                     dtype="float32").eval()
    assert resumable(m)
    g = torch.Generator().manual_seed(2)
    clean = torch.randint(1, m.cfg.d_vocab, (3, 10), generator=g)
    corrupt = torch.randint(1, m.cfg.d_vocab, (3, 10), generator=g)
    met = P.metric("loss", P.next_token_answers(clean, range(4, 9)))
    base = P.path_baselines(m, clean, corrupt, met)
    r = P.path_patching_matrix(m, clean, corrupt, met, progress=False, baselines=base)
    for j, s in enumerate(r.labels[1]):
        for k, t in enumerate(r.labels[2]):
            sl, sh, tl, th = int(s[1]), int(s[3]), int(t[1]), int(t[3])
            for i, c in enumerate(r.labels[0]):
                if tl > sl:
                    assert torch.equal(r.per_prompt[i, j, k].float(),
                                       _whole_run_paths(m, clean, corrupt, met, [(sl, sh)], [(tl, th)], c)), (c, s, t)
    joint = P.path_patching(m, clean, corrupt, met, ["L0H0", "L1H2"], ["L2H0", "L2H1"], "q", baselines=base)
    assert torch.equal(joint.per_prompt.reshape(-1).float(),
                       _whole_run_paths(m, clean, corrupt, met, [(0, 0), (1, 2)], [(2, 0), (2, 1)], "q"))
    assert torch.equal(joint.per_prompt, P.path_patching(m, clean, corrupt, met, ["L0H0", "L1H2"], ["L2H0", "L2H1"],
                                                         "q").per_prompt)  # shared baselines change no bit
    with pytest.raises(P.PatchingError, match="baselines"):
        P.path_patching(m, corrupt, clean, met, ["L0H0"], ["L1H0"], "q", baselines=base)
    with pytest.raises(P.PatchingError, match="baselines"):
        P.path_patching(m, clean, corrupt, met, ["L0H0"], ["L1H0"], "q", direction="denoising", baselines=base)


def test_only_models_that_run_from_a_layer_are_resumed():
    """Runs start at a layer only on a model whose forward takes TransformerLens 2.x's arguments for it; an
    encoder–decoder (and an object without `input_to_embed`) runs whole."""
    assert resumable(random_model())
    assert not resumable(models.load("enc-dec-reverse"))
    assert not resumable(torch.nn.Linear(2, 2))


@pytest.mark.tl4
def test_a_bridge_runs_whole():
    assert not resumable(models.to_transformer_lens(random_model()))

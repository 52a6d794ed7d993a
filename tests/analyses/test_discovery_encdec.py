"""Circuit discovery on the encoder–decoders: edge patching against hand-written hook loops and against the model's
own encode/decode (no hooks at all), EAP against exact patching where first order is exact, and the hand-found
cross-attention circuits of the zoo's enc-dec-reverse and enc-dec-sort (their cards: alignment heads with copying
OV circuits) found by each method."""

from __future__ import annotations

import pytest
import torch

import models
from analyses.discovery import DiscoveryTask, discover, discovery_task, edge_scores, single_edge_effects
from analyses.discovery.patching import EdgePatcher, patch_edges, run_subgraph, split_inputs
from analyses.patching import PatchingError
from analyses.patching.metrics import Answers

ATOL = 1e-6


@pytest.fixture(scope="module", params=["enc-dec-reverse", "enc-dec-sort"])
def setup(request):
    m = models.load(request.param).to(torch.float64).eval()
    task = discovery_task(m, "reversal" if request.param.endswith("reverse") else "sorting", n_prompts=4)
    return m, task


@pytest.fixture(scope="module")
def reverse():
    return models.load("enc-dec-reverse").eval()


def _sender_hook(name, L):
    """The hook and head where sender `name` writes, spelled out by hand."""
    stack, rest = name.split(".", 1)
    blocks, suffix = {"enc": ("encoder", "_src"), "dec": ("decoder", "_tgt")}[stack]
    if rest in ("embed", "pos_embed"):
        return f"hook_{rest}{suffix}", None
    if rest.endswith(".mlp"):
        return f"{blocks}.{rest[1:-4]}.hook_mlp_out", None
    layer, head = rest[1:].split("H")
    if layer.endswith("X"):
        return f"decoder.{layer[:-1]}.cross_attn.hook_result", int(head)
    return f"{blocks}.{layer}.attn.hook_result", int(head)


def _receiver_hook(name, m):
    stack, rest = name.split(".", 1)
    blocks = {"enc": "encoder", "dec": "decoder"}[stack]
    if rest == "logits":
        return f"decoder.{m.cfg.n_decoder_layers - 1}.hook_resid_post", None
    if rest.endswith(".mlp"):
        return f"{blocks}.{rest[1:-4]}.hook_mlp_in", None
    head, comp = rest.split(".")
    layer, h = (int(x) for x in head[1:].split("H"))
    if comp.startswith("x"):
        return f"decoder.{layer}.hook_cross_{comp[1]}_input", h
    return f"{blocks}.{layer}.hook_{comp}_input", h


def _senders(m):
    names = ["enc.embed", "enc.pos_embed", "dec.embed", "dec.pos_embed"]
    for stack, L in (("enc", m.cfg.n_encoder_layers), ("dec", m.cfg.n_decoder_layers)):
        for layer in range(L):
            names += [f"{stack}.L{layer}H{h}" for h in range(m.cfg.n_heads)]
            if stack == "dec":
                names += [f"dec.L{layer}XH{h}" for h in range(m.cfg.n_heads)]
            if not m.cfg.attn_only:
                names.append(f"{stack}.L{layer}.mlp")
    return names


def _hand_loop(m, task, edges):
    """The clean run in which, edge by edge, each receiver reads the removed sender's corrupted output in place of
    its output in this same run (TransformerLens hooks, one edge at a time)."""
    senders = _senders(m)

    def recorders(store):
        hooks = []
        for s in senders:
            hook, h = _sender_hook(s, None)
            hooks.append((hook, lambda x, hook, s=s, h=h: store.__setitem__(
                s, (x if h is None else x[:, :, h]).clone())))
        return hooks

    ablated, now = {}, {}
    with split_inputs(m):
        m.run_with_hooks(task.corrupt, task.target, fwd_hooks=recorders(ablated))
    hooks = recorders(now)
    for s, r in edges:
        hook, h = _receiver_hook(r, m)

        def patch(x, hook, s=s, h=h):
            x = x.clone()
            if h is None:
                x += ablated[s] - now[s]
            else:
                x[:, :, h] += ablated[s] - now[s]
            return x
        hooks.append((hook, patch))
    with split_inputs(m):
        return m.run_with_hooks(task.clean, task.target, fwd_hooks=hooks)


EDGE_SETS = {
    "enc-dec-reverse": [[("enc.embed", "dec.L0H1.xk")], [("enc.L0H1", "dec.L0H0.xv")], [("dec.L0H0", "dec.L0H1.xq")],
                        [("dec.L0XH1", "dec.logits")],
                        [("enc.embed", "enc.L0H0.k"), ("enc.pos_embed", "dec.L0H0.xk"), ("enc.L0H0", "dec.L0H0.xk"),
                         ("enc.embed", "dec.L0H1.xv"), ("dec.pos_embed", "dec.L0H1.q"), ("dec.L0XH0", "dec.logits")]],
    "enc-dec-sort": [[("enc.L1.mlp", "dec.L1H0.xk")], [("enc.L0H1", "enc.L1.mlp")], [("dec.L0XH0", "dec.L1H1.xq")],
                     [("dec.L1.mlp", "dec.logits")],
                     [("enc.embed", "enc.L0.mlp"), ("enc.L0.mlp", "dec.L1H1.xv"), ("enc.L0.mlp", "dec.L0H0.xk"),
                      ("dec.L0.mlp", "dec.L1.mlp"), ("dec.L0XH1", "dec.L1H0.v"), ("dec.L1XH1", "dec.logits")]],
}


def test_batched_edge_sets_and_complements_equal_the_hand_written_hook_loop(setup):
    m, task = setup
    sets = EDGE_SETS[m.cfg.model_name]
    p = EdgePatcher(m, task.clean, task.corrupt, target=task.target)
    masks = torch.stack([p.mask(s) for s in sets])
    got = p.run(torch.cat([masks, ~masks]))  # every set and every complement in one batched pass
    assert p.forwards == 2
    for i, edges in enumerate(sets):
        torch.testing.assert_close(got[i], _hand_loop(m, task, edges), atol=ATOL, rtol=0)
    rest = [e for e in p.graph.edges if e not in set(sets[-1])]
    torch.testing.assert_close(got[2 * len(sets) - 1], _hand_loop(m, task, rest), atol=ATOL, rtol=0)
    torch.testing.assert_close(run_subgraph(m, task.clean, task.corrupt, sets[-1], target=task.target),
                               got[2 * len(sets) - 1], atol=ATOL, rtol=0)
    torch.testing.assert_close(patch_edges(m, task.clean, task.corrupt, sets[0], target=task.target), got[0],
                               atol=ATOL, rtol=0)


def test_removing_every_cross_key_and_value_edge_is_decoding_the_corrupted_memory(setup):
    """No hooks in the reference: with every edge into every xk / xv input removed, the decoder runs on the clean
    target over the corrupted source's memory, `decode(target, encode(corrupt))`; with none removed it is the clean
    run, with all removed the corrupted one."""
    m, task = setup
    p = EdgePatcher(m, task.clean, task.corrupt, target=task.target)
    cross = torch.tensor([r.endswith((".xk", ".xv")) for _, r in p.graph.edges])
    out = p.run(torch.stack([cross, torch.zeros_like(cross), torch.ones_like(cross)]))
    torch.testing.assert_close(out[0], m.decode(task.target, m.encode(task.corrupt)), atol=ATOL, rtol=0)
    torch.testing.assert_close(out[1], m(task.clean, task.target), atol=ATOL, rtol=0)
    torch.testing.assert_close(out[2], m(task.corrupt, task.target), atol=ATOL, rtol=0)
    keys_only = torch.tensor([r.endswith(".xk") for _, r in p.graph.edges])
    assert not torch.allclose(p.run(keys_only)[0], out[0])  # the values alone carry something apart from the keys


def test_a_cross_key_input_with_every_edge_removed_reads_the_corrupted_input(setup):
    m, task = setup
    p = EdgePatcher(m, task.clean, task.corrupt, target=task.target)
    L = m.cfg.n_decoder_layers - 1
    with split_inputs(m):
        _, cx = m.run_with_cache(task.corrupt, task.target, names_filter=f"decoder.{L}.hook_cross_k_input")

        def put(x, hook):
            x = x.clone()
            x[:, :, 1] = cx[hook.name][:, :, 1]
            return x
        ref = m.run_with_hooks(task.clean, task.target, fwd_hooks=[(f"decoder.{L}.hook_cross_k_input", put)])
    got = p.run(p.mask([e for e in p.graph.edges if e[1] == f"dec.L{L}H1.xk"]))[0]
    torch.testing.assert_close(got, ref, atol=ATOL, rtol=0)


def test_eap_is_exact_where_the_metric_is_linear_in_the_receiver():
    """enc-dec-reverse has no norms: the logits are linear in the final residual stream, and a cross-attention
    head's output is linear in its values with the pattern fixed. With the logit difference (linear in the logits)
    EAP's first-order score of every edge into the logits and into a cross-attention value input is the exact
    effect of removing it (`single_edge_effects`); elsewhere (keys, queries, encoder inputs) it is not."""
    m = models.load("enc-dec-reverse").to(torch.float64).eval()
    t = discovery_task(m, "reversal", n_prompts=6)
    wrong = 3 + (t.answers.correct - 3 + 1) % (m.cfg.d_vocab_tgt - 3)  # another symbol at every position
    task = DiscoveryTask("reversal", t.clean, t.corrupt, Answers(t.answers.positions, t.answers.correct, wrong),
                         "logit_diff", t.target)
    p = EdgePatcher(m, task.clean, task.corrupt, target=task.target)
    eap, exact = edge_scores(p, task), single_edge_effects(p, task)
    linear = torch.tensor([r == "dec.logits" or r.endswith(".xv") for _, r in p.graph.edges])
    assert exact[linear].abs().max() > 1.0  # the comparison is not between zeros
    torch.testing.assert_close(eap[linear], exact[linear], atol=1e-6, rtol=1e-9)
    assert not torch.allclose(eap[~linear], exact[~linear], atol=1e-3)


def test_position_edges_carry_nothing_when_the_corruption_keeps_the_positions(reverse):
    """The positions are the same in the clean and the corrupted runs, so an edge from `enc.pos_embed` or
    `dec.pos_embed` changes nothing: the reversal heads' alignment (their keys read the source positions) is not
    what this task's corruption moves, and exact patching and every method give those edges zero."""
    task = discovery_task(reverse, "reversal", n_prompts=6)
    p = EdgePatcher(reverse, task.clean, task.corrupt, target=task.target)
    pos = [i for i, (s, _) in enumerate(p.graph.edges) if s.endswith("pos_embed")]
    assert pos
    assert single_edge_effects(p, task)[pos].abs().max() == 0
    assert edge_scores(p, task)[pos].abs().max() == 0


REVERSAL_CIRCUIT = [("enc.embed", "dec.L0H0.xv"), ("enc.embed", "dec.L0H1.xv"), ("dec.L0XH0", "dec.logits"),
                    ("dec.L0XH1", "dec.logits")]


@pytest.mark.parametrize("method", ["eap", "eap-ig", "acdc"])
def test_each_method_finds_the_reversal_heads_copying_path(reverse, method):
    """The card's circuit: both cross-attention heads align target position t with source position n−1−t and copy
    (copying scores 0.995, 1.000): the source symbols enter through their value inputs from the encoder's token
    embedding, and their outputs reach the logits. The circuit contains these four edges, recovers the behaviour,
    and the graph without it loses it."""
    r = discover(reverse, discovery_task(reverse, "reversal"), method)
    assert set(REVERSAL_CIRCUIT) <= set(r.circuit)
    assert r.faithfulness > 0.9
    assert abs(r.complement) < 0.05
    assert set(r.ranked()[:4]) == set(REVERSAL_CIRCUIT) or method == "acdc"


def test_eap_ig_finds_the_sorting_models_second_layer_cross_attention():
    """enc-dec-sort's card: content-based cross-attention, the layer-1 heads aligned (0.830, 0.808) with copying OV
    circuits. Both layer-1 cross-attention heads reach the logits in the circuit, each reads its keys and values
    from the encoder, and the graph without the circuit loses the behaviour."""
    m = models.load("enc-dec-sort").eval()
    r = discover(m, discovery_task(m, "sorting"), "eap-ig")
    c = set(r.circuit)
    for h in range(2):
        assert (f"dec.L1XH{h}", "dec.logits") in c
        assert any(s.startswith("enc.") and rr == f"dec.L1H{h}.xv" for s, rr in c)
        assert any(s.startswith("enc.") and rr == f"dec.L1H{h}.xk" for s, rr in c)
    assert r.faithfulness > 0.85 and abs(r.complement) < 0.05


def test_bad_input_is_refused(reverse):
    with pytest.raises(PatchingError, match="decoder-only"):
        discovery_task(reverse, "induction")
    with pytest.raises(PatchingError, match="encoder–decoder"):
        discovery_task(models.load("attn-only-1l"), "reversal")
    with pytest.raises(PatchingError, match="seq2seq:sort"):
        discovery_task(models.load("enc-dec-sort"), "reversal")
    task = discovery_task(reverse, "reversal", n_prompts=2)
    with pytest.raises(PatchingError, match="same shape"):
        EdgePatcher(reverse, task.clean, task.corrupt[:, :5], target=task.target)
    with pytest.raises(PatchingError, match="rows"):
        EdgePatcher(reverse, task.clean, task.corrupt, target=task.target[:1])
    from analyses.discovery import user_task
    with pytest.raises(PatchingError, match="decoder-only"):
        user_task(reverse, [[3, 4]], [[4, 3]], 3)

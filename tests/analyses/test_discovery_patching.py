"""Edge patching against hand-written TransformerLens hook loops (one edge, several edges, a whole receiver), on the
zoo's attn-only-2l (Shortformer, no norm) and gelu-2l (MLPs, LayerNorm, positions in the residual stream)."""

from __future__ import annotations

import pytest
import torch

import models
from analyses.discovery.patching import EdgePatcher, patch_edges, run_subgraph, split_inputs
from analyses.patching import PatchingError
from analyses.sequences import random_tokens

ATOL = 1e-6


@pytest.fixture(scope="module", params=["attn-only-2l", "gelu-2l"])
def setup(request):
    m = models.load(request.param).to(torch.float64).eval()
    clean = random_tokens(m, 12, 3, seed=0)
    corrupt = random_tokens(m, 12, 3, seed=1)
    return m, clean, corrupt


def _outputs(m, tokens):
    """Every sender's output by name from a plain cached run."""
    with split_inputs(m):
        _, cache = m.run_with_cache(tokens)
    out = {"embed": cache["hook_embed"]}
    if m.cfg.positions.adds_to == "residual":
        out["pos_embed"] = cache["hook_pos_embed"]
    for l in range(m.cfg.n_layers):
        for h in range(m.cfg.n_heads):
            out[f"L{l}H{h}"] = cache[f"blocks.{l}.attn.hook_result"][:, :, h]
        if not m.cfg.attn_only:
            out[f"L{l}.mlp"] = cache[f"blocks.{l}.hook_mlp_out"]
    return out


def _hand_loop(m, clean, corrupt, edges):
    """The clean run in which each receiver of `edges` reads each of its removed senders' corrupted output in place
    of the sender's output in this same run, written edge by edge with TransformerLens hooks."""
    ablated = _outputs(m, corrupt)
    now = {}
    L = m.cfg.n_layers

    def record(name):
        def hook(x, hook):
            now[name] = x.clone()
        return hook

    def record_heads(l):
        def hook(x, hook):
            for h in range(x.shape[2]):
                now[f"L{l}H{h}"] = x[:, :, h].clone()
        return hook

    def receiver(targets):  # targets: [(sender, head or None)]
        def hook(x, hook):
            x = x.clone()
            for s, h in targets:
                if h is None:
                    x += ablated[s] - now[s]
                else:
                    x[:, :, h] += ablated[s] - now[s]
            return x
        return hook

    hooks = [("hook_embed", record("embed")), ("hook_pos_embed", record("pos_embed"))]
    for l in range(L):
        hooks.append((f"blocks.{l}.attn.hook_result", record_heads(l)))
        if not m.cfg.attn_only:
            hooks.append((f"blocks.{l}.hook_mlp_out", record(f"L{l}.mlp")))
    by_hook = {}
    for s, r in edges:
        if r == "logits":
            by_hook.setdefault(f"blocks.{L - 1}.hook_resid_post", []).append((s, None))
        elif r.endswith(".mlp"):
            by_hook.setdefault(f"blocks.{r[1:r.index('.')]}.hook_mlp_in", []).append((s, None))
        else:
            head, comp = r.split(".")
            l, h = (int(x) for x in head[1:].split("H"))
            by_hook.setdefault(f"blocks.{l}.hook_{comp}_input", []).append((s, h))
    hooks += [(name, receiver(t)) for name, t in by_hook.items()]
    with split_inputs(m):
        return m.run_with_hooks(clean, fwd_hooks=hooks)


EDGE_SETS = {
    "attn-only-2l": [[("L0H1", "L1H1.k")], [("embed", "L1H2.v")], [("L1H1", "logits")],
                     [("embed", "L0H1.v"), ("L0H1", "L1H1.k"), ("L0H1", "L1H2.k"), ("embed", "L1H1.k"),
                      ("L0H3", "L1H1.k"), ("L1H2", "logits")]],
    "gelu-2l": [[("L0.mlp", "L1H2.v")], [("L0H0", "L0.mlp")], [("pos_embed", "L0H3.q")], [("L1.mlp", "logits")],
                [("embed", "L0H1.v"), ("L0H1", "L0.mlp"), ("L0.mlp", "L1H0.k"), ("pos_embed", "L1H0.k"),
                 ("L1H0", "L1.mlp"), ("L0H1", "logits"), ("L1.mlp", "logits")]],
}


def test_batched_edge_sets_equal_the_hand_written_hook_loop(setup):
    m, clean, corrupt = setup
    sets = EDGE_SETS[m.cfg.model_name]
    p = EdgePatcher(m, clean, corrupt)
    got = p.run(torch.stack([p.mask(s) for s in sets]))  # every set in one batched pass
    for i, edges in enumerate(sets):
        torch.testing.assert_close(got[i], _hand_loop(m, clean, corrupt, edges), atol=ATOL, rtol=0)
    assert p.forwards == 2  # the corrupted run's outputs, then one pass for all sets
    torch.testing.assert_close(patch_edges(m, clean, corrupt, sets[0]), got[0], atol=ATOL, rtol=0)


def test_no_edge_removed_is_the_clean_run_and_every_edge_the_corrupted_run(setup):
    m, clean, corrupt = setup
    p = EdgePatcher(m, clean, corrupt)
    both = p.run(torch.tensor([[False] * len(p.graph), [True] * len(p.graph)]))
    torch.testing.assert_close(both[0], m(clean), atol=ATOL, rtol=0)
    torch.testing.assert_close(both[1], m(corrupt), atol=ATOL, rtol=0)
    torch.testing.assert_close(run_subgraph(m, clean, corrupt, []), m(corrupt), atol=ATOL, rtol=0)


def test_a_receiver_with_every_edge_removed_reads_the_corrupted_input(setup):
    """Removing every edge into L1H1.k (or L1.mlp) gives that input its value in the corrupted run: an independent
    reference, the corrupted run's own hook_k_input / hook_mlp_in, patched in with a plain hook."""
    m, clean, corrupt = setup
    p = EdgePatcher(m, clean, corrupt)
    for receiver, hook, head in [("L1H1.k", "blocks.1.hook_k_input", 1), ("L1.mlp", "blocks.1.hook_mlp_in", None)]:
        if receiver not in [r.name for r in p.graph.receivers]:
            continue
        with split_inputs(m):
            _, cx = m.run_with_cache(corrupt)

            def put(x, hook, head=head, name=hook, cx=cx):
                x = x.clone()
                if head is None:
                    return cx[name]
                x[:, :, head] = cx[name][:, :, head]
                return x
            ref = m.run_with_hooks(clean, fwd_hooks=[(hook, put)])
        got = p.run(p.mask([e for e in p.graph.edges if e[1] == receiver]))[0]
        torch.testing.assert_close(got, ref, atol=ATOL, rtol=0)


def test_mean_ablation_replaces_a_sender_by_its_mean_over_prompts(setup):
    m, clean, corrupt = setup
    p = EdgePatcher(m, clean, corrupt, ablation="mean")
    mean = _outputs(m, clean)["L0H1"].mean(0)
    got = p.run(p.mask([("L0H1", "logits")]))[0]

    def hook(x, hook):
        return x - x.new_zeros(()) + (mean - now["L0H1"])
    now = {}
    with split_inputs(m):
        ref = m.run_with_hooks(clean, fwd_hooks=[
            ("blocks.0.attn.hook_result", lambda x, hook: now.__setitem__("L0H1", x[:, :, 1].clone())),
            (f"blocks.{m.cfg.n_layers - 1}.hook_resid_post", hook)])
    torch.testing.assert_close(got, ref, atol=ATOL, rtol=0)


def test_switches_are_restored_and_bad_input_refused():
    m = models.load("attn-only-2l").eval()
    clean = random_tokens(m, 5, 2, seed=0)
    before = (m.cfg.use_split_qkv_input, m.cfg.use_attn_result)
    p = EdgePatcher(m, clean, random_tokens(m, 5, 2, seed=1))
    assert (m.cfg.use_split_qkv_input, m.cfg.use_attn_result) == before
    with pytest.raises(PatchingError, match="bool"):
        p.run(torch.zeros(1, 3, dtype=torch.bool))
    with pytest.raises(PatchingError, match="ablation"):
        EdgePatcher(m, clean, clean, ablation="zero")
    with pytest.raises(PatchingError, match="same number of tokens"):
        EdgePatcher(m, clean, clean[:, :3])
    with pytest.raises(ValueError, match="no edge"):
        p.mask([("L1H1", "L0H1.k")])
    from models.arch.encoder import EncoderConfig, HookedEncoder

    encoder = HookedEncoder(EncoderConfig(n_layers=1, d_model=8, n_ctx=8, d_head=4, d_vocab=10, attn_only=True))
    with pytest.raises(PatchingError, match="decoder-only and encoder–decoder"):
        EdgePatcher(encoder, clean % 10, clean % 10)
    with pytest.raises(PatchingError, match="decoder input"):
        EdgePatcher(models.load("enc-dec-reverse"), clean, clean)

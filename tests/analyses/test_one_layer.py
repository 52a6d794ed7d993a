"""One-layer study on hand-built weights with known skip-trigrams, copying heads and positional heads."""

import math

import pytest
import torch

from analyses.one_layer import copying_heads_table, head_ablation_losses, positional_vs_content
from analyses.sequences import token_pool
from analyses.trigrams import skip_trigram_bugs, skip_trigrams
from analyses.zero_layer import bigram_table
from models import HookedTransformer, HookedTransformerConfig

V = 20


def one_layer(n_heads=2, d_model=V, d_head=V, n_ctx=64, pos="shortformer", seed=0):
    cfg = HookedTransformerConfig(n_layers=1, d_model=d_model, n_ctx=n_ctx, d_vocab=V, n_heads=n_heads,
                                  d_head=d_head, normalization_type=None, positional_embedding_type=pos,
                                  use_bias=False, seed=seed)
    return HookedTransformer(cfg)


def trigram_model():
    """Head 0: QK[d, s] = M, OV = P: [3]…[5]→7 (and 11), [3]…[8]→7 (and 11), [2]…[9]→12. One-hot E and U."""
    m = one_layer(n_heads=1)
    M = torch.zeros(V, V)
    M[5, 3], M[8, 3], M[9, 2] = 10.0, 6.0, 4.0
    P = torch.zeros(V, V)
    P[3, 7], P[3, 11], P[2, 12] = 5.0, 4.0, 3.0
    with torch.no_grad():
        m.embed.W_E.copy_(torch.eye(V))
        m.unembed.W_U.copy_(torch.eye(V))
        m.pos_embed.W_pos.zero_()
        a = m.blocks[0].attn
        a.W_Q[0].copy_(M * math.sqrt(V))
        a.W_K[0].copy_(torch.eye(V))
        a.W_V[0].copy_(P)
        a.W_O[0].copy_(torch.eye(V))
    return m


def test_skip_trigrams_recovers_the_built_triples():
    table = skip_trigrams(trigram_model(), 0, 0, k=5, block=7)
    top = [r.ids for r in table.rows[:3]]
    assert top == [(3, 5, 7), (3, 8, 7), (2, 9, 12)]
    assert table.rows[0].outs[0][0] == "#7" and table.rows[0].outs[1][0] == "#11"
    assert table.rows[0].strength > table.rows[1].strength > table.rows[2].strength > 0
    assert r"\[#3\] … \[#5\] → \[#7\]" in table.markdown()  # token text escaped for Markdown (renders as [#3] …)
    assert "Skip-trigrams of L0H0" in str(table)


def test_skip_trigram_bugs_cross_destinations_and_outs():
    table = skip_trigrams(trigram_model(), 0, 0, k=3)
    bugs = skip_trigram_bugs(table)
    shared = [b for b in bugs if b.kind == "shared source"]
    assert len(shared) == 1 and shared[0].source == "#3"
    assert set(shared[0].destination) == {"#5", "#8"} and shared[0].outs[:2] == ["#7", "#11"]
    assert "[#3] … [#5] → [#11]" in shared[0].crossed
    # against a corpus where 5→7 and 8→11 occur but 5→11 and 8→7 never do
    corpus = torch.tensor([5, 7, 1, 8, 11, 1, 5, 7, 8, 11])
    bugs = skip_trigram_bugs(table, bigrams=bigram_table(corpus, V))
    unseen = [b for b in bugs if b.kind == "shared source"][0].unseen_in_corpus
    assert "[#3] … [#5] → [#11]" in unseen and "[#3] … [#8] → [#7]" in unseen
    assert "[#3] … [#5] → [#7]" not in unseen


def test_copying_heads_table_identity_vs_negative():
    m = one_layer(n_heads=3, seed=1)
    with torch.no_grad():
        m.embed.W_E.copy_(torch.eye(V))
        m.unembed.W_U.copy_(torch.eye(V))
        a = m.blocks[0].attn
        for h, sign in enumerate((1.0, -1.0)):
            a.W_V[h].copy_(torch.eye(V))
            a.W_O[h].copy_(sign * torch.eye(V))
        # head 2: 0.1 I + u uᵀ, positive definite (Σλ/Σ|λ| = 1), but every row i ≠ 1 raises token 1 most
        u = torch.ones(V)
        u[1] = 5.0
        a.W_V[2].copy_(torch.eye(V))
        a.W_O[2].copy_(0.1 * torch.eye(V) + torch.outer(u, u))
    t = copying_heads_table(m, behavioural=False)
    assert t.copying_score[0, 0] == pytest.approx(1.0) and t.copying_score[0, 1] == pytest.approx(-1.0)
    assert t.top1[0, 0] == 1.0 and t.top5[0, 1] == 0.0
    assert t.positive_fraction[0, 0] == 1.0 and t.positive_fraction[0, 1] == 0.0
    assert t.copying_score[0, 2] == pytest.approx(1.0, abs=1e-5)
    assert float(t.top1[0, 2]) == pytest.approx(1 / token_pool(m).numel())  # only row 1 (the pool: all but BOS)
    assert t.heads == [(0, 0)] and t.ov_positive == [(0, 2)]
    assert [t.verdict(0, h) for h in range(3)] == ["copying", "", "OV-positive"]
    assert "OV-positive" in t.markdown() and "1 of 3 heads copy" in str(t)


def positional_model(n_ctx=32):
    """Head 0 attends to the previous position (position dims only); head 1 to earlier copies of its token."""
    d = V + n_ctx
    m = one_layer(n_heads=2, d_model=d, d_head=n_ctx, n_ctx=n_ctx, pos="shortformer", seed=2)
    c = 30.0 * math.sqrt(n_ctx)
    with torch.no_grad():
        m.embed.W_E.zero_()
        m.embed.W_E[:, :V].copy_(torch.eye(V))
        m.pos_embed.W_pos.zero_()
        m.pos_embed.W_pos[:, V:].copy_(torch.eye(n_ctx))
        a = m.blocks[0].attn
        a.W_Q.zero_()
        a.W_K.zero_()
        for i in range(1, n_ctx):
            a.W_Q[0, V + i, i] = c  # query at position i ...
            a.W_K[0, V + i - 1, i] = 1.0  # ... matches the key at position i-1
        a.W_Q[1, :V, :V] = torch.eye(V) * c / 3
        a.W_K[1, :V, :V] = torch.eye(V)
    return m


def test_positional_vs_content_separates_the_heads():
    res = positional_vs_content(positional_model(), seq_len=32, batch=4)
    assert res.content_independence[0, 0] > 0.99 and res.previous[0, 0] > 0.99
    assert res.content_independence[0, 1] < 0.8
    assert res.labels[0] == ["positional: previous token", "content"]
    assert res.positional_r2[0, 0] > 0.99 and res.positional_r2[0, 1] < 0.2
    assert "content independence" in res.markdown()


def test_head_ablation_matches_removing_the_head_term():
    m = one_layer(n_heads=3, d_model=16, d_head=8, seed=3)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.5)
    tokens = torch.randint(1, V, (3, 24), generator=torch.Generator().manual_seed(0))
    res = head_ablation_losses(m, tokens)
    m.set_use_attn_result(True)  # per-head outputs in the cache
    with torch.no_grad():
        logits, cache = m.run_with_cache(tokens)
        clean = float(m(tokens, return_type="loss"))
    for h in range(3):
        ablated = logits - cache["blocks.0.attn.hook_result"][:, :, h] @ m.W_U.detach()
        lp = ablated[:, :-1].log_softmax(-1).gather(-1, tokens[:, 1:, None])
        expect = -lp.mean() - clean
        assert res.delta[0, h].item() == pytest.approx(float(expect), abs=1e-5)
    assert res.clean_loss == pytest.approx(clean, abs=1e-6)


def test_head_ablation_freezes_patterns_in_two_layers():
    cfg = HookedTransformerConfig(n_layers=2, d_model=16, n_ctx=32, d_vocab=V, n_heads=2, normalization_type="LN",
                                  seed=4)
    m = HookedTransformer(cfg)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    tokens = torch.randint(1, V, (2, 20), generator=torch.Generator().manual_seed(1))
    res = head_ablation_losses(m, tokens)
    # an unfrozen ablation (patterns free to change) differs for layer-0 heads
    def zero(z, hook):
        z = z.clone()
        z[:, :, 0] = 0
        return z

    with torch.no_grad():
        free = float(m.run_with_hooks(tokens, return_type="loss", fwd_hooks=[("blocks.0.attn.hook_z", zero)]))
    assert abs((free - res.clean_loss) - float(res.delta[0, 0])) > 1e-4
    assert res.delta.shape == (2, 2)


def test_joint_ablation_per_position_matches_the_head_term():
    """`ablated_position_losses` zeroes several heads together (patterns frozen): in one layer that is exactly
    removing their head terms from the logits, per position; chunking changes nothing; one head agrees with
    `head_ablation_losses`."""
    from analyses.one_layer import ablated_position_losses

    m = one_layer(n_heads=3, d_model=16, d_head=8, seed=3)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.5)
    tokens = torch.randint(1, V, (5, 24), generator=torch.Generator().manual_seed(0))
    clean, ablated = ablated_position_losses(m, tokens, [(0, 0), (0, 2)], chunk=2)
    m.set_use_attn_result(True)  # per-head outputs in the cache
    with torch.no_grad():
        logits, cache = m.run_with_cache(tokens)
        removed = logits - (cache["blocks.0.attn.hook_result"][:, :, 0] + cache["blocks.0.attn.hook_result"][:, :, 2]
                            ) @ m.W_U.detach()
    for full, expect in ((logits, clean), (removed, ablated)):
        lp = full[:, :-1].log_softmax(-1).gather(-1, tokens[:, 1:, None])[..., 0]
        assert expect.shape == (5, 23) and torch.allclose(expect, -lp.double(), atol=1e-5)
    one = ablated_position_losses(m, tokens, [(0, 1)])[1]
    assert float(one.mean() - clean.mean()) == pytest.approx(float(head_ablation_losses(m, tokens).delta[0, 1]),
                                                             abs=1e-5)
    m.set_use_attn_result(False)  # as when `clean` was computed (with it, the hooked path sums per-head results)
    assert torch.equal(ablated_position_losses(m, tokens, [])[1], clean)


@pytest.mark.parametrize("positional", ["standard", "shortformer", "rotary"])
def test_head_ablation_equals_whole_runs_bitwise(positional):
    """An ablation of a layer-l head starts at block l from the clean run's cached input (`analyses.resume`); the
    losses are bitwise those of whole runs, written out here: every pattern frozen to the clean one, the head's
    `hook_z` zeroed."""
    from circuits.testing import random_model

    m = random_model(n_layers=3, n_heads=2, positional=positional, normalization="LN", attn_only=False,
                     dtype="float32").eval()
    tokens = torch.randint(1, m.cfg.d_vocab, (4, 11), generator=torch.Generator().manual_seed(5))
    res = head_ablation_losses(m, tokens)
    with torch.no_grad():
        clean, cache = m.run_with_cache(tokens, return_type="loss", loss_per_token=True)
        for l in range(3):
            for h in range(2):
                def zero(z, hook, h=h):
                    z = z.clone()
                    z[:, :, h] = 0
                    return z

                hooks = [(f"blocks.{i}.attn.hook_pattern", lambda p, hook: cache[hook.name]) for i in range(3)]
                loss = m.run_with_hooks(tokens, return_type="loss", loss_per_token=True,
                                        fwd_hooks=hooks + [(f"blocks.{l}.attn.hook_z", zero)])
                per = loss.double().mean(-1) - clean.double().mean(-1)
                assert torch.equal(res.delta[l, h], per.mean().float()), (l, h)

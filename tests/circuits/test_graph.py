"""The edge graph against counts derived by hand from the architecture, and its ordering property."""

from __future__ import annotations

import pytest

import models
from circuits.graph import GraphError, edge_graph


def _decoder_count(L, H, mlp, pos_where):
    """Edges of a decoder-only model, counted receiver by receiver: a layer-l head input reads the embedding, the
    positions (per `pos_where`), the 3·0 + H heads and MLPs of every earlier layer; an MLP also reads its own
    layer's heads; the logits read everything but query/key-only positions."""
    n = 0
    for layer in range(L):
        earlier = layer * (H + mlp)
        for c in "qkv":
            pos = pos_where == "residual" or (pos_where == "query_key" and c in "qk")
            n += H * (1 + pos + earlier)
        if mlp:
            n += 1 + (pos_where == "residual") + earlier + H
    n += 1 + (pos_where == "residual") + L * (H + mlp)
    return n


@pytest.mark.parametrize("name, L, H, mlp, pos", [("attn-only-1l", 1, 8, 0, "query_key"),
                                                  ("attn-only-2l", 2, 4, 0, "query_key"),
                                                  ("gelu-2l", 2, 4, 1, "residual")])
def test_zoo_decoder_sizes_match_the_hand_count(name, L, H, mlp, pos):
    g = edge_graph(models.load(name))
    assert len(g) == _decoder_count(L, H, mlp, pos)
    assert len(g.senders) == 1 + (pos is not None) + L * (H + mlp)
    assert len(g.receivers) == L * (3 * H + mlp) + 1


def test_attn_only_2l_edges_of_the_induction_circuit_exist_and_order_holds():
    g = edge_graph(models.load("attn-only-2l"))
    for e in [("pos_embed", "L0H1.k"), ("embed", "L0H1.v"), ("L0H1", "L1H1.k"), ("embed", "L1H2.v"),
              ("L1H1", "logits"), ("L0H3", "logits")]:
        g.index(e)
    for e in [("pos_embed", "L0H1.v"), ("pos_embed", "logits"), ("L1H1", "L1H2.k"), ("L1H1", "L0H0.q")]:
        with pytest.raises(GraphError):
            g.index(e)
    assert len(set(g.edges)) == len(g.edges)
    for s, r in g.edges:
        assert g.sender(s).stage < g.receiver(r).stage


def test_encoder_decoder_cross_attention_reads_the_encoder():
    m = models.load("enc-dec-sort")
    g = edge_graph(m)
    E, D, H = m.cfg.n_encoder_layers, m.cfg.n_decoder_layers, m.cfg.n_heads
    enc_senders = [s.name for s in g.senders if s.stack == "enc"]
    assert len(enc_senders) == 2 + E * (H + 1)
    for layer in range(D):
        for h in range(H):
            for c in ("xk", "xv"):
                assert sorted(s for s, r in g.edges if r == f"dec.L{layer}H{h}.{c}") == sorted(enc_senders)
            assert all(s.startswith("dec.") for s, r in g.edges if r == f"dec.L{layer}H{h}.xq")
            assert (f"dec.L{layer}H{h}", f"dec.L{layer}H{h}.xq") in g.edges  # self-attention feeds cross-queries
    assert not any(r.startswith("enc.") and s.startswith("dec.") for s, r in g.edges)
    assert not any(r == "enc.logits" for _, r in g.edges)

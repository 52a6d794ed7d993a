"""Zero-layer study: sparse bigram tables and the direct path's fit, against dense brute force."""

import matplotlib
import pytest
import torch

from analyses.zero_layer import bigram_table, direct_path_fit, direct_path_logits, plot_bigrams, zero_layer_study
from models import HookedTransformer, HookedTransformerConfig
from models.data.tokenizer import ByteTokenizer

matplotlib.use("Agg")



def markov_tokens(V=12, n=3000, seed=0):
    g = torch.Generator().manual_seed(seed)
    P = torch.rand(V, V, generator=g) ** 4
    P = P / P.sum(-1, keepdim=True)
    t = [0]
    for _ in range(n - 1):
        t.append(int(torch.multinomial(P[t[-1]], 1, generator=g)))
    return torch.tensor(t)


def zero_model(V=12, d_model=None, norm=None, pos="none", seed=0):
    cfg = HookedTransformerConfig(n_layers=0, d_model=d_model or V, n_ctx=4096, d_vocab=V, n_heads=1,
                                  normalization_type=norm, positional_embedding_type=pos, seed=seed)
    return HookedTransformer(cfg)


def dense_counts(tokens, V):
    C = torch.zeros(V, V, dtype=torch.float64)
    for a, b in zip(tokens[:-1].tolist(), tokens[1:].tolist()):
        C[a, b] += 1
    return C


@pytest.mark.parametrize("route", ["dense", "sorted"])
def test_bigram_table_matches_dense_counts_and_entropy(route, monkeypatch):
    import analyses.zero_layer as Z

    if route == "sorted":  # the chunked sort that vocabularies above DENSE_BIGRAMS pair keys take
        monkeypatch.setattr(Z, "DENSE_BIGRAMS", 0)
    V = 12
    tokens = markov_tokens(V)
    table = bigram_table(tokens.numpy(), V, chunk=257)  # small chunks: pairs across chunk edges count once
    assert bool((table.src * V + table.dst).diff().gt(0).all())  # sorted by (src, dst), each pair once
    C = dense_counts(tokens, V)
    dense = torch.zeros(V, V, dtype=torch.float64)
    dense[table.src, table.dst] = table.count
    torch.testing.assert_close(dense, C)
    assert table.n_tokens == len(tokens) - 1
    P = C / C.sum(-1, keepdim=True).clamp_min(1)
    H = -(C * torch.where(C > 0, P.log(), torch.zeros_like(P))).sum() / C.sum()
    assert table.entropy() == pytest.approx(float(H))


@pytest.mark.parametrize("norm", [None, "LN"])
def test_weighted_kl_matches_dense_formula(norm):
    V = 12
    tokens = markov_tokens(V, seed=1)
    m = zero_model(V, d_model=8, norm=norm, seed=3)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p))
    fit = direct_path_fit(m, tokens, block=5)
    C = dense_counts(tokens, V)
    p_a = C.sum(-1) / C.sum()
    P = C / C.sum(-1, keepdim=True).clamp_min(1)
    logQ = direct_path_logits(m, torch.arange(V)).log_softmax(-1)
    kl_rows = (P * torch.where(P > 0, P.log() - logQ, torch.zeros_like(P))).sum(-1)
    assert fit.weighted_kl == pytest.approx(float((p_a * kl_rows).sum()), rel=1e-6)
    assert fit.weighted_kl >= 0
    # for a 0-layer model without residual positions the direct path *is* the model
    with torch.no_grad():
        loss = float(m(tokens[None], return_type="loss"))
    assert fit.direct_path_loss == pytest.approx(loss, rel=1e-4)


def test_perfect_bigram_model_has_zero_kl_and_full_agreement():
    V = 12
    tokens = markov_tokens(V, seed=2)
    C = dense_counts(tokens, V)
    P = C / C.sum(-1, keepdim=True).clamp_min(1)
    m = zero_model(V)
    with torch.no_grad():
        m.embed.W_E.copy_(torch.eye(V))
        m.unembed.W_U.copy_((P + 1e-12).log())
    m.tokenizer = None
    fit = direct_path_fit(m, tokens)
    assert fit.weighted_kl == pytest.approx(0.0, abs=1e-6)
    assert fit.argmax_agreement == pytest.approx(1.0)
    assert fit.direct_path_loss == pytest.approx(fit.bigram_entropy, abs=1e-6)
    assert "weighted KL" in str(fit) and len(fit.top_bigrams) > 0


def test_study_and_plot_with_tokenizer(tmp_path):
    m = zero_model(259, d_model=16, norm="LN", pos="standard")
    m.tokenizer = ByteTokenizer()
    tokens = torch.tensor(list(b"the cat sat on the mat and the dog sat on the log " * 20))
    study = zero_layer_study(m, tokens, seq_len=64, n_windows=4)
    assert study.is_zero_layer and study.model_loss is not None
    assert study.fit.top_bigrams[0][0] in ("␣", "t", "e", "a")  # most frequent source first (a space shown as ␣)
    fig = plot_bigrams(m, tokens, n=10)
    fig.savefig(tmp_path / "b.png")
    assert (tmp_path / "b.png").stat().st_size > 1000

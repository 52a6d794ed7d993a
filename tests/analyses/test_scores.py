"""Behavioural head scores on hand-built attention patterns (forced with a hook on hook_pattern) and on
hand-built weights, each with a known answer; agreement with TransformerLens' head detector."""

import types

import pytest
import torch

from analyses import scores as S
from analyses.sequences import bos_token_id, repeated_tokens, special_token_ids, token_pool
from models import HookedTransformer, HookedTransformerConfig
from models.arch.tl_compat import head_detector
from models.data.tokenizer import ByteTokenizer

detect_head = head_detector().detect_head


def make_model(n_layers=1, n_heads=4, d_vocab=64, n_ctx=128, d_model=32, norm=None, pos="standard", seed=0, **kw):
    cfg = HookedTransformerConfig(n_layers=n_layers, d_model=d_model, n_ctx=n_ctx, d_vocab=d_vocab, n_heads=n_heads,
                                  d_mlp=None, normalization_type=norm, positional_embedding_type=pos, seed=seed, **kw)
    return HookedTransformer(cfg)


# --- hand-built patterns [pos, pos] --------------------------------------------------------------------
def prev_pattern(P):
    A = torch.zeros(P, P)
    A[0, 0] = 1
    A[torch.arange(1, P), torch.arange(P - 1)] = 1
    return A


def bos_pattern(P):
    A = torch.zeros(P, P)
    A[:, 0] = 1
    return A


def current_pattern(P):
    return torch.eye(P)


def induction_pattern(P, n):
    """Query q in the second copy attends to q − n + 1; every other query rests on BOS."""
    A = torch.zeros(P, P)
    for q in range(P):
        A[q, q - n + 1 if q >= n + 1 else 0] = 1
    return A


def duplicate_pattern(P, n):
    """Query q past the first copy attends to q − n (the same token one copy earlier); others rest on BOS."""
    A = torch.zeros(P, P)
    for q in range(P):
        A[q, q - n if q >= n + 1 else 0] = 1
    return A


def uniform_pattern(P):
    A = torch.ones(P, P).tril()
    return A / A.sum(-1, keepdim=True)


def forcing(model, builders):
    """Context manager: every layer's pattern becomes `builders[h](P)` for head h."""

    def hook(pattern, hook):
        P = pattern.shape[-1]
        forced = torch.stack([b(P) for b in builders]).to(pattern)
        return forced[None].expand_as(pattern).clone()

    return model.hooks(fwd_hooks=[(lambda name: name.endswith("attn.hook_pattern"), hook)])


# --- oracles: plain loops over the definitions -----------------------------------------------------------
def oracle_mass(pattern, tokens, marked):
    """pattern [batch, q, k]; mean over rows with marked keys of the mass on them."""
    tot, n = 0.0, 0
    for b in range(tokens.shape[0]):
        for q in range(tokens.shape[1]):
            keys = [k for k in range(tokens.shape[1]) if marked(tokens[b], q, k)]
            if keys:
                tot += float(sum(pattern[b, q, k] for k in keys))
                n += 1
    return tot / max(n, 1)


# --- sequences -----------------------------------------------------------------------------------------
def test_repeated_tokens_layout_and_seeding():
    m = make_model(d_vocab=259)
    m.tokenizer = ByteTokenizer()
    t = repeated_tokens(m, 10, 3, batch=5, seed=7)
    assert t.shape == (5, 31)
    assert (t[:, 0] == 256).all() and bos_token_id(m) == 256
    assert torch.equal(t[:, 1:11], t[:, 11:21]) and torch.equal(t[:, 1:11], t[:, 21:31])
    assert not torch.isin(t[:, 1:], torch.tensor(special_token_ids(m))).any()
    assert torch.equal(t, repeated_tokens(m, 10, 3, batch=5, seed=7))
    assert not torch.equal(t, repeated_tokens(m, 10, 3, batch=5, seed=8))
    pool = torch.tensor([3, 5, 7, 256])
    t2 = repeated_tokens(m, 20, 2, batch=3, seed=0, tokens_from=pool)
    assert set(t2[:, 1:].unique().tolist()) <= {3, 5, 7}
    assert token_pool(m, pool).tolist() == [3, 5, 7]
    with pytest.raises(ValueError, match="n_ctx"):
        repeated_tokens(m, 100, 2)


def test_no_tokenizer_uses_zero_as_bos():
    m = make_model()
    assert special_token_ids(m) == [0] and bos_token_id(m) == 0
    t = repeated_tokens(m, 30, 2, batch=4)
    assert (t[:, 0] == 0).all() and (t[:, 1:] != 0).all()


# --- scores on forced patterns ----------------------------------------------------------------------------
BUILDERS = [prev_pattern, bos_pattern, current_pattern, uniform_pattern]


def test_offset_scores_known_answers():
    m = make_model(n_layers=2)
    tokens = torch.randint(1, 64, (3, 20), generator=torch.Generator().manual_seed(0))
    with forcing(m, BUILDERS):
        prev = S.previous_token_scores(m, tokens)
        cur = S.current_token_scores(m, tokens)
        first = S.first_token_scores(m, tokens)
    uni_prev = sum(1 / (q + 1) for q in range(1, 20)) / 19
    torch.testing.assert_close(prev[0], torch.tensor([1.0, 1 / 19, 0.0, uni_prev]))
    torch.testing.assert_close(cur[1], torch.tensor([0.0, 0.0, 1.0, uni_prev]))
    torch.testing.assert_close(first[0], torch.tensor([1 / 19, 1.0, 0.0, uni_prev]))
    assert prev.shape == (2, 4)


def test_induction_score_counts_the_second_copy_and_arena_the_whole_stripe():
    n = 20
    m = make_model(n_layers=2)
    ind = lambda P: induction_pattern(P, n)
    with forcing(m, [ind, prev_pattern, bos_pattern, uniform_pattern]):
        score = S.induction_scores(m, seq_len=n, batch=3)
        arena = S.arena_induction_scores(m, seq_len=n, batch=3)
    # second copy, queries n+1 .. 2n, each to the key after its first occurrence
    assert score[0, 0].item() == pytest.approx(1.0)
    assert score[0, 1].item() == 0.0 and score[0, 2].item() == 0.0  # previous-token head, BOS head
    uni = sum(1 / (q + 1) for q in range(n + 1, 2 * n + 1)) / n
    assert score[1, 3].item() == pytest.approx(uni, rel=1e-5)
    # ARENA's stripe = queries n-1 .. 2n: the n above, query n-1 -> key 0 (BOS, 1 here), query n -> key 1 (0)
    assert arena[0, 0].item() == pytest.approx((n + 1) / (n + 2))
    assert arena[0, 1].item() == 0.0
    assert arena[0, 2].item() == pytest.approx(1 / (n + 2))  # BOS head: only the query n-1 entry
    uni = sum(1 / (q + 1) for q in range(n - 1, 2 * n + 1)) / (n + 2)
    assert arena[1, 3].item() == pytest.approx(uni, rel=1e-5)


def test_induction_scores_match_a_loop_over_the_documented_positions():
    n, b = 9, 3
    m = make_model(n_layers=2)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.5, generator=torch.Generator().manual_seed(1))
    tokens = repeated_tokens(m, n, 2, batch=b, seed=4)
    pat = S.attention_patterns(m, tokens).double()  # [layer, batch, head, q, k]
    second = torch.zeros(2, m.cfg.n_heads, dtype=torch.float64)
    whole = torch.zeros_like(second)
    for j in range(1, n + 1):  # second-copy query n + j (token R[j-1]); first occurrence at j, next token j + 1
        second += pat[:, :, :, n + j, j + 1].mean(1) / n
    for q in range(n - 1, 2 * n + 1):  # ARENA: every entry of the diagonal offset 1 - n
        whole += pat[:, :, :, q, q - n + 1].mean(1) / (n + 2)
    torch.testing.assert_close(S.induction_scores(m, n, b, 4).double(), second, atol=1e-6, rtol=0)
    torch.testing.assert_close(S.arena_induction_scores(m, n, b, 4).double(), whole, atol=1e-6, rtol=0)


def test_prefix_matching_and_duplicate_match_oracle():
    n, reps = 7, 4
    m = make_model(d_vocab=12)  # small vocab: chance repeats inside R exercise the general mask
    ind = lambda P: induction_pattern(P, n)
    dup = lambda P: duplicate_pattern(P, n)
    tokens = repeated_tokens(m, n, reps, batch=4, seed=3)
    with forcing(m, [ind, dup, uniform_pattern, prev_pattern]):
        pm = S.prefix_matching_scores(m, seq_len=n, n_repeats=reps, batch=4, seed=3)
        dp = S.duplicate_token_scores(m, seq_len=n, n_repeats=reps, batch=4, seed=3)
    P = tokens.shape[1]
    pats = [b(P) for b in (ind, dup, uniform_pattern, prev_pattern)]
    after_match = lambda t, q, k: 1 <= k <= q and t[k - 1] == t[q]
    earlier_same = lambda t, q, k: k < q and t[k] == t[q]
    for h, A in enumerate(pats):
        batch_pat = A[None].expand(4, P, P)
        assert pm[0, h].item() == pytest.approx(oracle_mass(batch_pat, tokens, after_match), abs=1e-6)
        assert dp[0, h].item() == pytest.approx(oracle_mass(batch_pat, tokens, earlier_same), abs=1e-6)
    assert pm[0, 0] > 0.8 and dp[0, 1] > 0.8


# --- behavioural copying score on hand-built weights -------------------------------------------------------
def copy_model(V=24, sign=(1.0, -1.0)):
    """1 layer, one-hot embeddings, W_U = I; head h has OV = sign[h]·I (copy / anti-copy)."""
    m = make_model(n_layers=1, n_heads=2, d_vocab=V, d_model=V, d_head=V, n_ctx=128)
    with torch.no_grad():
        m.embed.W_E.copy_(torch.eye(V))
        m.unembed.W_U.copy_(torch.eye(V))
        m.pos_embed.W_pos.zero_()
        for h, s in enumerate(sign):
            m.blocks[0].attn.W_V[h].copy_(torch.eye(V))
            m.blocks[0].attn.W_O[h].copy_(s * torch.eye(V))
    return m


def test_copying_score_known_answers():
    m = copy_model()
    with forcing(m, [prev_pattern, prev_pattern]):
        sc = S.copying_scores_behavioural(m, seq_len=8, n_repeats=4, batch=2)
    # raises exactly the attended token: ratio 0.5 (the maximum) on 31 of the 32 queries; query 1 attends to
    # BOS, outside the sample: ratio 0
    assert sc[0, 0].item() == pytest.approx(4 * 0.5 * 31 / 32 - 1)
    assert sc[0, 1].item() == pytest.approx(-1.0)  # lowers it; its raise lands on other tokens
    with forcing(m, [uniform_pattern, bos_pattern]):
        sc = S.copying_scores_behavioural(m, seq_len=8, n_repeats=4, batch=2)
    assert sc[0, 1].item() == pytest.approx(-1.0)  # attends only to BOS, which is outside the sample
    assert -1.0 <= sc[0, 0].item() <= 1.0


@pytest.mark.tl4
def test_copying_score_random_model_is_low_and_bridge_agrees():
    from models import to_transformer_lens

    m = make_model(n_layers=2, norm="LN", d_vocab=80, seed=1)
    ours = S.copying_scores_behavioural(m, batch=2)
    assert ours.shape == (2, 4) and (ours < 0).all()
    bridge = S.copying_scores_behavioural(to_transformer_lens(m), batch=2)
    torch.testing.assert_close(ours, bridge, atol=1e-4, rtol=1e-4)


# --- in-context learning score --------------------------------------------------------------------------
class LossStub:
    """Per-token loss = position index, so loss(token t) = t − 1."""

    cfg = types.SimpleNamespace(n_ctx=1000)
    W_E = torch.zeros(1)

    def __call__(self, tokens, return_type=None, loss_per_token=False):
        assert return_type == "loss" and loss_per_token
        return torch.arange(tokens.shape[1] - 1, dtype=torch.float)[None].expand(tokens.shape[0], -1)


def test_icl_score_indexing_and_errors():
    tokens = torch.zeros(3, 600, dtype=torch.long)
    assert S.in_context_learning_score(LossStub(), tokens) == pytest.approx(450.0)
    assert S.in_context_learning_score(LossStub(), tokens, early=1, late=599) == pytest.approx(598.0)
    with pytest.raises(ValueError, match="early"):
        S.in_context_learning_score(LossStub(), tokens[:, :100])


def test_icl_score_matches_manual_loss():
    m = make_model(n_layers=1, norm="LN", seed=2)
    tokens = torch.randint(0, 64, (2, 40), generator=torch.Generator().manual_seed(1))
    logp = m(tokens).log_softmax(-1)
    manual = -(logp[:, 29].gather(-1, tokens[:, 30:31]) - logp[:, 4].gather(-1, tokens[:, 5:6])).mean()
    assert S.in_context_learning_score(m, tokens, early=5, late=30) == pytest.approx(manual.item(), abs=1e-5)


# --- agreement with TransformerLens' head detector, run on our model ----------------------------------------
def tl_view(model):
    """Our model seen by `detect_head`, which reads `cfg.dtype` as a torch dtype (ours stores its name)."""
    cfg = types.SimpleNamespace(**{**model.cfg.to_dict(), "dtype": model.cfg.torch_dtype})
    view = types.SimpleNamespace(cfg=cfg, to_tokens=model.to_tokens, run_with_cache=model.run_with_cache)
    return view


@pytest.mark.parametrize("kind", ["previous_token_head", "duplicate_token_head", "induction_head"])
def test_agrees_with_transformer_lens_head_detector(kind):
    from helpers import randomize

    m = randomize(make_model(n_layers=2, d_vocab=259, norm="LN", seed=4), scale=0.5)
    m.tokenizer = ByteTokenizer()
    text = "the cat sat on the mat. the cat sat on the hat; abc xyz abc xyz"
    tokens = m.to_tokens(text)
    tl = detect_head(tl_view(m), text, kind)
    P = tokens.shape[1]
    t = tokens[0]
    if kind == "previous_token_head":
        ours, rows = S.previous_token_scores(m, tokens), P - 1
    elif kind == "duplicate_token_head":
        ours = S.duplicate_token_scores(m, tokens)
        rows = sum(bool((t[:q] == t[q]).any()) for q in range(P))
    else:
        ours = S.prefix_matching_scores(m, tokens=tokens)
        rows = sum(bool((t[:q] == t[q]).any()) for q in range(P))
    # TL's "mul" score divides the marked mass by the total mass (P rows); ours by the rows that have a mark
    torch.testing.assert_close(ours * rows / P, tl.float(), atol=1e-5, rtol=1e-5)


def test_copying_ratio_is_the_attended_share_of_the_movement():
    """Head 0's OV raises the source and token 5 by 1 each. Over S = {1..8} (∋ 5) the attended token then holds
    a quarter of the movement Σ|d| (ratio 0.25) unless it is 5 itself (ratio 0.5); head 1 (OV = 0) moves nothing."""
    V = 24
    m = copy_model(V, sign=(1.0, 0.0))
    with torch.no_grad():
        m.blocks[0].attn.W_O[0, :, 5] += 1.0
    pool = torch.arange(1, 9)
    tokens = repeated_tokens(m, 8, 4, batch=1, seed=0, tokens_from=pool)
    with forcing(m, [prev_pattern, prev_pattern]):
        sc = S.copying_scores_behavioural(m, seq_len=8, n_repeats=4, batch=1, tokens_from=pool)
    attended = tokens[0, 1:-1]  # queries 2..32 attend to keys 1..31; query 1 attends to BOS (ratio 0)
    ratios = torch.where(attended == 5, 0.5, 0.25)
    assert sc[0, 0].item() == pytest.approx(4 * float(ratios.sum()) / 32 - 1, abs=1e-5)
    assert sc[0, 1].item() == pytest.approx(-1.0)


def test_icl_positions_scale_olsson_50_and_500():
    from analyses.scores import icl_positions

    assert icl_positions(512) == (50, 500)
    assert icl_positions(128) == (12, 125) and icl_positions(256) == (25, 250)
    assert icl_positions(8) == (1, 7)  # never position 0, never past the context


def test_icl_windows_are_evenly_spaced_text_with_bos():
    from helpers import make_model

    model = make_model(1)
    text = torch.arange(5000) % 25 + 3  # ids inside the vocabulary; a shifted window shows in its tokens
    w = S.icl_windows(model, text)
    assert w.shape == (S.ICL_EXAMPLES, model.cfg.n_ctx) and bool((w[:, 0] == bos_token_id(model)).all())
    body = model.cfg.n_ctx - 1
    span = text.numel() - body
    for i in (0, 1, S.ICL_EXAMPLES - 1):  # window i starts at i * (span // n), as analyses.util.windows
        start = i * (span // S.ICL_EXAMPLES) % span
        assert torch.equal(w[i, 1:], text[start : start + body])
    assert S.icl_windows(model, text, seq_len=9).shape == (S.ICL_EXAMPLES, 9)


def test_icl_differences_and_score_share_one_definition():
    from helpers import make_model

    from analyses.scores import in_context_learning_differences, in_context_learning_score, position_losses

    model = make_model(2)
    tokens = torch.randint(0, model.cfg.d_vocab, (20, 16), generator=torch.Generator().manual_seed(1))
    ref = model(tokens, return_type="loss", loss_per_token=True).double()
    d = in_context_learning_differences(model, tokens, 2, 12, chunk=3)
    assert torch.allclose(d, ref[:, 11] - ref[:, 1], atol=1e-5)
    per = position_losses(model, tokens)
    assert torch.equal(in_context_learning_differences(model, tokens, 2, 12, losses=per), per[:, 11] - per[:, 1])
    assert in_context_learning_score(model, tokens, 2, 12) == pytest.approx(float(d.mean()), abs=1e-6)
    with pytest.raises(ValueError, match="early < late"):
        in_context_learning_differences(model, tokens, 5, 16, losses=per)

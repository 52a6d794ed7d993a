"""Generation: greedy equals a hand argmax loop, seeded sampling is reproducible and private, sampling follows
softmax(logits / T), top-k / top-p filtering, beam search scores, and argument checking."""

from __future__ import annotations

import itertools

import pytest
import torch
from helpers import randomize

from models import HookedTransformer, HookedTransformerConfig
from models.data.tokenizer import ByteTokenizer
from models.generation.generate import filter_logits

PROMPT = torch.tensor([[1, 4, 2], [3, 3, 0]])


def make(kind="rotary", d_vocab=7, n_ctx=16, tokenizer=None):
    cfg = HookedTransformerConfig(n_layers=2, d_model=16, n_ctx=n_ctx, d_vocab=d_vocab, n_heads=2, d_mlp=32,
                                  positional_embedding_type=kind, seed=0)
    return randomize(HookedTransformer(cfg, tokenizer=tokenizer), scale=0.5, seed=1)


def hand_greedy(model, tokens, n):
    for _ in range(n):
        learned = model.cfg.positional_embedding_type in ("standard", "shortformer")
        ctx = tokens[:, -model.cfg.n_ctx:] if learned else tokens
        with torch.no_grad():
            nxt = model(ctx)[:, -1].argmax(-1)
        tokens = torch.cat([tokens, nxt[:, None]], 1)
    return tokens


# --- greedy ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["rotary", "standard", "shortformer", "alibi"])
def test_greedy_equals_hand_argmax_loop(kind):
    model = make(kind, n_ctx=6)  # 3 + 8 tokens: learned positions slide the last n_ctx tokens
    out = model.generate(PROMPT, max_new_tokens=8, temperature=0)
    assert out.shape == (2, 11) and torch.equal(out[:, :3], PROMPT)
    assert torch.equal(out, hand_greedy(model, PROMPT, 8))


def test_top_k_1_equals_greedy():
    model = make()
    greedy = model.generate(PROMPT, max_new_tokens=6, temperature=0)
    for seed in (0, 1, 2):
        assert torch.equal(model.generate(PROMPT, max_new_tokens=6, temperature=1.0, top_k=1, seed=seed), greedy)
    assert torch.equal(model.generate(PROMPT, max_new_tokens=6, top_p=1e-6, seed=0), greedy)


def test_zero_new_tokens():
    model = make()
    assert torch.equal(model.generate(PROMPT, max_new_tokens=0), PROMPT)


# --- sampling -------------------------------------------------------------------------------------------
def test_seeded_sampling_is_reproducible_and_leaves_the_global_rng_alone():
    model = make()
    torch.manual_seed(123)
    state = torch.get_rng_state()
    a = model.generate(PROMPT, max_new_tokens=10, seed=7)
    b = model.generate(PROMPT, max_new_tokens=10, seed=7)
    unseeded = model.generate(PROMPT, max_new_tokens=10)
    assert torch.equal(torch.get_rng_state(), state)  # neither seeded nor unseeded generation drew from it
    assert torch.equal(a, b)
    outs = {tuple(model.generate(PROMPT, max_new_tokens=10, seed=s).flatten().tolist()) for s in range(6)}
    assert len(outs) > 1  # different seeds give different samples
    assert unseeded.shape == a.shape


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_samples_follow_softmax_of_scaled_logits(temperature):
    model = make(d_vocab=5)
    prompt = torch.tensor([[2, 0, 1]]).expand(4000, 3)
    out = model.generate(prompt, max_new_tokens=1, temperature=temperature, seed=0)[:, -1]
    with torch.no_grad():
        probs = (model(prompt[:1])[0, -1] / temperature).softmax(-1)
    freq = torch.bincount(out, minlength=5).double() / len(out)
    assert (freq - probs.double()).abs().max() < 0.03  # 4000 draws: std error <= 0.008


def test_sampling_respects_top_k():
    model = make(d_vocab=7)
    prompt = torch.tensor([[2, 0, 1]]).expand(500, 3)
    with torch.no_grad():
        top2 = set(model(prompt[:1])[0, -1].topk(2).indices.tolist())
    out = model.generate(prompt, max_new_tokens=1, top_k=2, seed=0)[:, -1]
    assert set(out.tolist()) == top2


# --- filtering ------------------------------------------------------------------------------------------
def reference_top_p_keep(logits, p):
    """The smallest set of most probable tokens whose total probability reaches p."""
    probs = logits.double().softmax(-1)
    keep = torch.zeros_like(probs, dtype=torch.bool)
    for row in range(probs.shape[0]):
        total = 0.0
        for i in probs[row].argsort(descending=True).tolist():
            keep[row, i] = True
            total += float(probs[row, i])
            if total >= p:
                break
    return keep


def test_top_p_on_known_probabilities():
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    for p, kept in [(0.45, [0]), (0.7, [0, 1]), (0.9, [0, 1, 2]), (0.99, [0, 1, 2, 3]), (1.0, [0, 1, 2, 3])]:
        out = filter_logits(logits, None, p)
        assert torch.isfinite(out[0]).nonzero().flatten().tolist() == kept, p
        assert torch.equal(out[0, kept], logits[0, kept])  # kept logits are unchanged


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("p", [0.1, 0.5, 0.8, 0.95])
def test_top_p_matches_reference(seed, p):
    logits = torch.randn(4, 30, generator=torch.Generator().manual_seed(seed)) * 2
    keep = torch.isfinite(filter_logits(logits, None, p))
    assert torch.equal(keep, reference_top_p_keep(logits, p))


def test_top_k_filter_and_combination():
    logits = torch.tensor([[3.0, 1.0, 2.0, 0.0, -1.0]])
    assert torch.isfinite(filter_logits(logits, 2, None)).nonzero()[:, 1].tolist() == [0, 2]
    assert torch.isfinite(filter_logits(logits, 10, None)).all()
    # top-k first, then top-p over the renormalised survivors
    probs = logits[0, [0, 2, 1]].softmax(-1)
    p = float(probs[0]) + 1e-3  # needs the two best of the three survivors
    assert torch.isfinite(filter_logits(logits, 3, p)).nonzero()[:, 1].tolist() == [0, 2]


# --- beam search ----------------------------------------------------------------------------------------
def summed_log_probs(model, seq, prompt_len):
    with torch.no_grad():
        logp = model(seq[None]).double().log_softmax(-1)[0]  # [pos, d_vocab]
    return sum(float(logp[i - 1, seq[i]]) for i in range(prompt_len, len(seq)))


def test_beam_search_with_one_beam_is_greedy():
    model = make()
    seqs, scores = model.beam_search(PROMPT[:1], beams=1, max_new_tokens=6)
    assert torch.equal(seqs, model.generate(PROMPT[:1], max_new_tokens=6, temperature=0))
    assert scores.shape == (1,)
    assert float(scores[0]) == pytest.approx(summed_log_probs(model, seqs[0], 3), abs=1e-4)


def test_beam_search_scores_and_order():
    model = make()
    seqs, scores = model.beam_search(PROMPT[:1], beams=4, max_new_tokens=5)
    assert seqs.shape == (4, 8) and (seqs[:, :3] == PROMPT[:1]).all()
    assert torch.all(scores[:-1] >= scores[1:])
    assert len({tuple(s.tolist()) for s in seqs}) == 4
    assert not scores.requires_grad and scores.grad_fn is None  # a search keeps no autograd graph of its steps
    for s, score in zip(seqs, scores):
        assert float(score) == pytest.approx(summed_log_probs(model, s, 3), abs=1e-4)


def test_exhaustive_beam_search_finds_the_best_sequence():
    """With beams = d_vocab^n nothing is pruned: the best beam is the argmax over all continuations."""
    model = make(d_vocab=5)
    seqs, scores = model.beam_search(PROMPT[:1], beams=25, max_new_tokens=2)
    best = max(itertools.product(range(5), repeat=2),
               key=lambda c: summed_log_probs(model, torch.cat([PROMPT[0], torch.tensor(c)]), 3))
    assert seqs[0, 3:].tolist() == list(best)


# --- text and arguments ---------------------------------------------------------------------------------
def test_text_in_text_out():
    model = make(d_vocab=259, tokenizer=ByteTokenizer())
    out = model.generate("ab", max_new_tokens=3, temperature=0)
    assert isinstance(out, str) and out.startswith("ab")  # TransformerLens 2.x: text in, text out without the BOS
    ids = model.generate(model.to_tokens("ab"), max_new_tokens=3, temperature=0)
    assert model.to_string(ids[0, 1:]) == out
    with torch.no_grad():
        new = model.generate(model.W_E[model.to_tokens("ab")], max_new_tokens=3, temperature=0, return_type="str")
    assert "ab" + new == out  # embeddings in: the text of the new tokens only


def test_eos_stops_and_pads():
    model = make()
    greedy = model.generate(PROMPT, max_new_tokens=6, temperature=0)
    eos = int(greedy[0, 3])  # the first token row 0 generates
    out = model.generate(PROMPT, max_new_tokens=6, temperature=0, eos_token_id=eos)
    assert (out[0, 3:] == eos).all()  # row 0 finished: padded with eos
    out = model.generate(PROMPT[:1], max_new_tokens=6, temperature=0, eos_token_id=eos, stop_at_eos=True)
    assert out.shape == (1, 4)


# --- embeddings in and out (TransformerLens 2.x) ----------------------------------------------------------
@pytest.mark.parametrize("kind", ["rotary", "standard", "shortformer", "alibi"])
@pytest.mark.parametrize("kv", [True, False])
@pytest.mark.parametrize("n_ctx", [16, 6])  # 6: 3 + 5 tokens outgrow a learned table, which slides its window
def test_generate_from_token_embeddings_equals_from_ids(kind, kv, n_ctx):
    model = make(kind, n_ctx=n_ctx)
    greedy = dict(max_new_tokens=5, temperature=0, use_past_kv_cache=kv)
    ids = model.generate(PROMPT, **greedy)
    with torch.no_grad():
        embeds = model.W_E[PROMPT]
        out = model.generate(embeds, **greedy)  # embeddings in: embeddings out, the new tokens' W_E rows appended
        torch.testing.assert_close(out, model.W_E[ids], rtol=0, atol=0)
        assert torch.equal(model.generate(embeds, return_type="tokens", **greedy), ids[:, 3:])  # the new ones only
        torch.testing.assert_close(model.generate(PROMPT, return_type="embeds", **greedy), model.W_E[ids])


def test_generate_from_embeddings_adds_positions_as_a_hand_loop():
    """Perturbed embeddings (no token's): positions W_pos[0..] are added, then every block; cached = uncached."""
    model = make("standard")
    with torch.no_grad():
        embeds = model.W_E[PROMPT] + 0.5 * torch.randn(2, 3, 16, generator=torch.Generator().manual_seed(0))
        hand = embeds
        for _ in range(4):
            pos = model.W_pos[: hand.shape[1]]
            nxt = model(hand + pos, start_at_layer=0)[:, -1].argmax(-1)
            hand = torch.cat([hand, model.W_E[nxt][:, None]], 1)
        for kv in (True, False):
            out = model.generate(embeds, max_new_tokens=4, temperature=0, use_past_kv_cache=kv)
            torch.testing.assert_close(out, hand, rtol=0, atol=0)


def test_get_residual_adds_the_rows_after_the_offset():
    """TransformerLens 2.x's get_residual(embed, pos_offset): W_pos[offset:offset+pos] added, or for Shortformer
    returned apart; rotary adds nothing."""
    e = torch.randn(2, 3, 16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        standard, shortformer = make("standard"), make("shortformer")
        torch.testing.assert_close(standard.get_residual(e, 2, return_shortformer_pos_embed=False),
                                   e + standard.W_pos[2:5], rtol=0, atol=0)
        resid, pos = shortformer.get_residual(e, 1)
        assert torch.equal(resid, e) and torch.equal(pos, shortformer.W_pos[1:4].expand(2, 3, 16))
        resid, pos = make("rotary").get_residual(e, 4)
        assert torch.equal(resid, e) and pos is None


@pytest.mark.parametrize("kwargs,match", [
    (dict(input=torch.zeros(1, 3, 5)), "d_model=16"),
    (dict(input=torch.zeros(3, 16)), r"\[batch, pos, d_model"),
    (dict(input=torch.zeros(1, 3, 16), freq_penalty=1.0), "freq_penalty"),
])
def test_bad_embeddings_input(kwargs, match):
    from models import InputError

    with pytest.raises(InputError, match=match):
        make().generate(max_new_tokens=2, **kwargs)


@pytest.mark.parametrize("kwargs,field", [
    (dict(max_new_tokens=-1), "max_new_tokens"),
    (dict(max_new_tokens=1.5), "max_new_tokens"),
    (dict(max_new_tokens=True), "max_new_tokens"),
    (dict(temperature=-0.1), "temperature"),
    (dict(temperature="hot"), "temperature"),
    (dict(top_k=0), "top_k"),
    (dict(top_k=2.0), "top_k"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_p="0.9"), "top_p"),
])
def test_bad_generate_arguments(kwargs, field):
    with pytest.raises(ValueError, match=field):
        make().generate(PROMPT, **kwargs)


@pytest.mark.parametrize("kwargs,field", [(dict(beams=0), "beams"), (dict(beams=2.0), "beams"),
                                          (dict(max_new_tokens=-2), "max_new_tokens")])
def test_bad_beam_arguments(kwargs, field):
    with pytest.raises(ValueError, match=field):
        make().beam_search(PROMPT[:1], **kwargs)


def test_beam_search_takes_one_prompt():
    with pytest.raises(ValueError, match="one prompt"):
        make().beam_search(PROMPT, beams=2)


@pytest.mark.parametrize("kind,kv_heads", [("rotary", 1), ("standard", None), ("shortformer", 1), ("alibi", None)])
def test_generated_pad_tokens_stay_in_context_with_the_cache(kind, kv_heads):
    """A generated token equal to the tokenizer's pad id (or EOS, where a tokenizer's pad is its EOS) is text: the
    cached decoding step passed no mask, so `forward` inferred one from the pad id and masked that token out of
    every later step (greedy tokens differed from the cache-free path and from TransformerLens 2.18). Cached =
    cache-free = a hand-written argmax loop, with the pad id set to a token the model generates."""
    tok = ByteTokenizer()
    cfg = HookedTransformerConfig(n_layers=2, d_model=16, n_ctx=32, d_vocab=tok.vocab_size, n_heads=2, d_mlp=32,
                                  positional_embedding_type=kind, n_key_value_heads=kv_heads, seed=0)
    model = randomize(HookedTransformer(cfg, tokenizer=tok), scale=0.5, seed=1)
    prompt = torch.tensor([[tok.bos_token_id, 104, 105, 33]])
    free = model.generate(prompt, max_new_tokens=12, do_sample=False, use_past_kv_cache=False)
    tok.pad_token_id = int(free[0, prompt.shape[1] + 1])  # the second generated token is now the pad id
    expected = hand_greedy(model, prompt, 12)
    assert torch.equal(model.generate(prompt, max_new_tokens=12, do_sample=False, use_past_kv_cache=False), expected)
    assert torch.equal(model.generate(prompt, max_new_tokens=12, do_sample=False, use_past_kv_cache=True), expected)

"""HookedEncoderDecoder and HookedEncoder: config checks and JSON round trip, named errors for bad input, weight
properties in TransformerLens' shapes, generation (the key/value cache against the cache-free path), checkpoints."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import randomize

import models
from models import (
    CheckpointError,
    ConfigError,
    EncoderConfig,
    EncoderDecoderConfig,
    HookedEncoder,
    HookedEncoderDecoder,
    InputError,
)

BASE = dict(d_model=16, n_heads=2, d_vocab_src=11, d_vocab_tgt=13, n_ctx_src=8, n_ctx_tgt=9, seed=0)


def make(**kw) -> HookedEncoderDecoder:
    return randomize(HookedEncoderDecoder(EncoderDecoderConfig(**dict(BASE, **kw))), scale=0.5, seed=1)


def test_config_round_trip_and_model_type():
    cfg = EncoderDecoderConfig(**BASE, d_mlp=32, normalization_position="post", positional_embedding_type="rotary")
    d = json.loads(cfg.to_json())
    assert d["model_type"] == "encoder_decoder" and d["d_head"] == 8
    assert EncoderDecoderConfig.from_json(cfg.to_json()) == cfg
    assert cfg.encoder_cfg.attention_dir == "bidirectional" and cfg.decoder_cfg.attention_dir == "causal"


@pytest.mark.parametrize("change,field", [
    (dict(normalization_position="middle"), "normalization_position"),
    (dict(share_embeddings=True), "share_embeddings"),
    (dict(positional_embedding_type="learned"), "positional_embedding_type"),
    (dict(eos_token_id=11), "eos_token_id"),
    (dict(n_encoder_layers=0), "n_encoder_layers"),
    (dict(d_mlp=-1), "d_mlp"),
    (dict(act_fn="tanh"), "act_fn"),
])
def test_config_errors_name_the_field(change, field):
    with pytest.raises(ConfigError, match=field):
        EncoderDecoderConfig(**dict(BASE, **change))


def test_config_refuses_unknown_fields_and_other_model_types():
    d = EncoderDecoderConfig(**BASE).to_dict()
    with pytest.raises(ConfigError, match="unknown config field"):
        EncoderDecoderConfig.from_dict(dict(d, n_layers=2))
    with pytest.raises(ConfigError, match="model_type"):
        EncoderDecoderConfig.from_dict(dict(d, model_type="encoder"))


def test_weight_properties_have_transformer_lens_shapes():
    m = make(d_mlp=32, n_encoder_layers=2, n_decoder_layers=3)
    assert m.W_E_src.shape == (11, 16) and m.W_E_tgt.shape == (13, 16) and m.W_U.shape == (16, 13)
    assert m.W_pos_src.shape == (8, 16) and m.W_pos_tgt.shape == (9, 16) and m.b_U.shape == (13,)
    assert m.enc_W_Q.shape == (2, 2, 16, 8) and m.enc_W_O.shape == (2, 2, 8, 16) and m.enc_b_O.shape == (2, 16)
    assert m.dec_W_K.shape == (3, 2, 16, 8) and m.cross_W_V.shape == (3, 2, 16, 8) and m.cross_b_Q.shape == (3, 2, 8)
    assert m.enc_W_in.shape == (2, 16, 32) and m.dec_W_out.shape == (3, 32, 16)
    assert torch.equal(m.cross_W_Q[1], m.decoder[1].cross_attn.W_Q)
    for name in ("enc", "dec", "cross"):
        qk, ov = getattr(m, f"{name}_QK"), getattr(m, f"{name}_OV")
        assert isinstance(qk, models.arch.model.FactoredMatrix) and qk.shape == ov.shape
        torch.testing.assert_close(ov.AB, getattr(m, f"{name}_W_V") @ getattr(m, f"{name}_W_O"))
    torch.testing.assert_close(m.cross_QK.AB, m.cross_W_Q @ m.cross_W_K.transpose(-1, -2))


def test_cross_attention_reads_the_encoder_output():
    """A hook replacing the memory changes the logits; hooks on cross_attn.hook_k see [batch, src_pos, ...]."""
    m = make()
    src, tgt = torch.randint(0, 11, (2, 8)), torch.randint(0, 13, (2, 5))
    seen = {}
    out = m.run_with_hooks(src, tgt, fwd_hooks=[("decoder.0.cross_attn.hook_k",
                                                  lambda t, hook: seen.update(k=t.shape))])
    assert seen["k"] == (2, 8, 2, 8)
    zeroed = m.run_with_hooks(src, tgt, fwd_hooks=[("encoder_ln_final.hook_normalized", lambda t, hook: t * 0)])
    assert not torch.allclose(out, zeroed)
    torch.testing.assert_close(m.decode(tgt, m.encode(src)), out)


@pytest.mark.parametrize("call,match", [
    (lambda m: m(torch.full((1, 4), 11), torch.zeros(1, 3, dtype=torch.long)), "src: token id 11 is out of range"),
    (lambda m: m(torch.zeros(1, 4, dtype=torch.long), torch.full((1, 3), 13)), "tgt: token id 13 is out of range"),
    (lambda m: m(torch.zeros(1, 9, dtype=torch.long), torch.zeros(1, 3, dtype=torch.long)), "longer than n_ctx=8"),
    (lambda m: m(torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 10, dtype=torch.long)), "longer than n_ctx=9"),
    (lambda m: m(torch.zeros(2, 4, dtype=torch.long), torch.zeros(1, 3, dtype=torch.long)), "one target each"),
    (lambda m: m(torch.zeros(2, 4, dtype=torch.long), torch.zeros(2, 3, dtype=torch.long),
                 src_mask=torch.ones(2, 5)), r"src_mask has shape \(2, 5\)"),
    (lambda m: m(torch.zeros(2, 4, dtype=torch.long), torch.zeros(2, 3, dtype=torch.long),
                 tgt_mask=torch.ones(3)), "tgt_mask has shape"),
    (lambda m: m(torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 3, dtype=torch.long),
                 src_mask=torch.zeros(1, 4)), "masks every position"),
    (lambda m: m(torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 3, dtype=torch.long),
                 tgt_mask=torch.tensor([[0, 1, 1]])), "pad targets on the right"),
    (lambda m: m(torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 3, dtype=torch.long),
                 src_mask=torch.full((1, 4), 2)), "booleans or 0/1 values"),
    (lambda m: m(torch.zeros(1, 4), torch.zeros(1, 3, dtype=torch.long)), "integer token ids"),
    (lambda m: m.generate(torch.zeros(1, 4, dtype=torch.long), 3, method="sample"), "method='sample'"),
    (lambda m: m.generate(torch.zeros(1, 4, dtype=torch.long), -1), "max_new_tokens must be an int >= 0"),
    (lambda m: m.generate(torch.zeros(1, 4, dtype=torch.long), 3, method="beam", beams=0), "beams"),
    (lambda m: m.generate(torch.zeros(1, 4, dtype=torch.long), 3, method="top_p", top_p=1.5), "top_p"),
])
def test_bad_input_gets_a_named_error(call, match):
    with pytest.raises(InputError, match=match):
        call(make())


def test_loss_leaves_padding_out():
    m = make()
    src, tgt = torch.randint(3, 11, (2, 8)), torch.randint(3, 13, (2, 6))
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1, 4:] = False
    logits, loss = m(src, tgt, tgt_mask=mask, return_type="both")
    logp = logits.log_softmax(-1)
    terms = [-logp[b, i, tgt[b, i + 1]] for b in range(2) for i in range(5) if mask[b, i + 1]]
    torch.testing.assert_close(loss, torch.stack(terms).mean())


@pytest.mark.parametrize("pos", ["standard", "rotary", "alibi", "shortformer"])
@pytest.mark.parametrize("position", ["pre", "post"])
def test_generation_with_cache_equals_the_cache_free_path(pos, position):
    m = make(positional_embedding_type=pos, normalization_position=position, n_decoder_layers=2, d_mlp=16)
    src = torch.randint(3, 11, (4, 8), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(4, 8, dtype=torch.bool)
    mask[3, 5:] = False
    for method in ("greedy", "beam"):
        fast = m.generate(src, 8, method=method, src_mask=mask, stop_at_eos=False)
        slow = m.generate(src, 8, method=method, src_mask=mask, stop_at_eos=False, use_cache=False)
        assert fast.shape == (4, 9) and torch.equal(fast, slow)
    greedy = m.generate(src, 8, src_mask=mask, stop_at_eos=False)
    torch.testing.assert_close(m(src, greedy[:, :-1], mask).argmax(-1), greedy[:, 1:])  # argmax of the forward
    assert torch.equal(m.generate(src, 8, method="beam", beams=1, src_mask=mask, stop_at_eos=False), greedy)
    assert torch.equal(m.generate(src, 8, method="top_k", top_k=1, src_mask=mask, stop_at_eos=False), greedy)
    a = m.generate(src, 8, method="top_p", top_p=0.9, seed=3, stop_at_eos=False)
    assert torch.equal(a, m.generate(src, 8, method="top_p", top_p=0.9, seed=3, stop_at_eos=False))


def test_beam_search_finds_a_sequence_at_least_as_likely_as_greedy():
    m = make(n_ctx_tgt=6)
    src = torch.randint(3, 11, (3, 8), generator=torch.Generator().manual_seed(1))

    def logprob(seqs):
        logp = m(src, seqs[:, :-1]).log_softmax(-1)
        return logp.gather(-1, seqs[:, 1:, None])[..., 0].sum(-1)

    greedy, beam = (m.generate(src, 5, method=k, beams=4, stop_at_eos=False) for k in ("greedy", "beam"))
    assert greedy.shape == beam.shape == (3, 6)  # n_ctx_tgt bounds the length
    assert bool((logprob(beam) >= logprob(greedy) - 1e-5).all())


def test_checkpoint_round_trip_and_refusals(tmp_path):
    m = make(tie_embeddings=True, d_mlp=8)
    m.save(tmp_path / "m")
    loaded = models.load(tmp_path / "m")
    assert type(loaded) is HookedEncoderDecoder and loaded.cfg == m.cfg
    src, tgt = torch.randint(0, 11, (2, 8)), torch.randint(0, 13, (2, 5))
    torch.testing.assert_close(loaded(src, tgt), m(src, tgt))
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    (tmp_path / "m" / "config.json").write_text(json.dumps(dict(cfg, model_type="seq2seq")))
    with pytest.raises(CheckpointError, match="model_type='seq2seq' is not supported"):
        models.load(tmp_path / "m")
    (tmp_path / "m" / "config.json").write_text(json.dumps(dict(cfg, d_model=32, d_mlp=8)))
    with pytest.raises(CheckpointError, match="shape"):
        models.load(tmp_path / "m")


def test_encoder_mlm_head_and_checkpoint(tmp_path):
    cfg = EncoderConfig(n_layers=2, d_model=16, n_ctx=8, d_vocab=20, n_heads=2, d_mlp=32, seed=0)
    assert cfg.mask_token_id == 19 and json.loads(cfg.to_json())["model_type"] == "encoder"
    with pytest.raises(ConfigError, match="attention_dir"):
        EncoderConfig(n_layers=1, d_model=16, n_ctx=8, d_vocab=20, attention_dir="causal")
    enc = randomize(HookedEncoder(cfg), scale=0.3)
    tokens = torch.randint(0, 19, (2, 8))
    labels = torch.full((2, 8), -100)
    labels[0, 3], labels[1, 0] = 5, 7
    logits, loss = enc(tokens, "both", labels=labels)
    logp = logits.log_softmax(-1)
    torch.testing.assert_close(loss, -(logp[0, 3, 5] + logp[1, 0, 7]) / 2)
    _, cache = enc.run_with_cache(tokens)
    assert bool((cache["blocks.0.attn.hook_pattern"][..., 0, 1:] > 0).all())  # bidirectional: sees later tokens
    assert "mlm_head.hook_post" in cache
    with pytest.raises(InputError, match="needs labels"):
        enc(tokens, "loss")
    enc.save(tmp_path / "e")
    loaded = models.load(tmp_path / "e")
    assert type(loaded) is HookedEncoder
    torch.testing.assert_close(loaded(tokens), logits)


def test_checkpoint_refuses_a_tokenizer_larger_than_the_vocabulary(tmp_path):
    from models.data.seq2seq import CharVocab, Seq2SeqTokenizer

    m = make()  # d_vocab_src 11, d_vocab_tgt 13
    m.tokenizer = Seq2SeqTokenizer(CharVocab("abcdefgh"), CharVocab("abcdefghij"))  # 11 and 13 ids: fits
    m.save(tmp_path / "m")
    assert models.load(tmp_path / "m").tokenizer.target.decode([1, 3, 2]) == "<bos>a<eos>"
    m.tokenizer = Seq2SeqTokenizer(CharVocab("abcdefghi"), CharVocab("abc"))
    m.save(tmp_path / "m")
    with pytest.raises(CheckpointError, match="src tokenizer has 12 ids but the model's d_vocab_src is 11"):
        models.load(tmp_path / "m")
    (tmp_path / "m" / "tokenizer.json").write_text('{"toy_circuits_tokenizer": "seq2seq", "source": 3}')
    with pytest.raises(models.TokenizerError, match="not a valid seq2seq tokenizer"):
        models.load(tmp_path / "m")

"""Training encoder–decoders and encoders with the one training loop: the seq2seq tasks and their held-out split,
step-pure batches, scheduled sampling, MLM masking, resuming bitwise, the `circuits train` presets, and the shipped
`enc-dec-reverse` (its card's claims re-measured)."""

from __future__ import annotations

import datetime
import json
import math

import numpy as np
import pytest
import torch

import models
from models import EncoderConfig, EncoderDecoderConfig, TrainConfigError
from models.data.batches import step_rng
from models.data.seq2seq import BOS, EOS, PAD, Date, Seq2SeqBatches, is_held_out, make_task
from models.data.tokenizer import load_tokenizer
from models.training.loop import TrainConfig, train
from models.training.tasks import mask_tokens, sampling_probability

TINY = dict(d_model=32, n_heads=2, d_vocab_src=8, d_vocab_tgt=8, n_ctx_src=4, n_ctx_tgt=6, normalization_type=None,
            use_bias=False, init_range=0.1)


def tiny_train(out=None, **kw) -> TrainConfig:
    d = dict(steps=20, batch_size=16, lr=3e-3, warmup_steps=5, data="seq2seq:reverse", task_symbols=5,
             task_min_len=4, task_max_len=4, checkpoint_every=10, log_checkpoints=0, eval_every=10, log_every=5,
             val_sequences=32, exact_match_sequences=64, progress=False, num_threads=1,
             out_dir=None if out is None else str(out))
    d.update(kw)
    return TrainConfig(**d)


def running_sum(ids, k):
    """The running sum mod k of symbol ids (letter a = id 3 = value 0), one symbol at a time, integers only."""
    out, total = [], 0
    for t in ids:
        total = (total + int(t) - 3) % k
        out.append(total + 3)
    return out


@pytest.mark.parametrize("name", ["copy", "reverse", "sort", "cumsum", "date"])
def test_tasks_targets_and_held_out_split(name):
    task = make_task(f"seq2seq:{name}", n_symbols=6, min_len=2, max_len=7)
    batches = Seq2SeqBatches(task, 12, 12)
    rows = batches.batch(seed=0, step=3, batch_size=64)
    assert np.array_equal(rows, batches.batch(seed=0, step=3, batch_size=64))  # a pure function of (seed, step)
    assert np.array_equal(rows[16:32], batches.batch(seed=0, step=3, batch_size=64, rank=1, world_size=4))
    src, tgt, src_mask, tgt_mask = batches.split(rows)
    val_src = batches.split(batches.val_batch(64))[0]
    for s, m in zip(src, src_mask):
        assert not is_held_out(s[m].numpy())
    assert all(is_held_out(s[s != PAD].numpy()) for s in val_src)
    for s, m, t, tm in zip(src, src_mask, tgt, tgt_mask):
        s, t = s[m].numpy(), t[tm].numpy()
        assert t[0] == BOS and t[-1] == EOS
        body = t[1:-1]
        tok = task.tokenizer
        if name == "date":
            text, iso = tok.source.decode(s), tok.target.decode(body)
            day = datetime.date.fromisoformat(iso)
            assert Date.formats(day) == (text, iso)
        elif name == "cumsum":
            assert body.tolist() == running_sum(s, 6) and task.alignment(s) is None
        else:
            expected = {"copy": s, "reverse": s[::-1], "sort": np.sort(s)}[name]
            assert np.array_equal(body, expected)
            a = task.alignment(s)  # [target, source]: where each target token may come from
            assert a.any(1).all() and all(set(s[row]) == {x} for row, x in zip(a, body))


def test_cumsum_by_hand():
    """"cab" with 3 symbols: values 2, 0, 1 → running sums 2, 2, 0 mod 3 → "cca"."""
    task = make_task("seq2seq:cumsum", n_symbols=3)
    src = np.asarray(task.tokenizer.source.encode("cab"))
    assert task.tokenizer.target.decode(task.target(src)) == "cca"


def test_task_settings_are_checked():
    with pytest.raises(TrainConfigError, match="unknown seq2seq task 'rot13'"):
        make_task("seq2seq:rot13")
    with pytest.raises(TrainConfigError, match="n_ctx_tgt >= 10"):
        Seq2SeqBatches(make_task("seq2seq:reverse", max_len=8), 8, 9)
    with pytest.raises(TrainConfigError, match="does not fit"):
        train(EncoderDecoderConfig(**TINY), tiny_train(data="stdlib"))
    with pytest.raises(TrainConfigError, match="d_vocab_src"):
        train(EncoderDecoderConfig(**dict(TINY, d_vocab_src=7)), tiny_train(task_symbols=5))
    with pytest.raises(TrainConfigError, match="sampling_schedule"):
        tiny_train(sampling_schedule="cosine").validate()


def test_sampling_schedules_rise_from_teacher_forcing():
    """Bengio et al. (2015): ε_i = max(0, 1 − i/k), k^i, k/(k + exp(i/k)); own-prediction probability max·(1 − ε_i)."""
    for kind, k, step, eps in [("linear", 100, 25, 0.75), ("exponential", 0.99, 50, 0.99**50),
                               ("inverse_sigmoid", 10, 30, 10 / (10 + math.exp(3)))]:
        cfg = tiny_train(steps=100, sampling_schedule=kind, sampling_k=k, sampling_max=0.4)
        assert sampling_probability(cfg, step) == pytest.approx(0.4 * (1 - eps))
        assert sampling_probability(cfg, 0) <= sampling_probability(cfg, 50) <= sampling_probability(cfg, 100) <= 0.4
    assert sampling_probability(tiny_train(), 10**6) == 0.0


def test_mask_tokens_follows_bert():
    rows = np.tile(np.arange(10, 60), (400, 1))
    inputs, labels = mask_tokens(rows, step_rng(0, 0, 3), 0.15, 99, np.array([5, 6]))
    chosen = labels != -100
    assert not chosen[:, 0].any() and abs(chosen.mean() - 0.15 * 49 / 50) < 0.01
    assert np.array_equal(labels[chosen], rows[chosen]) and np.array_equal(inputs[~chosen], rows[~chosen])
    masked, random = (inputs[chosen] == 99).mean(), np.isin(inputs[chosen], [5, 6]).mean()
    assert abs(masked - 0.8) < 0.03 and abs(random - 0.1) < 0.03


def test_reverse_trains_to_exact_match_and_saves(tmp_path):
    model, summary = train(EncoderDecoderConfig(**TINY), tiny_train(tmp_path / "run", steps=150, lr=1e-2))
    assert summary["final_exact_match"] >= 0.95
    loaded = models.load(tmp_path / "run")
    assert type(loaded) is models.HookedEncoderDecoder and loaded.cfg.extra["task"] == "seq2seq:reverse"
    tok = load_tokenizer(tmp_path / "run" / "tokenizer.json")
    assert tok.source.tokens == loaded.tokenizer.target.tokens == ["<pad>", "<bos>", "<eos>", *"abcde"]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "exact_match" in r] == [0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110,
                                                                   120, 130, 140, 150]


def test_scheduled_sampling_run_resumes_bitwise(tmp_path):
    """A run cut after its step-10 checkpoint (later checkpoints and the final files removed, as a kill leaves it)
    and resumed ends with the uninterrupted run's weights: the own-prediction choices are step-pure."""
    import shutil

    cfg, settings = EncoderDecoderConfig(**TINY), dict(sampling_schedule="linear", sampling_max=0.5,
                                                       label_smoothing=0.1)
    full, _ = train(cfg, tiny_train(tmp_path / "full", **settings))
    cut = tmp_path / "cut"
    shutil.copytree(tmp_path / "full", cut)
    shutil.rmtree(cut / "checkpoints" / "step-000020")
    (cut / "summary.json").unlink()
    resumed, _ = train(cfg, tiny_train(cut, **settings), resume=True)
    for (name, a), b in zip(full.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name
    teacher, _ = train(cfg, tiny_train(label_smoothing=0.1))
    assert not torch.equal(teacher.W_U, full.W_U)  # scheduled sampling changed the trajectory


def test_encoder_trains_on_masked_language_modelling(tmp_path):
    (tmp_path / "text.py").write_text("".join(f"def f{i}(x):\n    return x * {i % 13}\n\n" for i in range(400)))
    cfg = EncoderConfig(n_layers=1, d_model=32, n_ctx=16, d_vocab=260, n_heads=2, d_mlp=64, mask_token_id=259)
    tc = TrainConfig(steps=40, batch_size=16, lr=3e-3, warmup_steps=5, data=str(tmp_path / "text.py"),
                     tokenizer="bytes", cache_dir=str(tmp_path / "cache"), checkpoint_every=40, log_checkpoints=0,
                     eval_every=20, progress=False, out_dir=str(tmp_path / "mlm"), num_threads=1)
    model, summary = train(cfg, tc)
    records = [json.loads(line) for line in (tmp_path / "mlm" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["val_loss"] for r in records if "val_loss" in r]
    assert losses[-1] < losses[0] - 1.0  # the MLM loss falls from ~log(260)
    assert type(models.load(tmp_path / "mlm")) is models.HookedEncoder
    with pytest.raises(TrainConfigError, match="mask_token_id"):
        train(cfg.replace(mask_token_id=5), tc)


@pytest.mark.e2e
def test_cli_trains_an_encoder_decoder_config(tmp_path, capsys):
    from analyses.cli import main

    spec = {"model": dict(TINY, model_type="encoder_decoder"), "train": {"data": "seq2seq:copy", "task_symbols": 5,
                                                                          "task_min_len": 4, "task_max_len": 4}}
    rc = main(["train", "--config", json.dumps(spec), "--out", str(tmp_path / "m"), "--steps", "20", "--json",
               "--batch-size", "16", "--sampling-schedule", "linear"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["steps"] == 20 and 0 <= out["final_exact_match"] <= 1
    card = (tmp_path / "m" / "card.md").read_text()
    assert "exact match of greedy decoding" in card and "scheduled sampling (linear" in card


def test_zoo_enc_dec_sort_meets_its_card():
    from models.data.seq2seq import exact_match

    model = models.load("enc-dec-sort")
    batches = Seq2SeqBatches(make_task("seq2seq:sort", 10, 8, 8), model.cfg.n_ctx_src, model.cfg.n_ctx_tgt)
    assert exact_match(model, batches, batches.val_batch(256, seed=7)) >= 0.99
    assert model.to_string_tgt(model.generate(model.to_tokens_src("hgfabcjj"), 9)[0]) == "<bos>abcfghjj<eos>"


def test_zoo_enc_dec_reverse_meets_its_card():
    """The shipped model: ≥ 99 % exact match on held-out sources, an anti-diagonal alignment head (≥ 0.9) whose
    OV circuit copies (≥ 0.9), re-measured here on sequences the card did not use."""
    from analyses.seq2seq_card import cross_alignment_scores
    from circuits.cross_attention import cross_copying_scores
    from models.data.seq2seq import exact_match

    model = models.load("enc-dec-reverse")
    tc = json.loads((models.io.checkpoint.ZOO_DIR / "enc-dec-reverse" / "train_config.json").read_text())
    batches = Seq2SeqBatches(make_task(tc["data"], tc["task_symbols"], tc["task_min_len"], tc["task_max_len"]),
                             model.cfg.n_ctx_src, model.cfg.n_ctx_tgt)
    rows = batches.val_batch(512, seed=7)
    assert exact_match(model, batches, rows) >= 0.99
    align, copying = cross_alignment_scores(model, batches, rows), cross_copying_scores(model)
    best = align.flatten().argmax()
    assert align.flatten()[best] >= 0.9 and copying.flatten()[best] >= 0.9
    src = model.to_tokens_src(["abcdefgh", "jjaaebcd"])
    assert model.to_string_tgt(model.generate(src, 9)) == ["<bos>hgfedcba<eos>", "<bos>dcbeaajj<eos>"]
    with pytest.raises(models.TokenizerError, match=r"characters \['z'\]"):
        model.to_tokens_src("abz")
    card = json.loads((models.io.checkpoint.ZOO_DIR / "enc-dec-reverse" / "measured.json").read_text())
    assert card["exact_match_held_out"] >= 0.99
    assert np.allclose(card["cross_copying_scores"], copying.numpy(), atol=1e-3)


DDP_SCRIPT = """
import sys
sys.path.insert(0, {root!r})
from tests.models.test_encdec_train import TINY, tiny_train
from models import EncoderDecoderConfig
from models.training.loop import train
train(EncoderDecoderConfig(**TINY), tiny_train({out!r}, steps=16, log_every=1, eval_every=8, lr=1e-2,
                                              sampling_schedule="linear", sampling_max=0.5))
"""


@pytest.mark.slow
def test_two_process_gloo_seq2seq_matches_single_process(tmp_path):
    """The seq2seq task under torchrun (2 CPU processes, gloo) follows the single-process trajectory, scheduled
    sampling included (fixed-length targets: every rank's mean is over the same number of tokens)."""
    import sys

    from models.training.state import read_metrics
    from tests.models.test_train_ddp import ROOT, _free_port, _run

    for name in ("one", "two"):
        (tmp_path / f"{name}.py").write_text(DDP_SCRIPT.format(root=str(ROOT), out=str(tmp_path / name)))
    _run([sys.executable, "one.py"], tmp_path)
    _run([sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
          "--master_addr", "127.0.0.1", "--master_port", str(_free_port()), "two.py"], tmp_path)
    a, b = ([r["train_loss"] for r in read_metrics(tmp_path / n / "metrics.jsonl") if "train_loss" in r]
            for n in ("one", "two"))
    assert len(a) == len(b) == 16 and a[-1] < a[0] - 0.5
    assert torch.allclose(torch.tensor(a), torch.tensor(b), rtol=0, atol=1e-3), (a, b)
    assert (models.load(tmp_path / "one").W_U - models.load(tmp_path / "two").W_U).abs().max() < 1e-3
    assert json.loads((tmp_path / "two" / "summary.json").read_text())["world_size"] == 2

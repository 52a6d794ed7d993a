"""Seed sweeps (`models.training.stacked`, `models.training.sweep`): the stack against the single model, member k
against `train(..., seed=k)` alone (initial weights bitwise, the same batches, losses to float32 rounding), resume,
and a diverging member that must neither stop nor change the others."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from models import HookedTransformer, HookedTransformerConfig, lm_cross_entropy, load
from models.errors import FolderError, TrainConfigError
from models.io.checkpoint import read_safetensors
from models.training import loop as training_loop
from models.training import sweep as training_sweep
from models.training.loop import train
from models.training.stacked import StackedDecoder, check_stackable, clip_per_member
from models.training.state import read_metrics
from models.training.sweep import member_dir, parse_seeds, sweep_json, train_sweep
from tests.models.test_train import TEXT, tiny_model, tiny_train


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    (d / "code.py").write_text(TEXT)
    return d


def run_cfg(corpus_dir, out, **kw):
    return tiny_train(corpus_dir, out, **dict(dict(steps=16, log_every=1, checkpoint_every=6, log_checkpoints=0), **kw))


def final_weights(folder):
    return read_safetensors(folder / "model.safetensors")


# --- the stack ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("positions, bias", [("shortformer", False), ("standard", True)])
def test_stack_unstack_round_trip_and_forward(positions, bias):
    cfg = tiny_model().replace(positional_embedding_type=positions, use_bias=bias)
    models = [HookedTransformer(cfg.replace(seed=s)) for s in (0, 5, 9)]
    if bias:  # biases that are not zero, so a mixed-up bias shows
        for m in models:
            for name, p in m.named_parameters():
                if ".b_" in name:
                    p.data.normal_(generator=torch.Generator().manual_seed(len(name)))
    stack = StackedDecoder(models)
    for k, m in enumerate(models):  # unstacking gives back each member's weights, bit for bit
        member = stack.member_state(k)
        assert list(member) == [n for n, _ in m.named_parameters()]
        assert all(torch.equal(member[n], p) for n, p in m.named_parameters())
    tokens = torch.randint(0, cfg.d_vocab, (3, 4, cfg.n_ctx), generator=torch.Generator().manual_seed(1))
    logits, losses = stack(tokens), stack.losses(tokens)
    for k, m in enumerate(models):  # the single model is the reference
        torch.testing.assert_close(logits[k], m(tokens[k]), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(losses[k], lm_cross_entropy(m(tokens[k]), tokens[k]), rtol=1e-6, atol=1e-6)


def test_stack_members_do_not_mix():
    models = [HookedTransformer(tiny_model().replace(seed=s)) for s in range(3)]
    stack = StackedDecoder(models)
    tokens = torch.randint(0, 259, (3, 2, 32), generator=torch.Generator().manual_seed(0))
    before = stack(tokens)
    with torch.no_grad():
        stack.stacked("blocks.0.attn.W_Q")[1].fill_(float("nan"))
    after = stack(tokens)
    assert torch.isnan(after[1]).all() and torch.equal(after[0], before[0]) and torch.equal(after[2], before[2])


def test_clip_per_member_is_torch_rule_per_member():
    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.zeros(3, 4, 5)), torch.nn.Parameter(torch.zeros(3, 7))]
    for p, scale in zip(params, (3.0, 0.01), strict=True):
        p.grad = torch.randn(p.shape, generator=gen) * scale
    singles = [[torch.nn.Parameter(p.detach()[k].clone()) for p in params] for k in range(3)]
    for k, ps in enumerate(singles):
        for p, stacked in zip(ps, params, strict=True):
            p.grad = stacked.grad[k].clone()
        torch.nn.utils.clip_grad_norm_(ps, 1.0)
    params[1].grad[2] = float("nan")
    norms = clip_per_member(params, 1.0)
    assert torch.isnan(norms[2]) and torch.isfinite(norms[:2]).all()
    for k in range(2):
        for p, single in zip(params, singles[k], strict=True):
            torch.testing.assert_close(p.grad[k], single.grad, rtol=1e-6, atol=0)


def test_check_stackable_names_what_it_cannot_stack():
    check_stackable(tiny_model())
    cfg = HookedTransformerConfig(n_layers=1, d_model=16, n_ctx=8, d_vocab=20, n_heads=2, d_mlp=32,
                                  normalization_type="LN", positional_embedding_type="rotary")
    with pytest.raises(TrainConfigError, match="attn_only.*normalization_type.*positional_embedding_type"):
        check_stackable(cfg)


@pytest.mark.parametrize("text, seeds", [("0-7", list(range(8))), ("0,3,5", [0, 3, 5]), ("4", [4]),
                                         ("0-2,9", [0, 1, 2, 9]), ("5,1", [5, 1])])
def test_parse_seeds(text, seeds):
    assert parse_seeds(text) == seeds


@pytest.mark.parametrize("text, message", [("", "is not a seed"), ("3-1", "ends before it starts"),
                                           ("a", "is not a seed"), ("-1", "is not a seed"), ("0,,1", "is not"),
                                           ("1,1", "given twice"), ("0-2,2", "given twice"), ("1.5", "is not"),
                                           ("0-5000", "more than")])
def test_parse_seeds_refuses(text, message):
    with pytest.raises(TrainConfigError, match=message):
        parse_seeds(text)


# --- member k is `--seed k` alone -----------------------------------------------------------------------
def _spy_batches(monkeypatch, module, seen: list):
    real = module.build_data

    def build_data(*a, **kw):
        batches, tok, corpus = real(*a, **kw)
        draw = batches.batch

        def batch(seed, step, *rest):
            rows = draw(seed, step, *rest)
            seen.append((seed, step, rows.copy()))
            return rows

        batches.batch = batch
        return batches, tok, corpus

    monkeypatch.setattr(module, "build_data", build_data)


def test_member_equals_single_run(corpus_dir, tmp_path, monkeypatch):
    drawn_sweep, drawn_single = [], []
    _spy_batches(monkeypatch, training_sweep, drawn_sweep)
    _spy_batches(monkeypatch, training_loop, drawn_single)
    train_sweep(tiny_model(), run_cfg(corpus_dir, tmp_path / "sweep"), [0, 3])
    train(tiny_model(), run_cfg(corpus_dir, tmp_path / "alone", seed=3))
    member = member_dir(tmp_path / "sweep", 3)
    # the same batches, step by step
    assert [(s, t) for s, t, _ in drawn_sweep if s == 3] == [(s, t) for s, t, _ in drawn_single]
    assert all((a == b).all() for (_, _, a), (_, _, b) in zip([d for d in drawn_sweep if d[0] == 3], drawn_single,
                                                               strict=True))
    # the same initial weights, bit for bit
    init_a = read_safetensors(member / "checkpoints/step-000000/model.safetensors")
    init_b = read_safetensors(tmp_path / "alone/checkpoints/step-000000/model.safetensors")
    assert all(torch.equal(init_a[k], init_b[k]) for k in init_b)
    # losses to float32 rounding at every step
    la = [r["train_loss"] for r in read_metrics(member / "metrics.jsonl") if "train_loss" in r]
    lb = [r["train_loss"] for r in read_metrics(tmp_path / "alone/metrics.jsonl") if "train_loss" in r]
    assert len(la) == len(lb) == 16
    assert max(abs(a - b) / abs(b) for a, b in zip(la, lb, strict=True)) < 1e-5
    # an ordinary model folder: loadable, with its card's files and the single run's training settings
    m = load(member)
    assert m.cfg.seed == 3 and m.tokenizer is not None
    saved = json.loads((member / "train_config.json").read_text())
    alone = json.loads((tmp_path / "alone/train_config.json").read_text())
    assert {k: v for k, v in saved.items() if k != "out_dir"} == {k: v for k, v in alone.items() if k != "out_dir"}
    sweep = sweep_json(tmp_path / "sweep")
    assert [m["status"] for m in sweep["members"]] == ["finished", "finished"] and sweep["seeds"] == [0, 3]
    # every checkpoint carries the tokenizer, as the single run's do
    steps = sorted(p.name for p in (tmp_path / "alone" / "checkpoints").iterdir())
    assert steps == sorted(p.name for p in (member / "checkpoints").iterdir())
    for step in steps:
        assert (member / "checkpoints" / step / "tokenizer.json").read_bytes() == (
            tmp_path / "alone" / "checkpoints" / step / "tokenizer.json").read_bytes()


# --- resume ---------------------------------------------------------------------------------------------
class Killed(BaseException):
    """Stands for SIGKILL: raised from inside the loop, nothing after it runs."""


def test_resume_equals_uninterrupted(corpus_dir, tmp_path):
    seeds = [1, 2]
    train_sweep(tiny_model(), run_cfg(corpus_dir, tmp_path / "a"), seeds)
    calls = []

    def dies_at_second_checkpoint(model):  # after step 12's first member was scored
        calls.append(1)
        if len(calls) == 2 * 2 + 1:
            raise Killed
        return {}

    with pytest.raises(Killed):
        train_sweep(tiny_model(), run_cfg(corpus_dir, tmp_path / "b"), seeds, eval_fn=dies_at_second_checkpoint)
    assert sweep_json(tmp_path / "b")["status"] == "running"
    train_sweep(tiny_model(), run_cfg(corpus_dir, tmp_path / "b"), seeds, resume=True)
    for s in seeds:
        a, b = final_weights(member_dir(tmp_path / "a", s)), final_weights(member_dir(tmp_path / "b", s))
        assert all(torch.equal(a[k], b[k]) for k in a)
        la = [r["train_loss"] for r in read_metrics(member_dir(tmp_path / "a", s) / "metrics.jsonl")
              if "train_loss" in r]
        lb = [r["train_loss"] for r in read_metrics(member_dir(tmp_path / "b", s) / "metrics.jsonl")
              if "train_loss" in r]
        assert la == lb
    assert sweep_json(tmp_path / "b")["status"] == "finished"
    with pytest.raises(TrainConfigError, match="trains seeds"):  # another seed list would start its members anew
        train_sweep(tiny_model(), run_cfg(corpus_dir, tmp_path / "b"), [1, 2, 3], resume=True)
    # resuming a finished sweep changes nothing
    before = (member_dir(tmp_path / "b", 1) / "model.safetensors").read_bytes()
    train_sweep(tiny_model(), run_cfg(corpus_dir, tmp_path / "b"), seeds, resume=True)
    assert (member_dir(tmp_path / "b", 1) / "model.safetensors").read_bytes() == before


def test_sweep_refuses_a_folder_of_other_files(corpus_dir, tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(FolderError, match="not a seed sweep"):
        train_sweep(tiny_model(), run_cfg(corpus_dir, tmp_path / "mine"), [0, 1])
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


# --- a diverging member ---------------------------------------------------------------------------------
def poison(seed: int, at_call: int):
    """An eval_fn that fills member `seed`'s weights with NaN at its `at_call`-th checkpoint."""
    calls = []

    def eval_fn(model):
        if model.cfg.seed == seed:
            calls.append(1)
            if len(calls) == at_call:
                with torch.no_grad():
                    model.W_E.fill_(float("nan"))
        return {}

    return eval_fn


def test_diverging_member_is_marked_failed_and_others_unchanged(corpus_dir, tmp_path):
    seeds = [0, 1, 2]
    train_sweep(tiny_model(), run_cfg(corpus_dir, tmp_path / "clean"), seeds, eval_fn=lambda m: {})
    summary = train_sweep(tiny_model(), run_cfg(corpus_dir, tmp_path / "poisoned"), seeds, eval_fn=poison(1, 2))
    status = {m["seed"]: m for m in summary["members"]}
    assert status[1]["status"] == "failed" and status[1]["failed_at_step"] == 6 and "non-finite" in status[1]["reason"]
    assert status[0]["status"] == status[2]["status"] == "finished" and summary["n_failed"] == 1
    for s in (0, 2):  # the others: bit for bit the clean sweep's
        a, b = final_weights(member_dir(tmp_path / "clean", s)), final_weights(member_dir(tmp_path / "poisoned", s))
        assert all(torch.equal(a[k], b[k]) for k in a)
    failed = member_dir(tmp_path / "poisoned", 1)
    assert not (failed / "model.safetensors").exists()  # no final model for it
    recs = read_metrics(failed / "metrics.jsonl")
    assert "failed" in recs[-1] and recs[-1]["step"] == 7 and max(r["step"] for r in recs) == 7
    # resuming the sweep keeps the member failed and the others as they are
    assert sweep_json(tmp_path / "poisoned")["status"] == "finished"


def test_resume_after_a_failure_equals_uninterrupted(corpus_dir, tmp_path):
    seeds = [0, 1]
    train_sweep(tiny_model(), run_cfg(corpus_dir, tmp_path / "a"), seeds, eval_fn=poison(0, 2))
    calls = []
    poisoned = poison(0, 2)

    def then_dies(model):
        calls.append(1)
        if len(calls) == 5:  # step 12: the live member 1 (member 0 failed at step 6 and is no longer scored)
            raise Killed
        return poisoned(model)

    with pytest.raises(Killed):
        train_sweep(tiny_model(), run_cfg(corpus_dir, tmp_path / "b"), seeds, eval_fn=then_dies)
    train_sweep(tiny_model(), run_cfg(corpus_dir, tmp_path / "b"), seeds, resume=True)
    a, b = final_weights(member_dir(tmp_path / "a", 1)), final_weights(member_dir(tmp_path / "b", 1))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [m["status"] for m in sweep_json(tmp_path / "b")["members"]] == ["failed", "finished"]


def test_every_member_diverging_stops_with_a_named_error(corpus_dir, tmp_path):
    def all_nan(model):
        with torch.no_grad():
            model.W_E.fill_(float("nan"))
        return {}

    with pytest.raises(TrainConfigError, match="every member"):
        train_sweep(tiny_model(), run_cfg(corpus_dir, tmp_path / "s"), [0, 1], eval_fn=all_nan)
    assert sweep_json(tmp_path / "s")["status"] == "failed"


def test_sweep_cfg_seed_is_ignored(corpus_dir, tmp_path):
    cfg = dataclasses.replace(run_cfg(corpus_dir, tmp_path / "s", steps=2), seed=7)
    train_sweep(tiny_model(), cfg, [4])
    assert load(member_dir(tmp_path / "s", 4)).cfg.seed == 4


def test_sweep_eval_every_zero_evaluates_at_checkpoints_only(corpus_dir, tmp_path):
    train_sweep(tiny_model(), run_cfg(corpus_dir, tmp_path / "s", steps=8, eval_every=0), [0, 1])
    for k in (0, 1):
        m = read_metrics(member_dir(tmp_path / "s", k) / "metrics.jsonl")
        assert [r["step"] for r in m if "val_loss" in r] == [0, 6, 8]


def test_resuming_a_finished_sweep_refuses_changed_settings(corpus_dir, tmp_path):
    train_sweep(tiny_model(), run_cfg(corpus_dir, tmp_path / "s", steps=4), [0, 1])
    assert train_sweep(tiny_model(), run_cfg(corpus_dir, tmp_path / "s", steps=4), [0, 1], resume=True)["status"] == (
        "finished")
    with pytest.raises(TrainConfigError, match="weight_decay"):  # as a single run's resume (test_train)
        train_sweep(tiny_model(), run_cfg(corpus_dir, tmp_path / "s", steps=4, weight_decay=0.5), [0, 1], resume=True)


def test_sweep_memory_bound_counts_every_member(corpus_dir, tmp_path):
    """Each model fits the memory bound, the sweep's N at once do not: refused by name before anything is built
    or written, from the API and the command line alike (sized from this machine's bound, so on any machine)."""
    from analyses.cli import main
    from models.files.size_checks import check_train_sizes, implied_weights, memory_limit

    d_model = 64
    d_vocab = memory_limit() // (16 * 2 * d_model * 6)  # one model's weights ~ a sixth of the bound
    big = HookedTransformerConfig(n_layers=1, d_model=d_model, n_ctx=8, d_vocab=d_vocab, n_heads=2, d_mlp=None,
                                  attn_only=True, normalization_type=None)
    cfg = run_cfg(corpus_dir, tmp_path / "s", batch_size=1)
    check_train_sizes(big, cfg, TrainConfigError)  # one model: allowed
    assert 16 * implied_weights(big) * 8 > memory_limit()
    with pytest.raises(TrainConfigError, match="models trained at once"):
        train_sweep(big, cfg, list(range(8)))
    assert not (tmp_path / "s").exists()
    config = json.dumps({"model": big.to_dict(), "train": {"data": str(corpus_dir), "tokenizer": "bytes",
                                                           "batch_size": 1}})
    assert main(["train", "--config", config, "--seeds", "0-7", "--out", str(tmp_path / "c")]) == 2
    assert not (tmp_path / "c").exists()

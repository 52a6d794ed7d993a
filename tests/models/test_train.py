"""Training loop: learning, determinism, kill-and-resume, checkpoints as data, clear failures."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from models import HookedTransformerConfig, load
from models.data.corpora import CorpusError
from models.io.checkpoint import read_safetensors
from models.training.loop import TrainConfig, TrainConfigError, lr_at, train
from models.training.state import checkpoint_steps, read_metrics, resumable_checkpoints

TEXT = "".join(f"def f{i}(x):\n    return x * {i % 13} + {i % 7}\n\n" for i in range(600))


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    (d / "code.py").write_text(TEXT)
    return d



def tiny_model():
    return HookedTransformerConfig(n_layers=2, d_model=32, n_ctx=32, d_vocab=259, n_heads=4, d_mlp=None,
                                   normalization_type=None, positional_embedding_type="shortformer", use_bias=False)


def tiny_train(corpus_dir, out=None, **kw):
    """The tiny run, on the CPU wherever the tests run (the CUDA path: tests/models/test_cuda.py)."""
    d = dict(device="cpu", steps=30, batch_size=8, lr=3e-3, warmup_steps=5, data=str(corpus_dir), tokenizer="bytes",
             out_dir=None if out is None else str(out), cache_dir=str(corpus_dir / ".cache"), checkpoint_every=10,
             log_checkpoints=3, eval_every=10, log_every=5, progress=False, num_threads=1, repeat_fraction=0.25,
             repeat_min_len=3, repeat_max_len=8)
    d.update(kw)
    return TrainConfig(**d)


def weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_loss_falls_quickly(corpus_dir, tmp_path):
    model, summary = train(tiny_model(), tiny_train(corpus_dir, tmp_path / "run", steps=60))
    m = read_metrics(tmp_path / "run" / "metrics.jsonl")
    vals = [r["val_loss"] for r in m if "val_loss" in r]
    assert vals[0] > 5.0 and vals[-1] < vals[0] - 2.0, vals  # from log(259) ≈ 5.56 to well below
    assert summary["final_val_loss"] == vals[-1] and summary["unigram_val_loss"] > 0
    assert {"step", "tokens", "wall_time", "train_loss", "tokens_per_s", "lr"} <= set(m[5])
    loaded = load(tmp_path / "run")  # the final folder is a loadable model with its tokenizer
    assert loaded.tokenizer is not None and torch.equal(loaded.W_E, model.W_E)
    assert json.loads((tmp_path / "run" / "train_config.json").read_text())["steps"] == 60


def test_eval_every_zero_evaluates_at_checkpoints_only(corpus_dir, tmp_path):
    train(tiny_model(), tiny_train(corpus_dir, tmp_path / "run", steps=20, eval_every=0))
    m = read_metrics(tmp_path / "run" / "metrics.jsonl")
    evaluated = [r["step"] for r in m if "val_loss" in r]
    saved = sorted(int(p.name.split("-")[1]) for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert evaluated and set(evaluated) <= set(saved) | {20}


def test_seeded_runs_are_identical(corpus_dir):
    a, _ = train(tiny_model(), tiny_train(corpus_dir, steps=12, seed=3))
    b, _ = train(tiny_model(), tiny_train(corpus_dir, steps=12, seed=3))
    c, _ = train(tiny_model(), tiny_train(corpus_dir, steps=12, seed=4))
    wa, wb, wc = weights(a), weights(b), weights(c)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert not all(torch.equal(wa[k], wc[k]) for k in wa)


def test_label_smoothing_changes_the_objective(corpus_dir):
    a, _ = train(tiny_model(), tiny_train(corpus_dir, steps=8))
    b, _ = train(tiny_model(), tiny_train(corpus_dir, steps=8, label_smoothing=0.1))
    assert not torch.equal(a.W_U, b.W_U)


def test_eval_fn_and_checkpoints(corpus_dir, tmp_path):
    calls = []

    def eval_fn(model):
        calls.append(model.training)
        return {"probe": 1.5}

    cfg = tiny_train(corpus_dir, tmp_path / "run", steps=40, keep_checkpoints=[0, 10, 40])
    train(tiny_model(), cfg, eval_fn=eval_fn, report_fn=lambda m, s, r: {"card.md": "# card\n"})
    steps = checkpoint_steps(40, 10, 3)
    m = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in m if "probe" in r] == steps and not any(calls)  # eval mode during eval_fn
    kept = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert kept == ["step-000000", "step-000010", "step-000040"]
    for p in (tmp_path / "run" / "checkpoints").iterdir():
        assert sorted(f.name for f in p.iterdir()) == ["config.json", "model.safetensors"]
        load(p)
    assert (tmp_path / "run" / "card.md").read_text() == "# card\n"


def test_checkpoint_schedule_and_lr():
    s = checkpoint_steps(3000, 500, 16)
    assert s[0] == 0 and s[-1] == 3000 and {500, 1000, 2500} <= set(s)
    assert sum(1 for x in s if x <= 100) >= 5  # early, log-spaced
    cfg = TrainConfig(steps=1000, lr=1e-3, warmup_steps=100, min_lr_ratio=0.1)
    assert lr_at(cfg, 0) == pytest.approx(1e-5) and lr_at(cfg, 99) == pytest.approx(1e-3)
    assert lr_at(cfg, 550) == pytest.approx(0.55e-3, rel=1e-6) and lr_at(cfg, 1000) == pytest.approx(1e-4)


def test_dense_checkpoint_window(corpus_dir, tmp_path):
    """`dense_checkpoints = [start, stop, every]` adds every `every`-th step of the window to the schedule, and a
    run evaluates its head scores at each of them; a malformed window is refused before training."""
    assert set(checkpoint_steps(3000, 500, 16, dense=[1500, 2200, 25])) - set(checkpoint_steps(3000, 500, 16)) == {
        s for s in range(1500, 2201, 25) if s not in checkpoint_steps(3000, 500, 16)}
    cfg = tiny_train(corpus_dir, tmp_path / "run", steps=30, dense_checkpoints=[12, 20, 4], log_checkpoints=0,
                     checkpoint_every=0)
    train(tiny_model(), cfg, eval_fn=lambda m: {"probe": 1.0})
    m = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in m if "probe" in r] == [0, 12, 16, 20, 30]
    for bad in ([5, 2, 1], [0, 10, 0], [0, 10], "0:10:1", [0.5, 10, 1]):
        with pytest.raises(TrainConfigError, match="dense_checkpoints"):
            TrainConfig(dense_checkpoints=bad).validate()


def test_checkpoints_contain_no_pickle(corpus_dir, tmp_path):
    train(tiny_model(), tiny_train(corpus_dir, tmp_path / "run", steps=12))
    files = [f for f in (tmp_path / "run").rglob("*") if f.is_file()]
    assert any(f.name == "optimizer.safetensors" for f in files)
    for f in files:
        head = f.read_bytes()[:4]
        assert not head.startswith(b"\x80") and not head.startswith(b"PK\x03\x04"), f  # pickle / torch zip
        if f.suffix == ".safetensors":
            read_safetensors(f)
        elif f.suffix in (".json", ".jsonl"):
            for line in f.read_text().splitlines() if f.suffix == ".jsonl" else [f.read_text()]:
                json.loads(line)
    state = json.loads(next((tmp_path / "run").rglob("trainer_state.json")).read_text())
    assert {"step", "tokens_seen", "wall_time", "rng"} <= set(state)
    opt = read_safetensors(next((tmp_path / "run").rglob("optimizer.safetensors")))
    assert opt["rng.torch"].dtype == torch.uint8


def test_bad_settings_fail_before_training(corpus_dir, tmp_path):
    out = tmp_path / "run"
    with pytest.raises(TrainConfigError, match="exceeds the model's n_ctx"):
        train(tiny_model(), tiny_train(corpus_dir, out, seq_len=64))
    with pytest.raises(TrainConfigError, match="d_vocab"):
        train(tiny_model().replace(d_vocab=100), tiny_train(corpus_dir, out))
    with pytest.raises(TrainConfigError, match="lr"):
        train(tiny_model(), tiny_train(corpus_dir, out, lr=-1.0))
    with pytest.raises(TrainConfigError, match="repeat_fraction"):
        train(tiny_model(), tiny_train(corpus_dir, out, repeat_fraction=2.0))
    with pytest.raises(TrainConfigError, match="unknown training setting"):
        TrainConfig.from_dict({"stpes": 3})
    (tmp_path / "empty").mkdir()
    with pytest.raises(CorpusError, match="no text files"):
        train(tiny_model(), tiny_train(tmp_path / "empty", out))
    assert not out.exists()


def test_train_config_json_round_trip():
    cfg = TrainConfig(steps=7, keep_checkpoints=[0, 7], betas=(0.8, 0.9), label_smoothing=0.1)
    assert TrainConfig.from_json(cfg.to_json()) == cfg


def test_resume_rejects_changed_settings(corpus_dir, tmp_path):
    train(tiny_model(), tiny_train(corpus_dir, tmp_path / "run", steps=10))
    with pytest.raises(TrainConfigError, match="weight_decay"):  # the lr schedule may change (RESUME_SCHEDULE)
        train(tiny_model(), tiny_train(corpus_dir, tmp_path / "run", steps=20, weight_decay=0.5), resume=True)


KILL_SCRIPT = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {root!r})
    from tests.models.test_train import tiny_model, tiny_train
    from models.training.loop import train
    from pathlib import Path
    cfg = tiny_train(Path({corpus!r}), {out!r}, steps={steps}, checkpoint_every=7, log_checkpoints=0)
    train(tiny_model(), cfg, eval_fn=lambda m: (time.sleep(0.05), {{}})[1])
""")


@pytest.mark.e2e
def test_sigkill_and_resume_equals_uninterrupted(corpus_dir, tmp_path):
    steps = 40
    straight, _ = train(tiny_model(), tiny_train(corpus_dir, tmp_path / "a", steps=steps, checkpoint_every=7,
                                                 log_checkpoints=0))
    out = tmp_path / "b"
    script = KILL_SCRIPT.format(root=str(Path(__file__).resolve().parents[2]), corpus=str(corpus_dir),
                                out=str(out), steps=steps)
    proc = subprocess.Popen([sys.executable, "-c", script], env=dict(os.environ, PYTHONHASHSEED="0"))
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        found = resumable_checkpoints(out)
        if found and int(found[-1].name[5:]) >= 14:
            break
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    killed_at = int(resumable_checkpoints(out)[-1].name[5:])
    assert 14 <= killed_at < steps
    resumed, summary = train(tiny_model(), tiny_train(corpus_dir, out, steps=steps, checkpoint_every=7,
                                                      log_checkpoints=0), resume=True)
    a, b = weights(straight), weights(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a), "resumed weights differ from the uninterrupted run"
    m = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in m] == sorted({r["step"] for r in m})  # no duplicated records after resume
    assert summary["tokens_seen"] == steps * 8 * 32


def test_synthetic_steps_curriculum(corpus_dir):
    from models.training.loop import build_data

    cfg = tiny_train(corpus_dir, synthetic_steps=10, repeat_fraction=0.0)
    batches, _, corpus = build_data(cfg, tiny_model())
    early, late = batches.batch(0, 9, 8), batches.batch(0, 10, 8)
    periodic = [any(np.array_equal(r[1 + L:], r[1:-L]) for L in range(3, 9)) for r in early]
    assert all(periodic)  # [BOS] + R + R + ... with |R| in [repeat_min_len, repeat_max_len]
    text = np.asarray(corpus.train)
    assert all(any(np.array_equal(r[1:], text[s:s + 31]) for s in range(text.size - 30)) for r in late[:2])
    with pytest.raises(TrainConfigError, match="synthetic_steps"):
        tiny_train(corpus_dir, synthetic_steps=-1).validate()


def test_sinusoidal_pos_init(corpus_dir):
    from models import HookedTransformer
    from models.arch.positions import sinusoidal_table
    from models.training.loop import init_positions

    model = HookedTransformer(tiny_model())
    init_positions(model, "sinusoidal")
    table = sinusoidal_table(32, 32, torch.float64) * (model.cfg.init_range * 2**0.5)
    assert torch.allclose(model.W_pos.double(), table, atol=1e-7)
    assert float(model.W_pos.detach().pow(2).mean().sqrt()) == pytest.approx(model.cfg.init_range, rel=1e-3)
    m, _ = train(tiny_model(), tiny_train(corpus_dir, steps=1, pos_init="sinusoidal", lr=1e-9))
    assert torch.allclose(m.W_pos.double(), table, atol=1e-5)  # the run starts from the table
    with pytest.raises(TrainConfigError, match="pos_init must be one of"):
        tiny_train(corpus_dir, pos_init="sine").validate()
    with pytest.raises(TrainConfigError, match="learned positional table"):
        init_positions(HookedTransformer(tiny_model().replace(positional_embedding_type="rotary")), "sinusoidal")


def test_repeat_until_ends_the_mixture(corpus_dir):
    from models.data.batches import TextBatches
    from models.training.loop import build_data

    cfg = tiny_train(corpus_dir, repeat_fraction=1.0, repeat_random_fraction=1.0, repeat_fill=True, repeat_until=5)
    batches, _, corpus = build_data(cfg, tiny_model())
    mixed, plain = TextBatches(corpus, 32, cfg.mixture()), TextBatches(corpus, 32)
    assert np.array_equal(batches.batch(0, 4, 8), mixed.batch(0, 4, 8))
    assert np.array_equal(batches.batch(0, 5, 8), plain.batch(0, 5, 8))
    assert not np.array_equal(batches.batch(0, 5, 8), mixed.batch(0, 5, 8))  # every row of `mixed` has a repeat
    with pytest.raises(TrainConfigError, match="repeat_until"):
        tiny_train(corpus_dir, repeat_until=-2).validate()


def test_lr_multipliers_scale_their_parameters_only(corpus_dir):
    from models import HookedTransformer
    from models.training.loop import make_optimizer

    cfg = tiny_train(corpus_dir, lr_multipliers={"W_pos": 0.25})
    model = HookedTransformer(tiny_model())
    opt = make_optimizer(model, cfg)
    scales = {id(p): g["lr_scale"] for g in opt.param_groups for p in g["params"]}
    for name, p in model.named_parameters():
        assert scales[id(p)] == (0.25 if name.endswith("W_pos") else 1.0), name
    frozen, _ = train(tiny_model(), tiny_train(corpus_dir, steps=5, lr_multipliers={"W_pos": 1e-9}))
    start = HookedTransformer(tiny_model().replace(seed=0))
    assert torch.allclose(frozen.W_pos, start.W_pos, atol=1e-6)  # its lr is ~0
    assert not torch.allclose(frozen.W_E, start.W_E, atol=1e-4)  # everything else trained
    with pytest.raises(TrainConfigError, match=r"W_psos.*parameters: \[.*'W_pos'"):
        make_optimizer(model, tiny_train(corpus_dir, lr_multipliers={"W_psos": 0.1}))


def _adamw_reference(params, grads, groups, steps, betas=(0.9, 0.999), eps=1e-8):
    """AdamW in float64, loop by loop (Loshchilov & Hutter 2019, Algorithm 2, as torch's bias correction)."""
    out = []
    for p0, (lr, wd) in zip(params, groups, strict=True):
        p = p0.double()
        m, v = torch.zeros_like(p), torch.zeros_like(p)
        for t in range(1, steps + 1):
            g = grads[t - 1][len(out)].double()
            p = p * (1 - lr * wd)
            m = betas[0] * m + (1 - betas[0]) * g
            v = betas[1] * v + (1 - betas[1]) * g * g
            p = p - lr * (m / (1 - betas[0] ** t)) / ((v / (1 - betas[1] ** t)).sqrt() + eps)
        out.append(p)
    return out


@pytest.mark.parametrize("kind", ["chosen", "foreach"])
def test_adamw_matches_a_float64_loop(kind):
    from models.training.loop import adamw

    gen = torch.Generator().manual_seed(0)
    params = [torch.randn(s, generator=gen).requires_grad_() for s in ((7, 5), (33,), (4, 3, 2))]
    start = [p.detach().clone() for p in params]
    settings = [(1e-2, 0.1), (3e-3, 0.0), (1e-2, 0.1)]
    groups = [{"params": [params[0], params[2]], "weight_decay": 0.1}, {"params": [params[1]], "lr": 3e-3,
                                                                        "weight_decay": 0.0}]
    opt = adamw(groups, lr=1e-2) if kind == "chosen" else torch.optim.AdamW(groups, lr=1e-2, foreach=True)
    if kind == "chosen":  # torch has a fused CPU AdamW (2.4 and later): the trainer takes it
        assert all(g["fused"] for g in opt.param_groups)
    # gradients from 1e-7 (where eps matters) to 10
    grads = [[torch.randn(p.shape, generator=gen) * 10 ** (i % 3 - 1) * (1e-6 if j == 1 else 1) for j, p in
              enumerate(params)] for i in range(12)]
    for gs in grads:
        for p, g in zip(params, gs, strict=True):
            p.grad = g.clone()
        opt.step()
    for got, p0, want in zip(params, start, _adamw_reference(start, grads, settings, len(grads)), strict=True):
        moved = float((want - p0.double()).abs().max())
        assert float((got.double() - want).abs().max()) <= 1e-6 * float(want.abs().max()) + 1e-4 * moved


def test_adamw_falls_back_where_torch_has_no_fused_kernel():
    from models.training.loop import adamw

    p = torch.zeros(3, dtype=torch.complex64, requires_grad=True)  # fused AdamW takes real floating tensors only
    opt = adamw([p], lr=1e-3)
    assert opt.param_groups[0]["foreach"] and not opt.param_groups[0]["fused"]


def test_resume_keeps_this_process_optimizer_kernel():
    from models.training.loop import adamw
    from models.training.state import load_optimizer, optimizer_tensors

    p = torch.ones(4, requires_grad=True)
    old = torch.optim.AdamW([p], lr=1e-3, foreach=True)  # a checkpoint written before the trainer took fused AdamW
    p.grad = torch.full((4,), 0.5)
    old.step()
    tensors, groups = optimizer_tensors(old)
    new = adamw([p], lr=1e-3)
    load_optimizer(new, tensors, json.loads(json.dumps(groups)))
    assert new.param_groups[0]["fused"] and not new.param_groups[0]["foreach"]
    assert float(new.state[p]["step"]) == 1.0 and torch.equal(new.state[p]["exp_avg"], old.state[p]["exp_avg"])
    new.step()  # the fused kernel runs on the loaded state
    assert float(new.state[p]["step"]) == 2.0


def test_adamw_takes_what_torch_optimizers_take():
    from models.training.loop import adamw

    a, b = torch.zeros(2, requires_grad=True), torch.zeros(3, requires_grad=True)
    for params in ((p for p in (a, b)), [{"params": (p for p in (a,))}, {"params": b, "lr": 0.5}]):
        opt = adamw(params, lr=1e-3)
        assert [p for g in opt.param_groups for p in g["params"]] == [a, b] and opt.param_groups[0]["fused"]

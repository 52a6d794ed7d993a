"""A resumable, deterministic training loop for toy transformers (single process or DDP under `torchrun`): decoders
on text, encoder–decoders on seq2seq tasks (`data="seq2seq:NAME"`), encoders on masked-language modelling; what a step
computes for each is its task (`models.training.tasks`), the loop is one.

`train(model_cfg, train_cfg, eval_fn=None, resume=False)`: AdamW with linear warm-up and cosine decay,
gradient clipping, optional label smoothing, the config's initialisation (seeded), bf16 autocast on GPU.
The batch of step `s` is a pure function of `(seed, s)` (`models.data.batches`), and checkpoints carry optimizer and
RNG states, so a run killed at any point and resumed ends with bitwise the same weights on CPU.
`eval_fn(model) -> dict` (e.g. induction / previous-token / in-context-learning scores built in `analyses`)
runs at every checkpoint; its values go into `metrics.jsonl`. models/ never imports analyses/.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import torch
import torch.distributed as dist

from ..arch.encoder import EncoderConfig
from ..arch.encoder_decoder_config import EncoderDecoderConfig
from ..arch.model import HookedTransformer
from ..arch.positions import sinusoidal_table
from ..data.batches import Curriculum, RepeatBatches, TextBatches
from ..data.corpora import build_token_corpus, get_tokenizer, unigram_baseline_loss
from ..data.seq2seq import Seq2SeqBatches, make_task
from ..data.tokenizer import load_tokenizer
from ..errors import TrainConfigError
from ..files.atomic import atomic_write, atomic_write_text
from ..files.size_checks import check_train_sizes
from ..io.checkpoint import atomic_write_dir, config_from_json, load, model_class, save
from ..io.run_folder import check_folder, claim, open_folder
from . import state as ts
from .config import TrainConfig, lr_at
from .tasks import LanguageModelling, MaskedLM, Seq2Seq

__all__ = ["train", "TrainConfig", "TrainConfigError", "lr_at", "init_positions", "pick_device",
           "dist_info", "adamw", "make_optimizer", "optimizer_groups", "build_data", "check_setup", "evaluate_loss",
           "finalize"]


@torch.no_grad()
def init_positions(model: HookedTransformer, how: str) -> None:
    """`how="sinusoidal"`: overwrite a learned positional table with Vaswani et al.'s sinusoids scaled to the
    config's `init_range` (per-entry RMS), so that nearby positions start with similar embeddings and a
    low-rank QK circuit can already express "attend to the previous position"; the table is still trained."""
    if how == "normal":
        return
    if model.cfg.positions.table != "learned":
        raise TrainConfigError(f"pos_init={how!r} needs a learned positional table (standard or shortformer), "
                               f"got positional_embedding_type={model.cfg.positional_embedding_type!r}")
    for name in ("pos_embed", "pos_embed_src", "pos_embed_tgt"):  # decoder / encoder; encoder–decoder
        if hasattr(model, name):
            W_pos = getattr(model, name).W_pos
            W_pos.copy_(sinusoidal_table(*W_pos.shape, torch.float64) * (model.cfg.init_range * 2**0.5))




def pick_device(name: str = "auto") -> torch.device:
    if name != "auto":
        return torch.device(name)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def dist_info() -> tuple[int, int, int]:
    """(rank, world_size, local_rank) from the torchrun environment (0, 1, 0 without it)."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0))


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW over `optimizer_groups(model.named_parameters(), cfg)`."""
    return adamw(optimizer_groups(model.named_parameters(), cfg), lr=cfg.lr, betas=tuple(cfg.betas))


def optimizer_groups(named_parameters, cfg: TrainConfig) -> list[dict]:
    """AdamW's parameter groups for `(name, parameter)` pairs: weight decay on the weight matrices (`W_*` except
    `W_pos`), none on norms and biases; one group per (decay, lr multiplier), the multiplier stored in the group as
    `lr_scale`. A seed sweep passes its stacked parameters under the single model's names, so its groups and their
    order are a single run's (`models.training.sweep`)."""
    named = list(named_parameters)
    leaves = {name.rsplit(".", 1)[-1] for name, _ in named}
    unknown = sorted(set(cfg.lr_multipliers) - leaves)
    if unknown:
        raise TrainConfigError(f"lr_multipliers name parameters this model does not have: {unknown}; its "
                               f"parameters: {sorted(leaves)}")
    groups: dict = {}
    for name, p in named:
        leaf = name.rsplit(".", 1)[-1]
        decay = cfg.weight_decay if leaf.startswith("W_") and leaf != "W_pos" else 0.0
        scale = float(cfg.lr_multipliers.get(leaf, 1.0))
        groups.setdefault((decay, scale), []).append(p)
    return [{"params": ps, "weight_decay": d, "lr_scale": s} for (d, s), ps in sorted(groups.items())]


FUSED_ADAMW_DEVICES = ("cpu", "cuda")  # where torch documents its fused AdamW


def adamw(params, **kwargs) -> torch.optim.AdamW:
    """`torch.optim.AdamW(params, **kwargs)` on torch's fused kernel (the whole update in one pass over each
    parameter) where every parameter is a floating-point tensor on one of `FUSED_ADAMW_DEVICES`, else its `foreach`
    implementation: the same update to float32 rounding (Loshchilov & Hutter 2019, Algorithm 2; the tests hold both
    to a float64 loop), deterministic, and fewer passes over memory (benchmarks/README.md has the timings)."""
    params = [dict(g, params=_tensors(g["params"])) if isinstance(g, dict) else g for g in _tensors(params)]
    tensors = [p for g in params for p in (g["params"] if isinstance(g, dict) else [g])]
    fused = all(p.is_floating_point() and p.device.type in FUSED_ADAMW_DEVICES for p in tensors)
    return torch.optim.AdamW(params, **kwargs, **({"fused": True} if fused else {"foreach": True}))


def _tensors(params) -> list:
    """A parameter list (a lone tensor, or any iterable, as torch's optimizers take) as a list."""
    return [params] if isinstance(params, torch.Tensor) else list(params)


def build_data(cfg: TrainConfig, model_cfg, tokenizer=None):
    """(batches, tokenizer, corpus or None) for the configured data; raises `CorpusError` if unusable."""
    if isinstance(model_cfg, EncoderDecoderConfig) != cfg.data.startswith("seq2seq:"):
        raise TrainConfigError(f"data={cfg.data!r} does not fit a {type(model_cfg).__name__}: encoder–decoder models "
                               "train on 'seq2seq:TASK' data (copy, reverse, sort, date), the others on text")
    if isinstance(model_cfg, EncoderDecoderConfig):
        task = make_task(cfg.data, cfg.task_symbols, cfg.task_min_len, cfg.task_max_len)
        return Seq2SeqBatches(task, model_cfg.n_ctx_src, model_cfg.n_ctx_tgt), task.tokenizer, None
    seq_len = cfg.seq_len or model_cfg.n_ctx
    if cfg.data == "synthetic:repeat":
        tok = tokenizer or get_tokenizer("bytes")
        specials = {tok.bos_token_id, tok.pad_token_id, tok.eos_token_id}
        pool = [i for i in range(min(model_cfg.d_vocab, tok.vocab_size)) if i not in specials]
        return RepeatBatches(pool, tok.bos_token_id, seq_len), tok, None
    tok = tokenizer or get_tokenizer(cfg.tokenizer, cfg.data, cfg.cache_dir)
    corpus = build_token_corpus(cfg.data, tok, cfg.cache_dir)
    batches = TextBatches(corpus, seq_len, cfg.mixture())
    if cfg.repeat_until is not None and cfg.repeat_fraction > 0:
        batches = Curriculum(batches, TextBatches(corpus, seq_len), cfg.repeat_until)
    if cfg.synthetic_steps:
        first = RepeatBatches(corpus.seen_ids(), tok.bos_token_id, seq_len, min_len=cfg.repeat_min_len,
                              max_len=min(cfg.repeat_max_len, (seq_len - 1) // 2))
        batches = Curriculum(first, batches, cfg.synthetic_steps)
    return batches, tok, corpus


def make_task_of(model_cfg, cfg: TrainConfig, batches, tokenizer):
    """The training task of a model config (`models.training.tasks`)."""
    if isinstance(model_cfg, EncoderDecoderConfig):
        return Seq2Seq(batches, cfg)
    if isinstance(model_cfg, EncoderConfig):
        specials = {tokenizer.bos_token_id, tokenizer.pad_token_id, tokenizer.eos_token_id, model_cfg.mask_token_id}
        pool = [i for i in range(min(model_cfg.d_vocab, tokenizer.vocab_size)) if i not in specials]
        return MaskedLM(batches, model_cfg.mask_token_id, pool, cfg.mlm_probability)
    return LanguageModelling(batches)


def check_setup(model_cfg, cfg: TrainConfig, tokenizer, world_size: int) -> None:
    if cfg.batch_size % world_size:
        raise TrainConfigError(f"batch_size={cfg.batch_size} is not divisible by the {world_size} processes")
    if isinstance(model_cfg, EncoderDecoderConfig):
        for what, tok, field in (("source", tokenizer.source, "d_vocab_src"),
                                 ("target", tokenizer.target, "d_vocab_tgt")):
            if tok.vocab_size > getattr(model_cfg, field):
                raise TrainConfigError(f"the task's {what} vocabulary has {tok.vocab_size} ids but the model's "
                                       f"{field} is {getattr(model_cfg, field)}; set it >= {tok.vocab_size}")
        return
    if isinstance(model_cfg, EncoderConfig) and model_cfg.mask_token_id < tokenizer.vocab_size:
        raise TrainConfigError(f"mask_token_id={model_cfg.mask_token_id} is an id of the tokenizer; set d_vocab >= "
                               f"{tokenizer.vocab_size + 1} and mask_token_id to an id past the tokenizer's")
    seq_len = cfg.seq_len or model_cfg.n_ctx
    if model_cfg.positions.max_context is not None and seq_len > model_cfg.positions.max_context:
        raise TrainConfigError(f"seq_len={seq_len} exceeds the model's n_ctx={model_cfg.n_ctx}")
    if tokenizer.vocab_size > model_cfg.d_vocab:
        raise TrainConfigError(f"the tokenizer has {tokenizer.vocab_size} ids but the model's d_vocab is "
                               f"{model_cfg.d_vocab}; set d_vocab >= {tokenizer.vocab_size}")
    cfg.mixture().validate(seq_len)


def evaluate_loss(model, tokens: torch.Tensor, chunk: int = 16) -> float:
    """Mean next-token loss of `tokens` (float32), in chunks of `chunk` sequences."""
    return LanguageModelling(None).evaluate(model, tokens, chunk)


def train(model_cfg, cfg: TrainConfig, *, eval_fn=None, report_fn=None, resume: bool = False, tokenizer=None):
    """Train a model; returns `(model, summary)`. See the module docstring.

    `eval_fn(model) -> dict` runs at every checkpoint (rank 0). `report_fn(model, summary, metrics) ->
    {name: str | bytes}` adds files (a card, a figure) to the final folder. With `cfg.out_dir` the final
    folder holds config.json, model.safetensors, tokenizer.json, train_config.json, metrics.jsonl,
    summary.json and checkpoints/. `resume=True` continues from the newest checkpoint in `cfg.out_dir`.
    `cfg.out_dir` must be new, empty or an earlier run, not a seed sweep's member (`models.io.run_folder`); it is
    locked while the run lasts."""
    if isinstance(model_cfg, dict):
        model_cfg = config_from_json(json.dumps(model_cfg))  # by its model_type
    cfg.validate()
    check_train_sizes(model_cfg, cfg, TrainConfigError)  # before anything is built or read
    rank = dist_info()[0]
    if not cfg.out_dir:
        return _train(model_cfg, cfg, None, eval_fn, report_fn, resume, tokenizer)
    if rank != 0:  # rank 0 holds the folder; the others only read it
        return _train(model_cfg, cfg, check_folder(cfg.out_dir, "train", ts.legacy_mark), eval_fn, report_fn,
                      resume, tokenizer)
    with open_folder(cfg.out_dir, "train", ts.legacy_mark) as out:
        return _train(model_cfg, cfg, out, eval_fn, report_fn, resume, tokenizer)


def _train(model_cfg, cfg: TrainConfig, out: Path | None, eval_fn, report_fn, resume: bool, tokenizer):
    rank, world, local_rank = dist_info()
    if resume and out is None:
        raise TrainConfigError("resume needs an out_dir holding the checkpoints")
    if resume and tokenizer is None and (out / "train_config.json").is_file() and (out / "tokenizer.json").is_file():
        tokenizer = load_tokenizer(out / "tokenizer.json")
    device = _device_and_group(cfg, world, local_rank)
    if world > 1 and rank != 0:  # rank 0 tokenizes and caches the corpus first; the others then read the cache
        dist.barrier()
    batches, tokenizer, corpus = build_data(cfg, model_cfg, tokenizer)
    if world > 1 and rank == 0:
        dist.barrier()
    check_setup(model_cfg, cfg, tokenizer, world)
    task = make_task_of(model_cfg, cfg, batches, tokenizer)
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    if model_cfg.seed is None:
        model_cfg = model_cfg.replace(seed=cfg.seed)
    data = {"task": cfg.data} if isinstance(task, Seq2Seq) else {"tokenizer": cfg.tokenizer}
    model_cfg = model_cfg.replace(device=str(device), extra=dict(model_cfg.extra, **data))
    model = model_class(model_cfg)(model_cfg)
    model.tokenizer = tokenizer  # attached from the start: every checkpoint folder carries it
    init_positions(model, cfg.pos_init)
    run = _Run(cfg, model, make_optimizer(model, cfg), task, device, rank, world, out, eval_fn)
    if out is not None and rank == 0:
        out.mkdir(parents=True, exist_ok=True)
    found = ts.resumable_checkpoints(out) if (resume and out is not None) else []
    if resume and out is not None and (done := ts.finished_run(out, cfg.steps, found)) is not None:
        ts.resume_changes(out, cfg, model, found)  # a finished run is resumed only with its own model and settings
        return load(out, device=device), done
    run.step, run.tokens_seen, run.wall_before = ts.restore(out, cfg, model, run.opt, found, rank)
    if out is not None and rank == 0:
        claim(out, "train")  # every check passed: the folder is this run's
        atomic_write_text(out / ts.RUN_MARK, cfg.to_json())
        atomic_write(out / "tokenizer.json", tokenizer.save)
    if world > 1:  # wraps the model once its weights are final (restored or initialised)
        from torch.nn.parallel import DistributedDataParallel

        run.ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    run.loop()
    summary = {"steps": cfg.steps, "tokens_seen": run.tokens_seen, "world_size": world, "device": str(device),
               "wall_time": run.wall_time()}
    if out is not None and rank == 0:
        metrics = ts.read_metrics(out / ts.METRICS_FILE)
        last_val = [r["val_loss"] for r in metrics if "val_loss" in r]
        summary["final_val_loss"] = last_val[-1] if last_val else task.evaluate(model, run.val)
        for key in ("exact_match",):
            found_key = [r[key] for r in metrics if key in r]
            if found_key:
                summary[f"final_{key}"] = found_key[-1]
        summary["wall_time"] = max([summary["wall_time"]] + [r.get("wall_time", 0) for r in metrics])
        if corpus is not None:
            summary["unigram_val_loss"] = unigram_baseline_loss(corpus)
            summary["train_tokens_in_corpus"] = int(corpus.train.size)
            summary["val_tokens_in_corpus"] = int(corpus.val.size)
            summary["corpus"] = corpus.record()  # the text's name and sha256 (models.data.corpora)
        extra = dict(report_fn(model, summary, metrics)) if report_fn is not None else {}
        finalize(model, out, cfg, summary, extra)
    if run.ddp is not None:
        dist.barrier()
    return model, summary


def _device_and_group(cfg: TrainConfig, world: int, local_rank: int) -> torch.device:
    """The device to train on; under `torchrun` (world > 1) also the process group (NCCL on GPUs, gloo on CPUs)."""
    device = pick_device(cfg.device)
    if device.type == "cuda" and world > 1:
        device = torch.device("cuda", local_rank)
    if world > 1 and not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return device


class _Run:
    """The loop of one run: its step counter, tokens seen and clock, the optimisation step and the records."""

    def __init__(self, cfg: TrainConfig, model, opt, task, device, rank: int, world: int, out: Path | None, eval_fn):
        self.cfg, self.model, self.opt, self.task, self.device = cfg, model, opt, task, device
        self.rank, self.world, self.out, self.eval_fn = rank, world, out, eval_fn
        self.val = torch.as_tensor(task.batches.val_batch(cfg.val_sequences)).to(device)
        self.schedule = set(ts.checkpoint_steps(cfg.steps, cfg.checkpoint_every, cfg.log_checkpoints,
                                                     dense=cfg.dense_checkpoints))
        self.step, self.tokens_seen, self.wall_before, self.t0 = 0, 0, 0.0, time.perf_counter()
        self.ddp = None  # DistributedDataParallel(model) under torchrun

    def wall_time(self) -> float:
        """Seconds of training, including the runs this one resumed."""
        return round(self.wall_before + time.perf_counter() - self.t0, 3)

    def record(self, step: int, loss_sum: float, n: int, t_interval: float, tok_interval: int) -> dict:
        """One metrics.jsonl record: mean training loss since the last, validation loss every `eval_every` steps and
        at checkpoints, and `eval_fn`'s scores at checkpoints."""
        cfg, model = self.cfg, self.model
        rec = {"step": step, "tokens": self.tokens_seen, "lr": lr_at(cfg, max(step - 1, 0)),
               "wall_time": self.wall_time(),
               "loadavg_1min": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None}
        if n:
            rec["train_loss"] = loss_sum / n
            rec["tokens_per_s"] = tok_interval / max(t_interval, 1e-9)
        if (cfg.eval_every and step % cfg.eval_every == 0) or step in self.schedule:
            rec["val_loss"] = self.task.evaluate(model, self.val)
        if step in self.schedule:
            rec.update(self.task.metrics(model))
        if step in self.schedule and self.eval_fn is not None:
            model.eval()
            rec.update(self.eval_fn(model))
            model.train()
        return rec

    def optimise(self, step: int, autocast) -> torch.Tensor:
        """One AdamW step on the batch of `step` (a pure function of the seed and the step); returns the loss."""
        cfg, opt = self.cfg, self.opt
        lr = lr_at(cfg, step)
        for g in opt.param_groups:
            g["lr"] = lr * g["lr_scale"]
        rows = torch.as_tensor(self.task.batches.batch(cfg.seed, step, cfg.batch_size, self.rank, self.world))
        rows = rows.to(self.device)
        loss = self.task.loss(self.ddp or self.model, rows, cfg, step, autocast, self.model, (self.rank, self.world))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
        opt.step()
        self.tokens_seen += cfg.batch_size * rows.shape[1]
        loss = loss.detach()
        if self.ddp is not None:  # the mean over all ranks
            cuda = self.device.type == "cuda"
            dist.all_reduce(loss, op=dist.ReduceOp.AVG if cuda else dist.ReduceOp.SUM)
            loss = loss if cuda else loss / self.world
        return loss

    def loop(self) -> None:
        """Steps `self.step` to `cfg.steps`, logging every `log_every` steps and checkpointing on the schedule."""
        cfg, model, out, rank = self.cfg, self.model, self.out, self.rank
        bar = None
        if cfg.progress and rank == 0:
            from tqdm.auto import tqdm

            bar = tqdm(total=cfg.steps, initial=self.step, desc="train", unit="step", dynamic_ncols=True)
        autocast = torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.device.type == "cuda")
        self.t0 = time.perf_counter()
        model.train()
        loss_sum, n_loss, t_mark, tok_mark = 0.0, 0, time.perf_counter(), self.tokens_seen
        if self.step == 0 and out is not None and rank == 0:
            ts.append_metrics(out / ts.METRICS_FILE, self.record(0, 0.0, 0, 0.0, 0))
            ts.save_checkpoint(out, 0, model, self.opt, {"tokens_seen": 0, "wall_time": 0.0})
        for step in range(self.step, cfg.steps):
            loss_sum, n_loss = loss_sum + float(self.optimise(step, autocast)), n_loss + 1
            done = self.step = step + 1
            if bar is not None:
                bar.update(1)
            if done % cfg.log_every == 0 or done in self.schedule or done == cfg.steps:
                now = time.perf_counter()
                if rank == 0:
                    rec = self.record(done, loss_sum, n_loss, now - t_mark, self.tokens_seen - tok_mark)
                    if bar is not None:
                        bar.set_postfix(loss=f"{rec['train_loss']:.3f}", tok_s=f"{rec['tokens_per_s']:.0f}")
                    if out is not None:
                        ts.append_metrics(out / ts.METRICS_FILE, rec)
                        if done in self.schedule:
                            ts.save_checkpoint(out, done, model, self.opt, {
                                "tokens_seen": self.tokens_seen, "wall_time": rec["wall_time"]})
                if self.ddp is not None:
                    dist.barrier()
                loss_sum, n_loss, t_mark, tok_mark = 0.0, 0, time.perf_counter(), self.tokens_seen
        if bar is not None:
            bar.close()


def finalize(model, out: Path, cfg: TrainConfig, summary: dict, extra: dict) -> Path:
    """Write the final folder atomically: the model (`models.io.checkpoint.save` into a staging folder), the
    run's files, `extra` files and the kept checkpoints, hard-linked where possible; other files the folder held are
    copied over."""
    stage = out.parent / f".{out.name}.final-{os.getpid()}"
    save(model, stage, extra_files={"summary.json": json.dumps(summary, indent=2), **extra})
    keep = None if cfg.keep_checkpoints is None else set(cfg.keep_checkpoints)
    carried = ts.ship_files(out, keep, with_state=keep is None)
    for name in (ts.METRICS_FILE, "train_config.json"):
        carried[name] = out / name

    def write(tmp: Path) -> None:
        for f in stage.iterdir():
            os.link(f, tmp / f.name)
        for name, src in carried.items():
            dst = tmp / name
            dst.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(src, dst)
            except OSError:
                shutil.copy2(src, dst)
        for f in out.iterdir():  # what else the run folder holds (a user's notes) stays
            if not (tmp / f.name).exists() and f.name != ts.CHECKPOINTS:
                (shutil.copytree if f.is_dir() else shutil.copy2)(f, tmp / f.name)

    try:
        return atomic_write_dir(out, write)
    finally:
        shutil.rmtree(stage, ignore_errors=True)

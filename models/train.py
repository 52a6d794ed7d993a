"""A resumable, deterministic training loop for toy transformers (single process or DDP under `torchrun`).

`train(model_cfg, train_cfg, eval_fn=None, resume=False)`: AdamW with linear warm-up and cosine decay,
gradient clipping, optional label smoothing, the config's initialisation (seeded), bf16 autocast on GPU.
The batch of step `s` is a pure function of `(seed, s)` (`models.data`), and checkpoints carry optimizer and
RNG states, so a run killed at any point and resumed ends with bitwise the same weights on CPU.
`eval_fn(model) -> dict` (e.g. induction / previous-token / in-context-learning scores built in `analyses`)
runs at every checkpoint; its values go into `metrics.jsonl`. models/ never imports analyses/.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import train_state as ts
from .config import HookedTransformerConfig
from .data import Curriculum, Mixture, RepeatBatches, TextBatches, build_token_corpus, get_tokenizer
from .errors import TrainConfigError
from .model import HookedTransformer, lm_cross_entropy
from .positions import sinusoidal_table


@dataclass
class TrainConfig:
    """Settings of one training run (JSON round-trip with `to_json` / `from_json`)."""

    steps: int = 1000
    batch_size: int = 32  # global: data-parallel ranks each take batch_size / world_size rows
    seq_len: int | None = None  # default: the model's n_ctx
    lr: float = 1e-3
    min_lr_ratio: float = 0.1  # cosine decay from lr to lr * min_lr_ratio
    warmup_steps: int = 100
    weight_decay: float = 0.01  # on weight matrices only (not norms, biases, embeddings' positions)
    lr_multipliers: dict = field(default_factory=dict)  # {parameter leaf name, e.g. "W_Q": factor on lr}
    betas: tuple = (0.9, 0.99)
    grad_clip: float | None = 1.0
    label_smoothing: float = 0.0
    seed: int = 0
    data: str = "stdlib"  # "stdlib", a folder or file path, or "synthetic:repeat"
    tokenizer: str = "bpe-2048"  # "bytes", "bpe-<N>" (trained on the training split), or a tokenizer.json
    repeat_fraction: float = 0.0  # fraction of sequences with a repeated segment (models.data.Mixture)
    repeat_min_len: int = 8
    repeat_max_len: int = 64
    repeat_random_fraction: float = 0.5
    repeat_fill: bool = False  # the segment repeats to the end of the sequence (Mixture.fill)
    synthetic_steps: int = 0  # curriculum: the first N steps train on `[BOS] + R + R + ...` of the corpus's ids
    repeat_until: int | None = None  # repeated segments only before this step; natural text only from it on
    pos_init: str = "normal"  # learned positions start as Normal(0, init_range) or a scaled sinusoidal table
    checkpoint_every: int = 500
    log_checkpoints: int = 12  # log-spaced early checkpoints
    keep_checkpoints: list | None = None  # at the end keep only these steps' weights; None keeps everything
    eval_every: int = 100  # validation loss
    val_sequences: int = 64
    log_every: int = 10
    device: str = "auto"  # auto = cuda, then mps, then cpu
    num_threads: int | None = None
    out_dir: str | None = None
    cache_dir: str | None = None
    progress: bool = True
    extra: dict = field(default_factory=dict)

    def validate(self) -> None:
        def positive(name, allow_zero=False):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < (0 if allow_zero else 1):
                raise TrainConfigError(f"{name} must be an int >= {0 if allow_zero else 1}, got {v!r}")

        for n in ("steps", "batch_size", "val_sequences", "log_every"):
            positive(n)
        for n in ("warmup_steps", "checkpoint_every", "log_checkpoints", "eval_every", "seed", "synthetic_steps"):
            positive(n, allow_zero=True)
        if self.seq_len is not None and (not isinstance(self.seq_len, int) or self.seq_len < 2):
            raise TrainConfigError(f"seq_len must be an int >= 2 (or None for n_ctx), got {self.seq_len!r}")
        if not (isinstance(self.lr, (int, float)) and 0 < self.lr < 10):
            raise TrainConfigError(f"lr must be a number in (0, 10), got {self.lr!r}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise TrainConfigError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.weight_decay < 0:
            raise TrainConfigError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise TrainConfigError(f"betas must be two numbers in [0, 1), got {self.betas!r}")
        if self.grad_clip is not None and self.grad_clip <= 0:
            raise TrainConfigError(f"grad_clip must be > 0 or None, got {self.grad_clip}")
        if not 0 <= self.label_smoothing < 1:
            raise TrainConfigError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")
        if self.device not in ("auto", "cpu", "mps") and not str(self.device).startswith("cuda"):
            raise TrainConfigError(f"device must be auto, cpu, cuda[:N] or mps, got {self.device!r}")
        if not isinstance(self.lr_multipliers, dict) or not all(
                isinstance(v, (int, float)) and v > 0 for v in self.lr_multipliers.values()):
            raise TrainConfigError(f"lr_multipliers must map parameter names to positive numbers, got "
                                   f"{self.lr_multipliers!r}")
        if self.repeat_until is not None and (not isinstance(self.repeat_until, int) or self.repeat_until < 0):
            raise TrainConfigError(f"repeat_until must be an int >= 0 or None, got {self.repeat_until!r}")
        if self.pos_init not in POS_INITS:
            raise TrainConfigError(f"pos_init must be one of {POS_INITS}, got {self.pos_init!r}")
        if self.num_threads is not None and self.num_threads < 1:
            raise TrainConfigError(f"num_threads must be >= 1, got {self.num_threads}")
        try:
            self.mixture().validate(max(self.seq_len or 10**6, 2))
        except ValueError as e:
            raise TrainConfigError(str(e)) from None

    def mixture(self) -> Mixture:
        return Mixture(self.repeat_fraction, self.repeat_min_len, self.repeat_max_len, self.repeat_random_fraction,
                       self.repeat_fill)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["betas"] = list(self.betas)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> TrainConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise TrainConfigError(f"unknown training setting(s) {unknown}; allowed: {sorted(names)}")
        d = dict(d)
        if "betas" in d:
            d["betas"] = tuple(d["betas"])
        return cls(**d)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> TrainConfig:
        try:
            return cls.from_dict(json.loads(text))
        except json.JSONDecodeError as e:
            raise TrainConfigError(f"training config is not valid JSON: {e}") from None


POS_INITS = ("normal", "sinusoidal")


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
    table = sinusoidal_table(model.cfg.n_ctx, model.cfg.d_model, torch.float64)
    model.pos_embed.W_pos.copy_(table * (model.cfg.init_range * 2**0.5))


#: Settings that may differ between a run and its resumption (they do not change the trajectory).
RESUME_FREE = ("steps", "device", "progress", "out_dir", "cache_dir", "num_threads", "keep_checkpoints", "extra")


def lr_at(cfg: TrainConfig, step: int) -> float:
    """Linear warm-up over `warmup_steps`, then cosine decay to `lr * min_lr_ratio` at `steps`."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    frac = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))


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
    """AdamW; weight decay on the weight matrices (`W_*` except `W_pos`), none on norms and biases; one
    parameter group per (decay, lr multiplier), the multiplier stored in the group as `lr_scale`."""
    leaves = {name.rsplit(".", 1)[-1] for name, _ in model.named_parameters()}
    unknown = sorted(set(cfg.lr_multipliers) - leaves)
    if unknown:
        raise TrainConfigError(f"lr_multipliers name parameters this model does not have: {unknown}; its "
                               f"parameters: {sorted(leaves)}")
    groups: dict = {}
    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        decay = cfg.weight_decay if leaf.startswith("W_") and leaf != "W_pos" else 0.0
        scale = float(cfg.lr_multipliers.get(leaf, 1.0))
        groups.setdefault((decay, scale), []).append(p)
    param_groups = [{"params": ps, "weight_decay": d, "lr_scale": s} for (d, s), ps in sorted(groups.items())]
    return torch.optim.AdamW(param_groups, lr=cfg.lr, betas=tuple(cfg.betas), foreach=True)


def build_data(cfg: TrainConfig, model_cfg: HookedTransformerConfig, tokenizer=None):
    """(batches, tokenizer, corpus or None) for the configured data; raises `CorpusError` if unusable."""
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


def check_setup(model_cfg: HookedTransformerConfig, cfg: TrainConfig, tokenizer, world_size: int) -> None:
    seq_len = cfg.seq_len or model_cfg.n_ctx
    if model_cfg.positions.max_context is not None and seq_len > model_cfg.positions.max_context:
        raise TrainConfigError(f"seq_len={seq_len} exceeds the model's n_ctx={model_cfg.n_ctx}")
    if tokenizer.vocab_size > model_cfg.d_vocab:
        raise TrainConfigError(f"the tokenizer has {tokenizer.vocab_size} ids but the model's d_vocab is "
                               f"{model_cfg.d_vocab}; set d_vocab >= {tokenizer.vocab_size}")
    if cfg.batch_size % world_size:
        raise TrainConfigError(f"batch_size={cfg.batch_size} is not divisible by the {world_size} processes")
    cfg.mixture().validate(seq_len)


@torch.no_grad()
def evaluate_loss(model, tokens: torch.Tensor, chunk: int = 16) -> float:
    """Mean next-token loss of `tokens` (float32), in chunks of `chunk` sequences."""
    was = model.training
    model.eval()
    total = 0.0
    for i in range(0, tokens.shape[0], chunk):
        t = tokens[i : i + chunk]
        total += float(lm_cross_entropy(model(t), t)) * t.shape[0]
    model.train(was)
    return total / tokens.shape[0]


def train(model_cfg, cfg: TrainConfig, *, eval_fn=None, report_fn=None, resume: bool = False, tokenizer=None):
    """Train a model; returns `(model, summary)`. See the module docstring.

    `eval_fn(model) -> dict` runs at every checkpoint (rank 0). `report_fn(model, summary, metrics) ->
    {name: str | bytes}` adds files (a card, a figure) to the final folder. With `cfg.out_dir` the final
    folder holds config.json, model.safetensors, tokenizer.json, train_config.json, metrics.jsonl,
    summary.json and checkpoints/. `resume=True` continues from the newest checkpoint in `cfg.out_dir`."""
    if isinstance(model_cfg, dict):
        model_cfg = HookedTransformerConfig.from_dict(model_cfg)
    cfg.validate()
    rank, world, local_rank = dist_info()
    out = Path(cfg.out_dir) if cfg.out_dir else None
    if resume and out is None:
        raise TrainConfigError("resume needs an out_dir holding the checkpoints")
    if resume and out is not None and (out / "train_config.json").is_file() and tokenizer is None:
        from .tokenizer import load_tokenizer

        if (out / "tokenizer.json").is_file():
            tokenizer = load_tokenizer(out / "tokenizer.json")
    device = pick_device(cfg.device)
    if device.type == "cuda" and world > 1:
        device = torch.device("cuda", local_rank)
    if world > 1:
        import torch.distributed as dist

        if not dist.is_initialized():
            if device.type == "cuda":
                torch.cuda.set_device(device)
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        if rank != 0:  # rank 0 tokenizes and caches the corpus first; the others then read the cache
            dist.barrier()
    batches, tokenizer, corpus = build_data(cfg, model_cfg, tokenizer)
    if world > 1 and rank == 0:
        dist.barrier()
    check_setup(model_cfg, cfg, tokenizer, world)
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    if model_cfg.seed is None:
        model_cfg = model_cfg.replace(seed=cfg.seed)
    model_cfg = model_cfg.replace(device=str(device), extra=dict(model_cfg.extra, tokenizer=cfg.tokenizer))
    model = HookedTransformer(model_cfg)
    init_positions(model, cfg.pos_init)
    opt = make_optimizer(model, cfg)
    seq_len = cfg.seq_len or model_cfg.n_ctx
    val = torch.as_tensor(batches.val_batch(cfg.val_sequences)).to(device)
    schedule = set(ts.checkpoint_steps(cfg.steps, cfg.checkpoint_every, cfg.log_checkpoints))

    start, tokens_seen, wall_before = 0, 0, 0.0
    if out is not None and rank == 0:
        out.mkdir(parents=True, exist_ok=True)
    found = ts.resumable_checkpoints(out) if (resume and out is not None) else []
    if resume and out is not None and (out / "summary.json").is_file():
        done_summary = json.loads((out / "summary.json").read_text())
        if done_summary.get("steps") == cfg.steps and (not found or int(found[-1].name[5:]) >= cfg.steps):
            from .checkpoint import load

            return load(out, device=device), done_summary
    if found:
        saved = TrainConfig.from_json((out / "train_config.json").read_text())
        diff = [k for k in saved.to_dict() if k not in RESUME_FREE and saved.to_dict()[k] != cfg.to_dict()[k]]
        if diff:
            raise TrainConfigError(f"cannot resume from {out}: setting(s) {diff} differ from the saved run's "
                                   "train_config.json")
        state = ts.load_checkpoint(found[-1], model, opt)
        start, tokens_seen, wall_before = state["step"], state["tokens_seen"], state["wall_time"]
        if rank == 0:
            ts.truncate_metrics(out / ts.METRICS_FILE, start)
    elif out is not None and rank == 0:
        (out / ts.METRICS_FILE).unlink(missing_ok=True)
        if (out / ts.CHECKPOINTS).exists():
            shutil.rmtree(out / ts.CHECKPOINTS)
    if out is not None and rank == 0:
        (out / "train_config.json").write_text(cfg.to_json())
        tokenizer.save(out / "tokenizer.json")

    ddp = None
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel

        ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    net = ddp or model
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")

    def record(step: int, loss_sum: float, n: int, t_interval: float, tok_interval: int) -> dict:
        rec = {"step": step, "tokens": tokens_seen, "lr": lr_at(cfg, max(step - 1, 0)),
               "wall_time": round(wall_before + time.perf_counter() - t0, 3),
               "loadavg_1min": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None}
        if n:
            rec["train_loss"] = loss_sum / n
            rec["tokens_per_s"] = tok_interval / max(t_interval, 1e-9)
        if step % cfg.eval_every == 0 or step in schedule:
            rec["val_loss"] = evaluate_loss(model, val)
        if step in schedule and eval_fn is not None:
            model.eval()
            rec.update(eval_fn(model))
            model.train()
        return rec

    bar = None
    if cfg.progress and rank == 0:
        from tqdm.auto import tqdm

        bar = tqdm(total=cfg.steps, initial=start, desc="train", unit="step", dynamic_ncols=True)
    t0 = time.perf_counter()
    model.train()
    loss_sum, n_loss, t_mark, tok_mark = 0.0, 0, time.perf_counter(), tokens_seen
    if start == 0 and out is not None and rank == 0:
        ts.append_metrics(out / ts.METRICS_FILE, record(0, 0.0, 0, 0.0, 0))
        ts.save_checkpoint(out, 0, model, opt, {"tokens_seen": 0, "wall_time": 0.0})
    for step in range(start, cfg.steps):
        lr = lr_at(cfg, step)
        for g in opt.param_groups:
            g["lr"] = lr * g["lr_scale"]
        tokens = torch.as_tensor(batches.batch(cfg.seed, step, cfg.batch_size, rank, world)).to(device)
        with autocast:
            logits = net(tokens)
        loss = lm_cross_entropy(logits, tokens, label_smoothing=cfg.label_smoothing)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        tokens_seen += cfg.batch_size * seq_len
        lv = loss.detach()
        if ddp is not None:
            import torch.distributed as dist

            dist.all_reduce(lv, op=dist.ReduceOp.AVG if device.type == "cuda" else dist.ReduceOp.SUM)
            lv = lv / world if device.type != "cuda" else lv
        loss_sum, n_loss = loss_sum + float(lv), n_loss + 1
        done = step + 1
        if bar is not None:
            bar.update(1)
        if done % cfg.log_every == 0 or done in schedule or done == cfg.steps:
            now = time.perf_counter()
            if rank == 0:
                rec = record(done, loss_sum, n_loss, now - t_mark, tokens_seen - tok_mark)
                if bar is not None:
                    bar.set_postfix(loss=f"{rec['train_loss']:.3f}", tok_s=f"{rec['tokens_per_s']:.0f}")
                if out is not None:
                    ts.append_metrics(out / ts.METRICS_FILE, rec)
                    if done in schedule:
                        ts.save_checkpoint(out, done, model, opt, {
                            "tokens_seen": tokens_seen, "wall_time": rec["wall_time"]})
            if ddp is not None:
                torch.distributed.barrier()
            loss_sum, n_loss, t_mark, tok_mark = 0.0, 0, time.perf_counter(), tokens_seen
    if bar is not None:
        bar.close()
    model.tokenizer = tokenizer
    summary = {"steps": cfg.steps, "tokens_seen": tokens_seen, "world_size": world, "device": str(device),
               "wall_time": round(wall_before + time.perf_counter() - t0, 3)}
    if out is not None and rank == 0:
        metrics = ts.read_metrics(out / ts.METRICS_FILE)
        last_val = [r["val_loss"] for r in metrics if "val_loss" in r]
        summary["final_val_loss"] = last_val[-1] if last_val else evaluate_loss(model, val)
        summary["wall_time"] = max([summary["wall_time"]] + [r.get("wall_time", 0) for r in metrics])
        if corpus is not None:
            from .data import unigram_baseline_loss

            summary["unigram_val_loss"] = unigram_baseline_loss(corpus)
            summary["train_tokens_in_corpus"] = int(corpus.train.size)
            summary["val_tokens_in_corpus"] = int(corpus.val.size)
        extra = dict(report_fn(model, summary, metrics)) if report_fn is not None else {}
        finalize(model, out, cfg, summary, extra)
    if ddp is not None:
        torch.distributed.barrier()
    return model, summary


def finalize(model, out: Path, cfg: TrainConfig, summary: dict, extra: dict) -> Path:
    """Write the final folder atomically: the model (`models.checkpoint.save` into a staging folder), the
    run's files, `extra` files and the kept checkpoints, hard-linked where possible."""
    from .checkpoint import atomic_write_dir, save

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

    try:
        return atomic_write_dir(out, write)
    finally:
        shutil.rmtree(stage, ignore_errors=True)

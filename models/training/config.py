"""Settings of a training run (`TrainConfig`, validated before anything starts) and the learning-rate schedule."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import ClassVar

from ..data.batches import Mixture
from ..errors import TrainConfigError


@dataclass
class TrainConfig:
    """Settings of one training run (JSON round-trip with `to_json` / `from_json`)."""

    MAX_SEED: ClassVar[int] = 2**32 - 1  # the largest seed every generator takes (NumPy's legacy one included)

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
    data: str = "stdlib"  # "stdlib" (the pinned snapshot), "python-stdlib", a folder or file path, "synthetic:repeat"
    tokenizer: str = "bpe-2048"  # "bytes", "bpe-<N>" (trained on the training split), or a tokenizer.json
    repeat_fraction: float = 0.0  # fraction of sequences with a repeated segment (models.data.batches.Mixture)
    repeat_min_len: int = 8
    repeat_max_len: int = 64
    repeat_random_fraction: float = 0.5
    repeat_fill: bool = False  # the segment repeats to the end of the sequence (Mixture.fill)
    synthetic_steps: int = 0  # curriculum: the first N steps train on `[BOS] + R + R + ...` of the corpus's ids
    repeat_until: int | None = None  # repeated segments only before this step; natural text only from it on
    task_symbols: int = 10  # seq2seq:copy / reverse / sort / cumsum: the alphabet's size (letters a, b, ...)
    task_min_len: int = 1  # seq2seq:copy / reverse / sort: source lengths drawn from [task_min_len, task_max_len]
    task_max_len: int = 8
    exact_match_sequences: int = 512  # seq2seq: held-out sources decoded greedily at every checkpoint
    sampling_schedule: str = "none"  # seq2seq: teacher forcing ("none") or scheduled sampling (train_tasks)
    sampling_max: float = 0.5  # scheduled sampling: the own-prediction probability rises towards this
    sampling_k: float | None = None  # scheduled sampling: the schedule's constant (train_tasks.sampling_probability)
    mlm_probability: float = 0.15  # encoder MLM: fraction of positions predicted (BERT's 80/10/10 replacement)
    pos_init: str = "normal"  # learned positions start as Normal(0, init_range) or a scaled sinusoidal table
    checkpoint_every: int = 500
    log_checkpoints: int = 12  # log-spaced early checkpoints
    dense_checkpoints: list | None = None  # [start, stop, k]: also a checkpoint every k-th step, start to stop
    keep_checkpoints: list | None = None  # at the end keep only these steps' weights; None keeps everything
    eval_every: int = 100  # validation loss and head scores every this many steps (0: at checkpoints only)
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
        if self.seed > self.MAX_SEED:
            raise TrainConfigError(f"seed must be an int in 0 … {self.MAX_SEED}, got {self.seed!r}")
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
        for n in ("task_symbols", "task_min_len", "task_max_len", "exact_match_sequences"):
            positive(n)
        if self.sampling_schedule not in SAMPLING_SCHEDULES:
            raise TrainConfigError(f"sampling_schedule must be one of {SAMPLING_SCHEDULES}, got "
                                   f"{self.sampling_schedule!r}")
        for n in ("sampling_max", "mlm_probability"):
            v = getattr(self, n)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v <= 1:
                raise TrainConfigError(f"{n} must be a number in [0, 1], got {v!r}")
        if self.sampling_k is not None and (not isinstance(self.sampling_k, (int, float)) or not self.sampling_k > 0):
            raise TrainConfigError(f"sampling_k must be a number > 0 or None, got {self.sampling_k!r}")
        if self.pos_init not in POS_INITS:
            raise TrainConfigError(f"pos_init must be one of {POS_INITS}, got {self.pos_init!r}")
        d = self.dense_checkpoints
        if d is not None and not (isinstance(d, (list, tuple)) and len(d) == 3
                                  and all(isinstance(v, int) and not isinstance(v, bool) for v in d)
                                  and 0 <= d[0] <= d[1] and d[2] >= 1):
            raise TrainConfigError(f"dense_checkpoints must be [start, stop, every] with 0 <= start <= stop and "
                                   f"every >= 1 (ints), got {d!r}")
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
SAMPLING_SCHEDULES = ("none", "linear", "exponential", "inverse_sigmoid")


#: Settings that may differ between a run and its resumption (they do not change the trajectory).
RESUME_FREE = ("steps", "device", "progress", "out_dir", "cache_dir", "num_threads", "keep_checkpoints", "extra",
               "dense_checkpoints", "log_checkpoints")


def shortened(cfg: TrainConfig, steps: int, fixed=()) -> tuple[TrainConfig, list[str]]:
    """`(settings, notes)`: `cfg`, whose schedule was written for `cfg.steps` steps (a preset's), for a run of `steps`
    steps instead (`circuits train --steps`), so that a short run costs about its share of the full one. With
    `steps == cfg.steps` nothing changes. Otherwise `keep_checkpoints` keeps the steps up to `steps`, and `steps`;
    and for a shorter run, with f = steps / cfg.steps:

    - `log_checkpoints`, the log-spaced early checkpoints (each evaluates head scores and the ICL score, which
      together cost about as much as 25 training steps of `attn-only-2l`), becomes round(f · log_checkpoints); the
      regular checkpoints (`checkpoint_every`), validations (`eval_every`) and the `dense_checkpoints` window lie at
      fixed steps, so they thin out with the run by themselves; checkpoints 0 and `steps` stay;
    - a warm-up as long as the run or longer (the learning rate would never reach its peak), from a schedule whose
      warm-up was shorter than its run, becomes max(1, round(f · warmup_steps)): the same share of the run.

    Names in `fixed` (settings the user gave explicitly) keep their values. `notes`: what to tell the user about a
    shorter run (the scaled warm-up, or a warm-up left as long as the run or longer)."""
    import dataclasses

    new, notes = {"steps": steps}, []
    if steps != cfg.steps and "keep_checkpoints" not in fixed and cfg.keep_checkpoints is not None:
        new["keep_checkpoints"] = sorted({s for s in cfg.keep_checkpoints if s <= steps} | {steps})
    if steps < cfg.steps:
        f = steps / cfg.steps
        if "log_checkpoints" not in fixed:
            new["log_checkpoints"] = round(f * cfg.log_checkpoints)
        if "warmup_steps" not in fixed and steps <= cfg.warmup_steps < cfg.steps:
            new["warmup_steps"] = max(1, round(f * cfg.warmup_steps))
            notes.append(f"a warm-up of {cfg.warmup_steps} steps is not shorter than the run's {steps}: scaled to "
                         f"{new['warmup_steps']}, its share of the {cfg.steps}-step schedule")
    out = dataclasses.replace(cfg, **new)
    if steps < cfg.steps and out.warmup_steps >= out.steps:
        notes.append(f"the warm-up ({out.warmup_steps} steps) is not shorter than the run ({out.steps} steps): the "
                     "learning rate never reaches its peak (set warmup_steps below steps)")
    return out, notes


def lr_at(cfg: TrainConfig, step: int) -> float:
    """Linear warm-up over `warmup_steps`, then cosine decay to `lr * min_lr_ratio` at `steps`."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    frac = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))

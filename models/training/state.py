"""Resumable training state on disk: checkpoint schedule, checkpoint folders, resuming, metrics.jsonl.

A checkpoint is a folder `checkpoints/step-000123/` written atomically (`atomic_write_dir`) holding
`config.json` + `model.safetensors` + `tokenizer.json` (a loadable model, `models.load(folder)`),
`optimizer.safetensors` (AdamW moments and step counts, plus the torch/cuda RNG states as uint8 tensors) and
`trainer_state.json` (step, tokens seen, wall time, optimizer hyper-parameters, Python and NumPy RNG states). No
pickle anywhere.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import torch

from ..errors import CheckpointError, TrainConfigError
from ..files.atomic import atomic_write_text
from ..io.checkpoint import CHECKPOINTS, CONFIG_FILE, WEIGHTS_FILE, load_state_dict, read_config, read_safetensors, save
from ..io.readers import read_metrics, read_summary, read_train_config, read_trainer_state  # noqa: F401  (re-exported)
from ..io.run_folder import Mark, owner
from .config import RESUME_FREE, TrainConfig

OPTIMIZER_FILE, STATE_FILE, METRICS_FILE = "optimizer.safetensors", "trainer_state.json", "metrics.jsonl"


def checkpoint_steps(steps: int, every: int, n_log: int, first: int = 10, dense=None) -> list[int]:
    """Steps to checkpoint at: 0 (the initialisation), `n_log` log-spaced steps from `first` to `steps`
    (the phase change needs early ones), every `every` steps, the last step, and with `dense = [start, stop, k]`
    every k-th step from start to stop (a window around a phase change, so its rise and crossing are resolved)."""
    out = {0, steps}
    if dense:
        start, stop, k = dense
        out |= set(range(start, stop + 1, k))
    if n_log > 0 and steps > first:
        out |= {int(round(x)) for x in np.geomspace(first, steps, n_log)}
    if every > 0:
        out |= set(range(every, steps + 1, every))
    return sorted(s for s in out if 0 <= s <= steps)


def step_dir(out_dir, step: int) -> Path:
    return Path(out_dir) / CHECKPOINTS / f"step-{step:06d}"


# --- RNG state as data ----------------------------------------------------------------------------
def rng_state_json() -> dict:
    py = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {"python": [py[0], list(py[1]), py[2]],
            "numpy": [name, keys.tolist(), int(pos), int(has_gauss), float(cached)]}


def set_rng_state_json(d: dict) -> None:
    v, state, gauss = d["python"]
    random.setstate((v, tuple(state), gauss))
    name, keys, pos, has_gauss, cached = d["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))


# --- optimizer state as data ----------------------------------------------------------------------
def optimizer_tensors(opt: torch.optim.Optimizer) -> tuple[dict, list]:
    """(`{"state.{i}.{name}": tensor}`, param_groups without tensors) from `opt.state_dict()`."""
    sd = opt.state_dict()
    tensors = {}
    for idx, st in sd["state"].items():
        for name, value in st.items():
            t = value if isinstance(value, torch.Tensor) else torch.tensor(value)
            tensors[f"state.{idx}.{name}"] = t.detach().to("cpu").contiguous()
    groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()} for g in sd["param_groups"]]
    return tensors, groups


IMPLEMENTATION = ("foreach", "fused")  # an optimizer's param-group settings that choose its kernel


def load_optimizer(opt: torch.optim.Optimizer, tensors: dict, groups: list) -> None:
    state: dict = {}
    for key, t in tensors.items():
        if not key.startswith("state."):
            continue
        _, idx, name = key.split(".", 2)
        state.setdefault(int(idx), {})[name] = t
    for g in groups:
        if "betas" in g:
            g["betas"] = tuple(g["betas"])
    # which kernel runs the update (`models.training.loop.adamw`: fused where torch has one for these parameters) is the
    # resuming process's choice, not training state: the checkpoint's own setting is not restored
    kernels = [{k: g[k] for k in IMPLEMENTATION if k in g} for g in opt.param_groups]
    opt.load_state_dict({"state": state, "param_groups": groups})
    for g, kept in zip(opt.param_groups, kernels, strict=True):  # load_state_dict checked the group count
        g.update(kept)


# --- the run folder -------------------------------------------------------------------------------------------------
RUN_MARK = "train_config.json"  # a folder holding it, written before folders carried marks, is one of our runs
SWEEP_FILE = "sweep.json"  # a seed sweep's record (`models.training.sweep`)
MEMBER_NAME = re.compile(r"seed-\d+")  # a sweep's member folders: OUT/seed-K


def legacy_mark(folder: Path, is_sweep=None) -> Mark | None:
    """What a folder written before folders carried marks (`models.io.run_folder`) is: a seed sweep (it holds
    `SWEEP_FILE`; `is_sweep(folder)` decides where given), a sweep's member (a run folder `seed-K` inside a sweep), a
    training run (it holds `RUN_MARK`), or None (not ours)."""
    folder = Path(folder)
    if (folder / SWEEP_FILE).is_file():
        return Mark("sweep") if is_sweep is None or is_sweep(folder) else None
    if (folder / RUN_MARK).is_file():
        if MEMBER_NAME.fullmatch(folder.name):
            parent = owner(folder.parent, lambda f: legacy_mark(f, is_sweep))
            if parent is not None and parent.kind == "sweep":
                return Mark("sweep-member", "..")
        return Mark("train")
    return None


# --- checkpoints ----------------------------------------------------------------------------------
def save_checkpoint(out_dir, step: int, model, opt, trainer_state: dict) -> Path:
    """Write the resumable checkpoint of `step` atomically (see the module docstring)."""
    from safetensors.torch import save as st_save

    tensors, groups = optimizer_tensors(opt)
    tensors["rng.torch"] = torch.get_rng_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng.cuda.{i}"] = s
    state = dict(trainer_state, step=step, param_groups=groups, rng=rng_state_json())
    extra = {OPTIMIZER_FILE: st_save(tensors), STATE_FILE: json.dumps(state, indent=1)}
    return save(model, step_dir(out_dir, step), extra_files=extra)  # with the tokenizer: a checkpoint loads alone


def resumable_checkpoints(out_dir) -> list[Path]:
    """Checkpoint folders that carry a full training state, oldest first."""
    root = Path(out_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith("step-") and
             (p / STATE_FILE).is_file() and (p / OPTIMIZER_FILE).is_file() and (p / WEIGHTS_FILE).is_file()]
    return sorted(found, key=lambda p: int(p.name.split("-")[1]))


def load_checkpoint(folder: Path, model, opt) -> dict:
    """Restore model weights, optimizer and RNG states from `folder`; returns the trainer state."""
    state = read_trainer_state(folder / STATE_FILE)
    load_state_dict(model, read_safetensors(folder / WEIGHTS_FILE), source=str(folder / WEIGHTS_FILE))
    tensors = read_safetensors(folder / OPTIMIZER_FILE)
    load_optimizer(opt, tensors, state.pop("param_groups"))
    torch.set_rng_state(tensors["rng.torch"])
    cuda = [tensors[k] for k in sorted(tensors) if k.startswith("rng.cuda.")]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)
    set_rng_state_json(state.pop("rng"))
    return state


def finished_run(out_dir: Path, steps: int, found: list[Path]) -> dict | None:
    """The summary of a run in `out_dir` that already finished `steps` steps (so resuming it has nothing to do)."""
    if not (out_dir / "summary.json").is_file():
        return None
    summary = read_summary(out_dir / "summary.json")
    if summary.get("steps") == steps and (not found or int(found[-1].name[5:]) >= steps):
        return summary
    return None


#: Training settings a resumed run may change (the run continues on the new schedule); each change is recorded in
#: metrics.jsonl as `{"step": s, "resumed_with": {name: [old, new]}}`. Any other difference is refused.
RESUME_SCHEDULE = ("steps", "lr", "min_lr_ratio", "warmup_steps")
_MODEL_FREE = ("device", "extra")  # run-time choices and provenance, not architecture


def resume_changes(out_dir: Path, cfg: TrainConfig, model, found: list[Path]) -> dict:
    """`{setting: [old, new]}` of the schedule changes between the saved run and `cfg`; raises `TrainConfigError`
    naming the fields where the model config or another training setting differs."""
    saved = TrainConfig.from_dict(read_train_config(out_dir / RUN_MARK)).to_dict()
    now = cfg.to_dict()
    diff = [k for k in saved if k not in RESUME_FREE + RESUME_SCHEDULE and saved[k] != now[k]]
    if diff:
        raise TrainConfigError(f"cannot resume from {out_dir}: setting(s) {diff} differ from the saved run's "
                               f"{RUN_MARK}; allowed to change: {list(RESUME_SCHEDULE)}")
    for folder in reversed(found):  # the newest readable checkpoint config
        try:
            old_model = read_config(folder / CONFIG_FILE).to_dict()
            break
        except CheckpointError:
            continue
    else:  # no readable checkpoint: the finished model's own config, else restore() reports the damage
        try:
            old_model = read_config(out_dir / CONFIG_FILE).to_dict()
        except (CheckpointError, OSError):
            old_model = model.cfg.to_dict()
    new_model = model.cfg.to_dict()
    bad = [k for k in new_model if k not in _MODEL_FREE and old_model.get(k) != new_model[k]]
    if bad:
        shown = ", ".join(f"{k} {old_model.get(k)!r} -> {new_model[k]!r}" for k in bad[:6])
        raise TrainConfigError(f"cannot resume from {out_dir}: the model config differs from the checkpoint's in "
                               f"{bad} ({shown}); resume with the same model or train into a new folder")
    return {k: [saved[k], now[k]] for k in RESUME_SCHEDULE if saved[k] != now[k]}


def restore(out_dir: Path | None, cfg: TrainConfig, model, opt, found: list[Path], rank: int) -> tuple[int, int, float]:
    """Where a run starts, `(step, tokens_seen, wall_time)`: from the newest intact checkpoint of those `found`
    (`load_newest`; the model config must match and training settings may differ only in `RESUME_SCHEDULE` and
    `RESUME_FREE`; the later metrics records dropped), or (0, 0, 0.0) for a fresh run, whose old metrics and
    checkpoints in `out_dir` are removed (`start_fresh`)."""
    if found:
        changes = resume_changes(out_dir, cfg, model, found)
        state = load_newest(out_dir, model, opt, found, rank)
        if rank == 0:
            record_resume(out_dir, state["step"], changes)
        return state["step"], state["tokens_seen"], state["wall_time"]
    if out_dir is not None and rank == 0:
        start_fresh(out_dir)
    return 0, 0, 0.0


def load_newest(out_dir: Path, model, opt, found: list[Path], rank: int = 0) -> dict:
    """Load the newest intact checkpoint of those `found` into `model` and `opt` (a damaged newer one is skipped with
    a line on stderr) and return its trainer state; writes nothing."""
    for folder in reversed(found):
        try:
            state = load_checkpoint(folder, model, opt)
            break
        except (ValueError, KeyError, TypeError, OSError) as e:  # a torn or damaged checkpoint
            if rank == 0:
                print(f"warning: checkpoint {folder} is damaged ({type(e).__name__}: {str(e)[:200]}); trying the "
                      "previous one", file=sys.stderr)
    else:
        raise CheckpointError(f"cannot resume from {out_dir}: none of its {len(found)} checkpoint(s) is intact")
    if folder is not found[-1] and rank == 0:
        print(f"resuming from {folder.name}, the newest intact checkpoint", file=sys.stderr)
    return state


def record_resume(out_dir: Path, step: int, changes: dict) -> None:
    """metrics.jsonl of a run resumed at `step`: the later records dropped, the schedule `changes` recorded."""
    truncate_metrics(out_dir / METRICS_FILE, step)
    if changes:
        append_metrics(out_dir / METRICS_FILE, {"step": step, "resumed_with": changes})


def start_fresh(out_dir: Path) -> None:
    """Remove what an earlier run in our folder `out_dir` wrote that a fresh run writes anew: its metrics and
    checkpoints (nothing else: a user's files stay)."""
    (out_dir / METRICS_FILE).unlink(missing_ok=True)
    if (out_dir / CHECKPOINTS).exists():
        shutil.rmtree(out_dir / CHECKPOINTS)


# --- metrics.jsonl --------------------------------------------------------------------------------
def truncate_metrics(path, last_step: int) -> None:
    """Keep the records up to `last_step` (resuming from that checkpoint repeats the later ones)."""
    p = Path(path)
    if not p.exists():
        return
    keep = [r for r in read_metrics(p) if r.get("step", 0) <= last_step]
    atomic_write_text(p, "".join(json.dumps(r) + "\n" for r in keep))


def append_metrics(path, record: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()


def ship_files(out_dir, keep_steps, with_state: bool) -> dict[str, Path]:
    """`{relative name: source path}` of the checkpoint files to carry into the final folder: every file of
    every checkpoint (`keep_steps=None`), or only the loadable model of the listed steps."""
    files = {}
    root = Path(out_dir) / CHECKPOINTS
    if not root.is_dir():
        return files
    for d in sorted(root.iterdir()):
        if not (d.is_dir() and d.name.startswith("step-")):
            continue
        if keep_steps is not None and int(d.name.split("-")[1]) not in keep_steps:
            continue
        names = [CONFIG_FILE, WEIGHTS_FILE] if not with_state else [f.name for f in d.iterdir() if f.is_file()]
        for n in names:
            if (d / n).is_file():
                files[f"{CHECKPOINTS}/{d.name}/{n}"] = d / n
    return files

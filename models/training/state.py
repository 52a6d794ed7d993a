"""Resumable training state on disk: checkpoint schedule, checkpoint folders, resuming, metrics.jsonl.

A checkpoint is a folder `checkpoints/step-000123/` written atomically (`atomic_write_dir`) holding
`config.json` + `model.safetensors` + `tokenizer.json` (a loadable model, `models.load(folder)`),
`optimizer.safetensors` (AdamW moments and step counts, plus the torch/cuda RNG states as uint8 tensors) and
`trainer_state.json` (step, tokens seen, wall time, optimizer hyper-parameters, Python and NumPy RNG states). No
pickle anywhere.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from ..errors import CheckpointError, TrainConfigError
from ..io.checkpoint import CHECKPOINTS, CONFIG_FILE, WEIGHTS_FILE, load_state_dict, read_config, read_safetensors, save
from ..io.readers import read_metrics, read_summary, read_train_config, read_trainer_state  # noqa: F401  (re-exported)
from .config import RESUME_FREE, TrainConfig

OPTIMIZER_FILE, STATE_FILE, METRICS_FILE = "optimizer.safetensors", "trainer_state.json", "metrics.jsonl"


def checkpoint_steps(steps: int, every: int, n_log: int, first: int = 10) -> list[int]:
    """Steps to checkpoint at: 0 (the initialisation), `n_log` log-spaced steps from `first` to `steps`
    (the phase change needs early ones), every `every` steps, and the last step."""
    out = {0, steps}
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


# --- the run folder -------------------------------------------------------------------------------
RUN_MARK = "train_config.json"  # a folder holding it is one of our runs


def check_out_dir(out, mark: str = RUN_MARK, kind: str = "a training run") -> Path:
    """The real path of the run folder `out` (a symbolic link is followed: the run is written into its target and
    the link stays), checked before any work: not the current folder or one holding it (the finished run takes the
    folder's place in one swap), and either new, empty, or one of ours (`kind`: it holds the file `mark`). A
    folder with other files is refused, so a run never deletes a user's files."""
    real = Path(os.path.realpath(out))
    cwd = Path.cwd().resolve()
    if real == cwd or real in cwd.parents:
        raise TrainConfigError(f"out_dir {out} is the current folder or holds it; give a sub-folder (the finished "
                               "run takes the folder's place in one atomic swap)")
    if real.exists() and not real.is_dir():
        raise TrainConfigError(f"out_dir {out} exists and is not a folder")
    if real.is_dir() and any(real.iterdir()) and not (real / mark).is_file():
        raise TrainConfigError(f"out_dir {out} is a non-empty folder that is not {kind} (no {mark}); "
                               "give a new or empty folder (nothing was written)")
    return real


@contextmanager
def run_lock(out: Path | None):
    """Hold an exclusive lock on run folder `out` (`fcntl.flock` on the hidden file `.{name}.lock` beside it, holding
    the owner's PID) while the body runs; a second run on the same folder raises `TrainConfigError` naming the
    holder's PID. No lock where `out` is None or the platform has no `fcntl`."""
    try:
        import fcntl
    except ImportError:
        fcntl = None
    if out is None or fcntl is None:
        yield
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    lock = out.parent / f".{out.name}.lock"
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise TrainConfigError(f"out_dir {out} is in use by another training run (PID {holder}); wait for it "
                                   "to finish or choose another folder") from None
        try:
            if os.stat(lock).st_ino == os.fstat(fd).st_ino:
                break  # the lock file we hold is still the one at that path
        except FileNotFoundError:
            pass
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        try:
            os.unlink(lock)
        except OSError:
            pass
        os.close(fd)


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
    (model, optimizer and RNG states loaded, the later metrics records dropped; a damaged newer one is skipped with a
    line on stderr; the model config must match and training settings may differ only in `RESUME_SCHEDULE` and
    `RESUME_FREE`), or (0, 0, 0.0) for a fresh run, whose old metrics and checkpoints in `out_dir` are removed."""
    if found:
        changes = resume_changes(out_dir, cfg, model, found)
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
        if rank == 0:
            truncate_metrics(out_dir / METRICS_FILE, state["step"])
            if changes:
                append_metrics(out_dir / METRICS_FILE, {"step": state["step"], "resumed_with": changes})
        return state["step"], state["tokens_seen"], state["wall_time"]
    if out_dir is not None and rank == 0:
        (out_dir / METRICS_FILE).unlink(missing_ok=True)
        if (out_dir / CHECKPOINTS).exists():
            shutil.rmtree(out_dir / CHECKPOINTS)
    return 0, 0, 0.0


# --- metrics.jsonl --------------------------------------------------------------------------------
def truncate_metrics(path, last_step: int) -> None:
    """Keep the records up to `last_step` (resuming from that checkpoint repeats the later ones)."""
    p = Path(path)
    if not p.exists():
        return
    keep = [r for r in read_metrics(p) if r.get("step", 0) <= last_step]
    tmp = p.with_name(p.name + f".tmp-{os.getpid()}")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in keep))
    os.replace(tmp, p)


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

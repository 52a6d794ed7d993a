"""Seed sweeps: N models of one configuration, seeds k₁ … k_N, trained in one process as one stacked model
(`models.training.stacked`): one batched forward and backward per step over every member's own batch, AdamW on the
stacked weights (an elementwise update, so each member's is its own), gradients clipped per member.

Member k is what `train(model_cfg, replace(cfg, seed=k))` trains: the same initial weights (each member is built as
that run builds its model, then stacked), the same batch at every step (`batches.batch(k, step)`), the same schedule,
optimizer groups and checkpoint steps; its losses differ from the single run's by float32 rounding only (batched
products may sum in another order). `OUT/seed-K/` is written as that run writes its folder (config, weights, tokenizer,
metrics.jsonl, checkpoints with their optimizer states, summary, card), so every command loads it; it is marked as
the sweep's member (`models.io.run_folder`), so a single `circuits train` refuses it while the sweep owns it.
`OUT/sweep.json` lists the members.

Resumable and deterministic as a single run: a sweep killed at any point and resumed (`resume=True`) restarts every
member from the newest checkpoint step they all hold and ends with bitwise the same weights on CPU. A resume that
finds the sweep changed (a member folder missing or of another kind, members without a common checkpoint, other
settings) refuses before anything is written. A member whose
training loss or gradient norm is not finite is marked failed (in sweep.json and its metrics.jsonl) and set to zero
weights that no loss reads; the others train on unchanged, bit for bit (nothing in a step mixes members).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import time
from pathlib import Path

import torch

from ..arch.model import HookedTransformer
from ..arch.state_dict import load_state_dict
from ..data.tokenizer import load_tokenizer
from ..errors import CheckpointError, FolderError, TrainConfigError
from ..files.atomic import atomic_write, atomic_write_json, atomic_write_text
from ..files.size_checks import check_train_sizes
from ..io import readers
from ..io.checkpoint import WEIGHTS_FILE, read_safetensors
from ..io.run_folder import check_folder, claim, lock, open_folder, owner
from . import state as ts
from .config import TrainConfig, lr_at
from .loop import adamw, build_data, check_setup, dist_info, finalize, init_positions, optimizer_groups, pick_device
from .stacked import StackedDecoder, check_stackable, clip_per_member
from .state import SWEEP_FILE
from .tasks import LanguageModelling

__all__ = ["train_sweep", "parse_seeds", "member_dir", "sweep_json", "SWEEP_FILE", "MAX_SEEDS"]

MAX_SEEDS = 1024
MAX_SEED = TrainConfig.MAX_SEED
_DIGITS = re.compile(r"[0-9]{1,30}")
SWEEP_FORMAT = "toy-circuits seed sweep"


def parse_seeds(text: str) -> list[int]:
    """Seeds from "0-7" (a range, both ends included), "0,3,5" (a list) or both ("0-3,8"), in the order given; each
    written in ASCII digits and at most `MAX_SEED`. Raises `TrainConfigError` naming the problem and the allowed
    forms."""
    forms = f"allowed: 'A-B' (A <= B), 'A,B,C' or both, e.g. '0-7' or '0,3,5'; seeds are ints 0 … {MAX_SEED}"
    seeds: list[int] = []
    parts = str(text).replace(" ", "").split(",")
    for part in parts:
        lo, sep, hi = part.partition("-")
        if not _DIGITS.fullmatch(lo) or (sep and not _DIGITS.fullmatch(hi)):  # str.isdigit takes "²", int() not
            raise TrainConfigError(f"--seeds {text!r}: {part!r} is not a seed or a range; {forms}")
        a, b = int(lo), int(hi) if sep else int(lo)
        if max(a, b) > MAX_SEED:
            raise TrainConfigError(f"--seeds {text!r}: {max(a, b)} is larger than the largest seed; {forms}")
        if b < a:
            raise TrainConfigError(f"--seeds {text!r}: the range {part!r} ends before it starts; {forms}")
        if b - a + 1 + len(seeds) > MAX_SEEDS:
            raise TrainConfigError(f"--seeds {text!r}: more than {MAX_SEEDS} seeds")
        seeds.extend(range(a, b + 1))
    if len(set(seeds)) != len(seeds):
        dup = sorted({s for s in seeds if seeds.count(s) > 1})
        raise TrainConfigError(f"--seeds {text!r}: seed(s) {dup} given twice; {forms}")
    return seeds


def member_dir(out, seed: int) -> Path:
    return Path(out) / f"seed-{seed}"


def sweep_json(out) -> dict:
    """OUT/sweep.json as a dict, through its reader (`models.io.readers.read_sweep`: `CheckpointError` naming the file
    where it is missing, corrupt or not a sweep summary)."""
    return readers.read_sweep(Path(out) / SWEEP_FILE)


def _is_our_sweep(folder: Path) -> bool:
    try:
        return sweep_json(folder).get("format") == SWEEP_FORMAT
    except CheckpointError:  # a sweep.json of another tool, or not JSON
        return False


def legacy_sweep_mark(folder: Path):
    """`models.training.state.legacy_mark`, where a folder holding a sweep.json is a sweep only if that file is ours."""
    return ts.legacy_mark(folder, _is_our_sweep)


class _MemberOptimizer:
    """Member k's view of the stacked AdamW, in a single run's format: `state_dict()` holds row k of every moment
    (the step counts are shared), so its checkpoint is the one `--seed k` alone would write; `load_state_dict` keeps
    the member's state until `_load_stacked` loads every member's at once."""

    def __init__(self, opt: torch.optim.Optimizer, k: int, pending: dict):
        self.opt, self.k, self.pending = opt, k, pending

    @property
    def param_groups(self):
        return self.opt.param_groups

    def state_dict(self) -> dict:
        sd = self.opt.state_dict()
        state = {i: {n: (t if n == "step" else t[self.k]) for n, t in st.items()} for i, st in sd["state"].items()}
        return {"state": state, "param_groups": sd["param_groups"]}

    def load_state_dict(self, sd: dict) -> None:
        self.pending[self.k] = sd


def _load_stacked(opt: torch.optim.Optimizer, pending: dict, members: list[int], zero: list[int]) -> None:
    """Load the members' optimizer states (`pending[k]`, in member order) into the stacked AdamW; members in `zero`
    (failed ones) get zero moments."""
    ref = pending[next(k for k in members if k not in zero)]
    steps = {float(pending[k]["state"][i]["step"]) for k in members if k not in zero for i in pending[k]["state"]}
    if len(steps) > 1:
        raise CheckpointError(f"the members' checkpoints disagree on the optimizer step count ({sorted(steps)})")
    state = {}
    for i, st in ref["state"].items():
        state[i] = {n: (t if n == "step" else torch.stack([
            torch.zeros_like(t) if k in zero else pending[k]["state"][i][n] for k in members])) for n, t in st.items()}
    kernels = [{k: g[k] for k in ts.IMPLEMENTATION if k in g} for g in opt.param_groups]
    opt.load_state_dict({"state": state, "param_groups": ref["param_groups"]})
    for g, kept in zip(opt.param_groups, kernels, strict=True):
        g.update(kept)


def train_sweep(model_cfg, cfg: TrainConfig, seeds: list[int], *, eval_fn=None, report_fn_for=None,
                resume: bool = False, tokenizer=None, command: str | None = None, notes: dict | None = None) -> dict:
    """Train one member per seed in `seeds` (see the module docstring); returns the sweep summary (sweep.json).

    `eval_fn(model) -> dict` runs on each member at every checkpoint, as in `train`; `report_fn_for(member_cfg)`
    returns the `report_fn` of the member whose TrainConfig is `member_cfg` (its seed and folder). `cfg.out_dir` is
    the sweep folder (new, empty or an earlier sweep; locked while the sweep runs); `cfg.seed` is ignored. `notes`
    (e.g. which score definitions `eval_fn` records) go into sweep.json as they are."""
    cfg.validate()
    check_stackable(model_cfg)
    if not seeds:
        raise TrainConfigError("a seed sweep needs at least one seed")
    check_train_sizes(model_cfg, cfg, TrainConfigError, models=len(seeds))  # before anything is built or read
    if dist_info()[1] > 1:
        raise TrainConfigError("a seed sweep runs in one process (not under torchrun): the stack is its parallelism")
    if cfg.out_dir is None:
        raise TrainConfigError("a seed sweep needs out_dir (its members go to OUT/seed-K)")
    with open_folder(cfg.out_dir, "sweep", legacy_sweep_mark) as out, contextlib.ExitStack() as members:
        if owner(out, legacy_sweep_mark) is None:  # new or empty: the sweep's from now on (a `train` inside is refused)
            claim(out, "sweep")
        for s in seeds:  # each member folder new, empty or this sweep's, and locked while the sweep runs
            members.enter_context(lock(check_folder(member_dir(out, s), "sweep-member", legacy_sweep_mark)))
        sweep = _Sweep(model_cfg, cfg, list(seeds), out, eval_fn, report_fn_for, tokenizer, command)
        sweep.notes = dict(notes or {})
        return sweep.run(resume)


class _Sweep:
    def __init__(self, model_cfg, cfg, seeds, out, eval_fn, report_fn_for, tokenizer, command):
        self.cfg, self.seeds, self.out, self.eval_fn, self.report_fn_for = cfg, seeds, out, eval_fn, report_fn_for
        self.command = command
        self.model_cfg, self.tokenizer = model_cfg, tokenizer
        self.cfgs = [dataclasses.replace(cfg, seed=s, out_dir=str(member_dir(out, s))) for s in seeds]
        self.dirs = [member_dir(out, s) for s in seeds]
        self.failed: dict[int, dict] = {}  # member index -> {"step", "reason"}

    # --- set-up ---------------------------------------------------------------------------------------
    def build(self, resume: bool) -> None:
        cfg = self.cfg
        if resume and self.tokenizer is None and (self.dirs[0] / "tokenizer.json").is_file():
            self.tokenizer = load_tokenizer(self.dirs[0] / "tokenizer.json")
        self.device = pick_device(cfg.device)
        self.batches, self.tokenizer, self.corpus = build_data(cfg, self.model_cfg, self.tokenizer)
        check_setup(self.model_cfg, cfg, self.tokenizer, 1)
        self.task = LanguageModelling(self.batches)
        if cfg.num_threads:
            torch.set_num_threads(cfg.num_threads)
        extra = dict(self.model_cfg.extra, tokenizer=cfg.tokenizer)
        self.members = []
        for s in self.seeds:  # as `train` builds the model of `--seed s`
            mc = self.model_cfg if self.model_cfg.seed is not None else self.model_cfg.replace(seed=s)
            m = HookedTransformer(mc.replace(device=str(self.device), extra=extra))
            m.tokenizer = self.tokenizer  # attached from the start, as `train` does: every checkpoint carries it
            init_positions(m, cfg.pos_init)
            self.members.append(m)
        self.stack = StackedDecoder(self.members).to(self.device)
        for k, m in enumerate(self.members):  # each member's parameters become views of its row of the stack
            for name, p in m.named_parameters():
                p.data = self.stack.stacked(name).data[k]
        self.params = [p for _, p in self.stack.named_stacked()]
        self.alive = torch.ones(len(self.seeds), dtype=torch.bool, device=self.device)  # False: a failed member
        self.opt = adamw(optimizer_groups(self.stack.named_stacked(), cfg), lr=cfg.lr, betas=tuple(cfg.betas))
        self.val = torch.as_tensor(self.batches.val_batch(cfg.val_sequences)).to(self.device)
        self.schedule = set(ts.checkpoint_steps(cfg.steps, cfg.checkpoint_every, cfg.log_checkpoints,
                                                     dense=cfg.dense_checkpoints))

    def sweep_record(self, status: str, extra: dict | None = None) -> dict:
        members = []
        for k, s in enumerate(self.seeds):
            m = {"seed": s, "folder": self.dirs[k].name, "status": "failed" if k in self.failed else status}
            if k in self.failed:
                m.update(failed_at_step=self.failed[k]["step"], reason=self.failed[k]["reason"])
            members.append(m)
        d = {"format": SWEEP_FORMAT, "status": status, "seeds": self.seeds, "steps": self.cfg.steps,
             "n_members": len(self.seeds), "n_failed": len(self.failed), "method": "stacked weights, batched "
             "products (models.training.stacked)", "device": str(self.device), "command": self.command,
             "train_config": dict(self.cfg.to_dict(), seed=None, out_dir=None),
             "model_config": self.members[0].cfg.replace(seed=None).to_dict(), "notes": self.notes,
             "corpus": self.corpus.record() if getattr(self, "corpus", None) is not None else None,
             "members": members}
        return d | (extra or {})

    def write_sweep(self, status: str, extra: dict | None = None) -> dict:
        d = self.sweep_record(status, extra)
        atomic_write_json(self.out / SWEEP_FILE, d)
        return d

    def zero_member(self, k: int) -> None:
        """A failed member: zero weights and moments (its loss is left out, so its gradients stay zero)."""
        self.alive[k] = False
        with torch.no_grad():
            for _, p in self.stack.named_stacked():
                p[k].zero_()
                for name, t in self.opt.state.get(p, {}).items():
                    if name != "step":
                        t[k].zero_()

    def restore(self, resume: bool) -> int:
        """The step the sweep starts from: 0 (fresh: the members' old metrics and checkpoints removed) or the newest
        checkpoint step every live member holds intact. A resume that finds the sweep changed refuses before
        anything is written (`check_resumable`, settings checked and checkpoints loaded for every member first)."""
        self.tokens_seen, self.wall_before = 0, 0.0
        if not resume:
            for d in self.dirs:
                d.mkdir(parents=True, exist_ok=True)
                ts.start_fresh(d)
            return 0
        old = sweep_json(self.out) if (self.out / SWEEP_FILE).is_file() else None
        if old is None:  # killed before its first record: nothing was trained
            return self.restore(False)
        if old.get("seeds") is not None and old["seeds"] != self.seeds:
            raise TrainConfigError(f"cannot resume the sweep in {self.out} with seeds {self.seeds}: it trains seeds "
                                   f"{old['seeds']}; resume with those, or sweep into a new folder")
        self.check_resumable(old)
        failed_at = {m["seed"]: m.get("failed_at_step") for m in old["members"] if m.get("status") == "failed"}
        found = [ts.resumable_checkpoints(d) for d in self.dirs]
        steps_of = [{int(p.name.split("-")[1]) for p in f} for f in found]
        # a member that failed at step f (its loss at step f was not finite) is alive in checkpoints up to f
        # a member finalized before a kill (the sweep was in `finish`) keeps no optimizer state: the others then
        # hold the last step's checkpoint and only the finalization is left to do
        finished = [k for k, d in enumerate(self.dirs) if failed_at.get(self.seeds[k]) is None and
                    ts.finished_run(d, self.cfg.steps, found[k]) is not None]
        if finished:
            steps_of = [{self.cfg.steps} if k in finished else st for k, st in enumerate(steps_of)]
        live = [k for k in range(len(self.seeds)) if failed_at.get(self.seeds[k]) is None]
        common = set.intersection(*[steps_of[k] for k in live]) if live else set()
        if not common:
            if any(found):  # some members hold checkpoints, not at one step: restarting would delete them
                bare = [self.dirs[k].name for k in live if not steps_of[k]] or [self.dirs[k].name for k in live]
                raise FolderError(f"cannot resume the sweep in {self.out}: its members hold no common checkpoint "
                                  f"step ({', '.join(bare)}: none in common with the others); nothing was changed: "
                                  "restore the member folders, or sweep into a new folder")
            return self.restore(False)  # killed before the first checkpoint: nothing was trained
        pending: dict = {}
        start = max(common)
        dead = [k for k, s in enumerate(self.seeds) if failed_at.get(s) is not None and failed_at[s] < start]
        todo = [k for k in range(len(self.seeds)) if k not in finished and k not in dead]
        mine = {k: [p for p in found[k] if int(p.name.split("-")[1]) <= start] for k in todo}
        changes = {k: ts.resume_changes(self.dirs[k], self.cfgs[k], self.members[k], mine[k]) for k in todo}
        states = {}
        for k in todo:  # load every member before anything is written
            d = self.dirs[k]
            states[k] = ts.load_newest(d, self.members[k], _MemberOptimizer(self.opt, k, pending), mine[k])
            if states[k]["step"] != start:
                raise CheckpointError(f"cannot resume {self.out}: member {d.name} resumes from step "
                                      f"{states[k]['step']}, the others from {start} (a damaged checkpoint); "
                                      "nothing was changed: sweep into a new folder")
        for k in finished:  # finalized before the sweep was killed: its final weights, nothing left to train
            d = self.dirs[k]
            load_state_dict(self.members[k], read_safetensors(d / WEIGHTS_FILE), source=str(d / WEIGHTS_FILE))
        reasons = {m["seed"]: m.get("reason") for m in old["members"]}
        for k in dead:
            self.failed[k] = {"step": failed_at[self.seeds[k]],
                              "reason": reasons.get(self.seeds[k]) or "failed before the resumed step"}
        _load_stacked(self.opt, pending, list(range(len(self.seeds))), dead + finished)
        for k in dead:
            self.zero_member(k)
        for k in todo:  # every check passed: the members' records follow the resumed step
            ts.record_resume(self.dirs[k], start, changes[k])
            self.tokens_seen = states[k]["tokens_seen"]
            self.wall_before = max(self.wall_before, states[k]["wall_time"])
        return start

    def check_resumable(self, old: dict) -> None:
        """Refuse (`FolderError`, nothing written) a resume whose member folders are not all there as the sweep
        record `old` lists them."""
        listed = {m.get("folder") for m in old["members"]}
        missing = [d.name for d in self.dirs if d.name in listed and not d.is_dir()]
        if missing:
            raise FolderError(f"cannot resume the sweep in {self.out}: member folder(s) {', '.join(missing)} "
                              "missing; nothing was changed: restore them, or sweep into a new folder")

    # --- the loop -------------------------------------------------------------------------------------
    def run(self, resume: bool) -> dict:
        cfg = self.cfg
        self.build(resume)
        if resume and (self.out / SWEEP_FILE).is_file():
            old = sweep_json(self.out)
            if old.get("status") == "finished" and old.get("steps") == cfg.steps and old.get("seeds") == self.seeds:
                self.check_resumable(old)
                for k, (d, c, m) in enumerate(zip(self.dirs, self.cfgs, self.members, strict=True)):
                    if old["members"][k].get("status") != "failed":  # only with its own model and settings
                        ts.resume_changes(d, c, m, ts.resumable_checkpoints(d))
                return old
        step0 = self.restore(resume)
        claim(self.out, "sweep")  # every check passed: the folder and its members are this sweep's
        for d, c in zip(self.dirs, self.cfgs, strict=True):
            claim(d, "sweep-member", "..")
            atomic_write_text(d / ts.RUN_MARK, c.to_json())
            atomic_write(d / "tokenizer.json", self.tokenizer.save)
        self.write_sweep("running")
        self.loop(step0)
        return self.finish()

    def record(self, k: int, step: int, loss_sum: float, n: int, dt: float, tokens: int) -> dict:
        cfg, model = self.cfg, self.members[k]
        rec = {"step": step, "tokens": self.tokens_seen, "lr": lr_at(cfg, max(step - 1, 0)),
               "wall_time": self.wall_time(),
               "loadavg_1min": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None}
        if n:
            rec["train_loss"] = loss_sum / n
            rec["tokens_per_s"] = tokens / max(dt, 1e-9)  # this member's tokens; the sweep trains N times as many
            rec["sweep_members"] = len(self.seeds) - len(self.failed)
        if (cfg.eval_every and step % cfg.eval_every == 0) or step in self.schedule:
            rec["val_loss"] = self.task.evaluate(model, self.val)
        if step in self.schedule and self.eval_fn is not None:
            model.eval()
            rec.update(self.eval_fn(model))
            model.train()
        return rec

    def wall_time(self) -> float:
        return round(self.wall_before + time.perf_counter() - self.t0, 3)

    def log(self, step: int, sums: list[float], n: int, dt: float, tokens: int) -> None:
        for k in range(len(self.seeds)):
            if k in self.failed:
                continue
            rec = self.record(k, step, sums[k], n, dt, tokens)
            ts.append_metrics(self.dirs[k] / ts.METRICS_FILE, rec)
            if step in self.schedule:
                ts.save_checkpoint(self.dirs[k], step, self.members[k], _MemberOptimizer(self.opt, k, {}),
                                   {"tokens_seen": self.tokens_seen, "wall_time": rec["wall_time"]})

    def optimise(self, step: int, autocast) -> torch.Tensor:
        """One AdamW step of every member on its own batch of `step`; returns the members' losses (CPU, float)."""
        cfg, N = self.cfg, len(self.seeds)
        lr = lr_at(cfg, step)
        for g in self.opt.param_groups:
            g["lr"] = lr * g["lr_scale"]
        rows = torch.stack([torch.as_tensor(self.batches.batch(s, step, cfg.batch_size)) for s in self.seeds])
        rows = rows.to(self.device)
        with autocast:
            losses = self.stack.losses(rows, cfg.label_smoothing)
        self.opt.zero_grad(set_to_none=True)
        torch.where(self.alive, losses, torch.zeros_like(losses)).sum().backward()
        if cfg.grad_clip is not None:
            norms = clip_per_member(self.params, cfg.grad_clip)
        else:
            norms = torch.stack([p.grad.reshape(N, -1).float().pow(2).sum(1) for p in self.params]).sum(0)
        self.opt.step()
        self.tokens_seen += cfg.batch_size * rows.shape[2]
        return losses.detach().float().cpu(), norms.detach().cpu()

    def loop(self, start: int) -> None:
        cfg, N = self.cfg, len(self.seeds)
        bar = None
        if cfg.progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=cfg.steps, initial=start, desc=f"sweep of {N}", unit="step", dynamic_ncols=True)
        autocast = torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.device.type == "cuda")
        self.t0 = time.perf_counter()
        self.stack.train()
        if start == 0:
            self.log(0, [0.0] * N, 0, 0.0, 0)
        sums, n, t_mark, tok_mark = [0.0] * N, 0, time.perf_counter(), self.tokens_seen
        for step in range(start, cfg.steps):
            losses, norms = self.optimise(step, autocast)
            for k in range(N):
                if k in self.failed:
                    continue
                if not (torch.isfinite(losses[k]) and torch.isfinite(norms[k])):
                    self.fail(k, step, f"non-finite training loss ({float(losses[k])}) or gradient norm "
                                       f"({float(norms[k])}) at step {step}")
                    continue
                sums[k] += float(losses[k])
            n += 1
            done = step + 1
            if bar is not None:
                bar.update(1)
            if done % cfg.log_every == 0 or done in self.schedule or done == cfg.steps:
                now = time.perf_counter()
                self.log(done, sums, n, now - t_mark, self.tokens_seen - tok_mark)
                if bar is not None:
                    live = [sums[k] / n for k in range(N) if k not in self.failed]
                    bar.set_postfix(loss=f"{sum(live) / max(len(live), 1):.3f}", failed=len(self.failed),
                                    tok_s=f"{N * (self.tokens_seen - tok_mark) / max(now - t_mark, 1e-9):.0f}")
                sums, n, t_mark, tok_mark = [0.0] * N, 0, time.perf_counter(), self.tokens_seen
        if bar is not None:
            bar.close()

    def fail(self, k: int, step: int, reason: str) -> None:
        self.failed[k] = {"step": step, "reason": reason}
        self.zero_member(k)
        ts.append_metrics(self.dirs[k] / ts.METRICS_FILE, {"step": step + 1, "failed": reason})
        self.write_sweep("running")
        if len(self.failed) == len(self.seeds):
            self.write_sweep("failed")
            raise TrainConfigError(f"every member of the sweep in {self.out} diverged (last: seed {self.seeds[k]}, "
                                   f"{reason}); lower the learning rate")

    # --- the end --------------------------------------------------------------------------------------
    def finish(self) -> dict:
        cfg = self.cfg
        rows, corpus_numbers = [], {}
        if self.corpus is not None:  # the members share one corpus
            from ..data.corpora import unigram_baseline_loss

            corpus_numbers = {"unigram_val_loss": unigram_baseline_loss(self.corpus),
                              "train_tokens_in_corpus": int(self.corpus.train.size),
                              "val_tokens_in_corpus": int(self.corpus.val.size), "corpus": self.corpus.record()}
        for k, (m, d, c) in enumerate(zip(self.members, self.dirs, self.cfgs, strict=True)):
            if k in self.failed:
                continue
            metrics = ts.read_metrics(d / ts.METRICS_FILE)
            last_val = [r["val_loss"] for r in metrics if "val_loss" in r]
            summary = {"steps": cfg.steps, "tokens_seen": self.tokens_seen, "world_size": 1,
                       "device": str(self.device), "sweep_members": len(self.seeds),
                       "final_val_loss": last_val[-1] if last_val else self.task.evaluate(m, self.val),
                       "wall_time": max([self.wall_time()] + [r.get("wall_time", 0) for r in metrics])}
            summary.update(corpus_numbers)
            report_fn = self.report_fn_for(c) if self.report_fn_for is not None else None
            extra = dict(report_fn(m, summary, metrics)) if report_fn is not None else {}
            finalize(m, d, c, summary, extra)
            rows.append((k, summary))
        done = {self.seeds[k]: {key: summary[key] for key in ("final_val_loss", "wall_time", "tokens_seen")}
                for k, summary in rows}
        d = self.sweep_record("finished", {"wall_time": self.wall_time()})
        for m in d["members"]:
            m.update(done.get(m["seed"], {}))
        atomic_write_json(self.out / SWEEP_FILE, d)
        return d

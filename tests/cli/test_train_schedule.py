"""`circuits train --steps N` below a preset's steps: the preset's schedule scaled to the run (log-spaced checkpoints
in proportion, a warm-up longer than the run scaled with a note), so a short run costs about its share of the full
one; a preset run at its own length keeps its schedule exactly. Settings only: nothing is trained here."""

import dataclasses
import math

import pytest

from analyses.cli import build_parser
from analyses.cli.train_commands import train_settings
from models.training.config import RESUME_FREE, TrainConfig, shortened
from models.training.presets import PRESETS, get_preset
from models.training.state import checkpoint_steps


def settings(*argv):
    """The run's settings; the notes `circuits train` prints when the run has finished go to stderr here."""
    import sys

    args = build_parser().parse_args(["train", "--out", "unused", *argv])
    cfg = train_settings(args)[1]
    for note in args.schedule_notes:
        print(note, file=sys.stderr)
    return cfg


def schedule(cfg: TrainConfig) -> list[int]:
    """The steps a run evaluates its head scores at (models.training.loop: every checkpoint)."""
    return checkpoint_steps(cfg.steps, cfg.checkpoint_every, cfg.log_checkpoints, dense=cfg.dense_checkpoints)


RUN_TIME = ("out_dir", "progress")  # where and how a command-line run reports, not its schedule


def same_run(a: TrainConfig, b: TrainConfig) -> bool:
    return {k: v for k, v in a.to_dict().items() if k not in RUN_TIME} == {
        k: v for k, v in b.to_dict().items() if k not in RUN_TIME}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_a_preset_at_its_own_length_keeps_its_schedule(name, capsys):
    own = get_preset(name)[1]
    assert same_run(settings("--preset", name), own)
    assert same_run(settings("--preset", name, "--steps", str(own.steps)), own)
    assert capsys.readouterr().err == ""  # nothing to say


def test_sixty_steps_of_attn_only_2l_evaluate_twice_and_warm_up_in_one_step(capsys):
    """The issue's run: 13 evaluations (log-spaced checkpoints of the 6000-step schedule) and a 100-step warm-up
    that the 60 steps never finished, without a word."""
    cfg = settings("--preset", "attn-only-2l", "--steps", "60")
    assert schedule(cfg) == [0, 60]
    assert cfg.warmup_steps == 1 and cfg.keep_checkpoints == [0, 60]
    err = capsys.readouterr().err
    assert "warm-up of 100 steps" in err and "scaled to 1" in err
    full = get_preset("attn-only-2l")[1]
    assert same_run(dataclasses.replace(cfg, steps=full.steps, warmup_steps=full.warmup_steps,
                                        log_checkpoints=full.log_checkpoints, keep_checkpoints=full.keep_checkpoints),
                    full)  # nothing else changed


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_evaluations_scale_with_the_run(name):
    full = get_preset(name)[1]
    n_full = len(schedule(full))
    for frac in (0.01, 0.05, 0.1, 0.25, 0.5, 0.9):
        steps = max(1, round(frac * full.steps))
        cfg, _ = shortened(full, steps)
        assert len(schedule(cfg)) <= math.ceil(steps / full.steps * n_full) + 2, (steps, schedule(cfg))  # + 0, end
        assert cfg.warmup_steps < steps or steps == 1
        assert cfg.warmup_steps == full.warmup_steps or full.warmup_steps >= steps  # a warm-up that fits stays


def test_a_warm_up_that_fits_stays_and_explicit_settings_win(capsys):
    cfg = settings("--preset", "attn-only-2l", "--steps", "150")
    assert cfg.warmup_steps == 100 and cfg.log_checkpoints == round(150 / 6000 * 12)
    cfg = settings("--preset", "attn-only-2l", "--train-config", '{"steps": 60, "log_checkpoints": 5, '
                   '"warmup_steps": 80}')
    assert cfg.log_checkpoints == 5 and cfg.warmup_steps == 80 and len(schedule(cfg)) == 6
    assert "never reaches its peak" in capsys.readouterr().err  # said, not changed: the user asked for it
    longer = settings("--preset", "attn-only-2l", "--steps", "7000")
    assert longer.log_checkpoints == 12 and longer.warmup_steps == 100 and longer.keep_checkpoints[-1] == 7000


def test_the_log_spaced_checkpoints_may_change_on_resume():
    """Like `dense_checkpoints`, they only choose when to save and evaluate: a shortened run resumed with more steps
    (a different count) continues."""
    assert "log_checkpoints" in RESUME_FREE and "dense_checkpoints" in RESUME_FREE

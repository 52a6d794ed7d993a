"""`circuits train --seeds` and `circuits sweep`: bad seed lists exit 2 with one line; the analysis of a sweep folder
built by hand (known formation points, heads and losses) against the numbers written into it; the acceptance
command end to end (e2e)."""

from __future__ import annotations

import errno
import io
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from analyses.cli import main
from analyses.figure_checks import figure_problems
from analyses.sweep import plot_sweep, sweep_markdown, sweep_summary
from models import HookedTransformer, HookedTransformerConfig, load, save

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("seeds, message", [("3-1", "ends before it starts"), ("0,0", "given twice"),
                                            ("x", "is not a seed"), ("0--2", "is not a seed"),
                                            ("²", "is not a seed"), ("0-²", "is not a seed"),
                                            ("12345678901234567890", "larger than the largest seed"),
                                            ("0-12345678901234567890", "larger than the largest seed")])
def test_bad_seeds_exit_2_with_one_line(seeds, message, tmp_path, capsys):
    assert main(["train", "--preset", "attn-only-2l", "--seeds", seeds, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("argv", [["train", "--preset", "attn-only-2l", "--seed", "12345678901234567890"],
                                  ["heads", "attn-only-2l", "--seed", "12345678901234567890"],
                                  ["train", "--preset", "attn-only-2l", "--seed", "²"]])
def test_a_seed_out_of_range_exits_2_with_one_line(argv, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv + (["--out", str(tmp_path / "o")] if argv[0] == "train" else []))
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "--seed" in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_seeds_refuses_a_model_it_cannot_stack(tmp_path, capsys):
    assert main(["train", "--preset", "gelu-2l", "--seeds", "0-1", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert "normalization_type" in err and len(err.splitlines()) == 1


def test_seed_and_seeds_exclusive(tmp_path):
    with pytest.raises(SystemExit) as e:
        main(["train", "--preset", "attn-only-2l", "--seed", "1", "--seeds", "0-1", "--out", str(tmp_path / "o")])
    assert e.value.code == 2


def test_sweep_of_a_folder_that_is_not_one_exits_2(tmp_path, capsys):
    assert main(["sweep", str(tmp_path)]) == 2
    assert "not a seed sweep" in capsys.readouterr().err


# --- the analysis of a hand-built sweep -----------------------------------------------------------------------
def _member(folder: Path, seed: int, onset: int | None, prev_head: int, ind_head: int, weights: bool):
    if weights:  # first: saving writes the folder anew
        cfg = HookedTransformerConfig(n_layers=2, d_model=16, n_ctx=8, d_vocab=20, n_heads=4, d_mlp=None, seed=seed)
        save(HookedTransformer(cfg), folder)
    folder.mkdir(parents=True, exist_ok=True)
    recs = []
    for step in range(0, 1001, 100):
        tokens = step * 4096
        val = 6.0 - 2.0 * step / 1000 - (0.3 if onset is not None and step >= onset else 0.0)
        rec = {"step": step, "tokens": tokens, "val_loss": val}
        if step:
            rec["train_loss"] = val + 0.1
        formed = onset is not None and step >= onset
        ind = [[0.01] * 4, [0.01] * 4]
        ind[1][ind_head] = 0.6 if formed else 0.05
        prev = [[0.1] * 4, [0.1] * 4]
        prev[0][prev_head] = 0.9
        rec.update({"induction_scores_50": ind, "previous_token_scores": prev, "icl_score": -0.5 if formed else -0.1})
        recs.append(rec)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))


def _sweep(tmp_path, members) -> Path:
    out = tmp_path / "sw"
    out.mkdir()
    record = {"status": "finished", "steps": 1000, "seeds": [m[0] for m in members],
              "train_config": {"batch_size": 32, "seq_len": None}, "model_config": {"n_ctx": 128, "n_heads": 4,
                                                                                     "model_name": "toy $x$"},
              "notes": {"induction_scores_{p}": "second copy"},
              "members": [{"seed": s, "folder": f"seed-{s}", "status": st} for s, st, *_ in members]}
    (out / "sweep.json").write_text(json.dumps(record))
    for s, st, onset, prev, ind in members:
        if st != "failed":
            _member(out / f"seed-{s}", s, onset, prev, ind, weights=True)
    return out


def test_sweep_summary_reads_what_was_written(tmp_path):
    out = _sweep(tmp_path, [(0, "finished", 300, 2, 1), (1, "finished", 500, 2, 3), (2, "finished", None, 0, 1),
                            (5, "failed", None, 0, 0)])
    s = sweep_summary(out)
    by = {r["seed"]: r for r in s["seeds"]}
    assert by[0]["formation_step"] == 300 and by[0]["formation_tokens"] == 300 * 4096
    assert by[1]["formation_step"] == 500 and by[2]["formation_step"] is None
    assert by[0]["previous_token_head"] == "L0H2" and by[2]["previous_token_head"] == "L0H0"
    assert by[0]["induction_heads"] == ["L1H1"] and by[1]["induction_heads"] == ["L1H3"]
    assert by[2]["induction_heads"] == []
    assert by[0]["rise_tokens"] == 100 * 4096 and by[2]["rise_tokens"] is None  # one checkpoint interval: 0.05 → 0.6
    from analyses.stats import max_count_p_value
    from analyses.sweep import rise_tokens

    assert s["most_common_previous_token_head"]["p_uniform"] == pytest.approx(max_count_p_value(2, 3, 4))
    assert rise_tokens([(0, 0, 0.0), (1, 10, 0.05), (2, 20, 0.3), (3, 30, 0.55), (4, 40, 0.6)]) == 30 - 10
    from analyses.sweep import crossing

    # 0.3 at step 2, 0.55 at step 3: 0.4 is crossed 0.1 / 0.25 of the way, bracket (2, 3]
    c = crossing([(0, 0, 0.0), (1, 10, 0.05), (2, 20, 0.3), (3, 30, 0.55), (4, 40, 0.6)])
    assert c["step"] == pytest.approx(2.4) and c["tokens"] == pytest.approx(24) and c["bracket"] == [2, 3]
    assert crossing([(0, 0, 0.1), (5, 50, 0.2)]) is None
    assert crossing([(7, 70, 0.5), (9, 90, 0.9)]) == {"step": 7.0, "tokens": 70.0, "bracket": [None, 7]}
    for r in (by[0], by[1]):  # the member's crossing lies in its bracket, whose top is the formation checkpoint
        lo, hi = r["crossing_bracket"]
        assert lo < r["crossing_step"] <= hi == r["formation_step"]
    lo, hi = s["formation_bound_steps"]
    assert lo == pytest.approx((by[0]["crossing_bracket"][0] + by[1]["crossing_bracket"][0]) / 2) and hi == 400
    assert by[0]["final_icl_score"] == -0.5 and by[2]["final_icl_score"] == -0.1
    assert by[5]["status"] == "failed" and "formation_step" not in by[5]
    assert s["formed"]["k"] == 2 and s["formed"]["n"] == 3 and s["n_failed"] == 1
    assert s["previous_token_formed"]["k"] == 3
    a = s["across_seeds"]["formation_step"]
    assert a["n"] == 2 and a["mean"] == 400 and a["low"] == pytest.approx(400 - 12.706204736 * math.sqrt(2e4) /
                                                                            math.sqrt(2))
    assert s["most_common_previous_token_head"]["head"] == "L0H2" and s["most_common_previous_token_head"]["k"] == 2
    from circuits.eigen import copying_scores

    assert by[1]["copying_score_best_induction_head"] == pytest.approx(
        float(copying_scores(load(out / "seed-1"))[1, 3]))
    fig = plot_sweep(s)
    try:
        assert figure_problems(fig) == []
        texts = [t.get_text() for t in fig.axes[1].get_legend().get_texts()]
        assert texts == ["seed 0", "seed 1", "seed 2"]
        assert "toy \\$x\\$" in fig.axes[0].get_title()  # metadata text is escaped, never mathtext
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


def test_sweep_refuses_a_member_folder_outside_the_sweep(tmp_path):
    out = _sweep(tmp_path, [(0, "finished", 300, 2, 1)])
    rec = json.loads((out / "sweep.json").read_text())
    rec["members"][0]["folder"] = "../elsewhere"
    (out / "sweep.json").write_text(json.dumps(rec))
    with pytest.raises(ValueError, match="not seed-"):
        sweep_summary(out)


def test_sweep_of_a_sweep_with_a_member_folder_deleted_exits_2(tmp_path, capsys):
    out = _sweep(tmp_path, [(0, "finished", 300, 2, 1), (1, "finished", 500, 1, 2)])
    shutil.rmtree(out / "seed-1")
    capsys.readouterr()
    assert main(["sweep", str(out), "--out", str(tmp_path / "doc")]) == 2
    err = capsys.readouterr().err.strip()
    assert "seed-1" in err and "missing" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "doc").exists()


def _full_disk_at(monkeypatch, name: str) -> None:
    """Opening a file named `name*` for writing fails with ENOSPC, whichever writer opens it (a path or a descriptor
    from mkstemp: both go through io.open)."""
    real = io.open

    def full(file, mode="r", *a, **k):
        path = os.readlink(f"/proc/self/fd/{file}") if isinstance(file, int) else str(file)
        if any(c in mode for c in "wax+") and (Path(path).name.startswith(name) or
                                                Path(path).name.startswith(f".{name}")):
            raise OSError(errno.ENOSPC, "No space left on device", path)
        return real(file, mode, *a, **k)

    monkeypatch.setattr(io, "open", full)


@pytest.mark.parametrize("command, text", [("sweep", "sweep.md"), ("report", "report.md")])
def test_sweep_report_on_a_full_disk_keeps_the_previous_one_and_exits_1(tmp_path, capsys, monkeypatch, command,
                                                                        text):
    out = _sweep(tmp_path, [(0, "finished", 300, 2, 1), (1, "finished", 500, 1, 2)])
    doc = tmp_path / "doc"
    assert main([command, str(out), "--out", str(doc), "--no-copying"][:None if command == "sweep" else 4]) == 0
    before = {p.name: p.read_bytes() for p in doc.iterdir()}
    _member(out / "seed-1", 1, 700, 1, 2, weights=False)  # the new report differs: another formation step
    capsys.readouterr()
    _full_disk_at(monkeypatch, text)
    assert main([command, str(out), "--out", str(doc), "--no-copying"][:None if command == "sweep" else 4]) == 1
    err = capsys.readouterr().err.strip()
    assert "No space left on device" in err and len(err.splitlines()) == 1
    assert {p.name: p.read_bytes() for p in doc.iterdir()} == before  # no new sweep.png beside the old text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["doc", "sw"]  # no staging folder left


def test_sweep_command_writes_its_files(tmp_path, capsys):
    out = _sweep(tmp_path, [(0, "finished", 300, 2, 1), (1, "finished", 500, 1, 2)])
    assert main(["sweep", str(out), "--out", str(tmp_path / "doc"), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["formed"]["k"] == 2
    shipped = json.loads((tmp_path / "doc" / "sweep.json").read_text())
    assert shipped["analysis"]["formed"]["k"] == 2 and shipped["notes"] == {"induction_scores_{p}": "second copy"}
    assert (tmp_path / "doc" / "sweep.png").stat().st_size > 0
    assert "formation" in (tmp_path / "doc" / "sweep.md").read_text()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("x")
    assert main(["sweep", str(out), "--out", str(tmp_path / "mine")]) == 2
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == ["notes.txt"]


def test_report_of_a_sweep_folder_is_its_sweep_section(tmp_path, capsys):
    out = _sweep(tmp_path, [(0, "finished", 300, 2, 1), (1, "finished", 500, 1, 2)])
    assert main(["report", str(out), "--out", str(tmp_path / "rep"), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["sections"] == ["sweep"] and printed["analysis"]["formed"]["k"] == 2
    page = (tmp_path / "rep" / "report.md").read_text()
    assert page.startswith("# Circuits report: seed sweep") and "](sweep.png)" in page
    assert sweep_markdown(sweep_summary(out)) in page
    from models.io.run_folder import MARK_FILE

    assert sorted(p.name for p in (tmp_path / "rep").iterdir()) == [MARK_FILE, "report.md", "sweep.json",
                                                                     "sweep.png"]
    # options of a model's report do not apply to a sweep, and nothing is written
    assert main(["report", str(out), "--out", str(tmp_path / "rep2"), "--html"]) == 2
    assert "seed sweep" in capsys.readouterr().err and not (tmp_path / "rep2").exists()


# --- the acceptance command -----------------------------------------------------------------------------------
@pytest.mark.e2e
def test_acceptance_sweep_of_four_writes_loadable_members(tmp_path):
    out = tmp_path / "D"
    r = subprocess.run([sys.executable, "-m", "analyses.cli", "train", "--preset", "attn-only-2l", "--seeds", "0-3",
                        "--steps", "40", "--out", str(out), "--json"], capture_output=True, text=True, timeout=3000,
                       cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads(r.stdout)
    assert [m["status"] for m in summary["members"]] == ["finished"] * 4
    for k in range(4):
        m = load(out / f"seed-{k}")
        assert m.cfg.seed == k and m.tokenizer is not None
        assert (out / f"seed-{k}" / "card.md").is_file() and (out / f"seed-{k}" / "checkpoints").is_dir()
    for argv in (["heads", str(out / "seed-2"), "--json"], ["sweep", str(out), "--json"]):
        r = subprocess.run([sys.executable, "-m", "analyses.cli", *argv], capture_output=True, text=True,
                           timeout=1200, cwd=ROOT)
        assert r.returncode == 0, r.stderr[-2000:]
        json.loads(r.stdout)
    # member 1 is `--seed 1` alone: same initial weights, and losses to float32 rounding
    alone = tmp_path / "alone"
    r = subprocess.run([sys.executable, "-m", "analyses.cli", "train", "--preset", "attn-only-2l", "--seed", "1",
                        "--steps", "40", "--out", str(alone), "--json", "--no-scores"], capture_output=True, text=True,
                       timeout=3000, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    from models.io.checkpoint import read_safetensors

    a = read_safetensors(out / "seed-1" / "checkpoints" / "step-000000" / "model.safetensors")
    b = read_safetensors(alone / "checkpoints" / "step-000000" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    la = [json.loads(x) for x in (out / "seed-1" / "metrics.jsonl").read_text().splitlines()]
    lb = [json.loads(x) for x in (alone / "metrics.jsonl").read_text().splitlines()]
    pairs = [(x["train_loss"], y["train_loss"]) for x, y in zip(la, lb, strict=True) if "train_loss" in x]
    assert pairs and max(abs(x - y) / abs(y) for x, y in pairs) < 1e-3

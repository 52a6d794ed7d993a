"""A seed sweep's science (`circuits train --seeds`, `models.training.sweep`): per seed, when the induction heads
formed and which heads became the circuit; across seeds, the mean and a 95 % interval of each number; one figure of
every seed's curves.

Per seed (read from `OUT/seed-K/metrics.jsonl` and the member's newest weights):
- formation point: where the best layer ≥ 1 induction score (|R| = 50) first crosses `FORMED` (0.4, ARENA's
  threshold), by linear interpolation between the last checkpoint below it and the first at or above it
  (`crossing`; as step and tokens, with that bracket, the interpolation's resolution), the first checkpoint at or
  above it (an upper bound: `formation_step` / `formation_tokens`), and the loss bump
  (`analyses.dynamics.loss_bump`) in tokens;
- the circuit at the newest checkpoint: the layer-0 head with the highest previous-token score, the layer ≥ 1 heads
  whose induction score is ≥ 0.4, and the OV copying score (Σλ/Σ|λ| of W_E W_V W_O W_U, `circuits.eigen`) of
  the best induction head;
- the final ICL score and validation loss;
- how abrupt the rise is: `rise_tokens`, the tokens between the last checkpoint whose best induction score is below
  10 % of the final one and the first at or above 90 % of it (the 10–90 % rise time, an upper bound at the
  checkpoints' resolution), for a seed whose final score reached `FORMED`.

Across seeds: the checkpoints alone bound the mean crossing to (mean of the brackets' lower ends, mean of their
upper ends] (`formation_bound_steps`); the mean and Student's t 95 % interval, mean ± t₀.₉₇₅,ₙ₋₁ · s/√n (Student
1908), over the seeds that have the number (a seed whose heads never formed has no formation point: the count says
how many do); proportions (how many seeds form an induction head, how many share the most common previous-token
head) with Wilson's 95 % score interval (Wilson 1927). Olsson et al. (2022, "In-context Learning and Induction
Heads", §3) report the phase change in every small attention-only model they trained, abrupt and within a narrow
window of tokens.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from models.arch.model import head_label
from models.errors import FolderError
from models.io.checkpoint import WEIGHTS_FILE
from models.training.state import METRICS_FILE, read_metrics, step_dir
from models.training.sweep import SWEEP_FILE, sweep_json

from .dynamics import FORMED, loss_bump
from .labels import figure_text
from .stats import max_count_p_value, t_interval, wilson_interval

__all__ = ["sweep_summary", "plot_sweep", "sweep_markdown", "rise_tokens", "crossing"]

INDUCTION_KEY = "induction_scores_50"


# --- per seed -------------------------------------------------------------------------------------------------
def _member_folder(out: Path, member: dict) -> Path:
    """The member's folder, which must be `seed-K` inside `out` (sweep.json is data: no path leaves the sweep)."""
    name = member.get("folder")
    if not isinstance(name, str) or name != f"seed-{member.get('seed')}":
        raise ValueError(f"{out / SWEEP_FILE}: member folder {name!r} is not seed-<its seed>")
    if not (out / name).is_dir():  # deleted or moved: its numbers would read as a member that never trained
        raise FolderError(f"{out}: member folder {name} of the seed sweep is missing (the sweep was changed since "
                          "it was written); restore it, or analyse another sweep")
    return out / name


def _best_induction(scores) -> float:
    rows = scores[1:] if len(scores) > 1 else scores
    return max(max(r) for r in rows)


def crossing(curve: list, threshold: float = FORMED) -> dict | None:
    """Where a `(step, tokens, score)` curve, sampled at checkpoints, first reaches `threshold`: `{"step",
    "tokens"}` by linear interpolation between the last checkpoint below the threshold and the first at or above it,
    and that `"bracket"` (steps; the interpolation's resolution: the true crossing lies in (low, high] whatever the
    curve does between them). None if the curve never reaches it; a curve at or above it from its first checkpoint
    has no bracket below: the crossing is that checkpoint, bracket (None, step)."""
    i = next((k for k, (_, _, v) in enumerate(curve) if v >= threshold), None)
    if i is None:
        return None
    s1, t1, v1 = curve[i]
    if i == 0:
        return {"step": float(s1), "tokens": float(t1), "bracket": [None, s1]}
    s0, t0, v0 = curve[i - 1]
    f = (threshold - v0) / (v1 - v0)
    return {"step": s0 + f * (s1 - s0), "tokens": t0 + f * (t1 - t0), "bracket": [s0, s1]}


def member_numbers(folder: Path, batch_tokens: int, copying: bool = True) -> dict:
    """The per-seed numbers of the module docstring from one member's folder."""
    recs = read_metrics(folder / METRICS_FILE)
    scored = [r for r in recs if INDUCTION_KEY in r and "tokens" in r]
    curve = [(r["step"], r["tokens"], _best_induction(r[INDUCTION_KEY])) for r in scored]
    formed = next(((s, t, v) for s, t, v in curve if v >= FORMED), None)
    cross = crossing(curve)
    val = [(int(r["tokens"]), float(r["val_loss"])) for r in recs if "val_loss" in r and "tokens" in r]
    bump, slopes = loss_bump(val)
    out = {"steps_reached": max((r.get("step", 0) for r in recs if "failed" not in r), default=0),
           "formation_step": formed[0] if formed else None, "formation_tokens": formed[1] if formed else None,
           "crossing_step": cross["step"] if cross else None, "crossing_tokens": cross["tokens"] if cross else None,
           "crossing_bracket": cross["bracket"] if cross else None,
           "loss_bump_tokens": bump, "loss_bump_step": None if bump is None else bump // batch_tokens,
           "loss_bump_slopes": list(slopes) if slopes else None,
           "induction_curve": [[s, t, v] for s, t, v in curve],
           "val_loss_curve": [[t, v] for t, v in val],
           "train_loss_curve": [[int(r["tokens"]), float(r["train_loss"])] for r in recs if "train_loss" in r]}
    out["rise_tokens"] = rise_tokens(curve)
    last = scored[-1] if scored else {}
    out["scored_step"] = last.get("step")
    out["final_val_loss"] = val[-1][1] if val else None
    out["final_icl_score"] = last.get("icl_score")
    prev = last.get("previous_token_scores")
    if prev:
        h = max(range(len(prev[0])), key=lambda i: prev[0][i])
        out["previous_token_head"], out["previous_token_score"] = head_label(0, h), prev[0][h]
    ind = last.get(INDUCTION_KEY)
    if ind:
        heads = [(layer, h, v) for layer, row in enumerate(ind) for h, v in enumerate(row) if layer >= 1]
        out["induction_heads"] = [head_label(layer, h) for layer, h, v in heads if v >= FORMED]
        best = max(heads, key=lambda x: x[2])
        out["best_induction_head"], out["best_induction_score"] = head_label(best[0], best[1]), best[2]
        if copying:
            out["copying_score_best_induction_head"] = _copying(folder, last["step"], best[0], best[1])
    return out


def rise_tokens(curve: list[tuple[int, int, float]]) -> int | None:
    """The 10–90 % rise of a `(step, tokens, score)` curve in tokens (module docstring), None below `FORMED`."""
    if not curve or curve[-1][2] < FORMED:
        return None
    final = curve[-1][2]
    top = next(i for i, (_, _, v) in enumerate(curve) if v >= 0.9 * final)
    below = [i for i in range(top) if curve[i][2] < 0.1 * final]
    return curve[top][1] - curve[below[-1]][1] if below else None


def _copying(folder: Path, step: int, layer: int, head: int) -> float | None:
    """OV copying score of one head in the member's weights at `step` (final model, else that checkpoint)."""
    from circuits.eigen import copying_scores
    from models.io.checkpoint import load

    for where in (step_dir(folder, step), folder):
        if (where / WEIGHTS_FILE).is_file():
            return float(copying_scores(load(where, device="cpu"))[layer, head])
    return None


# --- across seeds ---------------------------------------------------------------------------------------------
SUMMARISED = ("crossing_step", "crossing_tokens", "formation_step", "formation_tokens", "rise_tokens",
              "loss_bump_tokens", "final_icl_score",
              "final_val_loss", "previous_token_score", "best_induction_score", "copying_score_best_induction_head")


def sweep_summary(out, copying: bool = True) -> dict:
    """Per-seed numbers and their distribution across the seeds of the sweep in folder `out` (see the module
    docstring). A member still training (or killed) is read up to its newest scored checkpoint (`scored_step`);
    a failed member is listed and left out of the statistics."""
    out = Path(out)
    sweep = sweep_json(out)
    tc = sweep.get("train_config", {})
    n_ctx = (sweep.get("model_config") or {}).get("n_ctx")
    n_heads = (sweep.get("model_config") or {}).get("n_heads")
    batch_tokens = int(tc.get("batch_size", 1)) * int(tc.get("seq_len") or n_ctx or 1)
    seeds = []
    for m in sweep["members"]:
        row = {"seed": m.get("seed"), "status": m.get("status")}
        if m.get("status") == "failed":
            row.update(failed_at_step=m.get("failed_at_step"), reason=m.get("reason"))
        else:
            row.update(member_numbers(_member_folder(out, m), batch_tokens, copying))
        seeds.append(row)
    ok = [r for r in seeds if r["status"] != "failed"]
    across = {k: t_interval([r.get(k) for r in ok]) for k in SUMMARISED}
    brackets = [r["crossing_bracket"] for r in ok if r.get("crossing_bracket")]
    widths = [b[1] - b[0] for b in brackets if b[0] is not None]
    n_formed = sum(r.get("formation_step") is not None for r in ok)
    prev = Counter(r.get("previous_token_head") for r in ok if r.get("previous_token_head"))
    common = prev.most_common(1)[0] if prev else (None, 0)
    return {"sweep": str(out), "status": sweep.get("status"), "steps": sweep.get("steps"), "n_seeds": len(seeds),
            "n_failed": len(seeds) - len(ok), "threshold": FORMED, "induction_key": INDUCTION_KEY,
            "score_definitions": sweep.get("notes", {}), "batch_tokens": batch_tokens,
            "model_name": (sweep.get("model_config") or {}).get("model_name"),
            "steps_reached": min((r["steps_reached"] for r in ok), default=0),
            "interval": "95 % Student t interval over seeds (mean ± t·s/√n); proportions: Wilson score interval",
            "formed": wilson_interval(n_formed, len(ok)),
            "previous_token_formed": wilson_interval(
                sum((r.get("previous_token_score") or 0) >= FORMED for r in ok), len(ok)),
            "previous_token_heads": dict(sorted(prev.items())),
            "most_common_previous_token_head": {"head": common[0], **wilson_interval(common[1], len(ok)),
                                                "p_uniform": None if not n_heads else
                                                max_count_p_value(common[1], sum(prev.values()), int(n_heads))},
            "induction_heads": dict(sorted(Counter(h for r in ok for h in r.get("induction_heads", [])).items())),
            "formation_bound_steps": [sum(b[0] for b in brackets) / len(brackets),
                                      sum(b[1] for b in brackets) / len(brackets)]
            if brackets and all(b[0] is not None for b in brackets) else None,
            "crossing_resolution_steps": [min(widths), max(widths)] if widths else None,
            "across_seeds": across, "seeds": seeds}


def _fmt(v, digits=3) -> str:
    if v is None:
        return "–"
    if isinstance(v, float) and abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.{digits}f}" if isinstance(v, float) else f"{v:,}" if isinstance(v, int) else str(v)


def _bracket(b) -> str:
    return "–" if not b else f"({'–' if b[0] is None else f'{b[0]:,}'}, {b[1]:,}]"


def sweep_markdown(s: dict) -> str:
    """The report section of a sweep summary: a table per seed, the distribution across seeds."""
    from .util import markdown_table

    reached = s["steps_reached"]
    head = [f"## Seed sweep: {s['n_seeds']} seeds of {s.get('model_name') or 'the model'}", "",
            f"Training steps reached: {reached:,} of {s['steps']:,} per seed" +
            ("" if reached >= (s["steps"] or 0) else " (the sweep is unfinished: numbers at its newest checkpoint)") +
            f"; failed (diverged): {s['n_failed']}. Formation: where the best layer-1 induction score crosses "
            f"{s['threshold']}, interpolated linearly between the checkpoints around it (bracket: those two "
            "checkpoints' steps); formation checkpoint: the first checkpoint at or above it.", ""]
    rows = [[r["seed"], r["status"], _fmt(r.get("crossing_step"), 0), _bracket(r.get("crossing_bracket")),
             _fmt(r.get("formation_step")), _fmt(r.get("formation_tokens")),
             _fmt(r.get("rise_tokens")), _fmt(r.get("loss_bump_tokens")), r.get("previous_token_head", "–"),
             _fmt(r.get("previous_token_score")), ", ".join(r.get("induction_heads", [])) or "none",
             _fmt(r.get("best_induction_score")), _fmt(r.get("copying_score_best_induction_head")),
             _fmt(r.get("final_icl_score")), _fmt(r.get("final_val_loss"), 4)] for r in s["seeds"]]
    table = markdown_table(["seed", "status", "crossing step (interpolated)", "bracket (steps)",
                            "formation checkpoint", "its tokens", "10–90 % rise (tokens, ≤)",
                            "loss bump (tokens)",
                            "prev-token head", "score", "induction heads (≥ 0.4)", "best induction",
                            "copying (best ind.)", "ICL", "val loss"], rows)
    f, p = s["formed"], s["previous_token_formed"]
    c = s["most_common_previous_token_head"]
    lines = [f"- induction heads formed in **{f['k']} of {f['n']}** seeds (Wilson 95 %: "
             f"{_fmt(f['low'], 2)}–{_fmt(f['high'], 2)})" if f["n"] else "- no live seeds",
             f"- a previous-token head (a layer-0 head scoring ≥ {s['threshold']}) in **{p['k']} of {p['n']}** seeds "
             f"(Wilson 95 %: {_fmt(p['low'], 2)}–{_fmt(p['high'], 2)}); the highest-scoring layer-0 head: "
             f"{s['previous_token_heads']}, most common {c['head']} in {c['k']} of {c['n']}" +
             ("" if c.get("p_uniform") is None else f" (if every seed picked one of the layer-0 heads uniformly, a "
              f"head this common or more: p = {c['p_uniform']:.2f}, exact)") if c["n"] else ""]
    if s.get("formation_bound_steps"):
        lo, hi = s["formation_bound_steps"]
        w = s["crossing_resolution_steps"]
        lines.append(f"- the checkpoints alone bound the mean crossing step to ({lo:,.0f}, {hi:,.0f}] (each seed's "
                     f"crossing lies in its bracket, {w[0]:,}–{w[1]:,} steps wide); the interpolated mean below "
                     "assumes the score rises linearly within a bracket")
    for k in SUMMARISED:
        a = s["across_seeds"][k]
        if a["n"] and k not in ("formation_step", "formation_tokens"):  # checkpoint steps: the bound above says it
            lines.append(f"- {k.replace('_', ' ')}: mean **{_fmt(a['mean'])}**, 95 % t interval "
                         f"[{_fmt(a['low'])}, {_fmt(a['high'])}] (n = {a['n']})")
    return "\n".join(head + [table, ""] + [x for x in lines if x] + [""])


# --- the figure -----------------------------------------------------------------------------------------------
def plot_sweep(s: dict):
    """Every seed's validation loss (tokens on a log axis: the whole run) and best layer-1 induction score (tokens
    on a linear axis, in millions: the phase change at its own width) against tokens, one colour per seed, the
    formation points marked (○: the formation checkpoint on the loss panel, the interpolated crossing on the score
    panel) and the 0.4 threshold drawn; returns the matplotlib figure."""
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_ind) = plt.subplots(1, 2, figsize=(11, 4.2))
    cmap = plt.get_cmap("tab10" if len(s["seeds"]) <= 10 else "tab20")
    for i, r in enumerate(s["seeds"]):
        colour = cmap(i % cmap.N)
        label = figure_text(f"seed {r['seed']}" + (" (failed)" if r["status"] == "failed" else ""))
        val, ind = r.get("val_loss_curve") or [], r.get("induction_curve") or []
        if val:
            ax_loss.plot(*zip(*val), "-", color=colour, lw=1.2, label=label)
        if ind:
            ax_ind.plot([t / 1e6 for _, t, _ in ind], [v for _, _, v in ind], "-", color=colour, lw=1.2, label=label)
        t_form = r.get("formation_tokens")
        if t_form is not None:
            v_at = [v for t, v in val if t == t_form]
            if v_at:
                ax_loss.plot([t_form], v_at, "o", mfc="none", color=colour, ms=7)
        if r.get("crossing_tokens") is not None:  # the interpolated crossing, on the threshold line
            ax_ind.plot([r["crossing_tokens"] / 1e6], [s["threshold"]], "o", mfc="none", color=colour, ms=7)
    ax_ind.axhline(s["threshold"], color="grey", lw=0.8, ls="--")
    ax_ind.text(0.99, s["threshold"] + 0.02, f"formed: {s['threshold']}", transform=ax_ind.get_yaxis_transform(),
                fontsize=8, color="grey", ha="right")
    ax_loss.set_xscale("symlog", linthresh=1e5)
    ax_loss.set_xlim(left=0)
    ax_ind.set_xlim(left=0)
    ax_loss.set_xlabel("tokens seen (per seed; linear below 10⁵, log above)", fontsize=9)
    ax_ind.set_xlabel("tokens seen (millions, per seed)", fontsize=9)
    for ax in (ax_loss, ax_ind):
        ax.tick_params(labelsize=8)
    ax_loss.set_ylabel("validation loss (nats/token)", fontsize=9)
    ax_ind.set_ylabel("best layer-1 induction score (|R| = 50)", fontsize=9)
    name = figure_text(s.get("model_name") or "model")
    ax_loss.set_title(f"{name}: {s['n_seeds']} seeds, validation loss", fontsize=10)
    ax_ind.set_title(f"induction score; ○ = crossing of {s['threshold']} (interpolated)", fontsize=10)
    ax_ind.set_ylim(-0.02, 1.02)
    ax_ind.legend(fontsize=8, ncol=2, loc="lower right", bbox_to_anchor=(1.0, 0.04))  # under the risen curves
    fig.tight_layout()
    return fig

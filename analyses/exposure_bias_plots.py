"""Figures of the exposure-bias experiment (`analyses.exposure_bias_experiment`'s results.json), per task: per target
position, the error from true prefixes against free running (against the true and the prefix-consistent target); and
per distance after one injected wrong symbol, the error of the model's own continuation against the base rate. Means
over the main seeds with their 95 % intervals as bands, labels from the results' own metadata."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.lines import Line2D

COLOURS = ("#222222", "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#8c564b", "#ff7f0e")
TARGET_NAMES = {"gold": "true target", "consistent": "prefix-consistent target"}


def _band(ax, x, triples, colour, label, style="-"):
    m, lo, hi = (np.array([np.nan if t[i] is None else t[i] for t in triples], dtype=float) for i in range(3))
    ax.plot(x, m, style, color=colour, label=label, marker="o", markersize=3)
    ax.fill_between(x, lo, hi, color=colour, alpha=0.18, linewidth=0)


def _label(name: str, entry: dict) -> str:
    return f"{name} ({len(entry['seeds'])} seeds)"


def _targets(task: str) -> tuple[str, ...]:
    return ("consistent",) if task == "walk" else ("gold", "consistent")


def plot_per_position(result: dict, task: str = "cumsum"):
    """One panel per schedule: error rate at each target position from true prefixes and free running, against each
    target the task reports; for cumsum also 1 − Π(1 − e_i), every true-prefix error carried to the end."""
    schedules = result["tasks"][task]["schedules"]
    fig, axes = plt.subplots(1, len(schedules), figsize=(max(2.6 * len(schedules) + 0.6, 8.0), 3.5), sharey=True,
                             layout="constrained", squeeze=False)
    targets = _targets(task)
    keys = [f"free_{t}_by_position" for t in targets] + ["compounded_by_position"] * (task != "walk")
    top = max((t[2] for e in schedules.values() for key in keys for t in e[key] if t[2] == t[2]), default=0.5)
    for ax, (name, e) in zip(axes[0], schedules.items()):
        x = np.arange(len(e["tf_consistent_by_position"]))
        _band(ax, x, e["tf_consistent_by_position"], COLOURS[1], "true prefix (teacher forced)")
        for t, c in zip(targets, (COLOURS[2], COLOURS[6])[-len(targets):]):
            _band(ax, x, e[f"free_{t}_by_position"], c, f"own prefix (free running), {TARGET_NAMES[t]}")
        if task != "walk":
            m = [t[0] for t in e["compounded_by_position"]]
            ax.plot(x, m, ":", color=COLOURS[0], label="1 − Π(1 − true-prefix error): every error carried")
        acc = e["measured_teacher_forced_accuracy"]
        ax.set_title(f"{_label(name, e)}\nteacher-forced accuracy {acc[0]:.3f}", fontsize=8)
        ax.set_xlabel("target position j", fontsize=8)
        ax.set_xticks(x)
        ax.tick_params(labelsize=7)
        ax.set_ylim(0, min(1.0, top * 1.1 + 0.02))
        ax.grid(alpha=0.3)
    axes[0, 0].set_ylabel("error rate of symbol j", fontsize=8)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7, loc="outside lower center", ncol=2)
    note = "\nposition 0 is a free choice: any symbol counts as right" if task == "walk" else ""
    fig.suptitle(f"seq2seq:{task}: error by position, mean and 95 % t-interval over seeds{note}", fontsize=9)
    return fig


def plot_injected(result: dict, task: str = "cumsum"):
    """One panel per target: the error of the model's own greedy continuation at distance d after one wrong symbol
    injected at position k (pooled over k), against the same positions continued from the true prefix (base)."""
    schedules = result["tasks"][task]["schedules"]
    targets = _targets(task)
    fig, axes = plt.subplots(1, len(targets), figsize=(4.6 * len(targets) + 2.4, 3.4), layout="constrained",
                             squeeze=False)
    for ax, t in zip(axes[0], targets):
        for c, (name, e) in zip(COLOURS, schedules.items()):
            x = np.arange(1, len(e[f"after_{t}_by_offset"]) + 1)
            _band(ax, x, e[f"after_{t}_by_offset"], c, _label(name, e))
            _band(ax, x, e[f"base_after_{t}_by_offset"], c, None, style="--")
        ax.set_xlabel("distance d = j − k after the wrong symbol at k", fontsize=8)
        ax.set_ylabel("error rate of symbol k + d", fontsize=8)
        ax.set_title(f"against the {TARGET_NAMES[t]}", fontsize=8)
        ax.set_ylim(0, 1.05 if t == "gold" else None)
        ax.set_xticks(x)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    handles += [Line2D([], [], color="grey", linestyle=ls) for ls in ("-", "--")]
    labels += ["after one wrong symbol", "base rate (no wrong symbol)"]
    fig.legend(handles, labels, fontsize=7, loc="outside right center")
    fig.suptitle(f"seq2seq:{task}: the model's own continuation after one injected wrong symbol,\nmean and 95 % "
                 "t-interval over seeds", fontsize=9)
    return fig

"""Figures of the exposure-bias experiment (`analyses.exposure_bias_experiment`'s results.json): per target position,
the error under true prefixes against free running, and the error after one injected wrong symbol against the base
rate; means over seeds with their 95 % intervals as bands, labels from the results' own metadata."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.lines import Line2D

COLOURS = ("#222222", "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#8c564b")


def _band(ax, x, triples, colour, label, style="-"):
    m, lo, hi = (np.array([t[i] for t in triples], dtype=float) for i in range(3))
    ax.plot(x, m, style, color=colour, label=label, marker="o", markersize=3)
    ax.fill_between(x, lo, hi, color=colour, alpha=0.18, linewidth=0)


def _label(name: str, entry: dict) -> str:
    return f"{name} ({len(entry['seeds'])} seeds)"


def plot_per_position(result: dict):
    """One panel per schedule: error rate at each target position under true prefixes and free running."""
    schedules = result["schedules"]
    fig, axes = plt.subplots(1, len(schedules), figsize=(max(2.6 * len(schedules) + 0.6, 8.0), 3.3), sharey=True,
                             layout="constrained", squeeze=False)
    top = max(t[2] for e in schedules.values() for key in ("free_by_position", "compounded_by_position")
              for t in e.get(key, []))
    for ax, (name, e) in zip(axes[0], schedules.items()):
        x = np.arange(len(e["gold_by_position"]))
        _band(ax, x, e["gold_by_position"], COLOURS[1], "true prefix (teacher forced)")
        _band(ax, x, e["free_by_position"], COLOURS[2], "own prefix (greedy, free running)")
        if "compounded_by_position" in e:
            m = [t[0] for t in e["compounded_by_position"]]
            ax.plot(x, m, ":", color=COLOURS[0], label="1 − Π(1 − true-prefix error): all errors carried")
        acc = e["measured_teacher_forced_accuracy"]
        ax.set_title(f"{_label(name, e)}\nteacher-forced accuracy {acc[0]:.3f}", fontsize=8)
        ax.set_xlabel("target position j", fontsize=8)
        ax.set_xticks(x)
        ax.tick_params(labelsize=7)
        ax.set_ylim(0, min(1.0, top * 1.1 + 0.02))
        ax.grid(alpha=0.3)
    axes[0, 0].set_ylabel("error rate of symbol j", fontsize=8)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7, loc="outside lower center", ncol=3)
    fig.suptitle(f"{result['setup']['task']}: error by position, mean and 95 % t-interval over seeds", fontsize=9)
    return fig


def plot_injected(result: dict):
    """Per injection position k: the next symbol's error after a wrong symbol k (later inputs true), and the mean error
    of the model's own continuation after it, each against the same positions' base rate (no injection)."""
    schedules = result["schedules"]
    fig, axes = plt.subplots(1, 2, figsize=(9.0, 3.3), layout="constrained")
    panels = (("injected_next_by_k", "base_next_by_k", "error rate of symbol k + 1",
               "next symbol, later inputs true"),
              ("injected_continuation_by_k", "base_continuation_by_k", "mean error rate of symbols k + 1 …",
               "own greedy continuation after k"))
    for ax, (inj, base, ylabel, title) in zip(axes, panels):
        for c, (name, e) in zip(COLOURS, schedules.items()):
            x = np.arange(len(e[inj]))
            _band(ax, x, e[inj], c, _label(name, e))
            _band(ax, x, e[base], c, None, style="--")
        ax.set_xlabel("position k of the injected wrong symbol", fontsize=8)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.set_title(title, fontsize=8)
        ax.set_ylim(0, 1.05)
        ax.set_xticks(np.arange(len(next(iter(schedules.values()))[inj])))
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    handles += [Line2D([], [], color="grey", linestyle=ls) for ls in ("-", "--")]
    labels += ["wrong symbol injected at k", "base rate (no injection)"]
    fig.legend(handles, labels, fontsize=7, loc="outside right center")
    fig.suptitle("One injected wrong symbol against the base rate, mean and 95 % t-interval over seeds", fontsize=9)
    return fig

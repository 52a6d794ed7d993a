"""Figures of the commands whose main result has none in `analyses.plots` (`circuits paths`, `circuits trigrams`):
ranked bars, drawn with matplotlib's constrained layout (nothing cut off), text at 7 pt or more, token text escaped
by `analyses.labels.figure_text`. Imported inside the `run_*` functions (fast `--help`)."""

from __future__ import annotations


def plot_ranked_bars(names: list[str], values: list[float], xlabel: str, title: str):
    """One horizontal bar per `(name, value)`, the first at the top."""
    import matplotlib.pyplot as plt

    from ..labels import figure_text

    n = max(len(names), 1)
    fig, ax = plt.subplots(figsize=(7.0, 1.2 + 0.28 * n), layout="constrained")
    ax.barh(range(len(values)), values, color=["tab:blue" if v >= 0 else "tab:red" for v in values])
    ax.set_yticks(range(len(names)), [figure_text(s) for s in names], fontsize=8)
    ax.invert_yaxis()
    ax.axvline(0, color="0.5", lw=0.8)
    ax.set_xlabel(xlabel, fontsize=9)
    ax.set_title(_wrap(title, fig), fontsize=10)
    return fig


def _wrap(text: str, fig) -> str:
    """`text` broken into lines that fit the figure's width at 10 pt (a model named by a long path included)."""
    import textwrap

    return textwrap.fill(text, max(30, int(10 * fig.get_figwidth())))


def plot_term_importance(losses: list[float], n_terms: list[int], model_loss: float, top: list[tuple[str, float]],
                         about: str):
    """`circuits paths`: the loss as path terms of higher order are kept (left; the model's own loss dashed) and the
    single terms whose removal raises the loss most (right)."""
    import matplotlib.pyplot as plt

    from ..labels import figure_text

    fig, (a, b) = plt.subplots(1, 2, figsize=(10.0, max(3.2, 1.2 + 0.28 * len(top))), layout="constrained",
                               width_ratios=(1, 1.4))
    orders = list(range(len(losses)))
    a.plot(orders, losses, marker="o", color="tab:blue", label="path terms up to this order")
    a.axhline(model_loss, color="0.3", ls="--", lw=1, label=f"model {model_loss:.3f}")
    a.set_xticks(orders, [f"{k}\n({n} terms)" for k, n in zip(orders, n_terms)], fontsize=8)
    a.set_xlabel("order kept (0 = direct path)", fontsize=9)
    a.set_ylabel("loss (nats/token)", fontsize=9)
    a.legend(fontsize=8)
    a.set_title("loss of the truncated path expansion", fontsize=10)
    names, vals = [n for n, _ in top], [v for _, v in top]
    b.barh(range(len(vals)), vals, color="tab:orange")
    b.set_yticks(range(len(names)), [figure_text(s) for s in names], fontsize=8)
    b.invert_yaxis()
    b.set_xlabel("loss increase when removed (nats)", fontsize=9)
    b.set_title("largest single terms", fontsize=10)
    fig.suptitle(_wrap(f"Term importance, attention patterns frozen ({figure_text(about)})", fig), fontsize=9)
    return fig

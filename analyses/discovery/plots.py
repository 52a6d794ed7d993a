"""Figures of a discovered circuit: the graph laid out by layer, and the faithfulness curve."""

from __future__ import annotations

#: the colour of an edge by the receiver's input it enters
INPUT_COLOURS = {"q": "#1f77b4", "k": "#ff7f0e", "v": "#2ca02c", "mlp": "#7f7f7f", "logits": "#7f7f7f"}


def _plt():
    import matplotlib

    if matplotlib.get_backend().lower() not in ("agg", "module://matplotlib_inline.backend_inline"):
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _component(name: str) -> tuple[str, str]:
    """(component, input) of a node name: "L1H2.k" → ("L1H2", "k"); "L0.mlp" → ("L0.mlp", "mlp"); a sender:
    (it, "")."""
    if name == "logits":
        return name, "logits"
    if name.endswith(".mlp"):
        return name, "mlp"
    if "." in name:
        head, part = name.rsplit(".", 1)
        return head, part
    return name, ""


def _layout(nodes: list[str]) -> dict[str, tuple[float, float]]:
    """Column by layer (embeddings, then each layer's heads and its MLP, then the logits); heads stacked in a column."""
    cols = {}
    for n in nodes:
        if n in ("embed", "pos_embed"):
            col = 0.0
        elif n == "logits":
            col = None
        elif n.endswith(".mlp"):
            col = 2.0 + 2 * int(n[1:n.index(".")])
        else:
            col = 1.0 + 2 * int(n[1:n.index("H")])
        cols.setdefault(col, []).append(n)
    last = max((c for c in cols if c is not None), default=0.0) + 1
    if None in cols:
        cols[last] = cols.pop(None)
    pos = {}
    for col, names in cols.items():
        names = sorted(names, key=lambda s: (len(s), s))
        for i, n in enumerate(names):
            pos[n] = (col, (len(names) - 1) / 2 - i)
    return pos


def plot_circuit(result, max_edges: int = 60):
    """The circuit's edges (the `max_edges` of largest |score|) between components placed by layer (columns) and
    head (rows); width ∝ |score|, colour = the receiver's input (query, key, value, MLP, logits)."""
    plt = _plt()
    edges = result.circuit[:max_edges]
    comps = sorted({_component(s)[0] for s, _ in edges} | {_component(r)[0] for _, r in edges})
    pos = _layout(comps or ["embed", "logits"])
    n_rows = max(1, max((sum(1 for p in pos.values() if p[0] == c) for c in {p[0] for p in pos.values()}), default=1))
    n_cols = len({p[0] for p in pos.values()})
    fig, ax = plt.subplots(figsize=(max(5.5, 1.7 * n_cols + 1.5), max(3.2, 0.75 * n_rows + 1.6)))
    top = max((abs(result.scores[e]) for e in edges), default=1.0) or 1.0
    offsets = {"q": 0.16, "k": 0.0, "v": -0.16}
    for s, r in edges:
        (x0, y0) = pos[_component(s)[0]]
        comp, part = _component(r)
        (x1, y1) = pos[comp]
        y1 += offsets.get(part, 0.0)
        ax.annotate("", xy=(x1 - 0.17, y1), xytext=(x0 + 0.17, y0),
                    arrowprops=dict(arrowstyle="-|>", lw=0.6 + 5.0 * abs(result.scores[(s, r)]) / top,
                                    color=INPUT_COLOURS.get(part, "#7f7f7f"), alpha=0.75, shrinkA=0, shrinkB=0,
                                    connectionstyle="arc3,rad=0.08"))
    for n, (x, y) in pos.items():
        ax.text(x, y, n, ha="center", va="center", fontsize=8,
                bbox=dict(boxstyle="round,pad=0.3", fc="white", ec="black", lw=0.8))
    xs = [p[0] for p in pos.values()]
    ys = [p[1] for p in pos.values()]
    ax.set_xlim(min(xs) - 0.6, max(xs) + 0.6)
    ax.set_ylim(min(ys) - 0.7, max(ys) + 0.7)
    ax.axis("off")
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=c, lw=2.5, label={"q": "into query", "k": "into key", "v": "into value",
                                                       "mlp": "into MLP / logits"}[k])
               for k, c in INPUT_COLOURS.items() if k != "logits"]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.02), ncol=4, fontsize=8, frameon=False)
    shown = f"top {len(edges)} of {len(result.circuit)}" if len(result.circuit) > len(edges) else \
        f"{len(edges)} edges"
    ax.set_title(f"{result.model}: {result.task.get('name', '')} circuit by {result.method} ({shown}; "
                 f"faithfulness {result.faithfulness:.2f})\nline width ∝ |edge score| (max {top:.3g})", fontsize=9)
    fig.tight_layout()
    return fig


def plot_faithfulness(result):
    """The metric recovered by the top-k edges (by |score|) run alone and by the graph without them, against k."""
    plt = _plt()
    c = result.curve
    fig, ax = plt.subplots(figsize=(6.0, 3.6))
    ax.plot(c["k"], c["circuit_faithfulness"], color="#1f77b4", lw=1.6, label="top-k edges alone")
    ax.plot(c["k"], c["complement_faithfulness"], color="#d62728", lw=1.6, label="graph without the top-k")
    ax.axhline(1.0, color="black", lw=0.6, ls=":")
    ax.axhline(0.0, color="black", lw=0.6, ls=":")
    ax.axvline(len(result.circuit), color="#555555", lw=0.9, ls="--",
               label=f"found circuit: {len(result.circuit)} edges")
    ax.set_xlabel("k, edges kept (ranked by |score|)", fontsize=9)
    ax.set_ylabel("faithfulness (1 = whole model,\n0 = every edge ablated)", fontsize=9)
    ax.tick_params(labelsize=8)
    ax.set_title(f"{result.model}: {result.task.get('name', '')}, {result.method} ranking "
                 f"({len(result.edges)} edges)", fontsize=9)
    ax.legend(fontsize=8, loc="center right")
    fig.tight_layout()
    return fig


__all__ = ["INPUT_COLOURS", "plot_circuit", "plot_faithfulness"]

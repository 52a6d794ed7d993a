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


def _split(name: str) -> tuple[str, str]:
    """(stack prefix with its dot, the rest): "dec.L0XH1" → ("dec.", "L0XH1"); "L1H2" → ("", "L1H2")."""
    if name.startswith(("enc.", "dec.")):
        return name[:4], name[4:]
    return "", name


def _component(name: str) -> tuple[str, str]:
    """(component, input) of a node name: "L1H2.k" → ("L1H2", "k"); "L0.mlp" → ("L0.mlp", "mlp"); a
    cross-attention input "dec.L0H1.xk" → ("dec.L0XH1", "xk"); a sender: (it, "")."""
    p, rest = _split(name)
    if rest == "logits":
        return name, "logits"
    if rest.endswith(".mlp"):
        return name, "mlp"
    if "." in rest:
        head, part = rest.rsplit(".", 1)
        return p + (head.replace("H", "XH") if part.startswith("x") else head), part
    return name, ""


def _column(comp: str, base: float) -> float | None:
    """A component's column: embeddings 0, layer l's heads 1 + 2l and its MLP 2 + 2l (a decoder stack of an
    encoder–decoder: self-attention heads 1 + 3l, cross-attention heads 2 + 3l, MLP 3 + 3l), shifted by `base`;
    None for the logits (placed last)."""
    p, rest = _split(comp)
    if rest == "logits":
        return None
    if rest in ("embed", "pos_embed"):
        return base
    layer = int(rest[1:].split(".")[0].split("X")[0].split("H")[0])
    step = 3 if p == "dec." else 2
    if rest.endswith(".mlp"):
        return base + step + step * layer
    return base + 1 + step * layer + ("XH" in rest)


def _layout(nodes: list[str]) -> dict[str, tuple[float, float]]:
    """Column by layer (embeddings, then each layer's heads and its MLP, then the logits; an encoder–decoder's
    decoder to the right of its encoder); heads stacked in a column."""
    enc = [_column(n, 0.0) for n in nodes if _split(n)[0] == "enc."]
    dec_base = max(enc) + 1 if enc else 0.0
    cols = {}
    for n in nodes:
        col = _column(n, dec_base if _split(n)[0] == "dec." else 0.0)
        cols.setdefault(col, []).append(n)
    last = max((c for c in cols if c is not None), default=0.0) + 1
    if None in cols:
        cols[last] = cols.pop(None)
    if any(_split(n)[0] for n in nodes):  # an encoder–decoder: the columns present, side by side
        cols = {float(i): cols[c] for i, c in enumerate(sorted(cols))}
    pos = {}
    for col, names in cols.items():
        names = sorted(names, key=lambda s: (len(s), s))
        for i, n in enumerate(names):
            pos[n] = (col, (len(names) - 1) / 2 - i)
    return pos


def plot_circuit(result, max_edges: int = 60):
    """The circuit's edges (the `max_edges` of largest |score|) between components placed by layer (columns) and
    head (rows); width ∝ |score|, colour = the receiver's input (query, key, value, MLP, logits; a
    cross-attention head's query, key and value inputs as a head's)."""
    plt = _plt()
    edges = result.circuit[:max_edges]
    comps = sorted({_component(s)[0] for s, _ in edges} | {_component(r)[0] for _, r in edges})
    pos = _layout(comps or ["embed", "logits"])
    n_rows = max(1, max((sum(1 for p in pos.values() if p[0] == c) for c in {p[0] for p in pos.values()}), default=1))
    n_cols = len({p[0] for p in pos.values()})
    fig, ax = plt.subplots(figsize=(max(5.5, 1.7 * n_cols + 1.5), max(3.2, 0.75 * n_rows + 1.6)))
    top = max((abs(result.scores[e]) for e in edges), default=1.0) or 1.0
    offsets = {"q": 0.16, "k": 0.0, "v": -0.16, "xq": 0.16, "xk": 0.0, "xv": -0.16}
    for s, r in edges:
        (x0, y0) = pos[_component(s)[0]]
        comp, part = _component(r)
        (x1, y1) = pos[comp]
        y1 += offsets.get(part, 0.0)
        ax.annotate("", xy=(x1 - 0.17, y1), xytext=(x0 + 0.17, y0),
                    arrowprops=dict(arrowstyle="-|>", lw=0.6 + 5.0 * abs(result.scores[(s, r)]) / top,
                                    color=INPUT_COLOURS.get(part.lstrip("x"), "#7f7f7f"), alpha=0.75, shrinkA=0,
                                    shrinkB=0,
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

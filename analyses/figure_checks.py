"""What can be checked on a rendered matplotlib figure without looking at it: `figure_problems(fig)`.

A figure passes when
- nothing is drawn outside the canvas: the figure's tight bounding box (`Figure.get_tightbbox`, every artist
  that takes part in layout) lies inside the saved area, and so does every visible text;
- no two visible texts overlap (tick labels, titles, axis labels, annotations, legend entries, suptitle), and no
  text of one panel runs into another panel's plotting area;
- every heatmap (an `AxesImage` or `QuadMesh`) has a colourbar: one drawn for it, or a colourbar of the same
  colour map and limits (a colour scale shared by several panels);
- every colour bar names its quantity (a non-empty label other than "value");
- every text is at least `min_fontsize` points at the saved size.

The report's figure test runs it on every figure a report writes; the notebooks' and CLI's figures are tested too.
Notebooks: `watch_notebook_figures()` (which `notebooks/build.py` runs in the kernel before the first cell) checks
every figure as the inline backend displays it and records its problems, smallest text and dpi in the PNG output's
metadata; `notebook_figure_problems(nb)` reads them back and also refuses text that a viewer shows below 7 pt
because the PNG is wider than its output area (`NOTEBOOK_WIDTH_PX`) and is shrunk to it.
"""

from __future__ import annotations

import itertools

import numpy as np

#: Overlaps smaller than this many pixels in both directions are glyph padding, not overprinting.
SLACK_PX = 1.0


def _texts(fig):
    """(text artist, owning axes or None, role) for every visible, non-empty text of the figure."""
    out = []

    def add(t, ax, role):
        if t is not None and t.get_visible() and t.get_text().strip():
            out.append((t, ax, role))

    for t in fig.texts:
        add(t, None, "figure text")
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        for t in (ax.title, ax._left_title, ax._right_title):
            add(t, ax, "title")
        if ax.axison:
            for axis, name in ((ax.xaxis, "x"), (ax.yaxis, "y")):
                add(axis.label, ax, f"{name} label")
                add(axis.get_offset_text(), ax, f"{name} offset")
                lo, hi = sorted(ax.get_xlim() if name == "x" else ax.get_ylim())
                for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                    loc = tick.get_loc()
                    if loc is None or not (lo - 1e-9 * (hi - lo) <= loc <= hi + 1e-9 * (hi - lo)):
                        continue  # matplotlib does not draw ticks outside the view limits
                    add(tick.label1, ax, f"{name} tick")
                    add(tick.label2, ax, f"{name} tick")
        for t in ax.texts:
            add(t, ax, "annotation")
        leg = ax.get_legend()
        if leg is not None and leg.get_visible():
            for t in leg.get_texts():
                add(t, ax, "legend")
            add(leg.get_title(), ax, "legend")
    for leg in fig.legends:
        for t in leg.get_texts():
            add(t, None, "legend")
    return out


def _boxes(artists, renderer) -> np.ndarray:
    return np.array([[b.x0, b.y0, b.x1, b.y1] for b in (a.get_window_extent(renderer) for a in artists)])


def _overlap(a, b) -> bool:
    return (min(a[2], b[2]) - max(a[0], b[0]) > SLACK_PX) and (min(a[3], b[3]) - max(a[1], b[1]) > SLACK_PX)


def _describe(t, role) -> str:
    s = t.get_text().replace("\n", " ")
    return f"{role} {s[:40]!r}"


def _has_colourbar(m, bars) -> bool:
    if getattr(m, "colorbar", None) is not None:
        return True
    lim = m.get_clim()
    for cb in bars:
        same_map = cb.cmap.name == m.get_cmap().name
        if same_map and np.allclose(cb.mappable.get_clim(), lim, rtol=1e-6, atol=1e-12):
            return True
    return False


def figure_problems(fig, min_fontsize: float = 7.0) -> list[str]:
    """Problems of a figure as it would be saved (no `bbox_inches="tight"`), one sentence each; [] when none.
    Draws the figure once (layout engines run then)."""
    from matplotlib.collections import QuadMesh
    from matplotlib.image import AxesImage

    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    W, H = fig.bbox.width, fig.bbox.height
    problems = []
    tb = fig.get_tightbbox(r)  # inches
    dpi = fig.dpi
    if tb.x0 * dpi < -SLACK_PX or tb.y0 * dpi < -SLACK_PX or tb.x1 * dpi > W + SLACK_PX or tb.y1 * dpi > H + SLACK_PX:
        problems.append(f"the tight bounding box ({tb.x0:.2f}, {tb.y0:.2f}, {tb.x1:.2f}, {tb.y1:.2f}) in exceeds "
                        f"the canvas ({W / dpi:.2f} × {H / dpi:.2f} in)")
    texts = _texts(fig)
    if not texts:
        return problems
    boxes = _boxes([t for t, _, _ in texts], r)
    for (t, _, role), b in zip(texts, boxes):
        if b[0] < -SLACK_PX or b[1] < -SLACK_PX or b[2] > W + SLACK_PX or b[3] > H + SLACK_PX:
            problems.append(f"{_describe(t, role)} is cut off by the canvas edge")
        if t.get_fontsize() < min_fontsize - 1e-9:
            problems.append(f"{_describe(t, role)} is {t.get_fontsize():.1f} pt, below {min_fontsize} pt")
    # text against text: sort by x so only neighbours in x are compared
    order = np.argsort(boxes[:, 0])
    for n, i in enumerate(order):
        for j in order[n + 1:]:
            if boxes[j, 0] >= boxes[i, 2] - SLACK_PX:
                break
            if _overlap(boxes[i], boxes[j]):
                (ti, _, ri), (tj, _, rj) = texts[i], texts[j]
                problems.append(f"{_describe(ti, ri)} overlaps {_describe(tj, rj)}")
    # text of one panel in another panel's plotting area
    panels = [ax for ax in fig.axes if ax.get_visible() and (ax.axison or ax.has_data())]
    pboxes = {ax: ax.get_window_extent(r) for ax in panels}
    for (t, owner, role), b in zip(texts, boxes):
        for ax, pb in pboxes.items():
            if ax is owner:
                continue
            if _overlap(b, [pb.x0, pb.y0, pb.x1, pb.y1]):
                what = "colour bar" if getattr(ax, "_colorbar", None) is not None else f"panel {ax.get_title()!r}"
                problems.append(f"{_describe(t, role)} runs into the {what}")
    for cb in (ax._colorbar for ax in fig.axes if getattr(ax, "_colorbar", None) is not None):
        label = (cb.ax.get_ylabel() if cb.orientation == "vertical" else cb.ax.get_xlabel()).strip()
        if not label or label.lower() == "value":
            problems.append(f"a colour bar is labelled {label!r}: name its quantity and unit")
    # heatmaps without a colour scale
    bars = [ax._colorbar for ax in fig.axes if getattr(ax, "_colorbar", None) is not None]
    for ax in fig.axes:
        if getattr(ax, "_colorbar", None) is not None:
            continue
        for m in itertools.chain(ax.images, (c for c in ax.collections if isinstance(c, QuadMesh))):
            if isinstance(m, (AxesImage, QuadMesh)) and not _has_colourbar(m, bars):
                problems.append(f"heatmap in panel {ax.get_title()!r} has no colour bar")
    return problems


#: Width of a notebook's output area in common viewers (GitHub, JupyterLab at 100 %), px: a wider PNG is shown
#: scaled down to it, its text with it.
NOTEBOOK_WIDTH_PX = 900
#: Key of the output metadata where `watch_notebook_figures` records a figure's problems.
NOTEBOOK_META = "toy_circuits/figure_problems"


def watch_notebook_figures(min_fontsize: float = 7.0) -> None:
    """In a Jupyter kernel with matplotlib's inline backend: run `figure_problems` on every figure the backend
    displays and record the list in the PNG output's metadata (`NOTEBOOK_META`). The backend looks its metadata
    function up at each display, so wrapping it here catches every figure, however the cell shows it."""
    import matplotlib_inline.backend_inline as inline

    original = getattr(inline._fetch_figure_metadata, "__wrapped__", inline._fetch_figure_metadata)

    def checked(fig):
        meta = dict(original(fig) or {})
        problems = figure_problems(fig, min_fontsize)
        sizes = [t.get_fontsize() for t, _, _ in _texts(fig)]
        meta[NOTEBOOK_META] = {"problems": problems, "min_fontsize": min(sizes) if sizes else None,
                               "dpi": float(fig.dpi)}
        return meta

    checked.__wrapped__ = original
    inline._fetch_figure_metadata = checked


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) in pixels from a PNG's IHDR chunk."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def notebook_figure_problems(nb, max_width_px: int = NOTEBOOK_WIDTH_PX, min_fontsize: float = 7.0) -> list[str]:
    """Problems of every PNG figure embedded in a notebook (an `nbformat` node): those recorded at build time by
    `watch_notebook_figures` (a PNG without the record was not checked: a problem too), and text that a viewer
    shows smaller than `min_fontsize` pt at 72 px per inch (the inline backend's default), because the PNG is
    wider than `max_width_px` and is shrunk to it: smallest text (pt) × dpi / 72 × min(1, max_width_px / width)."""
    import base64

    out = []
    for i, cell in enumerate(c for c in nb.cells if c.cell_type == "code"):
        for o in cell.get("outputs", []):
            data = o.get("data", {}).get("image/png")
            if data is None:
                continue
            where = f"code cell {i + 1}"
            meta = o.get("metadata", {})
            found = meta.get(NOTEBOOK_META, meta.get("image/png", {}).get(NOTEBOOK_META))
            if found is None:
                out.append(f"{where}: figure not checked when it was drawn (build with notebooks/build.py)")
                continue
            out += [f"{where}: {p}" for p in found["problems"]]
            w, _ = png_size(base64.b64decode(data))
            scale = min(1.0, max_width_px / w)
            if found["min_fontsize"] is not None:
                shown = found["min_fontsize"] * found["dpi"] / 72 * scale
                if shown < min_fontsize - 1e-9:
                    out.append(f"{where}: {w} px wide, shown at ×{scale:.2f} in a {max_width_px}-px output area: its "
                               f"smallest text ({found['min_fontsize']:.1f} pt at {found['dpi']:.0f} dpi) shows as "
                               f"{shown:.1f} pt at 72 px per inch, below {min_fontsize}")
    return out

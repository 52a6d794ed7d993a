"""The feature pages of `circuits sae report --html`: each feature as SAE dashboards show one (Bricken et al. 2023,
"Towards Monosemanticity", feature browser; SAEDashboard, Neuronpedia): how often it fires, a histogram of its
non-zero activations, the tokens its decoder direction promotes and suppresses through `W_U` (its logit weights),
and its top-activating contexts with every token shaded by the feature's activation on it and the token the context
was picked for outlined.

HTML of ours around data: every token text and number passes through `analyses.labels.html_text` (the one escaping
of data into HTML) once; no script, nothing loaded from elsewhere. `features_html(report)` returns the block that
`analyses.report.html.write_page` places in the page.
"""

from __future__ import annotations

from .labels import html_text
from .sae_metrics import Histogram
from .sae_report import Feature, FeatureContext, SAEReport

STYLE = """
.sae-feature { border: 1px solid #ccc; border-radius: 6px; padding: 0.4em 1em 0.8em; margin: 1.2em 0; }
.sae-feature h3 { margin: 0.4em 0; }
.sae-cols { display: flex; flex-wrap: wrap; gap: 1.5em; align-items: flex-start; }
.sae-side { flex: 0 0 330px; }
.sae-contexts { flex: 1 1 480px; min-width: 0; }
.sae-ctx { font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size: 0.95em; white-space: nowrap;
           overflow-x: auto; margin: 0.15em 0; }
.sae-ctx .v { display: inline-block; width: 4.5em; color: #555; }
.sae-tok { padding: 0 1px; border-radius: 2px; }
.sae-top { outline: 2px solid #b35900; }
.sae-logits td.num { text-align: right; font-variant-numeric: tabular-nums; }
.sae-bar { display: inline-block; height: 0.7em; vertical-align: middle; }
.sae-note { color: #555; font-size: 0.85em; }
"""


def _num(v: float, digits: int = 2, sign: bool = False) -> str:
    return html_text(f"{v:+.{digits}f}" if sign else f"{v:.{digits}f}")


def histogram_svg(hist: Histogram, width: int = 320, height: int = 130) -> str:
    """An inline SVG bar chart of `hist`: one `<rect>` per bin (its count in `data-count`, its range and count in a
    tooltip), the x axis from 0 to the largest activation, the y axis from 0 to the largest count."""
    if not hist.counts:
        return '<p class="sae-note">never active on these tokens</p>'
    left, bottom, top, right = 44, 30, 8, 8
    w, h = width - left - right, height - top - bottom
    peak = max(hist.counts) or 1
    bar = w / len(hist.counts)
    parts = [f'<svg class="sae-hist" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="activation histogram">']
    for i, c in enumerate(hist.counts):
        bh = h * c / peak
        lo, hi = hist.edges[i], hist.edges[i + 1]
        parts.append(f'<rect x="{left + i * bar:.2f}" y="{top + h - bh:.2f}" width="{max(bar - 1, 0.5):.2f}" '
                     f'height="{bh:.2f}" fill="#e07b00" data-count="{c}" data-lo="{lo!r}" data-hi="{hi!r}">'
                     f"<title>{_num(lo, 3)} to {_num(hi, 3)}: {c} tokens</title></rect>")
    axis = 'stroke="#333" stroke-width="1"'
    parts += [f'<line x1="{left}" y1="{top + h}" x2="{left + w}" y2="{top + h}" {axis}/>',
              f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + h}" {axis}/>',
              f'<text x="{left}" y="{top + h + 13}" font-size="11" text-anchor="middle">0</text>',
              f'<text x="{left + w}" y="{top + h + 13}" font-size="11" text-anchor="end">'
              f"{_num(hist.edges[-1])}</text>",
              f'<text x="{left + w / 2}" y="{height - 3}" font-size="11" text-anchor="middle">activation (non-zero '
              "only)</text>",
              f'<text x="{left - 4}" y="{top + 9}" font-size="11" text-anchor="end">{peak}</text>',
              f'<text x="{left - 4}" y="{top + h}" font-size="11" text-anchor="end">0</text>',
              f'<text x="11" y="{top + h / 2}" font-size="11" text-anchor="middle" '
              f'transform="rotate(-90 11 {top + h / 2})">tokens</text>', "</svg>"]
    return "".join(parts)


def logit_table(promoted, demoted) -> str:
    """The promoted (largest logit weight) and suppressed (smallest) tokens side by side, each with a bar."""
    if not promoted:
        return '<p class="sae-note">no logit weights: this hook point does not write to the residual stream ' \
               "linearly</p>"
    demoted = demoted or []
    scale = max([abs(v) for _, v in promoted + demoted] + [1e-12])
    rows = []
    for i in range(max(len(promoted), len(demoted))):
        cells = []
        for items, colour in ((promoted, "#2a7f3f"), (demoted, "#b22222")):
            if i < len(items):
                t, v = items[i]
                cells.append(f'<td><code>{html_text(t)}</code></td><td class="num">{_num(v, sign=True)}</td>'
                             f'<td><span class="sae-bar" style="width:{60 * abs(v) / scale:.1f}px;'
                             f'background:{colour}"></span></td>')
            else:
                cells.append("<td></td><td></td><td></td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return ('<table class="sae-logits"><thead><tr><th colspan="3">promoted</th><th colspan="3">suppressed</th>'
            "</tr></thead><tbody>" + "".join(rows) + "</tbody></table>")


def context_html(ctx: FeatureContext, scale: float) -> str:
    """One context as a line of tokens, each shaded by the feature's activation on it relative to `scale` (its
    activation in a tooltip), the token it was picked for outlined."""
    spans = []
    for i, (label, a) in enumerate(zip(ctx.labels, ctx.acts)):
        alpha = min(max(a / scale, 0.0), 1.0) if scale > 0 else 0.0
        cls = "sae-tok sae-top" if i == ctx.at else "sae-tok"
        spans.append(f'<span class="{cls}" style="background:rgba(255,140,0,{alpha:.3f})" '
                     f'title="activation {_num(a, 3)}">{html_text(label)}</span>')
    return f'<div class="sae-ctx"><span class="v">{_num(ctx.activation)}</span>{"".join(spans)}</div>'


def feature_html(f: Feature, tokens: int) -> str:
    """One feature's page: its heading and density, histogram, logit weights and contexts."""
    active = round(f.frequency * tokens)
    head = (f'<section class="sae-feature" id="feature-{f.index}"><h3>Feature {f.index}</h3>'
            f'<p class="sae-note">active on {html_text(f"{f.frequency:.2%}")} of tokens ({active} of {tokens}); '
            f"largest activation {_num(f.max_act, 3)}</p>")
    side = (f'<div class="sae-side"><h4>Activations</h4>{histogram_svg(f.histogram) if f.histogram else ""}'
            f"<h4>Logit weights (decoder direction · W_U)</h4>{logit_table(f.promoted, f.demoted)}</div>")
    rows = "".join(context_html(c, f.max_act) for c in f.windows) or '<p class="sae-note">no context</p>'
    contexts = f'<div class="sae-contexts"><h4>Top-activating contexts</h4>{rows}</div>'
    return f'{head}<div class="sae-cols">{side}{contexts}</div></section>'


def features_html(report: SAEReport) -> str:
    """The feature pages of `report`'s features, with their style and a line saying how to read them."""
    tokens = report.stats["tokens"]
    intro = ('<p class="sae-note">Per feature: a histogram of its non-zero activations on the measured tokens; the '
             "tokens its decoder direction promotes and suppresses through W_U; its top-activating contexts, each "
             "token shaded by the feature's activation on it (hover for the value), the token the context was "
             "picked for outlined, the activation there on the left. ␣ is a space, ⏎ a newline.</p>")
    index = " · ".join(f'<a href="#feature-{f.index}">{f.index}</a>' for f in report.features)
    return (f"<style>{STYLE}</style>{intro}<p>Features: {index}</p>\n"
            + "\n".join(feature_html(f, tokens) for f in report.features))

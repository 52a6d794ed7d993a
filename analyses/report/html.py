"""`report.html`: the markdown report as one self-contained page, with interactive attention patterns.

`write_html(ctx, markdown, path)` renders the report's markdown with markdown-it-py (CommonMark + tables), embeds
every PNG it references as a `data:` URI, and adds CircuitsVis views (`analyses.interactive`, bundle inlined) after
the attention section's heading: every head's pattern on the induction probe `[BOS] + R + R` and, with validation
text, on a window of it, plus each head's direct logit attribution per token. The page loads nothing: no CDN, no
font, no image from elsewhere (`tests/test_html_report.py` opens it in headless Chromium with the network off).
"""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; max-width: 1180px; margin: 2em auto;
       padding: 0 1em; color: #1b1b1b; line-height: 1.45; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; }
th { background: #f2f2f2; }
img { max-width: 100%; height: auto; }
code { background: #f4f4f4; padding: 0 0.2em; }
.interactive { border: 1px solid #ddd; border-radius: 6px; padding: 0.5em 1em; margin: 1em 0; }
.interactive h4 { margin: 0.8em 0 0.2em; }
"""

#: Where the interactive views go: after this section's heading (the first one when it is absent).
ANCHOR = "Attention patterns and head scores"


def _markdown_to_html(md: str) -> str:
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark", {"html": False}).enable("table").render(md)


def _embed_images(body: str, folder: Path) -> str:
    """Every `<img src="NAME.png">` of a file in `folder` as a base64 `data:` URI."""
    def sub(m):
        src = html.unescape(m.group(2))
        f = folder / src
        if "/" in src or not f.is_file():
            return m.group(0)
        data = base64.b64encode(f.read_bytes()).decode("ascii")
        return f'{m.group(1)}data:image/png;base64,{data}{m.group(3)}'

    return re.sub(r'(<img src=")([^"]+\.png)(")', sub, body)


def _views_html(ctx) -> str:
    """The interactive block, or "" when the model has no attention layers."""
    if ctx.cfg.n_layers == 0:
        return ""
    from ..interactive import html_fragment, model_views
    from ..sequences import repeated_tokens

    seq = min(50, (ctx.cfg.n_ctx - 1) // 2)
    probe = repeated_tokens(ctx.model, seq, 2, 1, ctx.seed, ctx.vocab)[0]
    text = ctx.windows[0, : min(64, ctx.windows.shape[1])] if ctx.windows is not None else None
    views = model_views(ctx.model, probe, text)
    return ('<div class="interactive"><h3>Interactive views</h3><p>Drawn by CircuitsVis from the numbers of this '
            'model, inside this page (no network). Head names are <code>L{layer}H{head}</code>; ⏎ is a newline, ␣ a '
            f'space.</p>\n{html_fragment(views, prefix="view")}</div>')


def write_html(ctx, markdown: str, path) -> Path:
    """Write the circuit report's page to `path` (`write_page`, with the interactive views) and return it."""
    return write_page(markdown, path, f"Circuit report: {ctx.name}", _views_html(ctx))


def write_page(markdown: str, path, title: str, views: str = "", anchor: str = ANCHOR) -> Path:
    """Write `markdown` as one self-contained page to `path` (atomically: a temporary file renamed into place): its
    PNGs (files beside `path`) embedded, raw HTML in the markdown shown as text, `views` (HTML of ours) after the
    level-2 heading `anchor` or the title."""
    path = Path(path)
    body = _embed_images(_markdown_to_html(markdown), path.parent)
    if views:
        heading = f"<h2>{html.escape(anchor)}</h2>"
        i = body.find(heading)
        at = i + len(heading) if i >= 0 else body.find("</h1>") + len("</h1>")
        body = body[:at] + "\n" + views + "\n" + body[at:]
    page = (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f"<title>{html.escape(title)}</title>\n<style>{STYLE}</style>\n</head>\n"
            f"<body>\n{body}\n</body>\n</html>\n")
    from models.files.atomic import atomic_write_text

    return atomic_write_text(path, page)

"""Interactive views through CircuitsVis (Cooney & Nanda, `circuitsvis` on PyPI), offline, each with a static twin.

CircuitsVis ships its React components as one JavaScript bundle (`circuitsvis/dist/cdn/iife.js`). Its own
`_repr_html_` probes the network (a request to google.com) and, when online, writes HTML that loads the bundle
from a CDN; here every view inlines the bundle instead, so a page or notebook output needs no network, ever:

- `attention_view(model, tokens)`: every head's attention pattern (`AttentionHeads`: pick a head, hover a token to
  see where it attends);
Token labels reach CircuitsVis HTML-escaped (`analyses.labels.html_text`): its components set a token's text as
HTML. The props are JSON escaped for a `<script>` (`json_for_script`).

- `token_values_view(labels, values, names)`: one value per token and per series (`ColoredTokensMulti`), e.g.
  `next_token_attribution`, each head's push on the logit of each next token;
- `html_fragment(views)`: several views sharing one copy of the bundle (the HTML report uses it);
- `show(*views)`: in a notebook, the interactive views and then their static PNGs (`view.figure()`), so that a code
  host, which strips scripts, still shows the pictures.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

from models.arch.model import head_label

from .labels import html_text


@lru_cache(maxsize=1)
def circuitsvis_bundle() -> str:
    """CircuitsVis' JavaScript bundle (it defines the global `CircuitsVis`), ready to inline in a `<script>`."""
    import circuitsvis

    src = (Path(circuitsvis.__file__).parent / "dist" / "cdn" / "iife.js").read_text(encoding="utf-8")
    return src.replace("</script>", "<\\/script>")


#: JSON inside an HTML `<script>`: these characters could end the script (`</script>`), open a comment that swallows
#: the page (`<!--` then `<script>`), start an entity, or end a JavaScript line (U+2028/U+2029); as `\\uXXXX` escapes
#: they are the same JSON strings.
_SCRIPT_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def json_for_script(obj) -> str:
    """`obj` as JSON that is safe inside an HTML `<script>` element whatever its strings hold."""
    text = json.dumps(obj)
    for c, esc in _SCRIPT_ESCAPES.items():
        text = text.replace(c, esc)
    return text


def _props(props: dict) -> str:
    """JSON for a script (`json_for_script`): tensors as lists."""
    def plain(v):
        return v.tolist() if isinstance(v, torch.Tensor) else v

    return json_for_script({k: plain(v) for k, v in props.items() if v is not None})


@dataclass
class View:
    """One CircuitsVis component with its props; `figure()` draws the static twin with matplotlib."""

    component: str  # a CircuitsVis React component, e.g. "AttentionHeads"
    props: dict
    title: str
    static: object = None  # a function of no arguments returning the static matplotlib figure

    def render(self, element_id: str) -> str:
        """A `<div>` and the classic `<script>` that renders the view into it (the bundle must be loaded)."""
        return (f'<div class="circuitsvis-view" id="{element_id}"></div>\n<script>CircuitsVis.render('
                f'"{element_id}", CircuitsVis.{self.component}, {_props(self.props)});</script>')

    def _repr_html_(self) -> str:
        return html_fragment([self])

    def figure(self):
        return self.static() if self.static is not None else None


def html_fragment(views: list[View], prefix: str = "circuitsvis") -> str:
    """HTML holding the CircuitsVis bundle once and every view after it; self-contained (no network)."""
    import uuid

    tag = uuid.uuid4().hex[:8]
    body = "\n".join(f"<h4>{v.title}</h4>\n" + v.render(f"{prefix}-{tag}-{i}") for i, v in enumerate(views))
    return f"<script>{circuitsvis_bundle()}</script>\n{body}"


def show(*views: View):
    """Display `views` in a notebook as one HTML output (the bundle once), then each view's static figure (the
    picture a code host shows, since it strips scripts)."""
    import matplotlib.pyplot as plt
    from IPython.display import HTML, display

    display(HTML(html_fragment(list(views))))
    for v in views:
        if v.figure() is not None:
            plt.show()


@torch.no_grad()
def attention_view(model, tokens, heads: list[tuple[int, int]] | None = None, title: str | None = None) -> View:
    """Every head's (or `heads`') attention pattern on one sequence `tokens [pos]` or `[1, pos]`, as CircuitsVis'
    `AttentionHeads`, named `L{layer}H{head}`; token labels from `analyses.labels` (whitespace made visible).
    Its static twin is `plots.plot_token_patterns` on the same patterns."""
    from .labels import token_labels
    from .scores import attention_patterns

    t = torch.as_tensor(tokens).reshape(1, -1)
    pat = attention_patterns(model, t)[:, 0]  # [layer, head, q, k]
    heads = heads or [(l, h) for l in range(pat.shape[0]) for h in range(pat.shape[1])]
    labels = token_labels(model, t[0].tolist())
    props = {"attention": torch.stack([pat[l, h] for l, h in heads]).round(decimals=4),
             "tokens": [html_text(x) for x in labels],
             "attentionHeadNames": [head_label(l, h) for l, h in heads], "maxValue": 1.0, "minValue": 0.0}

    def static():
        from .plots import plot_token_patterns

        return plot_token_patterns([pat[l, h].numpy() for l, h in heads], labels, props["attentionHeadNames"])

    return View("AttentionHeads", props, title or f"Attention patterns on {len(labels)} tokens: pick a head, hover "
                "a token to see where it attends", static)


#: The colour-bar label of `next_token_attribution`'s values: what they are and their unit.
DLA_QUANTITY = "direct logit attribution (logits)"


@torch.no_grad()
def next_token_attribution(model, tokens) -> tuple[torch.Tensor, list[str]]:
    """Each head's direct logit attribution to the token that comes next, at every position: `[pos − 1,
    n_heads_total]` (float32, CPU; row i is the prediction of token i + 1 made at position i) and the head names.
    The one direct-logit-attribution implementation computes it (`analyses.patching.direct_logit_attribution`,
    TransformerLens' DLA: head h's output `z_h W_O^h` through the final norm at its cached scale, norm weights
    folded into W_U, dotted with W_U[:, y]; value biases, the same at every position, go to its remainder)."""
    from .patching.lens import direct_logit_attribution

    t = torch.as_tensor(tokens).reshape(1, -1).to(model.W_E.device)
    dla = direct_logit_attribution(model, t, t[:, 1:], by="head", pos=slice(0, -1))
    return dla.attribution[:-1, 0].T.float().cpu(), list(dla.labels[:-1])  # every head, without the remainder


#: The name notebooks 01 and 02 call (their cells are hashed: they change when the notebooks are next rebuilt).
direct_logit_attribution = next_token_attribution


def token_values_view(labels: list[str], values: torch.Tensor, names: list[str], title: str, quantity: str) -> View:
    """Tokens coloured by one of several value series (`values [tokens, series]`), as CircuitsVis'
    `ColoredTokensMulti`: pick a series, hover a token for all its values. Static twin: a heatmap whose colour bar
    names `quantity` (what the values are, with their unit)."""
    values = torch.as_tensor(values, dtype=torch.float32)
    props = {"tokens": [html_text(x) for x in labels], "values": values.round(decimals=4), "labels": names}

    def static():
        return plot_token_values(labels, values, names, title, quantity)

    return View("ColoredTokensMulti", props, title, static)


def plot_token_values(labels: list[str], values: torch.Tensor, names: list[str], title: str, quantity: str):
    """A `[series, tokens]` heatmap of `values [tokens, series]`, diverging around 0, one colour bar labelled
    `quantity`."""
    import matplotlib.pyplot as plt

    from .labels import figure_text

    v = torch.as_tensor(values, dtype=torch.float32).T  # [series, tokens]
    lim = float(v.abs().max()) or 1.0
    fig, ax = plt.subplots(figsize=(max(6.0, 0.16 * len(labels) + 2.5), 0.35 * len(names) + 1.8),
                           layout="constrained")
    im = ax.imshow(v.numpy(), cmap="RdBu", vmin=-lim, vmax=lim, aspect="auto")
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.set_xticks(range(len(labels)), [figure_text(x) for x in labels], rotation=90, fontsize=7)
    ax.set_title(title, fontsize=10)
    fig.colorbar(im, ax=ax, label=quantity, shrink=0.9)
    return fig


def model_views(model, tokens, text_tokens=None) -> list[View]:
    """The views of the HTML report: attention on the probe sequence `tokens`, and, given `text_tokens`,
    attention and each head's direct logit attribution on that text."""
    out = [attention_view(model, tokens, title="Attention patterns on [BOS] + R + R (the induction probe): pick "
                          "a head (click locks it), hover a token to see where it attends")]
    if text_tokens is not None:
        from .labels import token_labels

        t = torch.as_tensor(text_tokens).reshape(-1)
        out.append(attention_view(model, t, title=f"Attention patterns on {t.numel()} tokens of validation text"))
        dla, names = next_token_attribution(model, t)
        out.append(token_values_view(token_labels(model, t[1:].tolist()), dla, names,
                                     "Direct logit attribution: each head's push on the logit of each token, "
                                     "from the position before it (pick a head)", DLA_QUANTITY))
    return out

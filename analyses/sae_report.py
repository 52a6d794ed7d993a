"""What a sparse autoencoder on a model's hook point does (`circuits sae report`): how well it reconstructs (FVU, L0,
dead features), how much of the model's loss survives it spliced in, and, for its top features, the contexts that
activate them most and the tokens their decoder direction promotes through `W_U`. Markdown and one PNG.

The SAE is SAELens' (`models.sae`); the measures are `analyses.sae_metrics.feature_stats` and `sae_losses`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from models.errors import SAEError
from models.io.sae import activations

from .labels import markdown_text, token_labels
from .sae_metrics import Histogram, activation_histogram, feature_stats, sae_losses
from .util import markdown_table

#: The heading of report.md's HTML page under which `analyses.sae_page` places the feature pages.
PAGES_HEADING = "Feature pages"


def residual_direction(model, hook_name: str, direction: torch.Tensor) -> torch.Tensor | None:
    """The residual-stream vector `[d_model]` an SAE decoder row at `hook_name` writes: the row itself at a hook
    in residual space (`hook_resid_*`, `hook_mlp_out`, `hook_attn_out`), through each head's `W_O` at `hook_z`
    (concatenated heads); None elsewhere."""
    last = hook_name.rsplit(".", 1)[-1]
    if last in ("hook_resid_pre", "hook_resid_mid", "hook_resid_post", "hook_mlp_out", "hook_attn_out",
                "hook_embed", "hook_pos_embed"):
        return direction
    if last == "hook_z" and hook_name.startswith("blocks."):
        layer = int(hook_name.split(".")[1])
        W_O = model.W_O[layer]  # [head, d_head, d_model]
        return torch.einsum("hd,hdm->m", direction.reshape(W_O.shape[0], W_O.shape[1]).to(W_O.dtype), W_O)
    return None


def logit_weights(model, hook_name: str, sae, feature: int) -> torch.Tensor | None:
    """`[d_vocab]`: the logit weights of `feature`, its decoder direction written to the residual stream
    (`residual_direction`) times `W_U` (Bricken et al. 2023, "Towards Monosemanticity", "logit weights"; the final
    norm's scale left out, as there), or None at a hook whose output does not reach the residual stream linearly."""
    d = residual_direction(model, hook_name, sae.W_dec[feature].detach())
    return None if d is None else d.to(model.W_U.dtype) @ model.W_U


@dataclass
class FeatureContext:
    """One top-activating context of a feature: the token `labels` shown (`before` tokens, the token, `after`
    tokens), the feature's activation `acts` on each, and `at`, the index of the token it was picked for."""

    labels: list[str]
    acts: list[float]
    at: int

    @property
    def activation(self) -> float:
        return self.acts[self.at]


@dataclass
class Feature:
    """One feature of the report: how often it fires (`frequency`), its largest activation, its top `contexts` as
    `(before, token, after, activation)` text, the `promoted` tokens (largest logit weights) and, for the feature
    page, the `demoted` ones (smallest), the `histogram` of its non-zero activations and the contexts token by
    token (`windows`)."""

    index: int
    frequency: float
    max_act: float
    contexts: list[tuple[str, str, str, float]]  # (before, token, after, activation)
    promoted: list[tuple[str, float]] | None  # (token, logit weight), largest first
    demoted: list[tuple[str, float]] | None = None  # (token, logit weight), smallest first
    histogram: Histogram | None = None
    windows: list[FeatureContext] = field(default_factory=list)


@dataclass
class SAEReport:
    """The measures (`stats`: FVU, L0, dead, d_sae, tokens; `losses`; `frequency [d_sae]`), and the top
    `features`."""

    stats: dict
    losses: dict
    frequency: torch.Tensor
    features: list[Feature] = field(default_factory=list)


def top_features(acts: torch.Tensor, top: int) -> list[int]:
    """The `top` features of largest activation anywhere on these tokens (`acts [n, d_sae]`), those that never fire
    left out: the ones that fire hardest somewhere (those of largest total activation are the densest, here
    whitespace features)."""
    mass = acts.max(0).values
    return [int(i) for i in torch.argsort(mass, descending=True)[:top] if mass[i] > 0]


def analyse(model, sae, windows: torch.Tensor, bos: int | None, top: int = 8, contexts: int = 5,
            promoted: int = 6, before: int = 10, after: int = 2, features: list[int] | None = None,
            bins: int = 24) -> SAEReport:
    """Measure `sae` on `windows` `[n, n_ctx]` (BOS first when `bos` is given: that position is left out) and
    describe `features` (default: the `top` of largest activation, `top_features`): each with its `contexts`
    highest-activating positions (`before` tokens of context, the token, `after` tokens, and the feature's
    activation on each), the `promoted` tokens of largest and smallest logit weight (`logit_weights`) and a
    `bins`-bin histogram of its non-zero activations (`activation_histogram`)."""
    hook = sae.cfg.metadata.hook_name
    skip = int(bos is not None)
    x = activations(model, hook, windows, skip=skip)
    st = feature_stats(sae, x)
    losses = sae_losses(model, sae, windows, bos)
    n, n_ctx = windows.shape
    span = n_ctx - skip
    if features is None:
        order = top_features(st.acts, top)
    else:
        bad = [f for f in features if not 0 <= f < st.acts.shape[1]]
        if bad:
            raise SAEError(f"feature {bad[0]} does not exist: this SAE has features 0 to {st.acts.shape[1] - 1}")
        order = list(dict.fromkeys(int(f) for f in features))
    per_window = st.acts.reshape(n, span, -1)
    feats = []
    for f in order:
        col = st.acts[:, f]
        best = torch.argsort(col, descending=True, stable=True)[:contexts]
        ctx, shown = [], []
        for k in best.tolist():
            if col[k] <= 0:
                break
            w, p = divmod(k, span)
            lo, hi = max(0, p - before), min(span, p + after + 1)  # positions after the BOS
            labels = token_labels(model, windows[w, lo + skip: hi + skip].tolist(), max_len=12)
            acts_shown = [float(v) for v in per_window[w, lo:hi, f]]
            cut = p - lo
            shown.append(FeatureContext(labels, acts_shown, cut))
            ctx.append(("".join(labels[:cut]), labels[cut], "".join(labels[cut + 1:]), float(col[k])))
        logits = logit_weights(model, hook, sae, f)
        prom = dem = None
        if logits is not None:
            k = min(promoted, logits.numel())
            vals, ids = torch.topk(logits, k)
            prom = list(zip(token_labels(model, ids.tolist()), vals.tolist()))
            vals, ids = torch.topk(logits, k, largest=False)
            dem = list(zip(token_labels(model, ids.tolist()), vals.tolist()))
        feats.append(Feature(f, float(st.frequency[f]), float(col.max()), ctx, prom, dem,
                             activation_histogram(col, bins), shown))
    stats = {"fvu": st.fvu, "l0": st.l0, "dead": st.dead, "d_sae": int(st.frequency.numel()), "tokens": int(x.shape[0]),
             "hook_name": hook}
    return SAEReport(stats, losses, st.frequency, feats)


def markdown(report: SAEReport, name: str, settings: dict | None, text: str, features: bool = True) -> str:
    """report.md: the settings, the reconstruction and loss tables and, with `features`, a section per feature
    (without: only a `## Feature pages` heading, under which the HTML page places `analyses.sae_page`'s pages)."""
    s, lo = report.stats, report.losses
    md = [f"# Sparse autoencoder on {markdown_text(name)} at `{s['hook_name']}`", "",
          f"Measured on {s['tokens']} token positions of {markdown_text(text)} (the BOS position left out). "
          "Losses are mean next-token cross-entropy in nats per token.", ""]
    if settings:
        keys = ("steps", "expansion", "l1", "batch_size", "lr", "d_in", "d_sae", "tokens_seen", "seconds", "sae_lens")
        md += ["Training: " + ", ".join(f"{k} {markdown_text(settings[k])}" for k in keys if k in settings) + ".", ""]
    md += ["## Reconstruction", "",
           markdown_table(["measure", "value", "what it is"], [
               ["FVU", s["fvu"], "fraction of variance unexplained, Σ‖x − x̂‖² / Σ‖x − mean x‖²"],
               ["L0", s["l0"], "features active per token (mean)"],
               ["dead features", f"{s['dead']} of {s['d_sae']}", "never active on these tokens"]]), "",
           "## Loss with the SAE spliced in", "",
           markdown_table(["run", "loss (nats)"], [
               ["clean (the model)", lo["clean"]], ["SAE reconstruction spliced in", lo["spliced"]],
               ["zero-ablated (the hook's output set to 0)", lo["zero_ablated"]],
               ["loss recovered, (zero − spliced) / (zero − clean)", lo["recovered"]]]), ""]
    if not features:
        return "\n".join(md + [f"## {PAGES_HEADING}", ""])
    md += ["## Top features", "",
           "By largest activation on these tokens. Contexts: the tokens before, the token, and the tokens after "
           "(whitespace shown as ␣ and ⏎); promoted / suppressed: the tokens of largest / smallest logit weight "
           "(decoder direction · W_U).", ""]
    for f in report.features:
        md += [f"### Feature {f.index}", "",
               f"Active on {f.frequency:.2%} of tokens; largest activation {f.max_act:.3f}.", ""]
        md += [markdown_table(["before", "token", "after", "activation"], [list(c) for c in f.contexts]), ""]
        if f.promoted:
            md += ["Promotes: " + ", ".join(f"{markdown_text(t)} ({v:+.2f})" for t, v in f.promoted), ""]
        if f.demoted:
            md += ["Suppresses: " + ", ".join(f"{markdown_text(t)} ({v:+.2f})" for t, v in f.demoted), ""]
    return "\n".join(md)


def plot(report: SAEReport, name: str):
    """Feature densities (log10 of the fraction of tokens each fires on; dead features at the red line) and the
    three losses."""
    import matplotlib.pyplot as plt

    frequency = report.frequency

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8), gridspec_kw={"width_ratios": [3, 2]})
    n_tok = report.stats["tokens"]
    floor = -float(torch.log10(torch.tensor(float(n_tok)))) - 0.5
    logf = torch.where(frequency > 0, frequency.clamp_min(1e-30).log10(), torch.tensor(floor, dtype=frequency.dtype))
    a.hist(logf.numpy(), bins=40, color="tab:blue")
    a.axvline(floor, color="tab:red", lw=1)
    a.set_xlabel("log10 fraction of tokens the feature fires on (red line: dead)", fontsize=9)
    a.set_ylabel("features", fontsize=9)
    a.set_title(f"feature density, {report.stats['d_sae']} features, L0 {report.stats['l0']:.1f}", fontsize=10)
    lo = report.losses
    names = ["clean", "SAE spliced", "zero-ablated"]
    vals = [lo["clean"], lo["spliced"], lo["zero_ablated"]]
    bars = b.bar(names, vals, color=["tab:green", "tab:blue", "tab:gray"])
    for bar, v in zip(bars, vals):
        b.text(bar.get_x() + bar.get_width() / 2, v, f"{v:.3f}", ha="center", va="bottom", fontsize=8)
    b.set_ylabel("loss (nats per token)", fontsize=9)
    b.set_ylim(0, max(vals) * 1.15)
    b.set_title(f"FVU {report.stats['fvu']:.3f}, loss recovered {lo['recovered']:.1%}", fontsize=10)
    b.tick_params(labelsize=8)
    fig.suptitle(f"SAE on {name} at {report.stats['hook_name']}", fontsize=11)
    fig.tight_layout()
    return fig

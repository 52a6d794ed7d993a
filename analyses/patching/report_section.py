"""The report section on causal interventions: path patching of the induction circuit (two-layer models and deeper)."""

from __future__ import annotations

import torch

from models.arch.model import head_label

from ..util import markdown_table
from .metrics import metric, next_token_answers
from .paths import path_baselines, path_patching, path_patching_matrix
from .plots import plot_patching


def induction_probe(model, vocab, seed: int, batch: int = 16, period: int = 50):
    """`(clean, corrupt, metric, period)`: clean `[BOS] + R + R` (|R| = `period`, shortened to fit n_ctx), corrupted
    the same with the first copy resampled, and the loss on the second copy (each of its positions but the last
    predicting the next token)."""
    from ..sequences import random_tokens, repeated_tokens

    n = min(period, (model.cfg.n_ctx - 1) // 2)
    clean = repeated_tokens(model, n, 2, batch, seed, tokens_from=vocab)
    corrupt = clean.clone()
    corrupt[:, 1:n + 1] = random_tokens(model, n, batch, seed + 1, tokens_from=vocab)
    return clean, corrupt, metric("loss", next_token_answers(clean, range(n + 1, 2 * n))), n


def induction_paths(ctx) -> str:
    """Path patching (noising) from every head to every later head's Q, K and V on the induction probe, the joint
    paths from the detected previous-token heads to the detected induction heads, and a figure."""
    model = ctx.model
    clean, corrupt, met, n = induction_probe(model, ctx.vocab, ctx.seed)
    emb = [e for e in ("embed", "pos_embed") if f"hook_{e}" in model.hook_dict]
    heads = [f"L{l}H{h}" for l in range(model.cfg.n_layers - 1) for h in range(model.cfg.n_heads)]
    base = path_baselines(model, clean, corrupt, met)  # the two runs every path below reads
    r = path_patching_matrix(model, clean, corrupt, met, senders=emb + heads, progress=False, baselines=base)
    share = r.share()
    ind, prev = ctx.detection()
    senders, receivers = list(prev.heads), [h for h in ind.heads if prev.heads and h[0] > max(p[0] for p in prev.heads)]
    if not (senders and receivers):  # no detected pair: the strongest single key path stands in
        keys = share[r.labels[0].index("k")].nan_to_num(-1e9)  # [sender, receiver]
        s, t = (int(i) for i in torch.unravel_index(keys.argmax(), keys.shape))
        senders, receivers = [r.labels[1][s]], [r.labels[2][t]]
    names = lambda hs: ", ".join(h if isinstance(h, str) else head_label(*h) for h in hs)
    first = [f"L0H{h}" for h in range(model.cfg.n_heads)]
    later = [f"L{l}H{h}" for l in range(1, model.cfg.n_layers) for h in range(model.cfg.n_heads)]
    share_of = lambda s, t, c: float(path_patching(model, clean, corrupt, met, s, t, c, baselines=base).share())
    joint = [[f"{names(senders)} → {names(receivers)}", "K", share_of(senders, receivers, "k")]]
    joint += [["every layer-0 head → every later head", c.upper(), share_of(first, later, c)] for c in "qkv"]
    joint += [["token embedding → every layer ≥ 1 head", c.upper(), share_of(["embed"], later, c)] for c in "qkv"]
    effect = r.corrupt_value - r.clean_value
    caveat = ("" if effect >= 0.5 else f" The corruption changes this loss by only {effect:.3f} nats: the model does "
              "little induction on this probe, so the shares below are fractions of a small difference.")
    mlps = (" MLP outputs are frozen too, so a path is the direct edge from sender to receiver." if not ctx.attn_only
            else "")
    return "\n".join([
        f"Path patching (Wang et al. 2022; Goldowsky-Dill et al. 2023) tests causally which heads carry the copying "
        f"of a repeated sequence. Clean prompts: {clean.shape[0]} random sequences repeated twice, [BOS] + R + R "
        f"with |R| = {n}; "
        f"corrupted: the same with the first copy R resampled. The metric is the loss on the second copy, "
        f"**{r.clean_value:.3f} nats clean and {r.corrupt_value:.3f} corrupted**. Each path runs the clean prompt "
        "with the sender heads' outputs taken from the corrupted run and reaching only the receivers' query, key or "
        "value input (every other head frozen to the clean run); its share is the part of the loss increase it "
        "reproduces (1 = all of it, 0 = none; above 1 when the path alone does more harm than the whole corruption)."
        " Senders are the layer-0 heads and the embeddings: `embed`, the token embedding, which reaches layer 1 "
        "directly through the residual stream" + (", and `pos_embed`, the positional embedding, identical in both "
        "prompts, so its paths carry nothing by construction" if "pos_embed" in emb else "") + ". A head's values "
        "read the token embedding directly, so the V route of an induction head shows as `embed` → head, not as a "
        "path from a layer-0 head." + mlps + caveat, "",
        "Single paths carrying at least 0.005 of the effect, the largest first:", "", r.markdown(6, 0.005), "",
        "Joint paths (senders and receivers patched together):", "",
        markdown_table(["path", "through", "share of the effect"], joint), "",
        "Heads can stand in for each other (the loss is not additive over heads), so single paths can carry less than "
        "their sum; the joint paths say how much of the effect the circuit carries as a whole. "
        f"The path {names(senders)} → {names(receivers)} through the keys ({joint[0][2]:.3f} of the effect) is what "
        "the pattern-preserving ablation (its own section) cannot see: it freezes the receivers' patterns, so there "
        "the sender loses only what it writes directly and into values.", "",
        ctx.figure(plot_patching(r), "path_patching", "Share of the loss increase carried by each path from a sender "
                   "(rows: the embeddings and the layer-0 heads) to a receiver head (columns) through its queries, "
                   "keys or values (one colour scale, white at 0" + ("; dark grey: not a path" if bool(
                       torch.isnan(r.share()).any()) else "") + ").")])

"""Source of notebooks/02_two_layer_induction.ipynb (build with `python notebooks/build.py 02`)."""
# ruff: noqa: E402  (notebook cells import after setup lines)

# %% [markdown]
# # Two layers: composition and induction heads
#
# With a second layer, heads can **compose**: a layer-1 head can read what a layer-0 head wrote, through its
# queries (Q-composition), keys (K-composition) or values (V-composition). The Framework (Elhage et al. 2021)
# and *In-context Learning and Induction Heads* (Olsson et al. 2022) show that the composition that matters in
# small attention-only models is **K-composition with a previous-token head**, which builds an **induction head**:
# at token `A`, attend to the token that followed an earlier `A`, and copy it (`[A][B] … [A] → [B]`).
#
# This notebook finds that circuit in the zoo model `attn-only-2l` from behaviour (attention patterns and scores)
# and from the weights alone (composition scores, eigenvalues), then measures how much each path through the
# model matters (term importance, virtual heads). Public API only; CPU, offline, about two minutes.

# %%
import warnings

warnings.filterwarnings("ignore", message="IProgress not found")  # tqdm without ipywidgets

# %%
import matplotlib.pyplot as plt
import torch

import analyses
import circuits
import models
from analyses import plots
from analyses.util import windows as windows_of
from models.data.corpora import build_token_corpus

torch.set_num_threads(1)  # small tensors: one thread is fastest, and polite on a shared CPU
torch.set_grad_enabled(False)  # analysis only: no autograd graphs
plt.rcParams["figure.dpi"] = 90  # 7-pt labels legible at the saved size

model = models.load("attn-only-2l")
cfg = model.cfg
print(f"{cfg.n_layers} layers × {cfg.n_heads} heads, d_model {cfg.d_model}, d_head {cfg.d_head}, "
      f"n_ctx {cfg.n_ctx}, positions {cfg.positional_embedding_type}, normalization {cfg.normalization_type}")

corpus = build_token_corpus("stdlib", model.tokenizer)
seen = torch.from_numpy(corpus.seen_ids())
bos = model.tokenizer.bos_token_id
windows = windows_of(corpus.val, cfg.n_ctx, 16, bos=bos)  # 16 evenly spaced validation windows, BOS first
print("validation loss", round(float(model(windows, return_type="loss")), 3), "nats")

# %% [markdown]
# ## Attention patterns on a repeated random sequence
#
# The standard probe is `[BOS] + R + R` with `R` random tokens (|R| = 50, drawn as for the induction score below).
# On the second copy, an induction head shows a stripe `|R| − 1` positions below the diagonal (each token attends
# to the token *after* its first occurrence); a previous-token head shows the sub-diagonal.

# %%
fig = plots.plot_attention_patterns(model, tokens_from=seen)

# %% [markdown]
# The same on real code repeated twice, as interactive CircuitsVis views (pick a head, hover a token to see where it
# attends; offline, the JavaScript is inlined), with each head's **direct logit attribution** per token: how much
# its output raises the logit of the token that comes next. On the second copy the induction heads attend to the
# token after the first occurrence and push exactly that token. The static figures below them are the same numbers.

# %%
from analyses import interactive
from analyses.labels import token_labels

code = "def area(self):\n    return self.width * self.height\n"
tokens = model.to_tokens(code + code)[0]
dla, head_names = interactive.direct_logit_attribution(model, tokens)
interactive.show(
    interactive.attention_view(model, tokens),
    interactive.token_values_view(token_labels(model, tokens[1:].tolist()), dla, head_names,
                                  "direct logit attribution of each head to each next token",
                                  interactive.DLA_QUANTITY))

# %% [markdown]
# ## Head scores
#
# The same thing as numbers (`analyses.scores`, one formula per function): the **induction score**, the mean
# attention from each token of the second copy to the token right after its first occurrence (|R| = 50, 10
# sequences, `R` drawn from the ids seen in training); beside it **ARENA's score** exactly as ARENA 1.2's
# `induction_attn_detector` computes it (`analyses.arena_induction_scores`: the mean of the whole stripe, which
# also holds two first-copy queries, one of them attending to BOS; `R` uniform over every non-special id, so the
# 85 ids this BPE never saw in training make it lower); Olsson's **prefix-matching score** (25 tokens × 4), and the
# **previous-token score** (mean attention to i−1 on real text).

# %%
ind = analyses.induction_scores(model, tokens_from=seen)
ind_arena = analyses.arena_induction_scores(model)
pm = analyses.prefix_matching_scores(model, tokens_from=seen)
prev = analyses.previous_token_scores(model, windows[:8])
fig = plots.plot_score_panels({"induction (2nd copy, seen ids)": ind, "ARENA stripe (all ids)": ind_arena,
                               "prefix matching": pm, "previous token (text)": prev})

# %% [markdown]
# `analyses.detect` turns these into verdicts, with the mechanistic evidence from the weights beside the
# behavioural scores: each candidate's K-composition partner, how "same-matching" that composed QK circuit is, and
# whether its OV circuit copies.

# %%
circuit = analyses.find_induction_circuit(model, prev_tokens=windows[:8], tokens_from=seen)
print(circuit.previous)
print()
print(circuit.induction.markdown(only_positive=True))
prev_heads, ind_heads = circuit.previous.heads, circuit.induction.heads

# %% [markdown]
# ## Composition scores: which heads read which
#
# For an earlier head h1 (writing `W_OV^{h1}`) and a later head h2, the composition score is
# `‖W_OV^{h1} R^{h2}‖_F / (‖W_OV^{h1}‖_F ‖R^{h2}‖_F)` with `R = W_QK^{h2}` (Q), `(W_QK^{h2})ᵀ` (K) or
# `W_OV^{h2}` (V). Random matrices of these shapes already score about `1/√d_model`, so we subtract that baseline
# (`circuits.composition_baseline`), as the Framework does.

# %%
study = analyses.composition_study(model)
print(study)
fig = plots.plot_composition(study)

# %% [markdown]
# ## The induction circuit in the weights
#
# The pairs found automatically: previous-token head → induction head, with the K-composition score above the
# random baseline.

# %%
for (l1, h1), (l2, h2), k in circuit.pairs:
    print(f"L{l1}H{h1} (previous token) → L{l2}H{h2} (induction): K-composition {k:+.3f} above baseline")
if not circuit.pairs:
    print("no (previous-token head, induction head) pair found")

# %% [markdown]
# ### K-composition eigenvalues
#
# Through K-composition, the induction head's key at position j holds the previous-token head's output, i.e. the
# embedding of token j−1 moved by `W_OV^{prev}`. The induction head's query is the current token. So the relevant
# QK circuit is `W_E W_QK^{ind} (W_E W_OV^{prev})ᵀ` `[d_vocab, d_vocab]`: entry `[t, s]` scores a key whose
# *previous* token is `s` for a query token `t`. An induction head wants `s = t`: this matrix should be
# **same-matching**, with mostly positive eigenvalues (Σλ/Σ|λ| near 1) — and its OV circuit should copy.

# %%
if circuit.pairs:
    prev_head, ind_head, _ = circuit.pairs[0]
else:  # no pair passed the thresholds: take the strongest K-composition
    l1, h1, l2, h2 = (int(i) for i in torch.unravel_index(study.excess("k").argmax(), study.excess("k").shape))
    prev_head, ind_head = (l1, h1), (l2, h2)
kc = circuits.k_composition_circuit(model, ind_head, prev_head)  # [d_vocab, d_vocab], factored
ov = circuits.full_ov_circuit(model, *ind_head)
name = lambda lh: f"L{lh[0]}H{lh[1]}"
fig, axes = plt.subplots(1, 2, figsize=(10, 5.2), layout="constrained")
circle = torch.linspace(0, 2 * torch.pi, 200)
for ax, fm, title in ((axes[0], kc, f"K-composition QK circuit {name(ind_head)} ∘ {name(prev_head)}"),
                      (axes[1], ov, f"full OV circuit of {name(ind_head)}")):
    z = circuits.eigenvalues(fm).cpu()
    z = z / z.abs().max()
    ax.plot(circle.cos(), circle.sin(), color="0.85", lw=0.8)
    ax.scatter(z.real, z.imag, s=14)
    ax.axvline(0, color="0.8")
    ax.axhline(0, color="0.8")
    ax.set_xlim(-1.1, 1.1)
    ax.set_ylim(-1.1, 1.1)
    ax.set_aspect("equal")
    ax.set_xlabel("Re λ / max|λ|")
    ax.set_ylabel("Im λ / max|λ|")
    ax.set_title(f"{title}\nΣλ/Σ|λ| = {float(circuits.copying_score(fm)):+.2f}", fontsize=10)
plt.show()

# %% [markdown]
# Every layer-1 head placed by these two numbers — QK positivity (same-matching of its K-composition circuit) and
# OV positivity (copying) — reproduces the Framework's scatter: induction heads sit in the top-right corner.

# %%
fig = plots.plot_positivity(circuit)

# %% [markdown]
# ## Path expansion: which terms carry the loss?
#
# With the attention patterns frozen, a two-layer attention-only model's logits are exactly a sum of terms:
#
# `T = Id ⊗ W_U W_E  +  Σ_h A^h ⊗ W_U W_OV^h W_E  +  Σ_{h2 ∈ L1, h1 ∈ L0} (A^{h2} A^{h1}) ⊗ W_U W_OV^{h2} W_OV^{h1} W_E`
#
# (direct path; one term per head; one **virtual head** per pair). Keeping the terms of order ≤ k and measuring
# the loss shows how much each order contributes. The Framework reports ≈ 5.2 nats from the individual heads and
# only ≈ 0.3 nats from all virtual heads together.

# %%
order = analyses.term_importance_by_order(model, windows[:8])
print(order)

# %%
ranking = analyses.virtual_head_importance(model, windows[:4])
print(ranking.markdown(n=8))

# %% [markdown]
# ## Do the induction heads carry in-context learning?
#
# Pattern-preserving ablation (Olsson et al.): zero one head's output with every attention pattern frozen and
# measure the loss increase — on real text and on the second copy of a repeated random sequence, where only
# induction can help.

# %%
rep = analyses.repeated_tokens(model, 60, 2, batch=8, tokens_from=seen)
abl_text = analyses.head_ablation_losses(model, windows)  # all 16 windows, spread over the validation text
abl_rep = analyses.head_ablation_losses(model, rep)
labels = [f"L{l}H{h}" for l in range(cfg.n_layers) for h in range(cfg.n_heads)]
fig, ax = plt.subplots(figsize=(10, 3.6), layout="constrained")
x = torch.arange(len(labels))
for r, dx, what in ((abl_text, -0.2, "validation text"), (abl_rep, 0.2, "repeated random tokens")):
    ax.bar(x + dx, r.delta.flatten(), 0.4, yerr=r.se.flatten(), capsize=2,
           label=f"{what} ({r.n_sequences} sequences, ± 1 s.e.)")
ax.set_xticks(x, labels, rotation=90)
ax.set_ylabel("loss increase (nats)")
ax.set_title("Pattern-preserving ablation of each head")
ax.legend()
plt.show()

# %% [markdown]
# **What this ablation cannot see.** With every pattern frozen, the attention that the previous-token head L0H1
# creates in the induction heads stays in place, so zeroing L0H1 removes only what it writes directly and into
# their values: it looks minor here. Path patching (`analyses.patching`, notebook 06) measures its effect through
# the induction heads' keys on the same kind of repeated sequence: there it carries most of the induction effect.

# %%
from analyses import patching as P
from analyses.patching.report_section import induction_probe

clean, corrupt, rep_loss, n_rep = induction_probe(model, seen, seed=0)
through_k = P.path_patching(model, clean, corrupt, rep_loss, ["L0H1"], ["L1H1", "L1H2"], "k")
print(f"pattern-preserving ablation of L0H1: {float(abl_text.delta[0, 1]):+.3f} ± {float(abl_text.se[0, 1]):.3f} "
      f"nats on text, {float(abl_rep.delta[0, 1]):+.3f} ± {float(abl_rep.se[0, 1]):.3f} on repeated tokens")
print(f"path patching L0H1 → L1H1 + L1H2 through their keys ([BOS] + R + R, |R| = {n_rep}): "
      f"{float(through_k.share().squeeze()):.3f} of the clean → corrupted loss increase "
      f"({through_k.clean_value:.3f} → {through_k.corrupt_value:.3f} nats)")
print("induction heads:", [f"L{l}H{h}" for l, h in ind_heads], "| previous-token heads:",
      [f"L{l}H{h}" for l, h in prev_heads])

"""Source of notebooks/06_causal_interventions.ipynb (build with `python notebooks/build.py 06`)."""
# ruff: noqa: E402  (notebook cells import after setup lines)

# %% [markdown]
# # Causal interventions: patching, attribution, the logit lens and ablations
#
# The weights say what a circuit *could* do (notebook 02: the previous-token head L0H1 K-composes with the
# induction heads L1H1 and L1H2). Interventions say what it *does*: change one activation, or one path, between a
# clean and a corrupted run, and measure the output. `analyses.patching` has the standard toolbox as library calls,
# on our models and on TransformerLens 4.x bridges:
#
# - **activation patching** (Heimersheim & Nanda 2024) — TransformerLens' own `transformer_lens.patching` sweeps,
#   in both directions, with baselines and labelled results;
# - **path patching** (Wang et al. 2022; Goldowsky-Dill et al. 2023) — a sender head's effect through a receiver's
#   query, key or value input only;
# - **attribution patching** (Nanda 2023) — the gradient × activation-difference estimate of every patch at once,
#   compared with the exact patches;
# - **direct logit attribution** and the **logit lens** (nostalgebraist 2020) — TransformerLens' own;
# - **ablations**: zero, mean and resample, optionally with the attention patterns preserved.
#
# Public API only; CPU, offline, well under a minute.

# %%
import warnings

warnings.filterwarnings("ignore", message="IProgress not found")  # tqdm without ipywidgets

# %%
import subprocess
import sys

import matplotlib.pyplot as plt
import torch

import analyses
import models
from analyses import patching as P
from analyses.sequences import random_tokens, repeated_tokens
from circuits.testing import build_induction_model
from models.data.corpora import build_token_corpus

torch.set_num_threads(1)  # small tensors: one thread is fastest, and polite on a shared CPU
torch.set_grad_enabled(False)  # analysis only (attribution patching turns gradients on where it needs them)
plt.rcParams["figure.dpi"] = 72

model = models.load("attn-only-2l")
seen = torch.from_numpy(build_token_corpus("stdlib", model.tokenizer).seen_ids())  # ids that occur in text

# %% [markdown]
# ## The experiment
#
# Clean prompts: random sequences repeated twice, `[BOS] + R + R`. Corrupted: the same with the first copy
# resampled, so that the second copy has nothing to match. The metric is the loss on the second copy (each of its
# positions predicting the next token): an `Answers` object says which positions are read and what they should
# predict, and `P.metric` turns it into a function of the logits with one value per prompt.

# %%
n = 30
clean = repeated_tokens(model, n, 2, batch=16, seed=0, tokens_from=seen)
corrupt = clean.clone()
corrupt[:, 1:n + 1] = random_tokens(model, n, 16, seed=1, tokens_from=seen)
loss = P.metric("loss", P.next_token_answers(clean, range(n + 1, 2 * n)))
print(f"loss on the second copy: clean {float(loss(model(clean)).mean()):.3f} nats, "
      f"corrupted {float(loss(model(corrupt)).mean()):.3f} nats")

# %% [markdown]
# ## Activation patching
#
# **Denoising** runs the corrupted prompt and patches in one clean activation: what *suffices* to restore the clean
# behaviour. Patching the residual stream by layer and position shows where the information lives: before layer 1
# it sits at the positions of the first copy (each of them must carry "what came before me" for the induction
# heads' keys); after that, nowhere else (the second copy is the same in both prompts). Shares are fractions of the
# clean − corrupted loss difference (1: the whole of it).

# %%
resid = P.activation_patching(model, clean, corrupt, loss, kind="resid_pre", progress=False)
fig = P.plot_patching(resid)

# %% [markdown]
# Per head, over all positions: the output (`z`), query, key, value and pattern of each head, in both directions.
# **Noising** runs the clean prompt and patches in one corrupted activation: what is *necessary*. Denoising the
# induction heads' outputs L1H1 and L1H2 restores most of the behaviour. Noising finds the previous-token head L0H1
# necessary (its output and its values: what it moves is the previous token), and the induction heads' keys and
# patterns necessary too; yet denoising their keys alone makes things worse (negative shares): with clean keys and
# corrupted values an induction head looks at the right place and copies the wrong token. Induction is an AND of
# keys (where to look) and values (what is there).

# %%
for direction in ("denoising", "noising"):
    rows = []
    for kind in ("z", "q", "k", "v", "pattern"):
        r = P.activation_patching(model, clean, corrupt, loss, kind=kind, direction=direction, progress=False)
        rows.append(r.share())
    print(f"{direction}: share of the effect, heads L0H0 … L1H3")
    for kind, s in zip(("z", "q", "k", "v", "pattern"), rows):
        print(f"  {kind:<8}", " ".join(f"{float(v):+.2f}" for v in s.flatten()))

# %% [markdown]
# ## Path patching
#
# Activation patching of L1H1's keys cannot say *which* earlier component the keys depend on. Path patching can: run
# the clean prompt with one sender's output taken from the corrupted run, reaching only one receiver's query, key
# or value input, every other head frozen (noising, as Wang et al. 2022). Senders are the layer-0 heads and the
# embeddings (`"embed"`, the token embedding, which reaches layer 1 directly through the residual stream;
# `"pos_embed"`, identical in both prompts, so it carries nothing by construction). Two routes stand out: the
# previous-token head L0H1 → the induction heads L1H1 and L1H2 through their **keys** (where to look), and the
# token embedding → the same heads through their **values** (what to copy). No layer-0 head feeds the values.

# %%
senders = ["embed", "pos_embed"] + [f"L0H{h}" for h in range(4)]
paths = P.path_patching_matrix(model, clean, corrupt, loss, senders=senders, progress=False)
print(paths.markdown(5))
fig = P.plot_patching(paths)

# %% [markdown]
# The heads back each other up (the loss is not additive), so the single paths understate the circuit. Patched
# together:

# %%
layer0 = [f"L0H{h}" for h in range(4)]
layer1 = [f"L1H{h}" for h in range(4)]
joint = {"L0H1 → L1H1 + L1H2 via K": P.path_patching(model, clean, corrupt, loss, ["L0H1"], ["L1H1", "L1H2"], "k")}
for c in "qkv":
    joint[f"all of layer 0 → all of layer 1 via {c.upper()}"] = P.path_patching(model, clean, corrupt, loss, layer0,
                                                                               layer1, c)
for c in "qkv":
    joint[f"token embedding → all of layer 1 via {c.upper()}"] = P.path_patching(model, clean, corrupt, loss,
                                                                                ["embed"], layer1, c)
for name, r in joint.items():
    print(f"{name:<42} share {float(r.share().squeeze()):.3f}")

# %% [markdown]
# A share above 1 means the path alone does more harm than the whole corruption: with clean keys but the corrupted
# embedding in their values, the induction heads look at the right place and copy a wrong token confidently.

# %% [markdown]
# **A check with a known answer.** `circuits.testing.build_induction_model` builds an induction circuit by hand:
# L0H0 is a previous-token head, L1H0 an induction head whose keys read only L0H0's output, L0H1 writes where
# nothing reads. With the corrupted first copy a reordering of the clean one (no token in place, no pair of
# neighbours kept), the path L0H0 → L1H0 through the keys carries the whole effect and every other path exactly none.

# %%
toy, info = build_induction_model(d_vocab=16, n_ctx=32)
g = torch.Generator().manual_seed(3)
r_clean = torch.randperm(15, generator=g) + 1
while True:  # a reordering with no token in place and no neighbouring pair kept
    r_bad = r_clean[torch.randperm(15, generator=g)]
    if (r_bad != r_clean).all() and not set(zip(r_bad[:-1].tolist(), r_bad[1:].tolist())) & set(
            zip(r_clean[:-1].tolist(), r_clean[1:].tolist())):
        break
toy_clean = torch.cat([torch.tensor([0]), r_clean, r_clean])[None]
toy_corrupt = torch.cat([torch.tensor([0]), r_bad, r_clean])[None]
toy_loss = P.metric("loss", P.next_token_answers(toy_clean, range(16, 30)))
toy_paths = P.path_patching_matrix(toy, toy_clean, toy_corrupt, toy_loss, progress=False)
print(f"loss: clean {toy_paths.clean_value:.4f}, corrupted {toy_paths.corrupt_value:.4f}")
print("share of every path (component, sender, receiver):")
for c, label in enumerate(toy_paths.labels[0]):
    print(f"  through {label}:", toy_paths.share()[c].tolist())

# %% [markdown]
# ## Attribution patching
#
# One forward and one backward pass estimate every patch to first order: Δmetric ≈ (a_clean − a_corrupt) ·
# ∂metric/∂a (Nanda 2023). `attribution_patching` runs the exact patches beside it; a correlation over cells hides
# where it fails, so `error_table()` lists each cell's estimate, exact effect and error.

# %%
for kind, by_pos in (("z", False), ("z", True), ("resid_pre", None)):
    a = P.attribution_patching(model, clean, corrupt, loss, kind=kind, by_pos=by_pos, progress=False)
    cells = " × ".join(a.estimate.axes)
    print(f"{kind:<10} cells {cells:<16} r = {a.correlation:.3f}, largest |estimate − exact| {a.max_error:.3f} nats")
per_head = P.attribution_patching(model, clean, corrupt, loss, kind="z", by_pos=False, progress=False)
print(per_head.error_table(8))
fig = P.plot_attribution(P.attribution_patching(model, clean, corrupt, loss, kind="z", by_pos=True, progress=False))

# %% [markdown]
# Where the linear estimate fails. Per head (the table), the correlation over the 8 heads is carried by the two
# induction heads, whose outputs reach the logits directly: their estimates have the right sign and overshoot
# (the loss is curved in the logits). The layer-0 heads act through the layer-1 heads' attention softmax, which a
# whole-head patch moves far from where the gradient was taken: the estimate for the previous-token head L0H1 has
# the **wrong sign**, and L0H0's is off by a factor. By position the patches are small and the estimate tracks the
# exact effect better (the scatter; points off the diagonal are again layer-0 cells); for the residual stream,
# whose patches are large and act through every softmax, it fails. Trust attribution patching to rank cells that
# write straight to the logits; for cells that steer later attention, run the exact patch.

# %% [markdown]
# ## Direct logit attribution
#
# How much each head's output, read straight through the unembedding (with the final norm's scale), raises the
# logit of the correct next token on the second copy — here with one answer per position (`pos=None` keeps every
# position). The induction heads write the answer directly.

# %%
following = torch.cat([clean[:, 1:], clean[:, :1]], 1)  # the token after each position (last: unused)
dla = P.direct_logit_attribution(model, clean, answer=following, by="head", pos=None)
dla.attribution = dla.attribution[:, :, n + 1: 2 * n]  # the second copy only
fig = P.plot_dla(dla, "Direct logit attribution of the correct next token, second copy")

# %% [markdown]
# ## The logit lens
#
# The residual stream before each layer, read through the unembedding as if the model stopped there (this model has
# no final norm; for a model with one, the lens applies it first). Before layer 0 it is the direct path (a bigram
# model); the repeated `foo(a, b)` is predicted only after the last layer, where the induction heads have written.

# %%
lens = P.logit_lens(model, "x = foo(a, b)\ny = foo(a, b)\n")
fig = P.plot_logit_lens(lens)

# %% [markdown]
# ## Ablations
#
# Replace heads' outputs and measure the loss on the second copy: with zeros, with their mean over a reference
# batch (other repeated sequences), or with their output on another prompt of that batch (resampling: the
# induction heads then copy another sequence's tokens, confidently wrong). `preserve_patterns=True` also freezes
# every attention pattern, the ablation of Olsson et al. 2022 (for one head at a time and the full-sequence loss,
# that is `analyses.head_ablation_losses`). It makes no difference for the last layer's heads, whose output no
# pattern reads; for the previous-token head it keeps the induction heads' patterns intact, so only what L0H1
# writes into their values is lost.

# %%
reference = repeated_tokens(model, n, 2, batch=32, seed=5, tokens_from=seen)
print(f"second-copy loss, clean: {float(loss(model(clean)).mean()):.3f} nats")
for heads in (["L1H1", "L1H2"], ["L0H1"]):
    for method in ("zero", "mean", "resample"):
        cells = []
        for preserve in (False, True):
            r = P.ablate_heads(model, clean, heads=heads, method=method, reference=reference,
                               preserve_patterns=preserve, metric=loss, together=True)
            cells.append(f"{float(r.per_prompt.mean()):6.3f}")
        print(f"{'+'.join(heads):<10} {method:<8} ablated: {cells[0]} nats (patterns frozen: {cells[1]})")

# %% [markdown]
# With the patterns frozen, removing the previous-token head costs almost nothing: L0H1 matters only through where
# the induction heads look (their keys), as path patching found.

# %% [markdown]
# ## On a TransformerLens bridge
#
# The same calls take a TransformerLens 4.x `TransformerBridge` (`models.to_transformer_lens`, for standard
# positions; `attn-only-2l` uses shortformer positions, which TransformerLens 4 removed, so here is `gelu-2l`).
# The numbers agree.

# %%
gelu = models.load("gelu-2l")
bridge = models.to_transformer_lens(gelu)
g_clean = repeated_tokens(gelu, 20, 2, batch=4, seed=0)
g_corrupt = g_clean.clone()
g_corrupt[:, 1:21] = random_tokens(gelu, 20, 4, seed=1)
g_loss = P.metric("loss", P.next_token_answers(g_clean, range(21, 40)))
for tool, call in (("activation patching (z)", lambda m: P.activation_patching(m, g_clean, g_corrupt, g_loss,
                                                                                  kind="z", progress=False).values),
                   ("path patching", lambda m: P.path_patching_matrix(m, g_clean, g_corrupt, g_loss,
                                                                      progress=False).values.nan_to_num()),
                   ("logit lens", lambda m: P.logit_lens(m, g_clean[:1]).next_prob)):
    print(f"{tool:<24} max |ours − bridge| = {float((call(gelu) - call(bridge)).abs().max()):.1e}")

# %% [markdown]
# ## From the command line
#
# `circuits patch` runs activation patching (`--what resid|heads`) or path patching (`--what paths`) between two
# prompts of the same length; `circuits lens` the logit lens. Both take `--json`, `--csv` and `--figure FIG.png`.

# %%
out = subprocess.run([sys.executable, "-m", "analyses.cli", "patch", "attn-only-2l", "--clean",
                      "x = foo(a, b)\ny = foo(a,", "--corrupt", "x = foo(a, c)\ny = foo(a,", "--answer", " b",
                      "--wrong", " c", "--what", "heads", "--top", "4", "--no-progress"],
                     capture_output=True, text=True)
print(out.stdout or out.stderr)
print("also exported at the top level:", analyses.path_patching is P.path_patching)

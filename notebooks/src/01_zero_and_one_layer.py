"""Source of notebooks/01_zero_and_one_layer.ipynb (build with `python notebooks/build.py 01`)."""
# ruff: noqa: E402  (notebook cells import after setup lines)

# %% [markdown]
# # Zero- and one-layer attention-only transformers
#
# *A Mathematical Framework for Transformer Circuits* (Elhage et al., 2021) starts with the smallest models:
#
# - a **zero-layer** transformer is only the direct path `W_E W_U`, so the best it can do is a (low-rank)
#   **bigram** table;
# - a **one-layer** attention-only transformer adds one term per head, `A^h ⊗ W_E W_OV^h W_U`: each head is a
#   set of **skip-trigrams** `[source] … [destination] → [out]`, read off its **QK circuit** (which source the
#   destination attends to) and its **OV circuit** (what attending to it does to the logits); in the Framework most
#   heads **copy**, which shows up as positive eigenvalues of the OV circuit and, token by token, as a diagonal
#   that is each row's maximum.
#
# We study the zoo models `attn-only-0l` and `attn-only-1l` (trained on the Python standard library with a
# 2048-id byte-level BPE), using only the public API: `models`, `circuits`, `analyses`. Runs offline on a CPU in
# about a minute.

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
from analyses.util import windows
from models.data.corpora import build_token_corpus

torch.set_num_threads(1)  # these tensors are small: one thread is fastest, and polite on a shared CPU
plt.rcParams["figure.dpi"] = 90  # 7-pt labels legible at the saved size

m0 = models.load("attn-only-0l")
m1 = models.load("attn-only-1l")
print(m1.cfg.n_layers, "layer,", m1.cfg.n_heads, "heads, d_model", m1.cfg.d_model, "| d_vocab", m1.cfg.d_vocab,
      "| positions:", m1.cfg.positional_embedding_type)

# the training split (what the models were fitted to) and the held-out validation split (tokenized once, cached)
corpus = build_token_corpus("stdlib", m1.tokenizer)
train_text = torch.from_numpy(corpus.train[:].astype("int64"))
val = torch.from_numpy(corpus.val[:300_000].astype("int64"))
seen = torch.from_numpy(corpus.seen_ids())  # ids that occur in the corpus: random probes are drawn from these
print(f"{val.numel():,} validation tokens; {seen.numel()} of {m1.cfg.d_vocab} ids occur in the corpus")

# %% [markdown]
# ## Zero layers: the direct path is a bigram model
#
# With no attention, `logits = one_hot(t) W_E W_U`: the prediction depends on the current token only. The best
# such model is the corpus's bigram table `log P(next | current)`; `W_E W_U` has rank ≤ d_model, so it can only
# approximate it. `direct_path_fit` measures the gap as a frequency-weighted KL divergence between the bigram rows
# of the **whole training split** (the text the model was fitted to; the same definition as the model card,
# README and REPRODUCTION) and `softmax(W_E W_U)` rows, and the direct path's loss beside the bigram entropy (its
# floor, in-sample). The model's loss on held-out validation windows comes beside it.

# %%
fit = analyses.direct_path_fit(m0, train_text)
print(fit)
val_windows = windows(val, m0.cfg.n_ctx, 64, bos=m0.tokenizer.bos_token_id)
print(f"validation loss of attn-only-0l on 64 held-out windows: {float(m0(val_windows, return_type='loss')):.3f}")

# %%
fig = analyses.zero_layer.plot_bigrams(m0, train_text, n=20)

# %% [markdown]
# Both heatmaps show the 20 most frequent tokens only, each row renormalised over those 20 columns (so the two are
# comparable; a row's full distribution also puts mass on the other tokens). The two agree closely: the zero-layer
# model has learnt the bigram statistics of Python code (after
# `self` comes `.`, after `(` comes `self` or a quote …). Its loss sits a little above the bigram entropy
# because of the rank limit.
#
# ## One layer: the QK and OV circuits
#
# Each head's behaviour splits into two `d_vocab × d_vocab` matrices (row-vector convention, as in the code):
#
# - full **QK** circuit `W_E W_Q^h W_K^hᵀ W_Eᵀ`: entry `[d, s]` is how much a destination token `d` wants to
#   attend to a source token `s`;
# - full **OV** circuit `W_E W_V^h W_O^h W_U`: entry `[s, o]` is how much attending to `s` raises the logit of `o`.
#
# `circuits` returns them **factored** (`FactoredMatrix`, inner dimension d_head): nothing of size d_vocab² is
# formed unless we ask for a row.

# %%
ov = circuits.full_ov_circuit(m1, 0)  # every head of layer 0: [head, d_vocab, d_vocab], factored
qk = circuits.full_qk_circuit(m1, 0)
print("OV:", type(ov).__name__, tuple(ov.shape), "factors", tuple(ov.A.shape), tuple(ov.B.shape))
print("QK:", type(qk).__name__, tuple(qk.shape))

# the 400 most frequent tokens of the training text: rows of rare BPE pieces are noisy, these are readable
counts = torch.from_numpy(corpus.unigram_counts().astype("int64"))
frequent = counts.topk(400).indices
name = lambda i: m1.tokenizer.decode([int(i)])

copying = circuits.copying_scores(m1)[0]  # one copying score per head (explained below)
h = int(copying.argmax())
rows = (ov.A[h, frequent] @ ov.B[h]).detach()  # 400 rows of L0H{h}'s full OV circuit: [400, d_vocab]
own = rows[torch.arange(len(frequent)), frequent]  # how much attending to a token raises that same token
rank = (rows > own[:, None]).sum(-1)  # 0: its own logit is the one raised most
print(f"L0H{h} (copying score {float(copying[h]):+.2f}): of the 400 most frequent tokens, "
      f"{int((rank == 0).sum())} raise themselves most of all 2048 outputs, {int((rank < 10).sum())} "
      f"are in their own top 10 (median rank {int(rank.median())}). Examples:")
print("  ", [name(i) for i in frequent[rank == 0][:16]])

# %% [markdown]
# The head **copies**: attending to a token raises that token. And what the QK circuit makes a destination
# token look for (its largest entries among the frequent tokens):

# %%
for w in [" self", " return", " import", "(", " if"]:
    ids = m1.tokenizer.encode(w)
    if len(ids) != 1:
        continue
    scores = (qk.A[h, ids[0]] @ qk.B[h][:, frequent]).detach()
    print(f"  at {w!r:>10} attend to {[name(frequent[i]) for i in scores.topk(6).indices]}")

# %% [markdown]
# ## Attention on real code
#
# The patterns of every head on a short snippet, as an interactive CircuitsVis view (pick a head, hover a token to
# see where it attends; the JavaScript is inlined, so it works offline), and each head's **direct logit
# attribution** per token: how much its output raises the logit of the token that actually comes next (pick a
# head; in a one-layer attention-only model these terms and the direct path sum to the logits). Heads with a fixed
# shape (previous token, first token) and content heads (scattered, token-dependent) look different. Below the
# interactive views, the same numbers as static figures (what a code host shows).

# %%
from analyses import interactive
from analyses.labels import token_labels

snippet = "def add(self, other):\n    return self.value + other.value\n\nx = add(a, b)\ny = add(c, d)\n"
tokens = m1.to_tokens(snippet)[0]
dla, head_names = interactive.direct_logit_attribution(m1, tokens)
interactive.show(
    interactive.attention_view(m1, tokens),
    interactive.token_values_view(token_labels(m1, tokens[1:].tolist()), dla, head_names,
                                  "direct logit attribution of each head to each next token",
                                  interactive.DLA_QUANTITY))

# %% [markdown]
# ## Skip-trigrams and their bugs
#
# Reading QK and OV together gives skip-trigrams `[source] … [destination] → [out]`: at `destination`, the head
# attends to an earlier `source` and raises `out`. `skip_trigrams` streams over rows of both circuits and keeps
# the strongest triples (strength = positive QK preference × positive OV raise), here over the frequent tokens.
# The Python standard library has its own idioms: doctest prompts, `unicodedata` character names
# (`LATIN SMALL LETTER A WITH …`), `if … elif`.

# %%
for hh in range(m1.cfg.n_heads):
    t = analyses.skip_trigrams(m1, 0, hh, k=5, vocab=frequent)
    print(f"L0H{hh}:", "; ".join(f"[{r.source}]…[{r.destination}]→[{r.outs[0][0]}]" for r in t.rows))

# %%
table = analyses.skip_trigrams(m1, 0, h, k=10, vocab=frequent)
print(table)

# %% [markdown]
# Because QK and OV are separate matrices, a head cannot express "raise `o1` after `d1` but `o2` after `d2`" for
# the same source: if a source is attended from several destinations, all of them get all of its outputs — the
# Framework's *skip-trigram bugs* ("keep … in mind" + "keep … at bay" ⇒ "keep … in bay"). With the corpus's bigram
# table of the training text we mark implied predictions whose bigram `[destination] → [out]` never occurs in it.

# %%
bigrams = analyses.bigram_table(torch.from_numpy(corpus.train[:].astype("int64")), m1.cfg.d_vocab)
found = 0
for hh in range(m1.cfg.n_heads):
    bugs = analyses.skip_trigram_bugs(analyses.skip_trigrams(m1, 0, hh, k=40, vocab=frequent), bigrams=bigrams)
    for b in bugs[:1]:
        found += 1
        print(f"L0H{hh} {b.kind}: source {b.source!r}, destinations {b.destination[:6]}, outs {b.outs}")
        print("   implied:", "; ".join(b.crossed[:4]))
        if b.unseen_in_corpus:
            print("   bigram never in the training text:", "; ".join(b.unseen_in_corpus[:3]))
    if found == 3:
        break
if not found:
    print("no crossed predictions among the strongest trigrams")

# %% [markdown]
# ## Copying: eigenvalues of the OV circuit
#
# A head that copies maps each token to itself: its full OV circuit is close to a positive multiple of the
# identity on the tokens it handles, so its eigenvalues are mostly **positive**. The Framework's copying score is
# `Σλ / Σ|λ|` over those eigenvalues: +1 for a pure copier, ≈ 0 for a random matrix. It is computed from a
# `d_head × d_head` matrix, because the non-zero eigenvalues of `AB` and `BA` coincide.

# %%
heads = analyses.copying_heads_table(m1, vocab=frequent)
print(heads)

# %% [markdown]
# The verdict rests on both measures: **copying** needs `Σλ/Σ|λ|` ≥ 0.5 *and* a top-1 diagonal accuracy ≥ 0.5 (the
# head raises each token's own logit most, for at least half of the tokens: ARENA's measure); a head that passes
# the eigenvalues only is **OV-positive**: attending to a token raises that token on balance, yet for most tokens
# some other logit is raised more. Our heads reach high eigenvalue scores with top-1 accuracies below one half, if
# far above chance (1/400), so "copying" holds for them in the eigenvalue sense only.

# %%
fresh = models.HookedTransformer(m1.cfg.replace(seed=1))  # same shapes, random weights
print("copying scores of a random model of the same shape:", [round(float(x), 2) for x in
                                                              circuits.copying_scores(fresh)[0]])
fig = plots.plot_eigenvalues(m1)

# %% [markdown]
# The Framework found 10 of its 12 one-layer heads to be copying heads, the other two positional. Which of ours
# attend by position rather than content? `positional_vs_content` compares each head's patterns on two
# independent random sequences (a positional head does the same thing on both).

# %%
print(analyses.positional_vs_content(m1, vocab=seen))

# %% [markdown]
# **Summary.** The zero-layer model is a rank-limited bigram table. The one-layer model adds skip-trigram heads
# whose OV circuits are mostly positive (eigenvalues), with top-1 diagonal accuracies above chance but below the
# copying verdict's one half, plus positional heads; the factorisation into QK and OV forces predictable "bugs".
# Notebook 02 adds a second layer, where heads compose into induction heads.

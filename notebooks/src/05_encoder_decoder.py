"""Source of notebooks/05_encoder_decoder.ipynb (build with `python notebooks/build.py 05`)."""
# ruff: noqa: E402  (notebook cells import after setup lines)

# %% [markdown]
# # Encoder–decoder transformers: cross-attention circuits and exposure bias
#
# The original transformer (Vaswani et al. 2017) is an encoder–decoder: the encoder reads the source with
# bidirectional self-attention, the decoder writes the target with causal self-attention and **cross-attention**,
# whose queries come from the decoder and whose keys and values come from the encoder's output. In the notation of
# *A Mathematical Framework for Transformer Circuits* (Elhage et al. 2021) a cross-attention head is
# `h_cross(x) = (A_cross ⊗ W_O W_V) · x_encoder` with a non-square pattern `A_cross [target, source]`, so its
# circuits read as before: a **QK circuit** (which source position a decoder position looks at) and an **OV
# circuit** `W_E_src W_OV W_U` (what the attended source token does to the target logits).
#
# Here we train a tiny encoder–decoder live to **reverse** strings, read its cross-attention circuits, and compare
# **teacher forcing** with **scheduled sampling** (Bengio et al. 2015) on exposure bias: greedy decoding of
# held-out sources, including sources longer than any seen in training. Runs offline on a CPU in about a minute.

# %%
import warnings

warnings.filterwarnings("ignore", message="IProgress not found")  # tqdm without ipywidgets

# %%
import time

import matplotlib.pyplot as plt
import torch

import circuits
from analyses.alignment import alignment_scores, task_alignment
from analyses.encdec_plots import plot_cross_patterns, plot_full_cross_ov, plot_positional_cross_qk
from models import EncoderDecoderConfig
from models.data.seq2seq import Seq2SeqBatches, exact_match, make_task
from models.training.config import TrainConfig
from models.training.loop import train

torch.set_num_threads(1)  # small tensors: one thread is fastest, and polite on a shared CPU
plt.rcParams["figure.dpi"] = 90

# %% [markdown]
# ## Train a tiny one, twice
#
# One encoder layer and one decoder layer, 2 heads each, d_model 32, attention-only, learned positions; sources of
# 3–6 letters out of 8 (`models.data.seq2seq`, held-out split by a hash of the source: never trained on). Both runs
# share everything but how the decoder's inputs are made: **teacher forcing** feeds the true previous target token;
# **scheduled sampling** feeds the model's own prediction with a probability rising linearly to 0.5 over training.

# %%
model_cfg = EncoderDecoderConfig(d_model=32, n_heads=2, d_mlp=None, n_encoder_layers=1, n_decoder_layers=1,
                                 d_vocab_src=11, d_vocab_tgt=11, n_ctx_src=8, n_ctx_tgt=10, normalization_type=None,
                                 positional_embedding_type="standard", use_bias=False, init_range=0.1, seed=0)
common = dict(data="seq2seq:reverse", task_symbols=8, task_min_len=3, task_max_len=6, steps=600, batch_size=64,
              lr=3e-3, warmup_steps=30, weight_decay=0.01, grad_clip=1.0, seed=0, eval_every=200,
              checkpoint_every=600, log_checkpoints=0, log_every=50, val_sequences=128, exact_match_sequences=256,
              num_threads=1, progress=False)
runs = {}
for name, schedule in (("teacher forcing", "none"), ("scheduled sampling", "linear")):
    t0 = time.perf_counter()
    model, summary = train(model_cfg, TrainConfig(sampling_schedule=schedule, sampling_max=0.5, **common))
    runs[name] = model.eval()
    print(f"{name}: {summary['steps']} steps in {time.perf_counter() - t0:.1f} s")

# %% [markdown]
# ## Exposure bias: greedy decoding on held-out sources, in and beyond the training lengths
#
# Exact match = the whole greedy output (and its EOS) right. Lengths 3–6 are the training distribution (held-out
# sources); lengths 7 and 8 were never seen. A teacher-forced model has only ever read true prefixes, so at test time
# its own mistakes lead it where it has never been (exposure bias); scheduled sampling trains on its own prefixes.

# %%
def held_out(min_len, max_len, n=512, seed=1):
    batches = Seq2SeqBatches(make_task("seq2seq:reverse", 8, min_len, max_len), 8, 10)
    return batches, batches.val_batch(n, seed=seed)


splits = {"3–6 (trained lengths)": held_out(3, 6), "7": held_out(7, 7), "8": held_out(8, 8)}
results = {name: {s: exact_match(m, *splits[s]) for s in splits} for name, m in runs.items()}
print(f"{'greedy exact match':<22}" + "".join(f"{s:>24}" for s in splits))
for name, r in results.items():
    print(f"{name:<22}" + "".join(f"{v:>24.1%}" for v in r.values()))

fig, ax = plt.subplots(figsize=(7, 3.2), layout="constrained")
width = 0.38
for k, (name, r) in enumerate(results.items()):
    bars = ax.bar([i + (k - 0.5) * width for i in range(len(r))], list(r.values()), width, label=name)
    ax.bar_label(bars, [f"{v:.0%}" for v in r.values()], fontsize=8)
ax.set_xticks(range(len(splits)), [f"source length {s}" for s in splits])
ax.set_ylabel("greedy exact match (held-out)")
ax.set_ylim(0, 1.15)
ax.legend(loc="upper right")
ax.set_title("Teacher forcing vs scheduled sampling")
plt.show()

# %% [markdown]
# What this run shows: both models decode held-out sources of the trained lengths; neither decodes longer ones. The
# limit beyond the training lengths is position, not exposure to its own predictions: the learned embeddings of
# source positions 6 and 7 and of the later target positions never receive a gradient (no training source is that
# long), so every length-7 or -8 source leaves the model off its training distribution from the first token on.
# (The same two runs with fixed sinusoidal positions, tried while writing this notebook, also decode none of them.)
# To see exposure bias itself, compare the two where teacher forcing leaves the model imperfect: fewer steps, or a
# harder task (`seq2seq:sort`, `seq2seq:date`).

# %% [markdown]
# ## The teacher-forced model's cross-attention: alignment heads
#
# An **alignment head** attends, from the decoder position that predicts a target token, to the source position that
# token comes from: for reversal, the anti-diagonal. Its **alignment score** (`analyses.alignment.alignment_scores`)
# is the attention mass there, averaged over every predicted symbol of held-out sources.

# %%
model = runs["teacher forcing"]
batches, rows = splits["3–6 (trained lengths)"]
src, tgt, src_mask, tgt_mask = batches.split(rows)
aligned = task_alignment(batches.task, src, src_mask, tgt.shape[1])
scores = alignment_scores(model, src, tgt, aligned, src_mask, tgt_mask)
print("alignment scores [decoder layer, head]:", [[round(float(v), 3) for v in r] for r in scores])

i = int(src_mask.sum(-1).argmax())  # a longest (6-letter) source
n_src, n_tgt = int(src_mask[i].sum()), int(tgt_mask[i].sum()) - 1
_, cache = model.run_with_cache(src[i:i + 1], tgt[i:i + 1], src_mask[i:i + 1], tgt_mask[i:i + 1])
pattern = cache["decoder.0.cross_attn.hook_pattern"][0, :, :n_tgt, :n_src][None].float()
letters = batches.task.tokenizer.source
src_labels = [f"{j}:{letters.id_to_token(int(t))}" for j, t in enumerate(src[i, :n_src])]
tgt_labels = [letters.id_to_token(int(t)) for t in list(tgt[i, 1:n_tgt]) + [2]]
fig = plot_cross_patterns(pattern, aligned[i, :n_tgt, :n_src], src_labels, tgt_labels, scores)
plt.show()

# %% [markdown]
# ## Its cross-attention OV circuits copy
#
# The full OV circuit `W_E_src W_V W_O W_U` of each cross-attention head, and its copying score `Σλ/Σ|λ|`
# (`circuits.cross_copying_scores`, the Framework's eigenvalue test; +1 = only raises the attended token's own
# logit). Source and target share their letters, so a copying head shows a positive diagonal.

# %%
copying = circuits.cross_copying_scores(model)
print("cross-attention copying scores:", [[round(float(v), 3) for v in r] for r in copying])
ov = circuits.full_cross_ov_circuit(model).AB.detach().float()
fig = plot_full_cross_ov(ov, [letters.id_to_token(k) for k in range(11)], copying)
plt.show()

# %% [markdown]
# ## Where does the alignment come from? The QK circuit's positional part, and the path expansion
#
# The positional part of the full cross-attention QK circuit, `W_pos_tgt W_QK W_pos_srcᵀ / √d_head`, is the score a
# decoder position gives a source position from the positional embeddings alone, along the direct path. For
# variable-length reversal the aligned source position depends on the source's length, so the positions alone cannot
# give it: the length has to reach the head through the encoder's or decoder's self-attention. The path expansion
# (`circuits.encdec_path_expansion`, patterns frozen; the terms sum to the logits) says which paths carry the correct
# token.

# %%
parts = circuits.full_cross_qk_circuit(model, positional=True)
fig = plot_positional_cross_qk((parts.pos_pos.AB / model.cfg.d_head**0.5).detach().float(), 10, 8)
plt.show()

exp = circuits.encdec_path_expansion(model, src[:64], tgt[:64], src_mask[:64], tgt_mask[:64])
print(f"{len(exp.terms)} terms; their sum against the model's logits: relative error {exp.reconstruction_error:.1e}")
nxt, keep = tgt[:64, 1:], tgt_mask[:64, 1:]
contrib = {}
for name in exp.terms:
    logits = exp.terms[name][:, :-1]
    centred = logits - logits.mean(-1, keepdim=True)
    contrib[name] = float(centred.gather(-1, nxt[..., None])[..., 0][keep].mean())
print("mean contribution to the correct token's logit (centred), largest first:")
for name, v in sorted(contrib.items(), key=lambda kv: -abs(kv[1]))[:8]:
    print(f"  {name:<18} {v:+.2f}")

# %% [markdown]
# Read together: the cross-attention heads align (the anti-diagonal above) and their OV circuits copy, so
# `C0H·[src]` terms, "attend to the aligned source token and copy it", carry most of the correct logit. The same
# reading on the zoo model `enc-dec-reverse` is in `docs/report-enc-dec-reverse/report.md` (`circuits report
# enc-dec-reverse`).

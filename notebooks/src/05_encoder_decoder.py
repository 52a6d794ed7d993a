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
# Here we train a tiny encoder–decoder live to **reverse** strings and read its cross-attention circuits; then we
# load a measured experiment on **exposure bias**, **teacher forcing** against each **scheduled-sampling** schedule
# (Bengio et al. 2015), on two tasks where every target token depends on the one before it, scored against the true
# target and against the target the task's rule gives for the prefix the model actually read (its results were
# computed once by a script, which this notebook names). Runs offline on a CPU in about a minute.

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
# ## Train a tiny one
#
# One encoder layer and one decoder layer, 2 heads each, d_model 32, attention-only, learned positions; sources of
# 3–6 letters out of 8 (`models.data.seq2seq`, held-out split by a hash of the source: never trained on), teacher
# forcing (the decoder reads the true previous target token). Exact match = the whole greedy output (and its EOS)
# right, on 512 held-out sources of the trained lengths. (Sources longer than any trained are not tried: their
# learned position rows never received a gradient, so they would test untrained parameters, not generalisation.)

# %%
model_cfg = EncoderDecoderConfig(d_model=32, n_heads=2, d_mlp=None, n_encoder_layers=1, n_decoder_layers=1,
                                 d_vocab_src=11, d_vocab_tgt=11, n_ctx_src=8, n_ctx_tgt=10, normalization_type=None,
                                 positional_embedding_type="standard", use_bias=False, init_range=0.1, seed=0)
t0 = time.perf_counter()
model, summary = train(model_cfg, TrainConfig(
    data="seq2seq:reverse", task_symbols=8, task_min_len=3, task_max_len=6, steps=600, batch_size=64, lr=3e-3,
    warmup_steps=30, weight_decay=0.01, grad_clip=1.0, seed=0, eval_every=200, checkpoint_every=600,
    log_checkpoints=0, log_every=50, val_sequences=128, exact_match_sequences=256, num_threads=1, progress=False))
model.eval()
batches = Seq2SeqBatches(make_task("seq2seq:reverse", 8, 3, 6), 8, 10)
rows = batches.val_batch(512, seed=1)
print(f"{summary['steps']} steps in {time.perf_counter() - t0:.1f} s; greedy exact match on 512 held-out sources: "
      f"{exact_match(model, batches, rows):.1%}")

# %% [markdown]
# ## The teacher-forced model's cross-attention: alignment heads
#
# An **alignment head** attends, from the decoder position that predicts a target token, to the source position that
# token comes from: for reversal, the anti-diagonal. Its **alignment score** (`analyses.alignment.alignment_scores`)
# is the attention mass there, averaged over every predicted symbol of held-out sources.

# %%
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

# %% [markdown]
# ## Exposure bias, measured: teacher forcing against scheduled sampling, against the right target
#
# Reversal cannot show exposure bias: its target tokens do not depend on each other, so a wrong token in the prefix
# changes nothing after it. Two tasks here, both running sums mod 10 of the source's symbols (`models.data.seq2seq`):
#
# - `seq2seq:cumsum`, y_j = (y_{j−1} + x_j) mod 10 from y_{−1} = 0: every target symbol is the previous one plus the
#   aligned source symbol, and also the sum of the source's first j + 1 symbols, so the source alone determines it;
# - `seq2seq:walk`, the same sum from a random start s that the source does not hold (y_j = s + x_0 + … + x_j): the
#   first symbol is a free choice, and every later one can only be known from the target symbols before it, so the
#   model **must** rely on its own earlier outputs.
#
# **Two targets.** Scoring against the *true* target measures the wrong thing after a mistake: in cumsum, once the
# model has written one wrong symbol, a model that applies the rule perfectly to what it reads is "wrong" against
# the true target at every later position, by the task's definition. That number is the compounding the task
# imposes, kept here under that name. Exposure bias is a model erring more often on its own prefixes than on true
# ones, so its measure is the error against the **prefix-consistent target** (`Task.consistent_targets`): the
# symbol the task's rule gives for the prefix the model actually read, its own or an injected wrong symbol included
# (for walk's first symbol any symbol is right).
#
# Sources of 4–8 symbols (the trained lengths only); one encoder and one decoder layer with an MLP (d_model 32,
# 2 heads, d_mlp 64, learned positions). Four ways of training: **teacher forcing**, and **scheduled sampling** with
# each schedule `models.training` supports (linear, exponential, inverse sigmoid: the decoder reads its own greedy
# prediction at a fraction 0.5 · (1 − ε_i) of the positions, ε_i falling below 0.02 by about step 400). **Stopping
# rule**: every run stops after the first step at which its teacher-forced per-symbol accuracy on 500 held-out
# sources reaches 0.93 (checked after every step; budget 2,000 steps), so all are compared at about the same
# accuracy from true prefixes; the accuracy it stops at is above 0.93 by the step's last jump (the **overshoot**,
# reported per run).
#
# Measured on 2,000 other held-out sources (`analyses.exposure_bias`, one function per measure), per target
# position j: the error **from true prefixes** (teacher forced) and **free running** (greedy, reading its own
# predictions); after **one wrong symbol injected** at position k of the decoder's input, the error of the model's
# own greedy continuation at distance d = j − k, beside the same positions continued from the true prefix (the base).
# Means over seeds 0–4 with 95 % Student-t intervals; seeds 5–7, trained afterwards, are a held-out check of those
# intervals (every arm on cumsum; CPU time cut walk to teacher forcing, seeds 0–4: `results.md` lists the runs not
# trained); each scheduled-sampling schedule minus
# teacher forcing with Welch's 95 % interval and the smallest difference a two-sided test at α = 0.05 finds with 80 %
# power given the observed between-seed spread. The results were computed once, on a CPU, by
#
#     python -m analyses.exposure_bias_experiment --out docs/exposure_bias --seeds 5 --held-out-seeds 3
#
# (the published summary by the same command with `--summarise-only`, over the runs in `docs/exposure_bias/runs/`),
# which writes `docs/exposure_bias/results.json`, `results.md` (every table, per position too) and the figures;
# this notebook loads the JSON and draws them.

# %%
import json
from pathlib import Path

import analyses
from analyses.exposure_bias_plots import plot_injected, plot_per_position

result = json.loads((Path(analyses.__file__).parents[1] / "docs" / "exposure_bias" / "results.json").read_text())
rows_of = {"tf": "error from true prefixes", "free": "error free running", "gap": "free − true prefixes",
           "after1": "1st symbol after a wrong one", "base_after1": "  its base rate",
           "later": "later symbols after a wrong one", "base_later": "  their base rate"}
for task, tr in result["tasks"].items():
    names = list(tr["schedules"])
    sch = tr["schedules"]
    print(f"\n=== seq2seq:{task} ===\n{'mean [95 % t-interval] over seeds':<40}" + "".join(f"{n:>24}" for n in names))
    for key, label in (("measured_teacher_forced_accuracy", "teacher-forced accuracy"),
                       ("overshoot", "stop overshoot (accuracy − 0.93)")):
        print(f"{label:<40}" + "".join(f"{'{:.3f} [{:.3f}, {:.3f}]'.format(*sch[n][key]):>24}" for n in names))
    for target in (("consistent",) if task == "walk" else ("gold", "consistent")):
        print(f"-- against the {'true' if target == 'gold' else 'prefix-consistent'} target")
        for key, label in rows_of.items():
            print(f"{label:<40}" + "".join(f"{'{:.3f} [{:.3f}, {:.3f}]'.format(*sch[n][f'{key}_{target}']):>24}"
                                           for n in names))
    print("scheduled sampling − teacher forcing, prefix-consistent target: difference [Welch 95 %]; detectable "
          "at 80 % power (with the seeds each has)")
    for n, diffs in tr["versus_teacher_forcing"].items():
        for key in ("gap_consistent", "after1_excess_consistent", "later_excess_consistent"):
            (d, lo, hi), mdd = diffs[key]["difference"], diffs[key]["detectable_at_80_power"]
            print(f"  {n:<16} {key:<26} {d:+.3f} [{lo:+.3f}, {hi:+.3f}]   detectable ±{mdd:.3f}")

# %%
fig = plot_per_position(result, "cumsum")
plt.show()

# %%
fig = plot_injected(result, "cumsum")
plt.show()

# %%
fig = plot_per_position(result, "walk")
plt.show()

# %%
fig = plot_injected(result, "walk")
plt.show()

# %% [markdown]
# What the data show (every number is in `docs/exposure_bias/results.md`, with the per-position tables; teacher forcing
# over seeds 0–4, seeds 5–7 held out):
#
# - **Against the true target the task compounds every mistake, by its definition.** With teacher forcing on cumsum the
#   per-symbol error is 0.066 [0.059, 0.072] from true prefixes and 0.173 [0.152, 0.194] free running, and the
#   free-running curve lies on 1 − Π(1 − e_i), the error if every mistake were carried to the end; after one wrong input
#   symbol the next symbol differs from the true one 0.986 of the time (base 0.079). A model that applies the rule to
#   what it reads scores 1 there and carries every mistake to the end, so these numbers measure the compounding the
#   task imposes, not exposure bias. (An earlier version of this notebook read them as "exposure bias is there, and
#   large": the data do not support that.)
# - **Against the prefix-consistent target free running errs as often as teacher forcing.** Free running 0.066 [0.060,
#   0.072] against 0.066 [0.059, 0.072] from true prefixes, a difference of +0.000 [-0.004, +0.005] (95 % t-interval
#   over 5 seeds); position by position the two curves lie on each other (first figure). After one injected wrong symbol
#   the model's own continuation errs 0.088 [0.077, 0.100] at the next symbol against a base of 0.079 [0.071, 0.087]
#   (difference +0.009 [-0.005, +0.024]), and +0.001 [-0.004, +0.005] more than base at the later ones (second figure):
#   the model applies the rule to the symbol it read, right or wrong. No exposure bias is detectable; the intervals
#   bound it to their half widths.
# - **walk, where only the model's own earlier outputs tell the next symbol, shows none either.** Teacher-forced 0.063
#   [0.053, 0.073], free running 0.065 [0.058, 0.073] (difference +0.002 [-0.004, +0.008]); after one wrong symbol
#   +0.000 [-0.004, +0.004] at the next symbol and -0.002 [-0.008, +0.005] at the later ones, against their base rates.
#   Having to rely on its own outputs does not by itself give a model exposure bias: these models read the previous
#   symbol, and a wrong symbol is as ordinary an input to them as a right one, since every symbol occurs in training.
# - **Scheduled sampling** (linear, exponential, inverse sigmoid; 5 seeds each, seeds 5–7 held out): against the
#   prefix-consistent target its free-running gap equals teacher forcing's (smallest difference detectable at 80 %
#   power: up to ±0.006), but the first symbol after a wrong one errs more than its base: +0.047 [+0.006, +0.088] /
#   +0.074 [+0.036, +0.111] / +0.064 [+0.026, +0.103] (linear / exponential / inverse sigmoid), against teacher
#   forcing's +0.009 [-0.005, +0.024]; at the later symbols the excess is back to about 0. Trained on the true target
#   after its own wrong symbols, a scheduled-sampling model learns to read part of the answer from the source rather
#   than its prefix, which is right against the true target and wrong for what it read: scheduled sampling does not
#   remove an exposure bias here (there is none to remove), it adds a first-symbol sensitivity to a wrong prefix.
# - **The held-out seeds** (seeds 5–7 of every way of training): 81 of 204 of their values fall outside the 5 seeds'
#   95 % interval of the mean, where one more seed falls outside with chance 0.32 even when all is as assumed (the
#   interval is for the mean, not for a seed), and 19 of 204 outside the 95 % prediction interval (expected 5 %). For
#   teacher forcing the counts are 13 and 7 of 51, mostly from one measure, the error just after a wrong symbol (seed 7
#   reads the source rather than its prefix there about as often as the scheduled-sampling models; over all 8 seeds its
#   excess over base is +0.025 [-0.005, +0.055]); for the scheduled-sampling models the per-position values fall
#   outside their prediction intervals 35–41 times in 264 (127 of 1056 over all four): their seeds vary more than 5
#   seeds show, so their intervals and detectable differences are too narrow by about that much. The teacher-forcing
#   measures other than the first symbol after a wrong one stand with their 5-seed intervals.
# - **The stopping rule's overshoot.** The rule stops at the first step over 0.93, so the accuracy at the stop is above
#   it by 0.004–0.005 on average per way of training; that accuracy moves by 0.004 [0.003, 0.006] (sd) from one step to
#   the next near the stop, the rule's resolution. Differences between ways of training in the teacher-forced error of
#   that size say nothing about the schedules. The exposure-bias measures are differences within one model (free running
#   − teacher forced; after a wrong symbol − base), which the overshoot moves only through the overall error level.
#
# Length generalisation is a separate question, not asked here: every source above is of a trained length.

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
# (Bengio et al. 2015), on a task where every target token depends on the one before it (its results were computed
# once by a script, which this notebook names). Runs offline on a CPU in about a minute.

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
# ## Exposure bias, measured: teacher forcing against scheduled sampling on a running sum
#
# Reversal cannot show exposure bias: its target tokens do not depend on each other, so a wrong token in the prefix
# changes nothing after it. Here the task is `seq2seq:cumsum`, the running sum mod 10 of the source's digits,
# y_j = (y_{j−1} + x_j) mod 10: the easiest rule reads the previous target token, so a model that learns it carries
# any mistake in its prefix forward. Sources of 4–8 symbols (the trained lengths only); the model has one encoder and
# one decoder layer with an MLP (d_model 32, 2 heads, d_mlp 64, learned positions). Four ways of training:
# **teacher forcing**, and **scheduled sampling** with each schedule `models.training` supports (linear, exponential,
# inverse sigmoid: the decoder reads its own greedy prediction at a fraction 0.5 · (1 − ε_i) of the positions,
# ε_i falling below 0.02 by about step 400), several seeds each. **Stopping rule**: every run stops after the first
# step at which its teacher-forced per-symbol accuracy on 500 held-out sources reaches 0.93 (checked after every
# step; budget 2,000 steps), so all four are compared at the same accuracy from true prefixes.
#
# Measured on 2,000 other held-out sources (`analyses.exposure_bias`, one function per measure): per target
# position j, the error **from true prefixes** (teacher forced) and **free running** (greedy, reading its own
# predictions); and after **one wrong symbol injected** at position k of the decoder's input, the error of the next
# symbol (later inputs true) and of the model's own greedy continuation, each beside the same positions' base rate
# without the injection. Means over seeds with 95 % Student-t intervals; each scheduled-sampling schedule minus
# teacher forcing with Welch's 95 % interval and the smallest difference a two-sided test at α = 0.05 finds with
# 80 % power given the observed between-seed spread. The results were computed once, on a CPU, by
#
#     python -m analyses.exposure_bias_experiment --out docs/exposure_bias --seeds 5
#
# which writes `docs/exposure_bias/results.json` and the two figures; this notebook loads the JSON and draws them.

# %%
import json
from pathlib import Path

import analyses
from analyses.exposure_bias_plots import plot_injected, plot_per_position

result = json.loads((Path(analyses.__file__).parents[1] / "docs" / "exposure_bias" / "results.json").read_text())
rows_of = {"gold": "error from true prefixes", "free": "error free running", "gap": "free − true prefixes",
           "injected_next": "next symbol after a wrong one", "base_next": "  its base rate",
           "injected_continuation": "own continuation after a wrong one", "base_continuation": "  its base rate"}
names = list(result["schedules"])
print(f"{'mean [95 % t-interval] over seeds':<36}" + "".join(f"{n:>24}" for n in names))
print(f"{'seeds':<36}" + "".join(f"{len(result['schedules'][n]['seeds']):>24}" for n in names))
print(f"{'steps to the stop (median)':<36}" + "".join(
    f"{sorted(result['schedules'][n]['steps'])[len(result['schedules'][n]['steps']) // 2]:>24}" for n in names))
for key, label in [("measured_teacher_forced_accuracy", "teacher-forced accuracy")] + list(rows_of.items()):
    cells = [result["schedules"][n][key] for n in names]
    print(f"{label:<36}" + "".join(f"{f'{m:.3f} [{lo:.3f}, {hi:.3f}]':>24}" for m, lo, hi in cells))

print("\nscheduled sampling − teacher forcing: difference [Welch 95 % interval]; smallest difference detectable "
      "at 80 % power")
for n, diffs in result["versus_teacher_forcing"].items():
    print(n)
    for key in ("gold", "free", "gap", "injected_next", "injected_continuation"):
        (d, lo, hi), mdd = diffs[key]["difference"], diffs[key]["detectable_at_80_power"]
        print(f"  {rows_of[key].strip():<36} {d:+.3f} [{lo:+.3f}, {hi:+.3f}]   detectable ±{mdd:.3f}")

# %%
fig = plot_per_position(result)
plt.show()

# %%
fig = plot_injected(result)
plt.show()

# %% [markdown]
# What this measures (5 seeds per way of training, all stopped at teacher-forced accuracy 0.93; the numbers are the
# table above, also in `docs/exposure_bias/results.md`):
#
# - **Exposure bias is there, and large.** With teacher forcing the per-symbol error is 0.066 from true prefixes and
#   0.175 free running; free running, it grows along the target to 0.43 at position 7, while from true prefixes it
#   stays at 0.07–0.13. The free-running curve lies on the dotted one, 1 − Π(1 − e_i), the error if every mistake
#   from a true prefix were carried to the end: the model reads its previous output symbol and adds the aligned
#   source symbol, so a wrong input symbol makes the next one wrong in 0.986 of cases (base rate 0.079), and its own
#   continuation after one wrong symbol stays wrong (0.973, base 0.183).
# - **Scheduled sampling does not remove it here.** Every schedule (own greedy predictions at up to half the
#   positions) leaves the free-running − true-prefix gap within 0.017–0.025 of teacher forcing's 0.109; each
#   difference's 95 % interval contains 0, and with 5 seeds a difference smaller than about ±0.04 (the smallest
#   detectable at 80 % power) could go unseen: a null with that power, not proof of no effect. At the same overall
#   accuracy the scheduled-sampling models err less at positions 1–2 and more at the last ones (free running 0.50–0.53
#   at position 7), and their free-running curves too follow the compounded one.
# - **A small robustness to one wrong symbol**, only at the first position: after a wrong symbol, the next one is
#   wrong 0.959 / 0.963 of the time for the exponential / inverse-sigmoid schedules against 0.986 for teacher forcing
#   (differences −0.027 [−0.045, −0.008] and −0.023 [−0.044, −0.003]; linear −0.014 [−0.034, +0.007]); the second
#   figure puts the difference at k = 0 (0.85–0.91 against 0.97), where symbol 1 = x_0 + x_1 can be read from the
#   source alone; from k = 1 on every model is wrong ≥ 0.98 of the time. These intervals are not corrected for the
#   15 comparisons printed above, and those two schedules also stopped at a slightly lower teacher-forced accuracy
#   (0.928 and 0.927 against 0.934).
#
# Length generalisation is a separate question, not asked here: every source above is of a trained length.

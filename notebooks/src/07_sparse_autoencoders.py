"""Source of notebooks/07_sparse_autoencoders.ipynb (build with `python notebooks/build.py 07` in an environment with
SAELens: `pip install -e ".[dev,sae]"`)."""
# ruff: noqa: E402  (notebook cells import after setup lines)

# %% [markdown]
# # Sparse autoencoders on the zoo, through SAELens
#
# A sparse autoencoder (SAE) rewrites one activation of a model as a sparse sum of learned directions, its
# *features*: `x ≈ b_dec + Σ_f a_f(x) W_dec[f]` with `a(x) = ReLU(W_enc (x − b_dec) + b_enc)` and an L1 penalty that
# keeps few `a_f` non-zero (Bricken et al. 2023, "Towards Monosemanticity"; Cunningham et al. 2023). The features
# are often more interpretable than neurons or residual directions.
#
# The training, the SAE classes and the splicing are SAELens' (the field's SAE library); `models.sae` connects our
# models to it: `with_saes(model)` gives a zoo model SAELens' `HookedSAETransformer` methods (`add_sae`,
# `run_with_saes`, `run_with_cache_with_saes`, ...), and `ActivationSource` feeds SAELens' `SAETrainer` with
# activations of our models on our corpora. The zoo ships two SAEs, trained by `circuits sae train` (the command is
# in each SAE's `card.md`, beside its numbers):
#
# 1. on `gelu-2l`'s second MLP output, `blocks.1.hook_mlp_out`;
# 2. on `attn-only-2l`'s layer-1 attention output, `blocks.1.attn.hook_z` concatenated over heads, as Kissane et
#    al. 2024 ("Interpreting Attention Layer Outputs with Sparse Autoencoders") did on a two-layer attention-only
#    model: each feature's decoder row then splits into one part per head, which says which heads write it.
#
# We load them and ask: how well do they reconstruct (FVU, L0), how much of the model's loss survives them spliced
# in, and what are the features? CPU, offline; `circuits sae report MODEL SAE_DIR --html` does the same from the
# command line, and the last section trains a small SAE of your own.

# %%
import warnings

warnings.filterwarnings("ignore", message="IProgress not found")  # tqdm without ipywidgets
warnings.filterwarnings("ignore", category=DeprecationWarning)  # SAELens imports transformer_lens.utils (3.x)

# %%
import matplotlib.pyplot as plt
import sae_lens
import torch
from IPython.display import HTML, display

import models
from analyses.report import training_corpus, validation_text
from analyses.sae_page import features_html
from analyses.sae_report import analyse, plot
from analyses.sequences import bos_token_id, repeated_tokens
from analyses.util import windows
from models.io.checkpoint import resolve
from models.sae import load_sae, train_sae, with_saes, zoo_sae

torch.set_num_threads(1)  # small tensors: one thread is fastest, and polite on a shared CPU
plt.rcParams["figure.dpi"] = 72
print("SAELens", sae_lens.__version__)


def text_of(name, n_windows=128):
    """The zoo model and the validation windows its SAE's card is measured on: `circuits sae report`'s default text,
    128 windows of n_ctx tokens from the first 400,000 validation tokens of its training corpus, BOS first."""
    model = models.load(name).eval()
    val, _ = validation_text(model, resolve(name), 400_000)
    return model, windows(val, model.cfg.n_ctx, n_windows, 0, bos=bos_token_id(model)), bos_token_id(model)


def show(report, k=4):
    """The top features: how often each fires, its strongest contexts (the token in [brackets]), what it promotes."""
    for f in report.features[:k]:
        print(f"feature {f.index}: active on {f.frequency:.1%} of tokens, max {f.max_act:.2f}")
        for before, tok, after, act in f.contexts[:4]:
            print(f"   {act:6.2f}  …{before}[{tok}]{after}")
        if f.promoted:
            print("   promotes: " + "  ".join(f"{t} ({v:+.2f})" for t, v in f.promoted[:5]))


# %% [markdown]
# ## 1. An SAE on gelu-2l's MLP output
#
# `gelu-2l` (two layers, d_model 128, byte tokenizer, trained on the Python standard library). The SAE has
# `8 × 128 = 1024` features, trained on 300 batches of 4096 token activations (BOS positions left out), Adam at
# 3e-3, L1 coefficient 2 on activations normalised to mean squared norm `d_in` (SAELens' `expected_average_only_in`,
# folded back at the end). `zoo_sae` gives its folder; our `load_sae` checks its files and hands them to SAELens
# (SAELens' own `SAE.load_from_disk` reads the same folder).

# %%
gelu, val, bos = text_of("gelu-2l")
mlp = load_sae(zoo_sae("gelu-2l", "blocks.1.hook_mlp_out"), gelu)
print(type(mlp).__name__, mlp.cfg.d_in, "→", mlp.cfg.d_sae, "features at", mlp.cfg.metadata.hook_name)

# %% [markdown]
# Measured on the card's 128 validation windows of 128 tokens (16,256 positions): the fraction of variance
# unexplained `Σ‖x − x̂‖² / Σ‖x − mean x‖²`, L0 (features active per token), dead features, and the loss with the
# reconstruction spliced in for the real activation (SAELens' `run_with_saes` on our model) against the clean model
# and the hook zero-ablated. "Loss recovered" is `(zero − spliced) / (zero − clean)`. These are the numbers of the
# SAE's card (`models/zoo/gelu-2l/saes/blocks.1.hook_mlp_out/card.md`).

# %%
def measure(model, sae, val, bos, name, prefix=""):
    """The SAE's report on validation windows: its numbers printed, its figure shown."""
    report = analyse(model, sae, val, bos, top=8, contexts=8, promoted=8, before=20, after=4)
    s, lo = report.stats, report.losses
    print(f"{prefix}FVU {s['fvu']:.3f}, L0 {s['l0']:.1f}, dead {s['dead']} of {s['d_sae']}")
    print(f"loss: clean {lo['clean']:.4f}, spliced {lo['spliced']:.4f}, zero-ablated {lo['zero_ablated']:.4f}, "
          f"recovered {lo['recovered']:.1%}")
    plot(report, name)
    plt.show()
    return report


mlp_report = measure(gelu, mlp, val, bos, "gelu-2l")

# %% [markdown]
# What the features are: for the features that fire hardest, the contexts where each fires most (whitespace shown
# as ␣ and ⏎) and the tokens its decoder direction promotes through `W_U` (its "logit weights").

# %%
show(mlp_report)

# %% [markdown]
# The same features as `circuits sae report --html` draws them, one page each (`analyses.sae_page`): a histogram
# of the feature's non-zero activations, the tokens it promotes and suppresses, and its top contexts with every
# token shaded by the feature's activation on it.

# %%
mlp_report.features = mlp_report.features[:2]
display(HTML(features_html(mlp_report)))

# %% [markdown]
# ## 2. An SAE on attn-only-2l's attention output (hook_z, concatenated)
#
# Layer 1 of `attn-only-2l` holds its induction heads (notebook 02: L1H1 and L1H2, fed by the previous-token head
# L0H1). Following Kissane et al. 2024, the SAE reads `hook_z` of all 4 heads concatenated (4 × 32 = 128 inputs),
# the attention layer's output before `W_O`. A feature's decoder row splits into 4 blocks of 32, one per head: the
# share of its squared norm in each block says which heads write it.

# %%
attn, val_a, bos_a = text_of("attn-only-2l")
zsae = load_sae(zoo_sae("attn-only-2l", "blocks.1.attn.hook_z"), attn)
z_report = measure(attn, zsae, val_a, bos_a, "attn-only-2l")

# %%
H, d_head = attn.cfg.n_heads, attn.cfg.d_head
W_dec = zsae.W_dec.detach().reshape(-1, H, d_head)
head_share = (W_dec ** 2).sum(-1) / (W_dec ** 2).sum((-2, -1))[:, None]  # [feature, head]
alive = z_report.frequency > 0
top_head = head_share.argmax(1)
counts = torch.bincount(top_head[alive], minlength=H)
fig, ax = plt.subplots(figsize=(6, 2.6))
ax.bar([f"L1H{h}" for h in range(H)], counts.tolist(), color="tab:blue")
ax.set_ylabel("live features", fontsize=9)
ax.set_title("the head holding most of each live feature's decoder norm", fontsize=10)
plt.show()
show(z_report)
for f in z_report.features[:4]:
    share = head_share[f.index]
    print(f"feature {f.index}: head shares " + " ".join(f"H{h} {share[h]:.2f}" for h in range(H)))

# %% [markdown]
# ## 3. The features on a repeated sequence (SAELens' HookedSAETransformer surface)
#
# `with_saes(model)` gives our model SAELens' own methods. `run_with_cache_with_saes` splices the SAE in for one
# run and caches its hook points under SAELens' names (`blocks.1.attn.hook_z.hook_sae_acts_post`). On random tokens
# repeated twice, the first copy cannot be predicted and the second can, by induction: which features switch on in
# the second copy?

# %%
m = with_saes(attn)
rep = repeated_tokens(attn, 20, 2, batch=8, seed=0)
with torch.no_grad():
    logits, cache = m.run_with_cache_with_saes(rep, saes=[zsae])
acts = cache["blocks.1.attn.hook_z.hook_sae_acts_post"]  # [batch, pos, d_sae]
first, second = acts[:, 1:21].mean((0, 1)), acts[:, 21:].mean((0, 1))
induction = torch.argsort(second - first, descending=True)[:5]
print("features most active on the second copy:", induction.tolist())
for f in induction.tolist():
    print(f"feature {f}: mean activation first copy {first[f]:.3f}, second copy {second[f]:.3f}; head shares "
          + " ".join(f"H{h} {head_share[f, h]:.2f}" for h in range(H)))
fig, ax = plt.subplots(figsize=(8, 2.8), constrained_layout=True)
for f in induction[:3].tolist():
    ax.plot(acts[:, :, f].mean(0).numpy(), label=f"feature {f}")
ax.axvline(20.5, color="gray", lw=1, ls="--")
ax.set_xlabel("position (BOS, first copy 1–20, second copy 21–40)", fontsize=9)
ax.set_ylabel("mean activation", fontsize=9)
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# The features that switch on in the second copy sit almost entirely in L1H1 or L1H2 (their head shares above), the
# induction heads that notebook 02 finds from the weights; the SAE found them from activations on ordinary text
# alone. The bar chart counts each live feature under the head that holds most of its decoder norm.
#
# ## 4. Train your own
#
# `train_sae` is SAELens' `SAETrainer` fed by our `ActivationSource`; `circuits sae train MODEL --hook HOOK --out DIR`
# runs it from the command line and writes a folder SAELens' `SAE.load_from_disk` reads. A short run on gelu-2l's
# first MLP output (60 batches of 1024 activations: a demonstration, far from trained):

# %%
corpus = training_corpus(gelu, resolve("gelu-2l"))
train = torch.from_numpy(corpus.train[:1_000_000].astype("int64"))
mine = train_sae(gelu, "blocks.0.hook_mlp_out", train, steps=60, batch_size=1024, bos=bos, progress=False)
mine_report = analyse(gelu, mine.sae, val[:32], bos, top=0)
print(f"{mine.settings['tokens_seen']} token activations: FVU {mine_report.stats['fvu']:.3f}, "
      f"L0 {mine_report.stats['l0']:.1f}, loss recovered {mine_report.losses['recovered']:.1%}")

# %% [markdown]
# ## Summary (the shipped SAEs, on their cards' validation windows)

# %%
for name, r in (("gelu-2l blocks.1.hook_mlp_out", mlp_report), ("attn-only-2l blocks.1.attn.hook_z", z_report)):
    s, lo = r.stats, r.losses
    print(f"{name}: d_sae {s['d_sae']}, FVU {s['fvu']:.3f}, L0 {s['l0']:.1f}, dead {s['dead']}, loss clean "
          f"{lo['clean']:.3f} / spliced {lo['spliced']:.3f} / zero-ablated {lo['zero_ablated']:.3f} "
          f"(recovered {lo['recovered']:.1%})")

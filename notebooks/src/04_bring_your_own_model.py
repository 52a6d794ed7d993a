"""Source of notebooks/04_bring_your_own_model.ipynb (build with `python notebooks/build.py 04`)."""
# ruff: noqa: E402  (notebook cells import after setup lines)

# %% [markdown]
# # Bring your own model
#
# TransformerLens 4.x removed `HookedTransformer`, `HookedTransformerConfig` and shortformer positions, so the
# attention-only toy models of the papers (and many saved checkpoints) no longer load there. This toolkit fills
# that gap while staying close to TransformerLens: the same weight names and shapes, the same hook names, its
# `HookPoint`, `ActivationCache` and `FactoredMatrix`. This notebook shows three ways in:
#
# 1. a **legacy TransformerLens state dict** (the old `HookedTransformer` key layout, a `.pth` file) loaded with
#    `models.from_transformer_lens_state_dict`, then analysed — from Python and from the `circuits` command line;
# 2. a **TransformerLens 4.x bridge** (`models.to_transformer_lens`, for standard-position models) run through the
#    very same `analyses` and `circuits` functions, with matching numbers;
# 3. **hooks and the `ActivationCache`** for your own experiments: direct logit attribution, ablations and
#    activation patching.
#
# CPU, offline, about a minute.

# %%
import warnings

warnings.filterwarnings("ignore", message="IProgress not found")  # tqdm without ipywidgets

# %%
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import torch

import analyses
import circuits
import models
from analyses import plots

torch.set_num_threads(1)  # small tensors: one thread is fastest, and polite on a shared CPU
torch.set_grad_enabled(False)  # analysis only: no autograd graphs
plt.rcParams["figure.dpi"] = 72
workdir = Path(tempfile.mkdtemp(prefix="byom-"))

# %% [markdown]
# ## 1. A legacy TransformerLens state dict
#
# We make one from the zoo's `attn-only-2l`, exactly as TransformerLens 2.x/3.x `HookedTransformer.state_dict()`
# laid it out — including the causal-mask buffers `blocks.{l}.attn.mask` / `IGNORE` it stored — and save it with
# `torch.save`, plus the TransformerLens config as a dict (with TransformerLens-only fields such as
# `tokenizer_name`). Such a file is *data*: it is read with `torch.load(weights_only=True)`, never unpickled as code.

# %%
zoo = models.load("attn-only-2l")
cfg = zoo.cfg
state = {k: v.clone() for k, v in zoo.state_dict().items()}
for l in range(cfg.n_layers):
    state[f"blocks.{l}.attn.mask"] = torch.tril(torch.ones(cfg.n_ctx, cfg.n_ctx, dtype=torch.bool))
    state[f"blocks.{l}.attn.IGNORE"] = torch.tensor(-1e5)
torch.save(state, workdir / "legacy_attn_only_2l.pth")

tl_config = {  # what TransformerLens' HookedTransformerConfig.to_dict() held for such a model
    "n_layers": cfg.n_layers, "d_model": cfg.d_model, "n_ctx": cfg.n_ctx, "d_head": cfg.d_head,
    "n_heads": cfg.n_heads, "d_vocab": cfg.d_vocab, "d_mlp": None, "act_fn": None, "attn_only": True,
    "normalization_type": None, "positional_embedding_type": "shortformer", "model_name": "legacy-attn-only-2l",
    "tokenizer_name": None, "original_architecture": None, "init_weights": True, "d_vocab_out": cfg.d_vocab,
}
(workdir / "legacy_config.json").write_text(json.dumps(tl_config, indent=1))
print(sorted(state)[:6], "...", len(state), "tensors")

# %%
legacy = models.from_transformer_lens_state_dict(workdir / "legacy_attn_only_2l.pth", tl_config)
legacy.tokenizer = zoo.tokenizer  # a state dict carries no tokenizer
tokens = zoo.to_tokens("import os\nimport sys\n\ndef main(argv):\n    return os.path.join(*argv)\n")
print("max |logit difference| vs the zoo model:", float((legacy(tokens) - zoo(tokens)).abs().max()))
print("TransformerLens-only config fields kept in cfg.extra:", sorted(legacy.cfg.extra["transformer_lens"]))

# %% [markdown]
# Everything in `analyses` and `circuits` takes it as is:

# %%
ind = analyses.detect_induction_heads(legacy)
print(ind)

# %% [markdown]
# The command line reads the same file with `--config` (here run through `python -m analyses.cli`, which is what
# the `circuits` console script calls):

# %%
out = subprocess.run([sys.executable, "-m", "analyses.cli", "compose", str(workdir / "legacy_attn_only_2l.pth"),
                      "--config", str(workdir / "legacy_config.json"), "--kind", "k", "--top", "4", "--no-progress"],
                     capture_output=True, text=True)
print(out.stdout[-1500:] or out.stderr)

# %% [markdown]
# ## 2. A TransformerLens 4.x bridge
#
# `models.to_transformer_lens(model)` builds a `TransformerBridge` (`boot_native`) carrying the same weights, for
# the configurations TransformerLens 4 can represent (standard or rotary positions; not shortformer or ALiBi).
# The zoo's `gelu-2l` (LayerNorm, GELU MLPs, learned positions) qualifies.

# %%
ours = models.load("gelu-2l")
bridge = models.to_transformer_lens(ours)
print(type(bridge).__module__, type(bridge).__name__)
t = ours.to_tokens("for i in range(10):\n    print(i * i)\n")
print("max |logit difference| ours vs bridge:", float((ours(t) - bridge(t)).abs().max()))

# %% [markdown]
# The analyses only use the weight properties (`W_E`, `W_Q`, … as stacked tensors, `QK`/`OV` factored) and
# `run_with_cache` with TransformerLens hook names, so the bridge goes through the same functions. Behavioural
# scores and weight-space scores agree:

# %%
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # circuits warns that LayerNorm weights are not folded (true for both)
    rows = {
        "induction score": (analyses.induction_scores(ours), analyses.induction_scores(bridge)),
        "previous-token score": (analyses.previous_token_scores(ours), analyses.previous_token_scores(bridge)),
        "OV copying score": (circuits.copying_scores(ours), circuits.copying_scores(bridge)),
        "K-composition": (circuits.composition_scores(ours, "k"), circuits.composition_scores(bridge, "k")),
    }
for name, (a, b) in rows.items():
    print(f"{name:<22} max |ours − bridge| = {float((a.double() - b.double().to(a.device)).abs().max()):.2e}")

# %% [markdown]
# ## 3. Hooks and the ActivationCache
#
# Hook names follow TransformerLens (`blocks.{l}.attn.hook_pattern`, `hook_z`, `hook_result`, `hook_resid_post`,
# …), and `run_with_cache` returns TransformerLens' own `ActivationCache`, so its helpers work. A repeated random
# sequence is the cleanest probe of the induction circuit.

# %%
model = zoo
rep = analyses.repeated_tokens(model, 40, 2, batch=8)  # [BOS] + R + R, |R| = 40
logits, cache = model.run_with_cache(rep)
print(type(cache).__name__, "with", len(cache), "activations, e.g.",
      tuple(cache["blocks.1.attn.hook_pattern"].shape), "for blocks.1.attn.hook_pattern [batch, head, q, k]")

loss = model(rep, return_type="loss", loss_per_token=True)  # [batch, pos-1]
print(f"loss on the first copy {float(loss[:, :40].mean()):.2f} nats, "
      f"on the second copy {float(loss[:, 41:].mean()):.2f}")

# %% [markdown]
# **Direct logit attribution.** `cache.stack_head_results` gives every head's output written to the residual
# stream; projecting it onto the unembedding direction of the correct next token says how much each head pushes
# the right answer, on the second copy.

# %%
per_head, labels = cache.stack_head_results(layer=-1, return_labels=True)  # [head, batch, pos, d_model]
answers = rep[:, 1:]  # the token each position should predict
dirs = model.W_U[:, answers].permute(1, 2, 0)  # [batch, pos-1, d_model]
dla = (per_head[:, :, :-1] * dirs).sum(-1)  # [head, batch, pos-1]
second = dla[:, :, 41:].mean((1, 2))
fig, ax = plt.subplots(figsize=(9, 3), layout="constrained")
ax.bar(range(len(labels)), second.detach())
ax.set_xticks(range(len(labels)), labels, rotation=90)
ax.set_ylabel("logit of the correct token")
ax.set_title("Direct logit attribution per head, second copy of a repeated sequence")
plt.show()

# %% [markdown]
# **Ablation.** Zero the output of the induction heads (`hook_z`), or of the previous-token heads they compose
# with, and the second copy is no longer predicted. `run_with_hooks` takes `(hook name, function)` pairs.

# %%
circuit = analyses.find_induction_circuit(model)
ind_heads, prev_heads = circuit.induction.heads, circuit.previous.heads
print("induction heads:", ind_heads, "| previous-token heads:", prev_heads)


def zero_heads(heads):
    def hook(z, hook):  # z: [batch, pos, head, d_head]
        layer = int(hook.name.split(".")[1])
        z = z.clone()
        for l, h in heads:
            if l == layer:
                z[:, :, h] = 0
        return z

    return [(f"blocks.{l}.attn.hook_z", hook) for l in sorted({l for l, _ in heads})]


def second_copy_loss(**kw):
    return float(model.run_with_hooks(rep, return_type="loss", loss_per_token=True, **kw)[:, 41:].mean())


print(f"clean: {second_copy_loss():.2f} nats")
for name, heads in (("induction heads", ind_heads), ("previous-token heads", prev_heads)):
    if heads:
        print(f"without the {name}: {second_copy_loss(fwd_hooks=zero_heads(heads)):.2f} nats")

# %% [markdown]
# **Activation patching.** Corrupt the first copy (new random tokens, so the second copy has nothing to match)
# and patch one head's output at a time from the clean run into the corrupted one. The heads whose patch restores
# the loss on the second copy are the ones that carry the information: the induction heads (layer 1), and the
# previous-token heads (layer 0), whose output at the first copy is what the induction heads' keys read.

# %%
corrupt = rep.clone()
corrupt[:, 1:41] = analyses.random_tokens(model, 40, rep.shape[0], seed=123)
clean_loss = second_copy_loss()
corrupt_loss = float(model(corrupt, return_type="loss", loss_per_token=True)[:, 41:].mean())


def patch_head(l, h):
    def hook(z, hook):
        z = z.clone()
        z[:, :, h] = cache[hook.name][:, :, h]
        return z

    out = model.run_with_hooks(corrupt, return_type="loss", loss_per_token=True,
                               fwd_hooks=[(f"blocks.{l}.attn.hook_z", hook)])
    return float(out[:, 41:].mean())


restored = torch.tensor([[(corrupt_loss - patch_head(l, h)) / (corrupt_loss - clean_loss)
                          for h in range(cfg.n_heads)] for l in range(cfg.n_layers)])
fig = plots.plot_score_heatmap(restored, "share of the second-copy loss restored by patching one head",
                               vmin=-0.2, vmax=1.0, label="share restored")
print(f"clean {clean_loss:.2f} nats, corrupted {corrupt_loss:.2f} nats")

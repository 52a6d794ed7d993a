"""TransformerLens 2.18's initial weights and components, for tests/tl2/test_legacy_init.py.

Run INSIDE the legacy environment (tests/tl2/make_legacy_venv.sh builds it):

    .venv-tl2/bin/python tests/tl2/make_init_references.py OUT_DIR

For every case of `init_grid()` it builds `HookedTransformer(HookedTransformerConfig(**BASE, **overrides))` (with
`seed` in the config, or, where the case's seed is None, after `torch.manual_seed(global_seed)`), and writes under
OUT_DIR `NAME.safetensors`: the state dict as built, plus `rng/torch`, `rng/numpy`, `rng/random`, the next draws of
torch's, numpy's and Python's global generators after the model is built. For every component of `COMPONENTS` it
writes `components.safetensors`: seeded weights, an input and 2.18's output; `grokking-training.safetensors`: the
losses of the first epochs of TransformerLens' Grokking demo (`grokking_run`). `manifest.json` (the cases with their
overrides and seeds, the components) is written last. Only torch, numpy, transformer_lens and safetensors are used.
"""

from __future__ import annotations

import random
import sys

import numpy as np
import torch
from safetensors.torch import save_file

BASE = dict(n_layers=2, d_model=16, d_head=4, n_heads=4, n_ctx=12, d_vocab=23, d_mlp=32, act_fn="gelu",
            normalization_type="LN", positional_embedding_type="standard")
POSITIONS = ("standard", "shortformer", "rotary", "alibi")  # every positional type TransformerLens 2.18 has
NORMS = (None, "LN", "LNPre", "RMS", "RMSPre")
MODES = ("gpt2", "xavier_uniform", "xavier_normal", "kaiming_uniform", "kaiming_normal", "muP")
ATTN_ONLY = dict(attn_only=True, d_mlp=None, act_fn="relu")
#: TransformerLens' Grokking demo's config (p = 113), as its notebook writes it (device left out)
GROKKING = dict(n_layers=1, n_heads=4, d_model=128, d_head=32, d_mlp=512, act_fn="relu", normalization_type=None,
                d_vocab=114, d_vocab_out=113, n_ctx=3, init_weights=True, seed=999)


def init_grid() -> dict[str, dict]:
    """Case name -> {"overrides": config overrides of BASE (the Grokking case replaces BASE), "seed": the config's
    seed, or None with "global_seed" the seed of torch's global generator before the model is built}.

    Positional type × norm (20 cases; attention-only on alternate cases, a gated MLP on every fourth), every init
    mode on two architectures (standard + LN + MLP, and rotary + grouped-query attention + gated MLP + d_vocab_out ≠
    d_vocab), grouped-query attention per positional type, an explicit initializer_range per mode family, float64,
    unseeded models (global generator), init_weights=False, and the Grokking demo's config."""
    cases: dict[str, dict] = {}
    for i, pos in enumerate(POSITIONS):
        for j, norm in enumerate(NORMS):
            k = i * len(NORMS) + j
            block = ATTN_ONLY if k % 2 else (dict(gated_mlp=True, act_fn="silu") if k % 4 == 0 else {})
            name = f"{pos}-{norm or 'none'}-{'attn' if k % 2 else 'gated' if k % 4 == 0 else 'mlp'}"
            cases[name] = dict(overrides=dict(positional_embedding_type=pos, normalization_type=norm, **block),
                               seed=100 + k)
    for m, mode in enumerate(MODES):
        cases[f"mode-{mode}"] = dict(overrides=dict(init_mode=mode), seed=200 + m)
        cases[f"mode-{mode}-rotary-gqa-gated-vocab-out"] = dict(
            overrides=dict(init_mode=mode, positional_embedding_type="rotary", n_key_value_heads=2, gated_mlp=True,
                           act_fn="silu", d_vocab_out=17, normalization_type="RMS"), seed=210 + m)
    for p, pos in enumerate(POSITIONS):
        cases[f"gqa-{pos}"] = dict(overrides=dict(positional_embedding_type=pos, n_key_value_heads=2), seed=300 + p)
    cases["gqa-kv-equals-heads"] = dict(overrides=dict(n_key_value_heads=4), seed=305)
    cases["range-gpt2-0.05"] = dict(overrides=dict(initializer_range=0.05), seed=310)
    cases["range-xavier-0.5"] = dict(overrides=dict(init_mode="xavier_uniform", initializer_range=0.5), seed=311)
    cases["d-vocab-out-attn-only"] = dict(overrides=dict(d_vocab_out=17, **ATTN_ONLY), seed=312)
    cases["three-layer-shortformer-none"] = dict(overrides=dict(n_layers=3, positional_embedding_type="shortformer",
                                                                normalization_type=None, **ATTN_ONLY), seed=313)
    cases["float64"] = dict(overrides=dict(dtype="float64"), seed=314)
    cases["solu-ln"] = dict(overrides=dict(act_fn="solu_ln"), seed=315)
    cases["parallel"] = dict(overrides=dict(parallel_attn_mlp=True), seed=316)
    cases["seed-0"] = dict(overrides={}, seed=0)
    cases["unseeded-gpt2"] = dict(overrides={}, seed=None, global_seed=7)
    cases["unseeded-alibi-kaiming"] = dict(overrides=dict(positional_embedding_type="alibi",
                                                          init_mode="kaiming_normal"), seed=None, global_seed=8)
    cases["grokking"] = dict(overrides=GROKKING, seed=999, replace_base=True)
    return cases


def tl_config(case: dict):
    from transformer_lens import HookedTransformerConfig

    over = dict(case["overrides"])
    if "dtype" in over:
        over["dtype"] = getattr(torch, over["dtype"])
    base = {} if case.get("replace_base") else BASE
    return HookedTransformerConfig(**{**base, **over, "seed": case["seed"]})


def rng_probe() -> dict[str, torch.Tensor]:
    """The next draws of torch's, numpy's and Python's global generators."""
    return {"rng/torch": torch.rand(4, dtype=torch.float64),
            "rng/numpy": torch.from_numpy(np.random.rand(4)),
            "rng/random": torch.tensor([random.random() for _ in range(4)], dtype=torch.float64)}


def build_case(case: dict) -> dict[str, torch.Tensor]:
    from transformer_lens import HookedTransformer

    random.seed(12345)  # whatever state the case finds, the same on both sides (the test does the same)
    np.random.seed(12345)
    torch.manual_seed(case.get("global_seed", 12345))
    model = HookedTransformer(tl_config(case))
    state = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    return {**state, **rng_probe()}


#: component -> (constructor arguments after cfg, config overrides of BASE, input kind)
COMPONENTS = {
    "LayerNorm": ((), {}, "resid"),
    "LayerNorm-length": ((7,), {}, "length"),
    "LayerNormPre": ((), {}, "resid"),
    "RMSNorm": ((), {}, "resid"),
    "RMSNorm-length": ((7,), {}, "length"),
    "RMSNormPre": ((), {}, "resid"),
    "Embed": ((), {}, "tokens"),
    "PosEmbed": ((), {}, "tokens"),
    "Unembed": ((), {"d_vocab_out": 17}, "resid"),
    "MLP": ((), {}, "resid"),
    "GatedMLP": ((), {"gated_mlp": True, "act_fn": "silu"}, "resid"),
}


def component_inputs(kind: str, gen: torch.Generator) -> torch.Tensor:
    if kind == "tokens":
        return torch.randint(0, BASE["d_vocab"], (2, 6), generator=gen)
    return torch.randn(2, 6, 7 if kind == "length" else BASE["d_model"], generator=gen, dtype=torch.float32)


def build_components() -> dict[str, torch.Tensor]:
    import transformer_lens.components as tlc
    from transformer_lens import HookedTransformerConfig

    out = {}
    for k, (name, (args, over, kind)) in enumerate(COMPONENTS.items()):
        cls = getattr(tlc, name.split("-")[0])
        layer = cls(HookedTransformerConfig(**{**BASE, **over}), *args)
        gen = torch.Generator().manual_seed(500 + k)
        with torch.no_grad():
            for pname, p in layer.named_parameters():
                p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype))
                out[f"{name}/param/{pname}"] = p.detach().clone()
            x = component_inputs(kind, gen)
            out[f"{name}/input"] = x
            out[f"{name}/output"] = layer(x).detach().contiguous().clone()
    return out


GROKKING_EPOCHS = 60


def grokking_run(model_cls, config_cls, epochs: int = GROKKING_EPOCHS) -> dict[str, torch.Tensor]:
    """The first `epochs` epochs of TransformerLens' Grokking demo (modular addition mod 113, 30 % of the pairs for
    training, full batch, AdamW lr 1e-3, weight decay 1, betas (0.9, 0.98), biases frozen, float64 loss on the last
    position), as its notebook writes them, with `model_cls` / `config_cls` the HookedTransformer classes to use:
    the train and test loss of every epoch."""
    p = 113
    a = torch.arange(p).repeat_interleave(p)
    b = torch.arange(p).repeat(p)
    dataset = torch.stack([a, b, torch.full_like(a, p)], dim=1)
    labels = (dataset[:, 0] + dataset[:, 1]) % p
    torch.manual_seed(598)  # the demo's DATA_SEED
    indices = torch.randperm(p * p)
    cutoff = int(p * p * 0.3)
    train_data, test_data = dataset[indices[:cutoff]], dataset[indices[cutoff:]]
    train_labels, test_labels = labels[indices[:cutoff]], labels[indices[cutoff:]]
    model = model_cls(config_cls(**GROKKING))
    for name, param in model.named_parameters():
        if "b_" in name:
            param.requires_grad = False
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1.0, betas=(0.9, 0.98))

    def loss_fn(logits, labels):
        log_probs = logits[:, -1].to(torch.float64).log_softmax(dim=-1)
        return -log_probs.gather(dim=-1, index=labels[:, None])[:, 0].mean()

    train_losses, test_losses = [], []
    for _ in range(epochs):
        train_loss = loss_fn(model(train_data), train_labels)
        train_loss.backward()
        train_losses.append(train_loss.item())
        optimizer.step()
        optimizer.zero_grad()
        with torch.inference_mode():
            test_losses.append(loss_fn(model(test_data), test_labels).item())
    return {"grokking/train_loss": torch.tensor(train_losses, dtype=torch.float64),
            "grokking/test_loss": torch.tensor(test_losses, dtype=torch.float64)}


def main(out_dir: str) -> None:
    from make_references import reference_folder, write_manifest  # this folder is the script's: on sys.path

    out = reference_folder(out_dir, "make_init_references")
    cases = init_grid()
    for name, case in cases.items():
        save_file(build_case(case), str(out / f"{name}.safetensors"))
    save_file(build_components(), str(out / "components.safetensors"))
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    save_file(grokking_run(HookedTransformer, HookedTransformerConfig), str(out / "grokking-training.safetensors"))
    write_manifest(out, cases=cases, components={k: [list(a), o, i] for k, (a, o, i) in COMPONENTS.items()})


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: .venv-tl2/bin/python tests/tl2/make_init_references.py OUT_DIR")
    main(sys.argv[1])

"""How a fresh model's weights are drawn: TransformerLens 2.18's `init_mode`s, bitwise, and this toolkit's own scheme.

`HookedTransformerConfig.init_mode` picks one:

- TransformerLens 2.18's (`TL_INIT_MODES`): "gpt2", "xavier_uniform", "xavier_normal", "kaiming_uniform",
  "kaiming_normal", "muP" (`init_weights_transformer_lens`). Only weight matrices are drawn (every parameter whose
  name holds "W_"); biases stay 0 and norm weights 1. The draws follow 2.18's parameter order from torch's global
  generator, reseeded with `cfg.seed` when it is set, so the same config and seed give 2.18's weights bit for bit.
- "gpt2_scaled" (`init_weights_gpt2_scaled`): this toolkit's scheme before TransformerLens' modes were accepted, kept
  for the zoo presets (which name it): Normal(0, init_range) with the residual writes scaled down, drawn in float64
  from a generator of its own.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch
from torch import nn

from .tl_compat import (  # TransformerLens' own initialisers (the formulas 2.18 draws with)
    calc_fan_in_and_fan_out,
    init_kaiming_normal_,
    init_kaiming_uniform_,
    init_xavier_normal_,
    init_xavier_uniform_,
)

#: TransformerLens 2.18's `HookedTransformerConfig.init_mode` values, in its order
TL_INIT_MODES = ("gpt2", "xavier_uniform", "xavier_normal", "kaiming_uniform", "kaiming_normal", "muP")
INIT_MODES = TL_INIT_MODES + ("gpt2_scaled",)


def default_init_range(init_mode: str, d_model: int) -> float:
    """`init_range` when the config leaves it unset, as TransformerLens 2.18's `initializer_range`: 0.8/√d_model for
    "gpt2" (its std), 1.0 for its other modes (a gain); 0.02 for "gpt2_scaled" (this toolkit's former default)."""
    if init_mode == "gpt2":
        return 0.8 / math.sqrt(d_model)
    return 0.02 if init_mode == "gpt2_scaled" else 1.0


def seed_everywhere(seed: int) -> None:
    """Seed torch's, Python's and numpy's global generators with `seed` (TransformerLens 2.18's
    `HookedTransformerConfig.set_seed_everywhere`)."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


@contextmanager
def rng_kept() -> Iterator[None]:
    """Leave torch's (CPU and CUDA), Python's and numpy's global generators as they were after the block: for building
    a model whose weights are read from a file, where a seeded initialisation must not reseed the process."""
    py, npy = random.getstate(), np.random.get_state()
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=devices):
        yield
    random.setstate(py)
    np.random.set_state(npy)


def init_mup_normal_(param: torch.Tensor, name: str) -> torch.Tensor:
    """μP (Yang et al. 2022) as TransformerLens 2.18 draws it: N(0, σ²) with σ = 1 for a name holding "embed" (the
    unembedding included: 2.18 tests "embed" first), 1/fan_in for "unembed" (so never reached), 1/√fan_in otherwise."""
    fan_in = calc_fan_in_and_fan_out(param)[0]
    if "embed" in name:
        scale = 1.0
    elif "unembed" in name:
        scale = 1 / fan_in
    else:
        scale = 1 / fan_in**0.5
    return nn.init.normal_(param, std=scale)


def _draw(param: torch.Tensor, name: str, mode: str, init_range: float) -> None:
    """One weight matrix drawn as TransformerLens 2.18's `HookedTransformer._init_weights_<mode>` draws it."""
    if mode == "gpt2":
        nn.init.normal_(param, std=init_range)
    elif mode == "xavier_uniform":
        init_xavier_uniform_(param, gain=init_range)
    elif mode == "xavier_normal":
        init_xavier_normal_(param, gain=init_range)
    elif mode == "kaiming_uniform":
        init_kaiming_uniform_(param, gain=init_range)
    elif mode == "kaiming_normal":
        init_kaiming_normal_(param, gain=init_range)
    else:  # muP: 2.18 draws normals whatever dist_type says
        init_mup_normal_(param, name)


def transformer_lens_weight_order(model: nn.Module) -> list[tuple[str, torch.Tensor | None]]:
    """`(name, parameter)` of every weight matrix in the order TransformerLens 2.18 registers (and so draws) them:
    `embed.W_E`; `pos_embed.W_pos`, which 2.18 builds for every positional type but rotary (None where ours holds no
    learned table: ALiBi, no positions, fixed sinusoids); per block `attn.W_Q, W_O, W_K, W_V` (its base class
    registers W_Q and W_O first) then `mlp.W_in, W_out` and, gated, `W_gate` (2.18's GatedMLP order); `unembed.W_U`;
    then any other weight matrix of ours in our order."""
    cfg = model.cfg
    params = {n: p for n, p in model.named_parameters() if "W_" in n}
    names = ["embed.W_E"] + ([] if cfg.positions.rotates_qk else ["pos_embed.W_pos"])
    for layer in range(len(getattr(model, "blocks", ()))):
        names += [f"blocks.{layer}.attn.{w}" for w in ("W_Q", "W_O", "W_K", "W_V")]
        if not cfg.attn_only:
            names += [f"blocks.{layer}.mlp.{w}" for w in ("W_in", "W_out") + (("W_gate",) if cfg.gated_mlp else ())]
    names.append("unembed.W_U")
    order = [(n, params.get(n)) for n in names]
    return order + [(n, p) for n, p in params.items() if n not in names]


@torch.no_grad()
def init_weights_transformer_lens(model: nn.Module) -> None:
    """TransformerLens 2.18's `HookedTransformer.init_weights` for `model.cfg.init_mode` (one of `TL_INIT_MODES`),
    bitwise: `torch.manual_seed(cfg.seed)` when a seed is set, then every weight matrix drawn in 2.18's parameter
    order (`transformer_lens_weight_order`) from torch's global generator, with `cfg.init_range` as 2.18's
    `initializer_range` (the std of "gpt2", the gain of the others; muP ignores it). A `pos_embed.W_pos` that 2.18
    has and we don't is drawn and dropped, so the weights after it match. Biases and norms are left as built (0, 1)."""
    cfg = model.cfg
    if cfg.seed is not None:
        torch.manual_seed(cfg.seed)
    order = transformer_lens_weight_order(model)
    for name, param in order:
        if param is None:  # 2.18's W_pos of a model without a learned table: the same draws (same device), discarded
            param = torch.empty(cfg.n_ctx, cfg.d_model, dtype=cfg.torch_dtype, device=order[0][1].device)
        _draw(param, name, cfg.init_mode, cfg.init_range)


@torch.no_grad()
def init_weights_gpt2_scaled(model: nn.Module, init_range: float, n_layers: int, seed: int | None) -> None:
    """Normal(0, init_range) for every weight matrix, scaled by 1/√(2·n_layers) on the residual writes (W_O, W_out) as
    GPT-2 (Radford et al. 2019); norms at w=1, b=0; biases 0. Drawn in float64 from a generator seeded by `seed`
    without touching the global one (from the global one when `seed` is None), in `model.named_parameters()` order."""
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    write_scale = (2 * max(n_layers, 1)) ** -0.5
    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if leaf.startswith("W_"):
            std = init_range * (write_scale if leaf in ("W_O", "W_out") else 1.0)
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * std)
        elif leaf == "w":
            p.fill_(1.0)
        else:
            p.zero_()


@torch.no_grad()
def zero_weights(model: nn.Module) -> None:
    """`init_weights=False`: every weight matrix 0 (TransformerLens 2.18 leaves them uninitialised memory, to be
    overwritten by a state dict; zeros keep a model deterministic); biases and norms as built (0, 1)."""
    for name, p in model.named_parameters():
        if name.rsplit(".", 1)[-1].startswith("W_"):
            p.zero_()

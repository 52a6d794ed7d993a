"""State dicts in TransformerLens' layout: renaming TransformerLens 2.x's names to ours (`tl_state_to_ours`) and
copying a state dict into a model with every name, shape and dtype checked first (`load_state_dict`)."""

from __future__ import annotations

import torch

from ..errors import CheckpointError

#: buffers TransformerLens 2.x keeps in its state dicts and recomputes (the causal mask, its fill value, rotary tables)
_DROPPED_SUFFIXES = (".mask", ".IGNORE", ".rotary_sin", ".rotary_cos")


def tl_state_to_ours(state: dict, expected: dict, source: str = "state dict") -> dict:
    """A TransformerLens 2.x state dict renamed to ours (`attn._W_K` → `attn.W_K`, …), without the buffers it
    recomputes and the unused W_pos of models without a positional table; absent zero biases and unit norm weights
    (LNPre checkpoints, bias-free ones) filled in, as its `fill_missing_keys` fills them from a fresh model."""
    fixed = {}
    bad_keys = [k for k in state if not isinstance(k, str)]
    if bad_keys:
        raise CheckpointError(f"{source}: tensor names must be strings, got {bad_keys[:4]!r}")
    for k, v in state.items():
        if k.endswith(_DROPPED_SUFFIXES) or (k == "pos_embed.W_pos" and "pos_embed.W_pos" not in expected):
            continue  # buffers TransformerLens recomputes; the W_pos TL 2.x keeps, unused, in ALiBi models
        k = k.replace("attn._W_K", "attn.W_K").replace("attn._W_V", "attn.W_V")
        k = k.replace("attn._b_K", "attn.b_K").replace("attn._b_V", "attn.b_V")
        fixed[k] = v
    for name, target in expected.items():
        if name not in fixed and (name.endswith((".b", ".b_U", ".b_O", ".b_Q", ".b_K", ".b_V", ".b_in", ".b_out"))):
            fixed[name] = torch.zeros_like(target)
        elif name not in fixed and name.endswith(".w"):
            fixed[name] = torch.ones_like(target)
    return fixed


def load_state_dict(model, state: dict, source: str = "state dict") -> None:
    """Copy `state` (TransformerLens layout) into `model`, checking every name and shape first."""
    expected = model.state_dict()
    bad_keys = [k for k in state if not isinstance(k, str)]
    if bad_keys:
        raise CheckpointError(f"{source}: tensor names must be strings, got {bad_keys[:4]!r}")
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing:
        raise CheckpointError(f"{source}: missing tensor(s) {missing[:8]}{' ...' if len(missing) > 8 else ''}")
    if unexpected:
        raise CheckpointError(
            f"{source}: unexpected tensor(s) {unexpected[:8]}{' ...' if len(unexpected) > 8 else ''} "
            "(does the config match the checkpoint?)"
        )
    for name, target in expected.items():
        t = state[name]
        if not isinstance(t, torch.Tensor):
            raise CheckpointError(f"{source}: {name} is a {type(t).__name__}, not a tensor")
        if tuple(t.shape) != tuple(target.shape):
            raise CheckpointError(
                f"{source}: tensor {name} has shape {tuple(t.shape)}, the config expects {tuple(target.shape)}"
            )
        if not t.dtype.is_floating_point:
            raise CheckpointError(f"{source}: tensor {name} has dtype {t.dtype}, expected a float tensor")
        if t.device.type == "meta":
            raise CheckpointError(f"{source}: tensor {name} is on the meta device (it holds no data)")
    buffers = {n for n, _ in model.named_buffers()}
    for name in sorted(buffers & set(expected)):
        if bool(state[name].ne(0).any()):
            raise CheckpointError(
                f"{source}: tensor {name} is non-zero but the config has use_bias=False; set use_bias=True"
            )
    with torch.no_grad():
        for name, target in expected.items():
            target.copy_(state[name].to(target.dtype))

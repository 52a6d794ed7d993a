"""State dicts in TransformerLens' layout: renaming TransformerLens 2.x's names to ours (`tl_state_to_ours`) and
copying a state dict into a model with every name, shape and dtype checked first (`load_state_dict`)."""

from __future__ import annotations

import torch

from ..errors import CheckpointError

#: buffers TransformerLens 2.x keeps in its state dicts and recomputes (the causal mask, its fill value, rotary tables)
_DROPPED_SUFFIXES = (".mask", ".IGNORE", ".rotary_sin", ".rotary_cos")


def tl_state_to_ours(state: dict, model, source: str = "state dict") -> dict:
    """A TransformerLens 2.x state dict as `model`'s: its recomputed buffers checked and dropped and its
    grouped-query names read as ours (`drop_recomputed_buffers`), the unused W_pos of models without a positional
    table dropped, absent zero biases and unit norm weights (LNPre checkpoints, bias-free ones) filled in, as its
    `fill_missing_keys` fills them from a fresh model."""
    bad_keys = [k for k in state if not isinstance(k, str)]
    if bad_keys:
        raise CheckpointError(f"{source}: tensor names must be strings, got {bad_keys[:4]!r}")
    expected = model.state_dict()
    fixed = drop_recomputed_buffers(model, state, source)
    for name, target in expected.items():
        if name not in fixed and (name.endswith((".b", ".b_U", ".b_O", ".b_Q", ".b_K", ".b_V", ".b_in", ".b_out"))):
            fixed[name] = torch.zeros_like(target)
        elif name not in fixed and name.endswith(".w"):
            fixed[name] = torch.ones_like(target)
    return fixed


def drop_recomputed_buffers(model, state, source: str = "state dict") -> dict:
    """`state` without the buffers TransformerLens 2.x keeps in a state dict and we recompute, each checked first
    against what this model computes (`CheckpointError` naming the first that differs), and with 2.x's grouped-query
    names (`attn._W_K`, …) read as ours. TransformerLens 2.18's `AbstractAttention` registers, per layer, `mask`
    (`tril(ones(n_ctx, n_ctx)).bool()`, whatever `attention_dir`), `IGNORE` (−inf; −1e5 in early 2.x) and, for rotary
    models, `rotary_sin` / `rotary_cos` (`[n_ctx, rotary_dim]`, each angle twice: adjacent or half-split)."""
    from .positions import rotary_angles

    expected = model.state_dict()
    cfg = model.cfg
    out, tables = {}, None  # tables: the rotary tables, computed once for every layer
    for k, v in state.items():
        if k == "pos_embed.W_pos" and k not in expected and not cfg.positions.table:
            continue  # the W_pos TransformerLens 2.x keeps, never read, in models without a positional table (ALiBi)
        if not isinstance(k, str) or k in expected or not k.endswith(_DROPPED_SUFFIXES) or not k.startswith("blocks."):
            renamed = k.replace("attn._", "attn.") if isinstance(k, str) and "attn._" in k else k
            out[renamed if renamed in expected and renamed not in state else k] = v
            continue
        if not isinstance(v, torch.Tensor):
            raise CheckpointError(f"{source}: {k} is a {type(v).__name__}, not a tensor")
        leaf = k.rsplit(".", 1)[1]
        if leaf == "mask":
            want = torch.ones(cfg.n_ctx, cfg.n_ctx, dtype=torch.bool).tril()
            ok = tuple(v.shape) == tuple(want.shape) and bool((v.cpu().bool() == want).all())
            what = f"the causal mask tril(ones({cfg.n_ctx}, {cfg.n_ctx}))"
        elif leaf == "IGNORE":
            ok = v.numel() == 1 and v.dtype.is_floating_point and float(v) <= -1e4
            what = "a fill value of -inf (or <= -1e4)"
        else:  # rotary_sin / rotary_cos
            rd = cfg.rotary_dim
            ok = cfg.positions.rotates_qk and rd is not None and tuple(v.shape) == (cfg.n_ctx, rd)
            if ok:
                if tables is None:  # TransformerLens 2.x's layout: each angle twice, adjacent or half-split
                    tables = {f"rotary_{n}": h.repeat_interleave(2, dim=1) if cfg.rotary_adjacent_pairs
                              else torch.cat([h, h], 1)
                              for n, h in zip(("cos", "sin"), rotary_angles(cfg.n_ctx, rd, cfg.rotary_base,
                                                                            torch.float64))}
                # TransformerLens 2.18 stores the tables in the model's dtype: compare with ours as that dtype holds
                # them, within its resolution (bfloat16 tables are up to 1.9e-3 off the float64 values)
                ref, atol = tables[leaf], 1e-4
                if v.dtype.is_floating_point and torch.finfo(v.dtype).eps > atol:
                    ref, atol = ref.to(v.dtype).double(), torch.finfo(v.dtype).eps
                ok = bool(torch.allclose(v.cpu().double(), ref, atol=atol))
            what = (f"TransformerLens 2.x's rotary table for rotary_dim={cfg.rotary_dim}, base {cfg.rotary_base}, "
                    f"n_ctx {cfg.n_ctx}")
        if not ok:
            raise CheckpointError(f"{source}: {k} (a buffer TransformerLens 2.x saves and we recompute) is not "
                                  f"{what}; does the config match the checkpoint?")
    return out


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

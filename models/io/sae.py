"""Sparse autoencoders on this toolkit's models through SAELens (optional: `pip install sae-lens`): the adapter.

Nothing here re-implements SAELens; it connects our models to it:

- `with_saes(model)`: the model itself once SAELens is there; our decoder-only models carry SAELens'
  `HookedSAETransformer` interface (`add_sae`, `reset_saes`, `saes`, `run_with_saes`, `run_with_cache_with_saes`,
  `run_with_hooks_with_saes`, `acts_to_saes`) in `models.arch.sae_interface`, written on SAELens' public `SAE`.
- `hook_width`, `activations`: what an SAE on a hook point reads (`hook_z` concatenated over heads).
- `load_sae` reads an SAE folder (SAELens' `cfg.json` and `sae_weights.safetensors`) through this toolkit's readers
  (`models.io.readers.read_sae_folder`: bounded, schema-checked, finite weights) and hands them to SAELens'
  `SAE.load_from_disk` as its `converter`; `save_sae` writes one atomically (a full disk: `DiskFullError`).
- `zoo_saes`, `zoo_sae`: the SAEs shipped with the zoo, `models/zoo/<model>/saes/<hook name>/` (SAELens' files,
  training.json, a card and measured.json).

Training is `models.training.sae`; the measures (FVU, L0, spliced losses) are `analyses.sae_metrics`.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..errors import MissingDependencyError, SAEError
from .readers import SAE_TRAINING_FILE, read_sae_folder

#: SAELens' version this module is tested with (pyproject's `sae` extra).
SAE_LENS_VERSION = "6.54.12"
#: Written beside SAELens' cfg.json and sae_weights.safetensors: how the SAE was trained.
TRAINING_FILE = SAE_TRAINING_FILE


def sae_lens():
    """The `sae_lens` package, or `MissingDependencyError` naming the install."""
    try:
        import sae_lens
    except ImportError as e:
        from ..arch.tl_compat import TL_VERSION, version_tuple

        why = "it is not installed" if (e.name or "").split(".")[0] == "sae_lens" else \
            f"SAELens 6.x needs transformer-lens<4, this environment has {TL_VERSION}" \
            if version_tuple(TL_VERSION) >= (4, 0) else f"importing it failed: {e}"
        raise MissingDependencyError(f"sparse autoencoders need SAELens: pip install sae-lens=={SAE_LENS_VERSION} "
                                     f"(from a source checkout: pip install -e '.[sae]'; {why})") from None
    return sae_lens


def check_model(model, what: str) -> None:
    """`SAEError` unless `model` is one of our decoder-only models (`models.model_kind`; a `HookedTransformer`, whose
    hook points SAEs here read)."""
    from ..arch.config import HookedTransformerConfig
    from ..arch.kind import DECODER, model_kind

    if not isinstance(getattr(model, "cfg", None), HookedTransformerConfig) or model_kind(model) != DECODER:
        raise SAEError(f"{what} takes a HookedTransformer (a decoder-only model), got {type(model).__name__}")


def with_saes(model):
    """`model` itself, with SAELens there: our decoder-only models carry SAELens' `HookedSAETransformer` methods
    (`models.arch.sae_interface.SAEInterface`), which need SAELens' `SAE` objects; `MissingDependencyError` without
    SAELens, `SAEError` for another kind of model."""
    sae_lens()
    check_model(model, "with_saes")
    return model


# --- activations ----------------------------------------------------------------------------------------------
def hook_width(model, hook_name: str) -> int:
    """`d_in` of an SAE on `hook_name`: the last axis of its activation, or `n_heads * d_head` for `hook_z`
    (concatenated over heads). `SAEError` for a name that is not a firing hook point or whose activation is not
    `[batch, pos, d]` (or `[batch, pos, head, d_head]` for `hook_z`)."""
    names = model.firing_hook_names()
    if hook_name not in names:
        near = [n for n in names if n.endswith(hook_name.rsplit(".", 1)[-1])][:6] or names[:6]
        raise SAEError(f"{hook_name!r} is not a hook point of this model that fires; e.g. {', '.join(near)}")
    probe = torch.zeros(1, 2, dtype=torch.long, device=model.W_E.device)
    with torch.no_grad():
        _, cache = model.run_with_cache(probe, names_filter=lambda n: n == hook_name)
    shape = tuple(cache[hook_name].shape)
    if hook_name.endswith("hook_z") and len(shape) == 4:
        return shape[2] * shape[3]
    if len(shape) != 3 or shape[1] != 2:
        raise SAEError(f"{hook_name!r} holds activations of shape {list(shape)}; an SAE reads [batch, pos, d] "
                       "(or hook_z, concatenated over heads): use e.g. hook_resid_post, hook_mlp_out, hook_z")
    return shape[2]


def activations(model, hook_name: str, tokens: torch.Tensor, skip: int = 1) -> torch.Tensor:
    """`[n, d_in]`: the activations at `hook_name` of every window of `tokens` `[batch, pos]`, positions from `skip`
    on (1: the BOS position left out), `hook_z` concatenated over heads."""
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n == hook_name)
    act = cache[hook_name][:, skip:]
    return act.reshape(-1, act.shape[2] * act.shape[3]) if act.dim() == 4 else act.reshape(-1, act.shape[-1])




# --- the folder -------------------------------------------------------------------------------------------------
def load_sae(folder, model=None):
    """The SAE in `folder` (SAELens' `SAE`), its files read and checked by `models.io.readers.read_sae_folder`
    (before SAELens is needed: a corrupt folder is refused the same with or without it) and handed to SAELens'
    `SAE.load_from_disk` as its converter. With `model`, `SAEError` unless its hook point fires in `model` with the
    SAE's width."""
    folder = Path(folder)
    cfg, tensors, _ = read_sae_folder(folder)
    sae_lens()
    from sae_lens import SAE

    device = "cpu" if model is None else str(model.W_E.device)

    def checked(path, device, cfg_overrides=None):  # SAELens' PretrainedSaeDiskLoader protocol
        return dict(cfg, device=device, **(cfg_overrides or {})), {k: v.to(device) for k, v in tensors.items()}

    try:
        sae = SAE.load_from_disk(folder, device=device, converter=checked)
    except (KeyError, ValueError, TypeError, RuntimeError) as e:  # an architecture or field SAELens refuses
        raise SAEError(f"{folder}: SAELens cannot load this SAE ({type(e).__name__}: {str(e)[:200]})") from None
    if model is not None:
        hook = sae.cfg.metadata.hook_name
        width = hook_width(model, hook)
        if width != sae.cfg.d_in:
            raise SAEError(f"the SAE in {folder} reads {sae.cfg.d_in} inputs at {hook}, where this model has {width}")
    return sae


def save_sae(trained, folder) -> Path:
    """Write `folder` (SAELens' cfg.json and sae_weights.safetensors by its `save_model`, and `training.json`) from
    `trained` (`models.training.sae.Trained`), staged and published through `models.io.run_folder` as an "sae"
    folder: a folder of other files or of another kind is refused (`FolderError`), nothing of the user's is
    replaced. A full disk raises `DiskFullError` (SAELens writes through the safetensors library, whose own error
    type carries the operating system's) and leaves nothing behind."""
    from .run_folder import write_folder

    def write(tmp: Path) -> None:
        trained.sae.save_model(tmp)
        (tmp / TRAINING_FILE).write_text(json.dumps(trained.settings, indent=2) + "\n")

    return write_folder(folder, "sae", write)


# --- the zoo's SAEs -------------------------------------------------------------------------------------------
#: Where a zoo model's SAEs are shipped: models/zoo/<model>/saes/<hook name>/ (each with card.md and measured.json).
ZOO_SAES_DIR = "saes"


def zoo_saes() -> list[tuple[str, str]]:
    """`(zoo model, hook name)` of every SAE shipped with the zoo."""
    from .checkpoint import ZOO_DIR

    return sorted((d.parent.parent.name, d.name) for d in ZOO_DIR.glob(f"*/{ZOO_SAES_DIR}/*")
                  if (d / "sae_weights.safetensors").is_file())


def zoo_sae(model: str, hook_name: str) -> Path:
    """The folder of the SAE shipped with zoo model `model` at `hook_name` (`load_sae`, SAELens' own
    `SAE.load_from_disk` and `circuits sae report` read it); `SAEError` naming the shipped ones when there is none."""
    from .checkpoint import ZOO_DIR

    if (model, hook_name) not in zoo_saes():
        have = ", ".join(f"{m} {h}" for m, h in zoo_saes()) or "none"
        raise SAEError(f"the zoo ships no SAE for {model} at {hook_name}; shipped: {have}")
    return ZOO_DIR / model / ZOO_SAES_DIR / hook_name

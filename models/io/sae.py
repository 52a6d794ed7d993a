"""Sparse autoencoders on this toolkit's models through SAELens (optional: `pip install sae-lens`): the adapter.

Nothing here re-implements SAELens; it connects our models to it:

- `with_saes(model)`: the model, its class extended by SAELens' own `HookedSAETransformer` methods (`add_sae`,
  `reset_saes`, `saes`, `run_with_saes`, `run_with_cache_with_saes`, `run_with_hooks_with_saes`, `acts_to_saes`). An
  attached SAE takes the hook point's place as SAELens' wrapper, so its hook points are cached under SAELens' names
  (`blocks.1.hook_mlp_out.hook_sae_acts_post`, ...). While an SAE is attached the model runs its fully hooked path
  (`models.arch.watch.forced`), the path a hand-written hook splice takes.
- `hook_width`, `activations`: what an SAE on a hook point reads (`hook_z` concatenated over heads).
- `load_sae` reads an SAE folder (SAELens' `cfg.json` and `sae_weights.safetensors`) through this toolkit's readers
  (`models.io.readers.read_sae_folder`: bounded, schema-checked, finite weights) and hands them to SAELens'
  `SAE.load_from_disk` as its `converter`; `save_sae` writes one atomically (a full disk: `DiskFullError`).

Training is `models.training.sae`; the measures (FVU, L0, spliced losses) are `analyses.sae_metrics`.
"""

from __future__ import annotations

import contextlib
import errno
import json
from pathlib import Path

import torch

from ..arch.watch import forced
from ..errors import DiskFullError, MissingDependencyError, SAEError
from .readers import SAE_TRAINING_FILE, read_sae_folder

#: SAELens' version this module is tested with (pyproject's `sae` extra).
SAE_LENS_VERSION = "6.54.12"
#: SAELens' `HookedSAETransformer` methods given to our models (`forward` is wrapped below: it calls `super()`).
SAE_METHODS = ("acts_to_saes", "add_sae", "_reset_sae", "reset_saes", "_compute_exclusion_mask", "_token_masks",
               "saes", "run_with_saes", "run_with_cache_with_saes", "run_with_hooks_with_saes")
#: Written beside SAELens' cfg.json and sae_weights.safetensors: how the SAE was trained.
TRAINING_FILE = SAE_TRAINING_FILE


def sae_lens():
    """The `sae_lens` package, or `MissingDependencyError` naming the install."""
    from ..deferred_import import complete_all

    # SAELens imports TransformerLens' model classes, whose modules import the package's other parts: its package
    # `__init__`s must have run (the command line defers them, `models.deferred_import`); a no-op otherwise.
    complete_all()
    try:
        import sae_lens
    except ImportError as e:
        from ..arch.tl_compat import TL_VERSION, version_tuple

        why = "it is not installed" if (e.name or "").split(".")[0] == "sae_lens" else \
            f"SAELens 6.x needs transformer-lens<4, this environment has {TL_VERSION}" \
            if version_tuple(TL_VERSION) >= (4, 0) else f"importing it failed: {e}"
        raise MissingDependencyError(f"sparse autoencoders need SAELens: pip install sae-lens=={SAE_LENS_VERSION} "
                                     f"(or pip install 'toy-circuits[sae]'; {why})") from None
    return sae_lens


_CLASSES: dict[type, type] = {}


def _with_saes_class(cls: type) -> type:
    if cls in _CLASSES:
        return _CLASSES[cls]
    from sae_lens.analysis.hooked_sae_transformer import HookedSAETransformer

    class WithSAEs(cls):
        __doc__ = f"{cls.__name__} with SAELens' HookedSAETransformer methods (models.sae.with_saes)."

        def forward(self, input, *args, **kwargs):
            # HookedSAETransformer.forward, plus the hooked path while an SAE is attached
            with self._token_masks(input, kwargs), (forced(self) if self._acts_to_saes else contextlib.nullcontext()):
                return super().forward(input, *args, **kwargs)

    for name in SAE_METHODS:
        setattr(WithSAEs, name, HookedSAETransformer.__dict__[name])
    WithSAEs.__name__ = WithSAEs.__qualname__ = f"{cls.__name__}WithSAEs"
    _CLASSES[cls] = WithSAEs
    return WithSAEs


def check_model(model, what: str) -> None:
    """`SAEError` unless `model` is a `HookedTransformer` (a decoder-only model): the models SAEs here read."""
    from ..arch.model import HookedTransformer

    if not isinstance(model, HookedTransformer):
        raise SAEError(f"{what} takes a HookedTransformer (a decoder-only model), got {type(model).__name__}")


def with_saes(model):
    """`model` itself, its class extended by SAELens' `HookedSAETransformer` methods (see the module docstring);
    idempotent. Decoder-only models (`HookedTransformer`)."""
    sae_lens()
    check_model(model, "with_saes")
    if not hasattr(model, "_acts_to_saes"):
        model._acts_to_saes = {}
        model._transcoder_output_hooks = {}
    if type(model) not in _CLASSES.values():
        model.__class__ = _with_saes_class(type(model))
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
    `trained` (`models.training.sae.Trained`) atomically; an existing folder that is not empty is refused
    (`SAEError`): nothing of the user's is replaced. A full disk raises `DiskFullError` (SAELens writes through the
    safetensors library, whose own error type carries the operating system's) and leaves nothing behind."""
    folder = Path(folder)
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise SAEError(f"{folder} exists and is not an empty folder; give a new folder (nothing is overwritten)")
    from ..files.atomic import atomic_write_dir

    def write(tmp: Path) -> None:
        trained.sae.save_model(tmp)
        (tmp / TRAINING_FILE).write_text(json.dumps(trained.settings, indent=2) + "\n")

    try:
        return atomic_write_dir(folder, write)
    except Exception as e:
        full = disk_full(e, folder)
        if full is None:
            raise
        raise full from None


#: how the safetensors library (Rust) spells the operating system's "disk full" errors in its messages
_RUST_DISK_FULL = {"code: 28,": errno.ENOSPC, "StorageFull": errno.ENOSPC, "code: 122,": errno.EDQUOT,
                   "QuotaExceeded": errno.EDQUOT}


def disk_full(e: BaseException, where) -> DiskFullError | None:
    """`DiskFullError` for an error that says the disk (or quota) is full: an `OSError` with ENOSPC / EDQUOT, or a
    library's own error type (safetensors' `SafetensorError`) whose message carries that error; None otherwise."""
    if isinstance(e, DiskFullError):
        return e
    code = getattr(e, "errno", None) if isinstance(e, OSError) else None
    if code is None:
        code = next((c for text, c in _RUST_DISK_FULL.items() if text in str(e)), None)
    if code not in (errno.ENOSPC, errno.EDQUOT):
        return None
    why = "quota exceeded" if code == errno.EDQUOT else "no space left on device"
    return DiskFullError(code, f"{where}: not written, the disk is full ({why}); nothing was left behind")

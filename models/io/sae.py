"""Sparse autoencoders on this toolkit's models through SAELens (optional: `pip install sae-lens`): the adapter.

Nothing here re-implements SAELens; it connects our models to it:

- `with_saes(model)`: the model, its class extended by SAELens' `HookedSAETransformer` interface (`add_sae`,
  `reset_saes`, `saes`, `run_with_saes`, `run_with_cache_with_saes`, `run_with_hooks_with_saes`, `acts_to_saes`),
  `SAEMethods`, written on SAELens' public `SAE` (its `forward`, `hook_dict`, `cfg`). An attached SAE takes the hook
  point's place (`SAESplice`), so its hook points are cached under SAELens' names
  (`blocks.1.hook_mlp_out.hook_sae_acts_post`, ...). While an SAE is attached the model runs its fully hooked path
  (`models.arch.watch.forced`), the path a hand-written hook splice takes.
- `hook_width`, `activations`: what an SAE on a hook point reads (`hook_z` concatenated over heads).
- `load_sae` reads an SAE folder (SAELens' `cfg.json` and `sae_weights.safetensors`) through this toolkit's readers
  (`models.io.readers.read_sae_folder`: bounded, schema-checked, finite weights) and hands them to SAELens'
  `SAE.load_from_disk` as its `converter`; `save_sae` writes one atomically (a full disk: `DiskFullError`).
- `zoo_saes`, `zoo_sae`: the SAEs shipped with the zoo, `models/zoo/<model>/saes/<hook name>/` (SAELens' files,
  training.json, a card and measured.json).

Training is `models.training.sae`; the measures (FVU, L0, spliced losses) are `analyses.sae_metrics`.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import torch

from ..arch.watch import forced
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


class SAESplice(torch.nn.Module):
    """What stands at a hook point while an SAE is attached: the SAE's reconstruction (SAELens' `SAE.forward`, with its
    error term when `use_error_term`) in place of the activation, the activation itself at the positions `mask`
    excludes. The SAE's hook points are this module's children (the SAE itself is kept outside the module tree), so
    they are cached under SAELens' names, `blocks.1.hook_mlp_out.hook_sae_acts_post`."""

    def __init__(self, sae, use_error_term: bool, exclude_special_tokens):
        super().__init__()
        self.__dict__["sae"] = sae
        for name, hook in sae.hook_dict.items():
            setattr(self, name, hook)
        self.use_error_term, self.exclude_special_tokens = bool(use_error_term), exclude_special_tokens
        self.mask: torch.Tensor | None = None  # [batch, pos], True: the model's own activation (set per forward)

    def forward(self, act: torch.Tensor) -> torch.Tensor:
        sae, saved = self.sae, self.sae.use_error_term
        sae.use_error_term = self.use_error_term
        try:
            out = sae(act)
        finally:
            sae.use_error_term = saved
        if self.mask is None:
            return out
        mask = self.mask.reshape(*self.mask.shape, *([1] * (act.dim() - 2))).to(act.device)
        return torch.where(mask, act, out)


def _set_module(model, path: str, module) -> None:
    *parents, last = path.split(".")
    owner = model
    for part in parents:
        owner = owner[int(part)] if part.isdigit() else getattr(owner, part)
    setattr(owner, last, module)


class SAEMethods:
    """SAELens' `HookedSAETransformer` interface (`add_sae`, `reset_saes`, `saes`, `run_with_saes`,
    `run_with_cache_with_saes`, `run_with_hooks_with_saes`, `acts_to_saes`) for our models, written on SAELens'
    public `SAE` (`forward`, `hook_dict`, `cfg.metadata.hook_name`): mixed into the model's class by `with_saes`. An
    SAE takes its hook point's place as an `SAESplice` until it is reset; the forward pass sets the excluded
    positions (`exclude_special_tokens`) from its tokens and runs the fully hooked path while any SAE is attached."""

    @property
    def acts_to_saes(self) -> dict:
        """`{hook name: SAE}` of the attached SAEs."""
        return {name: splice.sae for name, splice in self._sae_splices.items()}

    def add_sae(self, sae, use_error_term: bool | None = None, exclude_special_tokens=False):
        """Attach `sae` at its hook point (`sae.cfg.metadata.hook_name`) until `reset_saes`, replacing any SAE there.
        `use_error_term` (default: the SAE's own setting) adds the reconstruction error back, so the model's output is
        unchanged while the SAE's activations are cached; `exclude_special_tokens` (True: the tokenizer's BOS, EOS and
        pad ids; or a list of ids) keeps the model's own activation at those tokens."""
        hook = sae.cfg.metadata.hook_name
        if hook not in self._sae_splices and hook not in self.hook_dict:
            raise SAEError(f"{hook!r} is not a hook point of this model; e.g. {', '.join(list(self.hook_dict)[:4])}")
        if hook in self._sae_splices:
            self.reset_saes(hook)
        splice = SAESplice(sae, sae.use_error_term if use_error_term is None else use_error_term,
                           exclude_special_tokens)
        self._sae_splices[hook] = splice
        _set_module(self, hook, splice)
        self.setup()

    def reset_saes(self, act_names: str | list[str] | None = None) -> None:
        """Detach the SAEs at `act_names` (default: all), putting plain hook points back."""
        from ..arch.tl_compat import HookPoint

        names = [act_names] if isinstance(act_names, str) else list(self._sae_splices) if act_names is None else \
            act_names
        for name in names:
            if self._sae_splices.pop(name, None) is not None:
                _set_module(self, name, HookPoint())
        self.setup()

    @contextlib.contextmanager
    def saes(self, saes=(), reset_saes_end: bool = True, use_error_term: bool | None = None,
             exclude_special_tokens=False):
        """Attach `saes` (one SAE or a list) for the body; at its end (with `reset_saes_end`) the SAEs attached before
        at those hook points are back as they were."""
        saes = [saes] if hasattr(saes, "cfg") else list(saes)
        before = [(sae.cfg.metadata.hook_name, self._sae_splices.get(sae.cfg.metadata.hook_name)) for sae in saes]
        try:
            for sae in saes:
                self.add_sae(sae, use_error_term=use_error_term, exclude_special_tokens=exclude_special_tokens)
            yield self
        finally:
            if reset_saes_end:
                for name, old in reversed(before):
                    self.reset_saes(name)
                    if old is not None:
                        self.add_sae(old.sae, old.use_error_term, old.exclude_special_tokens)

    def run_with_saes(self, *model_args, saes=(), reset_saes_end: bool = True, use_error_term: bool | None = None,
                      exclude_special_tokens=False, **model_kwargs):
        """The forward pass with `saes` attached for it (see `saes`)."""
        with self.saes(saes, reset_saes_end, use_error_term, exclude_special_tokens):
            return self(*model_args, **model_kwargs)

    def run_with_cache_with_saes(self, *model_args, saes=(), reset_saes_end: bool = True,
                                 use_error_term: bool | None = None, exclude_special_tokens=False, **kwargs):
        """`run_with_cache` with `saes` attached for it: the SAEs' activations are cached under SAELens' names."""
        with self.saes(saes, reset_saes_end, use_error_term, exclude_special_tokens):
            return self.run_with_cache(*model_args, **kwargs)

    def run_with_hooks_with_saes(self, *model_args, saes=(), reset_saes_end: bool = True,
                                 exclude_special_tokens=False, fwd_hooks=(), bwd_hooks=(), reset_hooks_end=True,
                                 clear_contexts=False, **model_kwargs):
        """`run_with_hooks` with `saes` attached for it."""
        with self.saes(saes, reset_saes_end, exclude_special_tokens=exclude_special_tokens):
            return self.run_with_hooks(*model_args, fwd_hooks=list(fwd_hooks), bwd_hooks=list(bwd_hooks),
                                       reset_hooks_end=reset_hooks_end, clear_contexts=clear_contexts,
                                       **model_kwargs)

    def forward(self, input, *args, **kwargs):
        if not self._sae_splices:
            return super().forward(input, *args, **kwargs)
        masked = [s for s in self._sae_splices.values() if s.exclude_special_tokens is not False]
        if masked:
            tokens = input if isinstance(input, torch.Tensor) else self.to_tokens(
                input, prepend_bos=kwargs.get("prepend_bos"), padding_side=kwargs.get("padding_side"))
            for splice in masked:
                ids = splice.exclude_special_tokens
                if ids is True:
                    tok = self.tokenizer
                    ids = {getattr(tok, a, None) for a in ("bos_token_id", "eos_token_id", "pad_token_id")} - {None}
                splice.mask = torch.isin(tokens, torch.tensor(sorted(ids), dtype=tokens.dtype, device=tokens.device))
        try:
            with forced(self):  # the fully hooked path: the one a hand-written splice takes
                return super().forward(input, *args, **kwargs)
        finally:
            for splice in masked:
                splice.mask = None


_CLASSES: dict[type, type] = {}


def _with_saes_class(cls: type) -> type:
    """`cls` with `SAEMethods` mixed in (one class per model class)."""
    if cls not in _CLASSES:
        _CLASSES[cls] = type(f"{cls.__name__}WithSAEs", (SAEMethods, cls),
                             {"__doc__": f"{cls.__name__} with SAELens' SAE methods (models.sae.with_saes)."})
    return _CLASSES[cls]


def check_model(model, what: str) -> None:
    """`SAEError` unless `model` is one of our decoder-only models (`models.model_kind`; a `HookedTransformer`, whose
    hook points SAEs here read)."""
    from ..arch.config import HookedTransformerConfig
    from ..arch.kind import DECODER, model_kind

    if not isinstance(getattr(model, "cfg", None), HookedTransformerConfig) or model_kind(model) != DECODER:
        raise SAEError(f"{what} takes a HookedTransformer (a decoder-only model), got {type(model).__name__}")


def with_saes(model):
    """`model` itself, its class extended by SAELens' `HookedSAETransformer` methods (see the module docstring);
    idempotent. Decoder-only models (`HookedTransformer`)."""
    sae_lens()
    check_model(model, "with_saes")
    if "_sae_splices" not in model.__dict__:
        model.__dict__["_sae_splices"] = {}  # hook name -> SAESplice (outside the module tree: they are in it already)
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

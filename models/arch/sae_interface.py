"""SAELens' `HookedSAETransformer` interface on this toolkit's models (`SAEInterface`, mixed into `HookedTransformer`),
written on SAELens' public `SAE` (its `forward`, `hook_dict`, `cfg.metadata.hook_name`) without importing SAELens: an
attached SAE takes its hook point's place as an `SAESplice` until it is reset, so its own hook points are cached under
SAELens' names (`blocks.1.hook_mlp_out.hook_sae_acts_post`). While any SAE is attached the model carries a forward
pre-hook (which sets the positions `exclude_special_tokens` keeps from the pass's tokens) and a forward hook (which
clears them): plain PyTorch hooks, so the model is watched and every forward pass takes its fully hooked path
(`models.arch.watch`), the path a hand-written hook splice takes. `models.sae.with_saes` checks that SAELens is there
and returns the model.
"""

from __future__ import annotations

import contextlib

import torch

from ..errors import SAEError


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


class SAEInterface:
    """SAELens' `HookedSAETransformer` interface (`add_sae`, `reset_saes`, `saes`, `run_with_saes`,
    `run_with_cache_with_saes`, `run_with_hooks_with_saes`, `acts_to_saes`), mixed into `HookedTransformer` (see the
    module docstring)."""

    @property
    def _sae_splices(self) -> dict:
        """`{hook name: SAESplice}` of the attached SAEs (kept outside the module tree: they are in it already)."""
        return self.__dict__.setdefault("_sae_splice_table", {})

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
        if "_sae_hook_handles" not in self.__dict__:
            self.__dict__["_sae_hook_handles"] = (
                self.register_forward_pre_hook(_set_masks, with_kwargs=True),
                self.register_forward_hook(_clear_masks, always_call=True))

    def reset_saes(self, act_names: str | list[str] | None = None) -> None:
        """Detach the SAEs at `act_names` (default: all), putting plain hook points back."""
        from .tl_compat import HookPoint

        names = [act_names] if isinstance(act_names, str) else list(self._sae_splices) if act_names is None else \
            act_names
        for name in names:
            if self._sae_splices.pop(name, None) is not None:
                _set_module(self, name, HookPoint())
        self.setup()
        if not self._sae_splices:
            for handle in self.__dict__.pop("_sae_hook_handles", ()):
                handle.remove()

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


def _set_masks(model, args, kwargs) -> None:
    """Forward pre-hook while SAEs are attached: each splice with `exclude_special_tokens` gets the positions of
    this forward pass's special tokens (its input ids, or its text tokenized)."""
    masked = [s for s in model._sae_splices.values() if s.exclude_special_tokens is not False]
    if not masked:
        return
    input = args[0] if args else kwargs.get("input", kwargs.get("tokens"))
    tokens = input if isinstance(input, torch.Tensor) else model.to_tokens(
        input, prepend_bos=kwargs.get("prepend_bos"), padding_side=kwargs.get("padding_side"))
    for splice in masked:
        ids = splice.exclude_special_tokens
        if ids is True:
            tok = model.tokenizer
            ids = {getattr(tok, a, None) for a in ("bos_token_id", "eos_token_id", "pad_token_id")} - {None}
        splice.mask = torch.isin(tokens, torch.tensor(sorted(ids), dtype=tokens.dtype, device=tokens.device))


def _clear_masks(model, args, output) -> None:
    """Forward hook (run also when the pass raises): no mask outlives its forward pass."""
    for splice in model._sae_splices.values():
        splice.mask = None


__all__ = ["SAEInterface", "SAESplice"]

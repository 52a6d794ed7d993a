"""TransformerLens 2.x's opt-in hook points and their switches (`set_use_*`), mixed into `HookedTransformer`.

Every block always has the hook points `hook_attn_in`, `hook_q_input`, `hook_k_input`, `hook_v_input` (and, with an
MLP, `hook_mlp_in`), and every attention layer `hook_result`, as TransformerLens; they fire only while their switch
in the config is on. An encoder–decoder's decoder blocks add `hook_cross_q_input`, `hook_cross_k_input`,
`hook_cross_v_input` (the cross-attention's per-head inputs) under the same switch as `hook_q_input`.
`firing_hook_names()` lists the hook points that fire on a forward pass as configured now. A model whose layers read
their switches from several configs (an encoder–decoder: one per stack) names them in `_switch_configs`.
"""

from __future__ import annotations

from ..errors import ConfigError, HookSwitchError, InputError

#: hook-name suffix → the config switch without which it never fires
OPT_IN = {".hook_attn_in": "use_attn_in", ".hook_q_input": "use_split_qkv_input",
          ".hook_k_input": "use_split_qkv_input", ".hook_v_input": "use_split_qkv_input",
          ".hook_cross_q_input": "use_split_qkv_input", ".hook_cross_k_input": "use_split_qkv_input",
          ".hook_cross_v_input": "use_split_qkv_input",
          ".hook_mlp_in": "use_hook_mlp_in", "attn.hook_result": "use_attn_result"}


class HookSwitches:
    """The `set_use_*` switches of TransformerLens 2.x's `HookedTransformer` (same names, arguments and checks)."""

    def _switch_configs(self, name: str) -> tuple:
        """The configs whose switch `name` the layers read, the one read first (the model's own config)."""
        return (self.cfg,)

    def _switched_on(self, name: str) -> bool:
        """Whether the switch `name` is on."""
        return bool(getattr(self._switch_configs(name)[0], name))

    def _switch(self, name: str, value: bool) -> None:
        if not isinstance(value, bool):
            raise ConfigError(f"{name} must be true or false, got {value!r}")
        for cfg in self._switch_configs(name):
            setattr(cfg, name, value)

    def set_use_attn_result(self, use_attn_result: bool) -> None:
        """Compute and hook each head's output `blocks.{l}.attn.hook_result [batch, pos, head, d_model]`."""
        self._switch("use_attn_result", use_attn_result)

    def set_use_split_qkv_input(self, use_split_qkv_input: bool) -> None:
        """Give each head its own copy of the query, key and value inputs (`hook_q_input`, `hook_k_input`,
        `hook_v_input`, `[batch, pos, head, d_model]`), so that they can be patched separately."""
        self._switch("use_split_qkv_input", use_split_qkv_input)

    def set_use_hook_mlp_in(self, use_hook_mlp_in: bool) -> None:
        """Hook a copy of each MLP's input (`blocks.{l}.hook_mlp_in`, before ln2)."""
        if use_hook_mlp_in and self._switch_configs("attn_only")[0].attn_only:
            raise HookSwitchError("use_hook_mlp_in needs MLP layers; this model is attention-only")
        self._switch("use_hook_mlp_in", use_hook_mlp_in)

    def set_use_attn_in(self, use_attn_in: bool) -> None:
        """Hook the attention input once per head (`blocks.{l}.hook_attn_in [batch, pos, head, d_model]`)."""
        cfg = self._switch_configs("use_attn_in")[0]
        if use_attn_in and cfg.n_key_value_heads != cfg.n_heads:
            raise HookSwitchError("use_attn_in cannot be used with grouped-query attention; use "
                              "set_use_split_qkv_input instead")
        self._switch("use_attn_in", use_attn_in)

    def set_ungroup_grouped_query_attention(self, ungroup_grouped_query_attention: bool) -> None:
        """Expand the key/value heads to one per query head before `hook_k` / `hook_v` (grouped-query attention)."""
        self._switch("ungroup_grouped_query_attention", ungroup_grouped_query_attention)

    def check_hooks_to_add(self, hook_point, hook_point_name: str, hook, dir="fwd", is_permanent=False,
                           prepend=False) -> None:
        """`add_hook` on an opt-in hook point whose switch is off raises `HookSwitchError` (as TransformerLens 2.x's
        assertion); `run_with_cache` and `run_with_hooks` with a filter skip the check, as there."""
        for suffix, switch in OPT_IN.items():
            if hook_point_name.endswith(suffix) and not self._switched_on(switch):
                raise HookSwitchError(f"cannot add a hook to {hook_point_name} while {switch} is False; call "
                                      f"model.set_{switch}(True) first")

    def firing_hook_names(self) -> list[str]:
        """The hook points that fire on a forward pass with the current switches (`hook_dict` also holds the opt-in
        points that are switched off, as TransformerLens)."""
        off = self._switched_off()
        return [name for name in self.hook_dict if not name.endswith(off)]

    def _switched_off(self) -> tuple[str, ...]:
        """The name suffixes of the opt-in hook points whose switch is off now."""
        return tuple(suffix for suffix, switch in OPT_IN.items() if not self._switched_on(switch))

    def get_caching_hooks(self, names_filter=None, incl_bwd: bool = False, device=None, remove_batch_dim: bool = False,
                          cache: dict | None = None, pos_slice=None):
        """TransformerLens' caching hooks (`run_with_cache`), for the hook points that fire only (a switched-off
        opt-in point never fires: its hook would only cost adding and removing), each a `CacheHook`."""
        from .tl_compat import utilities

        Slice = utilities().slice.Slice

        cache, fwd, bwd = super().get_caching_hooks(names_filter, incl_bwd, device, remove_batch_dim, cache, pos_slice)
        off = self._switched_off()
        plain = device is None and not remove_batch_dim and Slice.unwrap(pos_slice).mode == "identity"
        fwd = [(name, CacheHook(cache, None if plain else save)) for name, save in fwd if not name.endswith(off)]
        return cache, fwd, [(name, save) for name, save in bwd if not name.endswith(off)]

    def remove_all_hook_fns(self, direction="both", including_permanent: bool = False, level: int | None = None):
        """TransformerLens' `remove_all_hook_fns`, visiting only the hook points that hold hooks (the others have
        nothing to remove; `reset_hooks` runs this after every `run_with_hooks` / `run_with_cache`)."""
        if direction not in ("fwd", "bwd", "both"):
            raise InputError(f"direction={direction!r} is not a hook direction; allowed: 'fwd', 'bwd', 'both'")
        for point in self.hook_dict.values():
            if point.fwd_hooks or point.bwd_hooks:
                point.remove_hooks(direction, including_permanent=including_permanent, level=level)


class CacheHook:
    """A forward hook of `run_with_cache`: it stores what its hook point sees in `cache` and changes nothing. `save`
    is TransformerLens' save hook, used when `run_with_cache` moves, slices or un-batches what it stores; without one
    the tensor is stored as TransformerLens stores it then (`tensor.detach()`, a view of the same values)."""

    __slots__ = ("cache", "save")

    def __init__(self, cache: dict, save=None):
        self.cache, self.save = cache, save

    def __call__(self, tensor, hook):
        if self.save is not None:
            return self.save(tensor, hook=hook)
        self.cache[hook.name] = tensor.detach()
        return None

"""Edge patching: run a model with a set of edges of its graph (`circuits.graph`) replaced by their ablated value,
many edge sets in one batched forward pass.

In a pre-norm model each receiver's input is the residual stream, the sum of every earlier sender's output (plus
biases, the same in every run). Removing edge (s, r) gives r the ablated output of s instead of its output in this
run, and leaves every other reader of s alone (Conmy et al. 2023, ACDC, §3; the AutoCircuit implementation):

    input_r = resid_r + Σ_{s : (s, r) removed} (ablated_s − current_s)

where `current_s` is s's output in this run (it differs from the clean run when edges upstream of s are removed:
the subgraph's own values flow along the kept edges) and `ablated_s` is s's output on the corrupted prompt
("corrupt", the usual choice) or its mean over the clean prompts at each position ("mean"). The receiver inputs are
TransformerLens 2.x's per-head hook points `hook_q_input` / `hook_k_input` / `hook_v_input` (before ln1: patching an
edge into a normalised input happens before the norm), `hook_mlp_in` (before ln2) and, for the logits, the last
block's `hook_resid_post` (before the final norm); senders are `hook_embed`, `hook_pos_embed`, `attn.hook_result`
and `hook_mlp_out`. Edge sets are stacked along the batch axis: rows `e·N … e·N + N − 1` run the N prompts with the
e-th edge set removed, and each receiver's correction is one batched product over (edge set, sender).

Shortformer positions (added after the norm to queries and keys only) are identical in clean and corrupted prompts
of the same length, and their mean is themselves, so removing a `pos_embed` edge changes nothing: those edges are
in the graph and carry exactly zero.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from circuits.graph import EdgeGraph, edge_graph

from ..patching.inputs import PatchingError, prepare, token_pair

ABLATIONS = ("corrupt", "mean")
#: elements of the largest correction tensor one chunk of edge sets may build ([rows, pos, senders, d_model])
CHUNK_ELEMENTS = 2 ** 26


@contextmanager
def split_inputs(model):
    """The model with per-head inputs, per-head outputs and the MLP-input hook switched on
    (`use_split_qkv_input`, `use_attn_result`, `use_hook_mlp_in`), restored afterwards."""
    cfg = model.cfg
    names = ["use_split_qkv_input", "use_attn_result"] + ([] if cfg.attn_only else ["use_hook_mlp_in"])
    old = {n: getattr(cfg, n) for n in names}
    try:
        for n in names:
            setattr(cfg, n, True)
        yield model
    finally:
        for n, v in old.items():
            setattr(cfg, n, v)


def _check_model(model) -> None:
    from models.arch.kind import DECODER, model_kind

    kind = model_kind(model)
    if kind != DECODER:
        raise PatchingError(f"edge patching serves decoder-only models; this one is {kind.replace('_', '–')}")
    prepare(model)
    cfg = model.cfg
    if cfg.n_key_value_heads != cfg.n_heads:
        raise PatchingError("edge patching needs one key/value head per query head (grouped-query attention shares "
                            "a key/value input between heads, so a per-head K or V edge is undefined)")


class EdgePatcher:
    """Edge patching of one model on clean/corrupted prompt pairs (see the module docstring).

    `run(removed)` takes a bool `[n_sets, n_edges]` (True: the edge is removed) and returns the logits
    `[n_sets, batch, pos, d_vocab]`; `forwards` / `backwards` count the model's forward and backward passes (the
    methods add theirs) and `rows` the prompt rows the forward passes ran."""

    def __init__(self, model, clean, corrupt, ablation: str = "corrupt", graph: EdgeGraph | None = None):
        _check_model(model)
        if ablation not in ABLATIONS:
            raise PatchingError(f"unknown ablation {ablation!r}; allowed: {', '.join(ABLATIONS)}")
        self.model, self.ablation = model, ablation
        self.clean, self.corrupt = token_pair(model, clean, corrupt)
        self.graph = edge_graph(model) if graph is None else graph
        cfg = model.cfg
        self.query_key_positions = bool(cfg.positions.table) and cfg.positions.adds_to == "query_key"
        self.forwards = self.backwards = self.rows = 0
        self._layout()
        with torch.no_grad():
            ablated = self.sender_outputs(self.corrupt if ablation == "corrupt" else self.clean)
        if ablation == "mean":
            ablated = {k: v.mean(0, keepdim=True).expand_as(v) for k, v in ablated.items()}
        self.ablated = ablated  # sender name → [batch, pos, d_model]

    # --- where each sender and receiver lives --------------------------------------------------------------------
    def _layout(self):
        """Per receiver hook: the senders it reads (as indices into `self.sender_names`) and the edge index of
        each (sender, receiver-in-hook) pair (−1: no such edge)."""
        g, H = self.graph, self.model.cfg.n_heads
        carried = [s for s in g.senders if not (s.part == "pos_embed" and self.query_key_positions)]
        self.sender_names = [s.name for s in carried]
        pos = {n: i for i, n in enumerate(self.sender_names)}
        self.hooks = {}  # hook name → (sender indices [S], edge index [S, heads or 1])
        L = self.model.cfg.n_layers
        groups = {}
        for r in g.receivers:
            if r.part in ("q", "k", "v"):
                groups.setdefault((f"blocks.{r.layer}.hook_{r.part}_input", H), {})[r.head] = r.name
            elif r.part == "mlp":
                groups[(f"blocks.{r.layer}.hook_mlp_in", 1)] = {0: r.name}
            elif r.part == "logits":
                groups[(f"blocks.{L - 1}.hook_resid_post", 1)] = {0: r.name}
        for (hook, width), names in groups.items():
            senders = sorted({pos[s] for s, rr in g.edges if rr in names.values() and s in pos})
            index = torch.full((len(senders), width), -1, dtype=torch.long)
            for j, si in enumerate(senders):
                for h, rname in names.items():
                    key = (self.sender_names[si], rname)
                    if g.has(key):
                        index[j, h] = g.index(key)
            self.hooks[hook] = (senders, index)

    def _sender_hooks(self, store: dict):
        """Hooks recording every sender's output of this run into `store` (name → [rows, pos, d_model])."""
        hooks = [("hook_embed", lambda x, hook: store.__setitem__("embed", x))]
        if "pos_embed" in self.sender_names:
            hooks.append(("hook_pos_embed", lambda x, hook: store.__setitem__("pos_embed", x)))
        for l in range(self.model.cfg.n_layers):
            def heads(x, hook, l=l):
                for h in range(x.shape[2]):
                    store[f"L{l}H{h}"] = x[:, :, h]
            hooks.append((f"blocks.{l}.attn.hook_result", heads))
            if f"L{l}.mlp" in self.sender_names:
                hooks.append((f"blocks.{l}.hook_mlp_out", lambda x, hook, l=l: store.__setitem__(f"L{l}.mlp", x)))
        return hooks

    def sender_outputs(self, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
        """Every sender's output on `tokens` (one forward pass), name → `[batch, pos, d_model]`."""
        store = {}
        with split_inputs(self.model):
            self.model.run_with_hooks(tokens, fwd_hooks=self._sender_hooks(store))
        self.forwards += 1
        self.rows += tokens.shape[0]
        return {k: v.detach().clone() for k, v in store.items()}

    # --- the patched run ---------------------------------------------------------------------------------------
    def _chunk(self) -> int:
        N, P = self.clean.shape
        S = max(1, len(self.sender_names))
        return max(1, CHUNK_ELEMENTS // (N * P * S * self.model.cfg.d_model))

    def run(self, removed: torch.Tensor, tokens: torch.Tensor | None = None) -> torch.Tensor:
        """Logits `[n_sets, batch, pos, d_vocab]` of the clean prompts (or `tokens`) with each row of `removed`
        (bool `[n_sets, n_edges]`) removed; edge sets beyond one chunk run in several passes."""
        removed = torch.as_tensor(removed)
        if removed.ndim == 1:
            removed = removed[None]
        if removed.dtype != torch.bool or removed.shape[-1] != len(self.graph):
            raise PatchingError(f"removed must be a bool [n_sets, {len(self.graph)}] mask of this model's edges, got "
                                f"{removed.dtype} {tuple(removed.shape)}")
        tokens = self.clean if tokens is None else tokens
        step = self._chunk()
        with torch.no_grad():
            return torch.cat([self._run(removed[i:i + step], tokens) for i in range(0, removed.shape[0], step)])

    def _run(self, removed: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        E, (N, P) = removed.shape[0], tokens.shape
        coef = torch.cat([removed, torch.zeros(E, 1, dtype=torch.bool)], 1)  # column −1: "no such edge"
        current = {}

        def correct(x, hook):
            senders, index = self.hooks[hook.name]
            if not senders:
                return x
            c = coef[:, index].to(device=x.device, dtype=x.dtype)  # [E, S, width]; index −1 → the appended zero column
            names = [self.sender_names[s] for s in senders]
            diff = torch.stack([self.ablated[n].to(x.dtype) - current[n].reshape(E, N, P, -1) for n in names], 1)
            # Σ_s c[e, s, h] · diff[e, s]: one batched product, [E, width, N·P·d_model]
            delta = torch.bmm(c.transpose(1, 2), diff.reshape(E, len(names), -1)).reshape(E, c.shape[2], N, P, -1)
            if x.ndim == 4:  # per-head inputs [rows, pos, head, d_model]
                return x + delta.permute(0, 2, 3, 1, 4).reshape(x.shape)
            return x + delta[:, 0].reshape(x.shape)

        hooks = self._sender_hooks(current) + [(name, correct) for name in self.hooks]
        with split_inputs(self.model):
            logits = self.model.run_with_hooks(tokens.repeat(E, 1), fwd_hooks=hooks)
        self.forwards += 1
        self.rows += E * N
        return logits.reshape(E, N, P, -1)

    def mask(self, edges) -> torch.Tensor:
        """A bool `[n_edges]` with True at `edges` (pairs `(sender, receiver)`)."""
        m = torch.zeros(len(self.graph), dtype=torch.bool)
        for e in edges:
            m[self.graph.index(e)] = True
        return m


def patch_edges(model, clean, corrupt, edges, ablation: str = "corrupt") -> torch.Tensor:
    """Logits `[batch, pos, d_vocab]` of `clean` with `edges` (pairs `(sender, receiver)`) removed: each receiver
    reads those senders' ablated outputs (module docstring)."""
    p = EdgePatcher(model, clean, corrupt, ablation)
    return p.run(p.mask(edges))[0]


def run_subgraph(model, clean, corrupt, edges, ablation: str = "corrupt") -> torch.Tensor:
    """Logits `[batch, pos, d_vocab]` of the subgraph `edges` alone: every other edge removed."""
    p = EdgePatcher(model, clean, corrupt, ablation)
    return p.run(~p.mask(edges))[0]


__all__ = ["ABLATIONS", "EdgePatcher", "patch_edges", "run_subgraph", "split_inputs"]

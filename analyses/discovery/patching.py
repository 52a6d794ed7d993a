"""Edge patching: run a model with a set of edges of its graph (`circuits.graph`) replaced by their ablated value,
many edge sets in one batched forward pass.

In a pre-norm model (a decoder-only model, or each stack of an encoder–decoder) each receiver's input is the
residual stream, the sum of every earlier sender's output (plus biases, the same in every run). Removing edge (s, r)
gives r the ablated output of s instead of its output in this run, and leaves every other reader of s alone (Conmy
et al. 2023, ACDC, §3; the AutoCircuit implementation):

    input_r = resid_r + Σ_{s : (s, r) removed} (ablated_s − current_s)

where `current_s` is s's output in this run (it differs from the clean run when edges upstream of s are removed: the
subgraph's own values flow along the kept edges) and `ablated_s` is s's output on the corrupted prompt ("corrupt",
the usual choice) or its mean over the clean prompts at each position ("mean"). The receiver inputs are
TransformerLens 2.x's per-head hook points `hook_q_input` / `hook_k_input` / `hook_v_input` (before ln1: patching an
edge into a normalised input happens before the norm), `hook_mlp_in` (before ln2) and, for the logits, the last
block's `hook_resid_post` (before the final norm); senders are `hook_embed`, `hook_pos_embed`, `attn.hook_result`
and `hook_mlp_out`. An encoder–decoder's senders and receivers are the same per stack (`hook_embed_src`,
`encoder.{l}.attn.hook_result`, ..., `decoder.{l}.cross_attn.hook_result`); its cross-attention reads through
`hook_cross_q_input` (decoder senders) and `hook_cross_k_input` / `hook_cross_v_input` (the encoder's final residual
stream before its final norm: every encoder sender), and the clean and corrupted runs differ in the source and share
the decoder input (`target`). Edge sets are stacked along the batch axis: rows `e·N … e·N + N − 1` run the N prompts
with the e-th edge set removed, and each receiver's correction is one batched product over (edge set, sender).

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
#: elements of the largest correction tensor one chunk of edge sets may build ([rows, pos, senders, d_model]): 16 MB
#: of float32. Larger chunks make tensors the C allocator maps fresh from the system on every pass (page faults):
#: at 2 ** 26 attn-only-2l's faithfulness curve took 7.4–9.1 s of CPU, at 2 ** 22 3.3–4.0 s (benchmarks/discovery.py)
CHUNK_ELEMENTS = 2 ** 22


#: a stack's prefix in node names → (its blocks' module name, the suffix of its embedding hooks)
STACKS = {"": ("blocks", ""), "enc": ("encoder", "_src"), "dec": ("decoder", "_tgt")}


def _configs(model) -> tuple:
    """The configs whose switches the model's blocks read: its own, or an encoder–decoder's two stacks'."""
    from models.arch.kind import ENCODER_DECODER, model_kind

    return (model.enc_cfg, model.dec_cfg) if model_kind(model) == ENCODER_DECODER else (model.cfg,)


@contextmanager
def split_inputs(model):
    """The model with per-head inputs, per-head outputs and the MLP-input hook switched on
    (`use_split_qkv_input`, `use_attn_result`, `use_hook_mlp_in`: the models' `set_use_*` switches, which act on
    both stacks of an encoder–decoder), restored afterwards."""
    cfg = _configs(model)[-1]
    names = ["use_split_qkv_input", "use_attn_result"] + ([] if cfg.attn_only else ["use_hook_mlp_in"])
    old = {n: getattr(cfg, n) for n in names}
    try:
        for n in names:
            getattr(model, f"set_{n}")(True)
        yield model
    finally:
        for n, v in old.items():
            getattr(model, f"set_{n}")(v)


def sender_hook(node, n_layers: int) -> tuple[str, int | None]:
    """`(hook name, head or None)` where sender `node` (`circuits.graph.Node`) writes: `hook_embed` /
    `hook_pos_embed` (an encoder–decoder's `hook_embed_src` / `_tgt`, ...), a head's slice of `attn.hook_result`
    (cross-attention: `cross_attn.hook_result`), `hook_mlp_out`. `n_layers`: the node's stack's layers."""
    blocks, suffix = STACKS[node.stack]
    if node.part in ("embed", "pos_embed"):
        return f"hook_{node.part}{suffix}", None
    if node.part == "head":
        return f"{blocks}.{node.layer}.attn.hook_result", node.head
    if node.part == "xhead":
        return f"{blocks}.{node.layer}.cross_attn.hook_result", node.head
    return f"{blocks}.{node.layer}.hook_mlp_out", None


def receiver_hook(node, n_layers: int) -> tuple[str, int | None]:
    """`(hook name, head or None)` where receiver `node` reads, before any norm: a head's slice of
    `hook_{q,k,v}_input` (cross-attention: `hook_cross_{q,k,v}_input`), `hook_mlp_in`, and for the logits the last
    block's `hook_resid_post`."""
    blocks, _ = STACKS[node.stack]
    if node.part in ("q", "k", "v"):
        return f"{blocks}.{node.layer}.hook_{node.part}_input", node.head
    if node.part in ("xq", "xk", "xv"):
        return f"{blocks}.{node.layer}.hook_cross_{node.part[1]}_input", node.head
    if node.part == "mlp":
        return f"{blocks}.{node.layer}.hook_mlp_in", None
    return f"{blocks}.{n_layers - 1}.hook_resid_post", None


def _check_model(model) -> str:
    from models.arch.kind import DECODER, ENCODER_DECODER, model_kind

    kind = model_kind(model)
    if kind not in (DECODER, ENCODER_DECODER):
        raise PatchingError(f"edge patching serves decoder-only and encoder–decoder models; this one is "
                            f"{kind.replace('_', '–')}")
    if kind == DECODER:
        prepare(model)
    else:
        model.eval()
    for cfg in _configs(model):
        if cfg.n_key_value_heads != cfg.n_heads:
            raise PatchingError("edge patching needs one key/value head per query head (grouped-query attention "
                                "shares a key/value input between heads, so a per-head K or V edge is undefined)")
    return kind


def _source_pair(model, clean, corrupt, target):
    """An encoder–decoder's clean and corrupted sources and the decoder input they share, checked."""
    from models.errors import ToyCircuitsError

    if target is None:
        raise PatchingError("an encoder–decoder's edge patching needs the decoder input (target) the clean and "
                            "corrupted sources share")
    try:
        c, x = model.validate_src(clean)[0], model.validate_src(corrupt)[0]
        t = model.validate_tgt(target)[0]
    except ToyCircuitsError as e:
        raise PatchingError(str(e)) from None
    if c.shape != x.shape:
        raise PatchingError(f"clean and corrupt sources must have the same shape (activations are patched position by "
                            f"position): {tuple(c.shape)} vs {tuple(x.shape)}")
    if t.shape[0] != c.shape[0]:
        raise PatchingError(f"the target has {t.shape[0]} rows but the sources have {c.shape[0]}")
    return c, x, t


class EdgePatcher:
    """Edge patching of one model on clean/corrupted prompt pairs (see the module docstring).

    `run(removed)` takes a bool `[n_sets, n_edges]` (True: the edge is removed) and returns the logits
    `[n_sets, batch, pos, d_vocab]`; `forwards` / `backwards` count the model's forward and backward passes (the
    methods add theirs) and `rows` the prompt rows the forward passes ran. An encoder–decoder takes clean and
    corrupted sources and `target`, the decoder input both runs share."""

    def __init__(self, model, clean, corrupt, ablation: str = "corrupt", graph: EdgeGraph | None = None,
                 target=None):
        from models.arch.kind import ENCODER_DECODER

        kind = _check_model(model)
        if ablation not in ABLATIONS:
            raise PatchingError(f"unknown ablation {ablation!r}; allowed: {', '.join(ABLATIONS)}")
        self.model, self.ablation = model, ablation
        if kind == ENCODER_DECODER:
            self.clean, self.corrupt, self.target = _source_pair(model, clean, corrupt, target)
            self.layers = {"enc": model.enc_cfg.n_layers, "dec": model.dec_cfg.n_layers}
            positions = model.enc_cfg.positions
        else:
            self.clean, self.corrupt = token_pair(model, clean, corrupt)
            self.target = None
            self.layers = {"": model.cfg.n_layers}
            positions = model.cfg.positions
        self.graph = edge_graph(model) if graph is None else graph
        self.query_key_positions = bool(positions.table) and positions.adds_to == "query_key"
        self.forwards = self.backwards = self.rows = 0
        self._layout()
        with torch.no_grad():
            ablated = self.sender_outputs(self.corrupt if ablation == "corrupt" else self.clean)
        if ablation == "mean":
            ablated = {k: v.mean(0, keepdim=True).expand_as(v) for k, v in ablated.items()}
        self.ablated = ablated  # sender name → [batch, pos, d_model]

    def inputs(self, tokens: torch.Tensor, copies: int = 1) -> tuple:
        """The model's positional arguments for `copies` copies of the prompts `tokens` (an encoder–decoder's
        sources, with the shared decoder input)."""
        if self.target is None:
            return (tokens.repeat(copies, 1),)
        return tokens.repeat(copies, 1), self.target.repeat(copies, 1)

    # --- where each sender and receiver lives --------------------------------------------------------------------
    def _layout(self):
        """Per receiver hook: the senders it reads (as indices into `self.sender_names`) and the edge index of
        each (sender, receiver-in-hook) pair (−1: no such edge); per sender hook, the senders it records."""
        g, H = self.graph, self.model.cfg.n_heads
        carried = [s for s in g.senders if not (s.part == "pos_embed" and self.query_key_positions)]
        self.sender_names = [s.name for s in carried]
        pos = {n: i for i, n in enumerate(self.sender_names)}
        self.sender_hooks = {}  # hook name → [(sender name, head or None)]
        for s in carried:
            hook, head = sender_hook(s, self.layers[s.stack])
            self.sender_hooks.setdefault(hook, []).append((s.name, head))
        #: (hook, sender name) of each token embedding (EAP-IG interpolates there)
        self.embed_hooks = [(sender_hook(s, 0)[0], s.name) for s in carried if s.part == "embed"]
        self.hooks = {}  # hook name → (sender indices [S], edge index [S, heads or 1])
        groups = {}
        for r in g.receivers:
            hook, head = receiver_hook(r, self.layers[r.stack])
            groups.setdefault((hook, H if head is not None else 1), {})[0 if head is None else head] = r.name
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
        def record(x, hook):
            for name, head in self.sender_hooks[hook.name]:
                store[name] = x if head is None else x[:, :, head]

        return [(hook, record) for hook in self.sender_hooks]

    def sender_outputs(self, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
        """Every sender's output on `tokens` (one forward pass), name → `[batch, pos, d_model]`."""
        store = {}
        with split_inputs(self.model):
            self.model.run_with_hooks(*self.inputs(tokens), fwd_hooks=self._sender_hooks(store))
        self.forwards += 1
        self.rows += tokens.shape[0]
        return {k: v.detach().clone() for k, v in store.items()}

    # --- the patched run ---------------------------------------------------------------------------------------
    def _chunk(self) -> int:
        N, P = self.clean.shape[0], max(self.clean.shape[1], 0 if self.target is None else self.target.shape[1])
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
        E, N = removed.shape[0], tokens.shape[0]
        coef = torch.cat([removed, torch.zeros(E, 1, dtype=torch.bool)], 1)  # column −1: "no such edge"
        current = {}

        def correct(x, hook):
            senders, index = self.hooks[hook.name]
            if not senders:
                return x
            c = coef[:, index].to(device=x.device, dtype=x.dtype)  # [E, S, width]; index −1 → the appended zero column
            names = [self.sender_names[s] for s in senders]
            diff = torch.stack([self.ablated[n].to(x.dtype) - current[n].reshape(E, *self.ablated[n].shape)
                                for n in names], 1)  # [E, S, N, P, d_model], P the positions of this hook's stream
            P = diff.shape[3]
            # Σ_s c[e, s, h] · diff[e, s]: one batched product, [E, width, N·P·d_model]
            delta = torch.bmm(c.transpose(1, 2), diff.reshape(E, len(names), -1)).reshape(E, c.shape[2], N, P, -1)
            if x.ndim == 4:  # per-head inputs [rows, pos, head, d_model]
                return x + delta.permute(0, 2, 3, 1, 4).reshape(x.shape)
            return x + delta[:, 0].reshape(x.shape)

        hooks = self._sender_hooks(current) + [(name, correct) for name in self.hooks]
        with split_inputs(self.model):
            logits = self.model.run_with_hooks(*self.inputs(tokens, E), fwd_hooks=hooks)
        self.forwards += 1
        self.rows += E * N
        return logits.reshape(E, N, *logits.shape[1:])

    def mask(self, edges) -> torch.Tensor:
        """A bool `[n_edges]` with True at `edges` (pairs `(sender, receiver)`)."""
        m = torch.zeros(len(self.graph), dtype=torch.bool)
        for e in edges:
            m[self.graph.index(e)] = True
        return m


def patch_edges(model, clean, corrupt, edges, ablation: str = "corrupt", target=None) -> torch.Tensor:
    """Logits `[batch, pos, d_vocab]` of `clean` with `edges` (pairs `(sender, receiver)`) removed: each receiver
    reads those senders' ablated outputs (module docstring). An encoder–decoder: `clean`, `corrupt` are sources and
    `target` the decoder input."""
    p = EdgePatcher(model, clean, corrupt, ablation, target=target)
    return p.run(p.mask(edges))[0]


def run_subgraph(model, clean, corrupt, edges, ablation: str = "corrupt", target=None) -> torch.Tensor:
    """Logits `[batch, pos, d_vocab]` of the subgraph `edges` alone: every other edge removed."""
    p = EdgePatcher(model, clean, corrupt, ablation, target=target)
    return p.run(~p.mask(edges))[0]


__all__ = ["ABLATIONS", "EdgePatcher", "STACKS", "patch_edges", "receiver_hook", "run_subgraph", "sender_hook",
           "split_inputs"]

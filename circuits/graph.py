"""The edge graph of a model: the nodes that write to and read from the residual stream, and the edges between them.

Elhage et al. (2021, "A Mathematical Framework for Transformer Circuits") read a pre-norm residual stream as the sum
of what every component writes to it, so each component's input is a sum over the earlier components' outputs; an
edge is one term of that sum. The node grammar follows ACDC (Conmy et al. 2023) and AutoCircuit:

- senders (they write): `embed` (the token embedding), `pos_embed` (the positional embedding, where the model has a
  table), `L{l}H{h}` (a head's output), `L{l}.mlp` (an MLP's output);
- receivers (they read): `L{l}H{h}.q`, `L{l}H{h}.k`, `L{l}H{h}.v` (a head's query, key and value inputs, apart),
  `L{l}.mlp` (an MLP's input), `logits` (the final residual stream, before the final norm).

An edge `(sender, receiver)` exists when the sender writes before the receiver reads. Positions that are added after
the norm to queries and keys only (Shortformer: `adds_to == "query_key"`) make `pos_embed` a sender of q and k
inputs alone. Encoder–decoders prefix their nodes `enc.` and `dec.`; a decoder layer's cross-attention heads write
as `dec.L{l}XH{h}` and read through `dec.L{l}H{h}.xq` (decoder senders) and `.xk` / `.xv` (every encoder sender:
the memory is the encoder's final residual stream). Works from `cfg` alone, on any model `circuits` reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from models.arch.kind import DECODER, ENCODER, ENCODER_DECODER, model_kind
from models.errors import ToyCircuitsError


class GraphError(ToyCircuitsError, ValueError):
    """An edge the graph lacks, or a model whose residual stream is not a sum of its components' outputs."""


#: the receivers of a head, in the order the graph lists them
QKV = ("q", "k", "v")


@dataclass(frozen=True)
class Node:
    """One node. `stage` orders the forward pass (a sender feeds a receiver of a later stage); `layer` is None for
    the embeddings and the logits; `head` is None but for heads; `part` is "q"/"k"/"v"/"xq"/"xk"/"xv" for a head's
    inputs, "mlp" for MLPs, the node's own name otherwise; `stack` is "", "enc" or "dec"."""

    name: str
    stage: int
    layer: int | None = None
    head: int | None = None
    part: str = ""
    stack: str = ""


@dataclass
class EdgeGraph:
    """`senders` and `receivers` (in forward order) and `edges`: every `(sender, receiver)` name pair, grouped by
    receiver in forward order, senders in forward order within a receiver."""

    senders: list[Node]
    receivers: list[Node]
    edges: list[tuple[str, str]]
    _index: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        self._index = {e: i for i, e in enumerate(self.edges)}
        self._senders = {n.name: n for n in self.senders}
        self._receivers = {n.name: n for n in self.receivers}

    def __len__(self) -> int:
        return len(self.edges)

    def index(self, edge: tuple[str, str]) -> int:
        """The position of `edge` in `edges`; `GraphError` naming it when the graph has no such edge."""
        try:
            return self._index[tuple(edge)]
        except (KeyError, TypeError):
            raise GraphError(f"no edge {edge!r} in this model's graph (an edge is (sender, receiver), e.g. "
                                f"{self.edges[0]!r})") from None

    def has(self, edge: tuple[str, str]) -> bool:
        """Whether `edge` (sender, receiver) is in the graph."""
        return tuple(edge) in self._index

    def sender(self, name: str) -> Node:
        return self._senders[name]

    def receiver(self, name: str) -> Node:
        return self._receivers[name]

    def incoming(self, receiver: str) -> list[int]:
        """Indices of the edges into `receiver`, in forward order of their senders."""
        return [i for i, (_, r) in enumerate(self.edges) if r == receiver]

    def sizes(self) -> dict[str, int]:
        """`{"senders", "receivers", "edges"}` counts."""
        return {"senders": len(self.senders), "receivers": len(self.receivers), "edges": len(self.edges)}


def _decoder_nodes(cfg, prefix: str = "", stage0: int = 0, logits: bool = True, cross: bool = False):
    """Senders and receivers of one stack of blocks (a decoder-only model, or an encoder–decoder's encoder or decoder).
    Stages: embeddings 0; layer l's attention inputs and heads 3l+1 (cross-attention 3l+2); its MLP 3l+3."""
    p = prefix
    stack = prefix.rstrip(".")
    L, H = cfg.n_layers, cfg.n_heads
    positions = cfg.positions
    senders = [Node(f"{p}embed", stage0, part="embed", stack=stack)]
    if positions.table:
        senders.append(Node(f"{p}pos_embed", stage0, part="pos_embed", stack=stack))
    receivers = []
    for layer in range(L):
        s = stage0 + 3 * layer + 1
        receivers += [Node(f"{p}L{layer}H{h}.{c}", s, layer, h, c, stack) for h in range(H) for c in QKV]
        senders += [Node(f"{p}L{layer}H{h}", s, layer, h, "head", stack) for h in range(H)]
        if cross:
            receivers += [Node(f"{p}L{layer}H{h}.x{c}", s + 1, layer, h, "x" + c, stack) for h in range(H)
                          for c in QKV]
            senders += [Node(f"{p}L{layer}XH{h}", s + 1, layer, h, "xhead", stack) for h in range(H)]
        if not cfg.attn_only:
            # a parallel block's MLP reads the block input, beside the heads: the same stage as the heads
            m = s if getattr(cfg, "parallel_attn_mlp", False) else s + 2
            receivers.append(Node(f"{p}L{layer}.mlp", m, layer, None, "mlp", stack))
            senders.append(Node(f"{p}L{layer}.mlp", m, layer, None, "mlp", stack))
    if logits:
        receivers.append(Node(f"{p}logits", stage0 + 3 * L + 1, part="logits", stack=stack))
    return senders, receivers


def _reads(sender: Node, receiver: Node, query_key_positions: bool) -> bool:
    """Whether `receiver` reads `sender` in one stack: an earlier stage, and positions added after the norm reach
    only the query and key inputs."""
    if sender.part == "pos_embed" and query_key_positions:
        return receiver.part in ("q", "k")
    if receiver.part in ("xk", "xv"):  # a cross-attention's keys and values read the encoder alone
        return False
    return sender.stage < receiver.stage


def _edges(senders, receivers, query_key_positions: bool) -> list[tuple[str, str]]:
    return [(s.name, r.name) for r in receivers for s in senders if _reads(s, r, query_key_positions)]


def _check_served(cfg, what: str) -> None:
    if getattr(cfg, "normalization_position", "pre") != "pre":
        raise GraphError(f"{what}: the edge graph needs a pre-norm residual stream (a sum of the components' "
                            "outputs); this model normalises after each sublayer (normalization_position='post')")


def edge_graph(model) -> EdgeGraph:
    """The edge graph of `model` (a decoder-only model, an encoder or an encoder–decoder; see the module
    docstring). `GraphError` for a post-norm model, whose residual stream is not a sum of outputs."""
    kind = model_kind(model)
    cfg = model.cfg
    if kind in (DECODER, ENCODER):
        _check_served(cfg, "edge_graph")
        senders, receivers = _decoder_nodes(cfg)
        qk = bool(cfg.positions.table) and cfg.positions.adds_to == "query_key"
        return EdgeGraph(senders, receivers, _edges(senders, receivers, qk))
    if kind != ENCODER_DECODER:  # pragma: no cover - model_kind knows three kinds
        raise GraphError(f"edge_graph does not serve models of kind {kind!r}")
    enc, dec = model.enc_cfg, model.dec_cfg
    _check_served(enc, "edge_graph")
    es, er = _decoder_nodes(enc, "enc.", logits=False)
    ds, dr = _decoder_nodes(dec, "dec.", stage0=3 * enc.n_layers + 1, cross=True)  # after the whole encoder
    qk = bool(enc.positions.table) and enc.positions.adds_to == "query_key"
    edges = _edges(es, er, qk)
    for r in dr:
        if r.part in ("xk", "xv"):
            edges += [(s.name, r.name) for s in es if not (s.part == "pos_embed" and qk)]
        else:
            edges += [(s.name, r.name) for s in ds if _reads(s, r, qk)]
    return EdgeGraph(es + ds, er + dr, edges)


__all__ = ["GraphError", "Node", "EdgeGraph", "edge_graph", "QKV"]

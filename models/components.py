"""`models.components`: TransformerLens 2.x's `transformer_lens.components` under our name, for the layers this
toolkit has (`from transformer_lens.components import LayerNorm` becomes `from models.components import LayerNorm`).

Same constructors as 2.18 (`LayerNorm(cfg, length=None)`, `RMSNorm(cfg, length=None)`, `LayerNormPre(cfg)`,
`RMSNormPre(cfg)`, `Embed(cfg)`, `PosEmbed(cfg)`, `Unembed(cfg)`, `MLP(cfg)`, `GatedMLP(cfg)`,
`TransformerBlock(cfg, block_index)`) and, for the norms, embeddings, unembedding and MLPs, the same `forward`
(tests/tl2/test_legacy_init.py checks them against 2.18 on the same weights). `Attention` (and
`GroupedQueryAttention`, the same class: grouped when `cfg.n_key_value_heads < cfg.n_heads`) takes
`Attention(cfg, layer)` and `TransformerBlock.forward(resid, side)` a `BlockInputs`: their forwards are ours
(docs/coming-from-transformerlens.md). Not here: 2.18's BERT and T5 parts, `MoE`, `TokenTypeEmbed`."""

from models.arch.attention import Attention
from models.arch.components import (  # noqa: F401
    MLP,
    BlockInputs,
    Embed,
    GatedMLP,
    LayerNorm,
    LayerNormPre,
    Norm,
    PosEmbed,
    RMSNorm,
    RMSNormPre,
    TransformerBlock,
    Unembed,
)

GroupedQueryAttention = Attention  # one class: grouped-query when n_key_value_heads < n_heads

__all__ = ["MLP", "Attention", "BlockInputs", "Embed", "GatedMLP", "GroupedQueryAttention", "LayerNorm",
           "LayerNormPre", "Norm", "PosEmbed", "RMSNorm", "RMSNormPre", "TransformerBlock", "Unembed"]

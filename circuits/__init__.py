"""Weight-space math of "A Mathematical Framework for Transformer Circuits" (Elhage et al. 2021), factored and exact.

Works on any model exposing the weight properties and `cfg` (see `circuits.interface`): our
`models.HookedTransformer` or a TransformerLens bridge from `models.to_transformer_lens(model)`.

- circuits (FactoredMatrix): `qk_circuit`, `ov_circuit`, `full_qk_circuit`, `full_ov_circuit`,
  `k_composition_circuit`; norms: `fold_layer_norm`
- spectra: `eigenvalues`, `copying_score`, `positive_eigenvalue_fraction`, `copying_scores`, `diagonal_rank_stats`
- composition: `composition_score`, `composition_scores`, `composition_baseline`
- tensor products and paths: `TensorProduct`, `path_expansion`, `attention_score_decomposition`, `term_importance`
- the edge graph (nodes and edges for circuit discovery): `edge_graph`, `EdgeGraph`, `Node`
- encoder–decoder models: `cross_qk_circuit`, `cross_ov_circuit`, `full_cross_qk_circuit`, `full_cross_ov_circuit`,
  `cross_copying_scores`, `cross_attention_map` (`A_cross ⊗ W_OV`), `stack_view`, `encdec_path_expansion`
- argument checks shared with `analyses`: `circuits.checks`; hand-built test model: `circuits.testing`

The names below load on first use (`models.lazy`), so importing `circuits` is cheap until one is used.
"""

from typing import TYPE_CHECKING

from models.lazy import lazy_exports

if TYPE_CHECKING:
    from .composition import composition_baseline, composition_score, composition_scores
    from .cross_attention import (
        StackView,
        cross_attention_map,
        cross_copying_scores,
        cross_diagonal_accuracy,
        cross_ov_circuit,
        cross_qk_circuit,
        full_cross_ov_circuit,
        full_cross_qk_circuit,
        stack_view,
    )
    from .diagonal import diagonal_rank_stats
    from .eigen import copying_score, copying_scores, eigenvalues, positive_eigenvalue_fraction
    from .encdec_paths import encdec_path_expansion
    from .factored import (
        PositionalQK,
        full_ov_circuit,
        full_qk_circuit,
        k_composition_circuit,
        ov_circuit,
        qk_circuit,
    )
    from .fold import fold_layer_norm
    from .frozen import FrozenForward, frozen_forward
    from .graph import EdgeGraph, GraphError, Node, edge_graph
    from .importance import TermImportance, term_importance
    from .paths import PathExpansion, path_expansion, term_name
    from .score_decomposition import ScoreDecomposition, attention_score_decomposition
    from .tensor_product import TensorProduct

__all__, __getattr__, __dir__ = lazy_exports(__name__, __file__)

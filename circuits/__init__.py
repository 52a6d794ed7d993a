"""Weight-space math of "A Mathematical Framework for Transformer Circuits" (Elhage et al. 2021), factored and exact.

Works on any model exposing the weight properties and `cfg` (see `circuits.interface`): our
`models.HookedTransformer` or a TransformerLens bridge from `models.to_transformer_lens(model)`.

- circuits (FactoredMatrix): `qk_circuit`, `ov_circuit`, `full_qk_circuit`, `full_ov_circuit`,
  `k_composition_circuit`; norms: `fold_layer_norm`
- spectra: `eigenvalues`, `copying_score`, `positive_eigenvalue_fraction`, `copying_scores`, `diagonal_rank_stats`
- composition: `composition_score`, `composition_scores`, `composition_baseline`
- tensor products and paths: `TensorProduct`, `path_expansion`, `attention_score_decomposition`, `term_importance`
- hand-built test model: `circuits.testing.build_induction_model`

Attributes load lazily, so importing `circuits` is cheap until one is used.
"""

from importlib import import_module

_EXPORTS = {
    "qk_circuit": "factored",
    "ov_circuit": "factored",
    "full_qk_circuit": "factored",
    "full_ov_circuit": "factored",
    "k_composition_circuit": "factored",
    "PositionalQK": "factored",
    "fold_layer_norm": "fold",
    "eigenvalues": "eigen",
    "copying_score": "eigen",
    "copying_scores": "eigen",
    "positive_eigenvalue_fraction": "eigen",
    "diagonal_rank_stats": "diagonal",
    "composition_score": "composition",
    "composition_scores": "composition",
    "composition_baseline": "composition",
    "TensorProduct": "tensor_product",
    "path_expansion": "paths",
    "PathExpansion": "paths",
    "term_name": "paths",
    "attention_score_decomposition": "scores",
    "ScoreDecomposition": "scores",
    "term_importance": "importance",
    "TermImportance": "importance",
    "frozen_forward": "frozen",
    "FrozenForward": "frozen",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        value = getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'circuits' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))

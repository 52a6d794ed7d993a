"""Analyses of toy transformers: head scores, induction/copying detection, zero/one/two-layer studies,
training dynamics, causal interventions (`analyses.patching`), reports with figures, and the `circuits` command line.

Attributes are imported lazily (module `__getattr__`), so `import analyses.cli` and `circuits --help`
stay fast and do not import torch.
"""

from importlib import import_module

_EXPORTS = {
    # behavioural scores
    "attention_patterns": "scores",
    "induction_scores": "scores",
    "prefix_matching_scores": "scores",
    "previous_token_scores": "scores",
    "current_token_scores": "scores",
    "first_token_scores": "scores",
    "duplicate_token_scores": "scores",
    "copying_scores_behavioural": "scores",
    "in_context_learning_score": "scores",
    "in_context_learning_differences": "scores",
    "icl_positions": "scores",
    "icl_windows": "scores",
    "position_losses": "scores",
    # probe sequences
    "random_tokens": "sequences",
    "repeated_tokens": "sequences",
    # detection
    "detect_induction_heads": "detect",
    "detect_previous_token_heads": "detect",
    "DetectionResult": "detect",
    # studies
    "zero_layer_study": "zero_layer",
    "bigram_table": "zero_layer",
    "direct_path_fit": "zero_layer",
    "skip_trigrams": "one_layer",
    "skip_trigram_bugs": "one_layer",
    "copying_heads_table": "one_layer",
    "positional_vs_content": "one_layer",
    "head_ablation_losses": "one_layer",
    "ablated_position_losses": "one_layer",
    "composition_study": "two_layer",
    "find_induction_circuit": "two_layer",
    "virtual_head_importance": "two_layer",
    "term_importance_by_order": "two_layer",
    "training_dynamics": "dynamics",
    # causal interventions (analyses.patching holds the metrics, results and figures too)
    "activation_patching": "patching",
    "path_patching": "patching",
    "path_patching_matrix": "patching",
    "attribution_patching": "patching",
    "direct_logit_attribution": "patching",
    "logit_lens": "patching",
    "ablate_heads": "patching",
    # reports
    "build_report": "report",
    "Report": "report",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module 'analyses' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))


class _Package(type(import_module("sys"))):
    """`analyses.skip_trigrams` is the function, although a submodule has the same name: importing the submodule
    sets the package attribute to the module, which would shadow the lazy export (then `analyses.skip_trigrams(...)`
    fails with "'module' object is not callable"). A data descriptor on the module's class wins over that."""

    @property
    def skip_trigrams(self):
        return import_module(".skip_trigrams", __name__).skip_trigrams

    @skip_trigrams.setter
    def skip_trigrams(self, value):  # the import system's setattr(package, "skip_trigrams", submodule)
        pass


import sys as _sys  # noqa: E402

_sys.modules[__name__].__class__ = _Package

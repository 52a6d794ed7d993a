"""Analyses of toy transformers: head scores, induction/copying detection, zero/one/two-layer studies,
training dynamics, causal interventions (`analyses.patching`), reports with figures, and the `circuits` command line
(`analyses.cli`).

The names below load on first use (`models.lazy`), so `import analyses.cli` and `circuits --help` stay fast and do
not import torch.
"""

from typing import TYPE_CHECKING

from models.lazy import lazy_exports

if TYPE_CHECKING:
    from .detect import DetectionResult, detect_induction_heads, detect_previous_token_heads
    from .dynamics import training_dynamics
    from .one_layer import (
        ablated_position_losses,
        copying_heads_table,
        head_ablation_losses,
        positional_vs_content,
    )
    from .patching.ablation import ablate_heads  # causal interventions (analyses.patching: metrics, results, figures)
    from .patching.activation import activation_patching
    from .patching.attribution import attribution_patching
    from .patching.lens import direct_logit_attribution, logit_lens
    from .patching.paths import path_patching, path_patching_matrix
    from .report.build import Report, build_report
    from .scores import (  # behavioural head scores and the in-context-learning score
        arena_induction_scores,
        attention_patterns,
        copying_scores_behavioural,
        current_token_scores,
        duplicate_token_scores,
        first_token_scores,
        icl_positions,
        icl_windows,
        in_context_learning_differences,
        in_context_learning_score,
        induction_scores,
        position_losses,
        prefix_matching_scores,
        previous_token_scores,
    )
    from .sequences import random_tokens, repeated_tokens
    from .trigrams import skip_trigram_bugs, skip_trigrams
    from .two_layer import composition_study, find_induction_circuit, term_importance_by_order, virtual_head_importance
    from .zero_layer import bigram_table, direct_path_fit, zero_layer_study

__all__, __getattr__, __dir__ = lazy_exports(__name__, __file__)

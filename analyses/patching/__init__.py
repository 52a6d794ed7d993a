"""Causal interventions as library calls, on our `models.HookedTransformer` and on a TransformerLens 4.x bridge.

What comes from TransformerLens 4.3 and what is written here:

- metrics (`answers`, `next_token_answers`, `metric`: `logit_diff`, `loss`, `prob`; `normalized`): written here,
  TransformerLens ships none;
- activation patching (`activation_patching`): TransformerLens' `transformer_lens.patching.get_act_patch_*` sweeps;
  added: the noising direction, input checks, the unpatched baselines and a labelled `PatchResult`;
- path patching (`path_patching`, `path_patching_matrix`): written here; TransformerLens' `get_act_patch_direct_path`
  needs split Q/K/V input hooks, which our model and TransformerLens' native bridge lack;
- attribution patching (`attribution_patching`): gradients from TransformerLens' `cache_activation_and_gradient`;
  the estimate for every patching kind and the comparison with exact patching written here;
- direct logit attribution (`direct_logit_attribution`) and the logit lens (`logit_lens`): TransformerLens'
  `tools.analysis` functions (norm weights folded first on our models);
- ablations (`ablate_heads`: zero, mean, resample; pattern-preserving): written here, the pattern freezing is
  `analyses.one_layer`'s;
- figures (`plot_patching`, `plot_attribution`, `plot_dla`, `plot_logit_lens`): written here.

Conventions: clean and corrupted prompts have the same length; a metric maps logits `[batch, pos, d_vocab]` to one
value per prompt `[batch]`; "denoising" runs the corrupted prompt with clean activations patched in, "noising" the
reverse; shares are fractions of the clean−corrupted metric difference. Every tool puts the model in eval mode
(TransformerLens' patching requires it). Heads are addressed by `Head` (layer, head and the attention module's hook
prefix, so cross-attention heads can be added without changing the tools). Bad input raises `PatchingError`.
"""

from .ablation import Ablation, ablate_heads
from .activation import HEAD_KINDS, KINDS, activation_patching
from .attribution import AttributionResult, attribution_patching, linear_estimate
from .inputs import Head, PatchingError
from .lens import LensResult, direct_logit_attribution, logit_lens
from .metrics import (
    METRICS,
    Answers,
    Metric,
    answer_loss,
    answer_probability,
    answers,
    logit_difference,
    metric,
    next_token_answers,
    normalized,
)
from .paths import COMPONENTS, PathBaselines, path_baselines, path_patching, path_patching_matrix
from .plots import plot_attribution, plot_dla, plot_logit_lens, plot_patching
from .result import PatchResult

__all__ = [
    "Ablation", "ablate_heads", "HEAD_KINDS", "KINDS", "activation_patching", "AttributionResult",
    "attribution_patching", "linear_estimate", "Head", "PatchingError", "LensResult", "direct_logit_attribution",
    "logit_lens", "METRICS", "Answers", "Metric", "answer_loss", "answer_probability", "answers", "logit_difference",
    "metric", "next_token_answers", "normalized", "COMPONENTS", "path_patching", "path_patching_matrix",
    "path_baselines", "PathBaselines",
    "plot_attribution", "plot_dla", "plot_logit_lens", "plot_patching", "PatchResult",
]

"""Sparse autoencoders through SAELens (optional: `pip install sae-lens`), the names users call in one place:
`with_saes`, `load_sae`, `save_sae`, `hook_width`, `activations`, `zoo_sae`, `zoo_saes` (the adapter and the
zoo's SAEs, `models.io.sae`), and `train_sae`,
`ActivationSource`, `text_windows`, `Trained` (training, `models.training.sae`). The measures are
`analyses.sae_metrics` (`fvu`, `feature_stats`, `sae_losses`), the report `analyses.sae_report`."""

from __future__ import annotations

from .io.sae import (  # noqa: F401  (the public names)
    SAE_LENS_VERSION,
    TRAINING_FILE,
    activations,
    check_model,
    hook_width,
    load_sae,
    sae_lens,
    save_sae,
    with_saes,
    zoo_sae,
    zoo_saes,
)
from .training.sae import ActivationSource, Trained, text_windows, train_sae  # noqa: F401  (the public names)

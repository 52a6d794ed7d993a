"""Hookable toy transformers: config, model, positional schemes, tokenizers, data, training, checkpoints and the
model zoo. The names below load on first use (`models.lazy`), so `circuits --help` answers without importing torch.

TransformerLens 2.x's module paths are files of this package: `models.utils`, `models.hook_points`,
`models.patching`, `models.past_key_value_caching`, `models.evals` (`import transformer_lens.utils as utils` becomes
`import models.utils as utils`).
"""

from typing import TYPE_CHECKING

from .arch.persist import save  # bound now, not on first use: nnsight 0.8 gives every object a `save` method
from .lazy import lazy_exports

if TYPE_CHECKING:
    from .arch.config import HookedTransformerConfig
    from .arch.encoder import EncoderConfig, HookedEncoder
    from .arch.encoder_decoder import HookedEncoderDecoder
    from .arch.encoder_decoder_config import EncoderDecoderConfig
    from .arch.kind import model_kind
    from .arch.model import HookedTransformer, head_label, lm_cross_entropy
    from .arch.persist import save
    from .arch.tl_compat import ActivationCache, FactoredMatrix
    from .errors import (
        CheckpointError,
        ConfigError,
        CorpusError,
        DiskFullError,
        FolderError,
        InputError,
        TokenizerError,
        TokenNotFoundError,
        ToyCircuitsError,
        TrainConfigError,
        UnsupportedByTransformerLens,
        WeightProcessingError,
    )
    from .generation.kv_cache import HookedTransformerKeyValueCache, HookedTransformerKeyValueCacheEntry
    from .io.checkpoint import load
    from .io.interop import from_transformer_lens_state_dict, to_transformer_lens

__all__, __getattr__, __dir__ = lazy_exports(__name__, __file__)

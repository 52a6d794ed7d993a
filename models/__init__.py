"""Hookable toy transformers: config, model, positional schemes, tokenizers, data, training, checkpoints and the
model zoo. The names below load on first use (`models.lazy`), so `circuits --help` answers without importing torch."""

import os
from typing import TYPE_CHECKING

from .deferred_import import TRANSFORMER_LENS, defer_package_inits
from .lazy import lazy_exports

# The module paths TransformerLens 2.x code imports (`transformer_lens.utils`, `.hook_points`, `.patching`,
# `.past_key_value_caching`, `.evals`) are files of models/tl_paths/, imported as `models.utils`, `models.hook_points`,
# …: that folder (no __init__.py) is on this package's search path, so changing the package name is the whole
# migration.
__path__.append(os.path.join(os.path.dirname(__file__), "tl_paths"))

# TransformerLens' package `__init__` imports transformers, datasets, pandas and pyarrow, none of which we use: its
# classes load without it, the `__init__` running only if something asks for a name it alone makes
# (`models.deferred_import`; TOY_CIRCUITS_EAGER_IMPORTS=1 turns this off).
defer_package_inits(TRANSFORMER_LENS)

if TYPE_CHECKING:
    from .arch.config import HookedTransformerConfig
    from .arch.encoder import EncoderConfig, HookedEncoder
    from .arch.encoder_decoder import HookedEncoderDecoder
    from .arch.encoder_decoder_config import EncoderDecoderConfig
    from .arch.kind import model_kind
    from .arch.model import HookedTransformer, head_label, lm_cross_entropy
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
    from .io.checkpoint import load, save
    from .io.interop import from_transformer_lens_state_dict, to_transformer_lens

__all__, __getattr__, __dir__ = lazy_exports(__name__, __file__)

"""`models.past_key_value_caching`: TransformerLens 2.x's `transformer_lens.past_key_value_caching` path for the
key/value cache our models decode with (`models.generation.kv_cache`)."""

from models.generation.kv_cache import HookedTransformerKeyValueCache, HookedTransformerKeyValueCacheEntry  # noqa: F401

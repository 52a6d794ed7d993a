"""Training presets of the shipped model zoo: `circuits train --preset NAME --out DIR` reproduces `models/zoo/NAME`.

Each preset is a model config (attention-only models as in the papers: shortformer positions, no LayerNorm,
no biases) and a `TrainConfig` for the Python standard-library corpus with a 2048-id byte-level BPE.
"""

from __future__ import annotations

from .config import HookedTransformerConfig
from .train import TrainConfig

_ATTN_ONLY = dict(d_model=128, n_ctx=256, d_vocab=2048, d_mlp=None, attn_only=True, normalization_type=None,
                  positional_embedding_type="shortformer", use_bias=False, init_range=0.02)
_TRAIN = dict(batch_size=32, lr=2e-2, warmup_steps=50, weight_decay=0.01, grad_clip=1.0, seed=0, data="stdlib",
              tokenizer="bpe-2048", checkpoint_every=500, log_checkpoints=16, eval_every=100, log_every=10,
              num_threads=2)

PRESETS: dict[str, dict] = {
    "attn-only-0l": {
        "about": "0-layer model: the direct path W_E W_U only, a low-rank bigram model",
        "model": dict(_ATTN_ONLY, n_layers=0, n_heads=1, model_name="attn-only-0l"),
        "train": dict(_TRAIN, steps=1500, lr=3e-3),
    },
    "attn-only-1l": {
        "about": "1-layer attention-only model: direct path + skip-trigram heads (copying OV circuits)",
        "model": dict(_ATTN_ONLY, n_layers=1, n_heads=8, model_name="attn-only-1l"),
        "train": dict(_TRAIN, steps=2500),
    },
    "attn-only-2l": {
        "about": "2-layer attention-only model: previous-token heads in layer 0, induction heads in layer 1",
        "model": dict(_ATTN_ONLY, n_layers=2, n_heads=8, model_name="attn-only-2l"),
        "train": dict(_TRAIN, steps=1500, repeat_fraction=0.4, repeat_min_len=4, repeat_max_len=64,
                      repeat_random_fraction=0.5, keep_checkpoints=[0, 50, 100, 200, 300, 500, 1000]),
    },
    "gelu-2l": {
        "about": "2-layer transformer with GELU MLPs and LayerNorm (standard learned positions)",
        "model": dict(n_layers=2, d_model=128, n_ctx=256, d_vocab=2048, n_heads=4, d_mlp=512, act_fn="gelu",
                      normalization_type="LN", positional_embedding_type="standard", use_bias=True,
                      model_name="gelu-2l"),
        "train": dict(_TRAIN, steps=1500),
    },
}


def preset_names() -> list[str]:
    return sorted(PRESETS)


def get_preset(name: str) -> tuple[HookedTransformerConfig, TrainConfig, str]:
    """(model config, training config, one-line description) of preset `name`; `KeyError` lists the names."""
    if name not in PRESETS:
        raise KeyError(f"unknown preset {name!r}; presets: {', '.join(preset_names())}")
    p = PRESETS[name]
    return HookedTransformerConfig(**p["model"]), TrainConfig(**p["train"]), p["about"]

"""A model as a folder of our format: `save` and the file names (`config.json` + `model.safetensors` +
`tokenizer.json`) that `models.io.checkpoint` reads back.

Writing needs nothing but the model's own `cfg.to_json()`, `state_dict()` and tokenizer, so it sits beside the
models (their `save` method calls it) and imports no model class; reading dispatches on the model types and lives
above them (`models.io.checkpoint.load`). Importing this module imports neither torch nor safetensors, so `models.save`
is bound when `models` is imported (models/__init__.py).
"""

from __future__ import annotations

from pathlib import Path

from ..files.atomic import atomic_write_dir

CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE = "config.json", "model.safetensors", "tokenizer.json"


def save(model, path, extra_files: dict | None = None) -> Path:
    """Write `model` to folder `path` (config.json, model.safetensors, tokenizer.json if attached, and any
    `extra_files` {name: str | bytes}) atomically. The safetensors keys are TransformerLens' former `HookedTransformer`
    state-dict keys (`embed.W_E`, `blocks.0.attn.W_Q [n_heads, d_model, d_head]`, ...)."""
    from safetensors.torch import save_file

    state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}

    def write(tmp: Path) -> None:
        (tmp / CONFIG_FILE).write_text(model.cfg.to_json())
        save_file(state, str(tmp / WEIGHTS_FILE), metadata={"format": "pt", "layout": "transformer_lens"})
        if model.tokenizer is not None and hasattr(model.tokenizer, "save"):
            model.tokenizer.save(tmp / TOKENIZER_FILE)
        for name, content in (extra_files or {}).items():
            target = tmp / name
            target.parent.mkdir(parents=True, exist_ok=True)
            (target.write_bytes if isinstance(content, bytes) else target.write_text)(content)

    return atomic_write_dir(path, write)

"""Checkpoints as data: reading a model folder (`config.json` + `model.safetensors` + `tokenizer.json`, written by
`models.arch.persist.save`, re-exported here) by its model type; the model zoo.

The safetensors keys are TransformerLens' former `HookedTransformer` state-dict keys (`embed.W_E`,
`blocks.0.attn.W_Q [n_heads, d_model, d_head]`, ...), so one loader serves our folders and legacy
TransformerLens state dicts (`models.io.interop`). Nothing here unpickles.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch

from ..arch.config import dtype_name
from ..arch.initialization import rng_kept
from ..arch.kind import ENCODER_DECODER, model_kind
from ..arch.model import HookedTransformer
from ..arch.persist import CONFIG_FILE, TOKENIZER_FILE, WEIGHTS_FILE, save  # noqa: F401  (re-exported)
from ..arch.state_dict import load_state_dict  # noqa: F401  (re-exported)
from ..arch.weight_processing import process_loaded
from ..errors import CheckpointError, ConfigError
from ..files.atomic import _recover, atomic_write_dir  # noqa: F401  (atomic_write_dir: re-exported)
from ..files.safe_read import JSON_LIMIT, read_json, read_text
from ..files.size_checks import check_size, implied_weights  # noqa: F401  (re-exported: loaders and tests use them)
from .readers import (  # noqa: F401  (re-exported: the readers of a model folder's files)
    SUMMARY_FILE,
    WEIGHTS_LIMIT,
    read_config,
    read_safetensors,
    read_safetensors_header,
    read_summary,
    safetensors_numel,
)
from .registry import config_from_dict, config_from_json, model_class, model_types  # noqa: F401  (re-exported)

ZOO_DIR = Path(__file__).resolve().parent.parent / "zoo"


def zoo_names() -> list[str]:
    """The shipped models' names (folders of `models/zoo` with a config.json), sorted."""
    if not ZOO_DIR.is_dir():
        return []
    return sorted(p.name for p in ZOO_DIR.iterdir() if (p / CONFIG_FILE).is_file())


def zoo_cards() -> list[dict]:
    """One entry per shipped model: name, the card's first line, architecture, validation loss and folder."""
    out = []
    for name in zoo_names():
        d = ZOO_DIR / name
        cfg = read_json(d / CONFIG_FILE, JSON_LIMIT, CheckpointError, "the config", contained=True)
        summary = read_summary(d / SUMMARY_FILE) if os.path.lexists(d / SUMMARY_FILE) else {}
        about = ""
        if (d / "card.md").is_file():
            lines = [ln.strip() for ln in read_text(d / "card.md", JSON_LIMIT, CheckpointError, "the card",
                                                    contained=True).splitlines()]
            about = next((ln for ln in lines if ln and not ln.startswith("#")), "")
        kind = cfg.get("model_type", "decoder")
        if kind == "encoder_decoder":  # n_layers "encoder+decoder"; context and vocabulary of the target
            layers, n_ctx, d_vocab = f"{cfg['n_encoder_layers']}+{cfg['n_decoder_layers']}", cfg["n_ctx_tgt"], \
                cfg["d_vocab_tgt"]
        else:
            layers, n_ctx, d_vocab = cfg["n_layers"], cfg["n_ctx"], cfg["d_vocab"]
        out.append({"name": name, "about": about, "model_type": kind, "n_layers": layers, "n_heads": cfg["n_heads"],
                    "d_model": cfg["d_model"], "n_ctx": n_ctx, "d_vocab": d_vocab,
                    "attn_only": cfg.get("attn_only", cfg.get("d_mlp") is None),
                    "positions": cfg["positional_embedding_type"],
                    "val_loss": summary.get("final_val_loss"), "path": str(d)})
    return out


# --- reading ----------------------------------------------------------------------------------------
def resolve(path_or_name) -> Path:
    """A saved-model folder for a zoo name or a path; raises `CheckpointError` listing the zoo names."""
    if not isinstance(path_or_name, (str, os.PathLike)):
        raise TypeError(f"a model is named by a zoo name or a folder path, got {type(path_or_name).__name__}")
    if not str(path_or_name).strip():  # Path("") is the current folder: never what an empty name meant
        raise CheckpointError(f"empty model name {str(path_or_name)!r}; give a zoo name or a folder path "
                              f"(zoo models: {', '.join(zoo_names()) or '(none)'})")
    p = Path(path_or_name)
    _recover(p)
    if p.is_dir():
        return p
    if isinstance(path_or_name, str) and (ZOO_DIR / path_or_name / CONFIG_FILE).is_file():
        return ZOO_DIR / path_or_name
    if p.exists():
        raise CheckpointError(
            f"{p} is a file, not a model folder; a legacy TransformerLens state dict loads with "
            "models.from_transformer_lens_state_dict(path, cfg) (CLI: MODEL --config CONFIG.json)"
        )
    raise CheckpointError(
        f"unknown model {str(path_or_name)!r}: not a folder and not a zoo name; zoo models: "
        f"{', '.join(zoo_names()) or '(none)'}"
    )


def load(path_or_name, device=None, dtype=None, **processing) -> HookedTransformer:
    """Load a model folder or a zoo model by name (`models.load("attn-only-2l")`), offline. `device` (default the
    CPU, whatever device the model was trained on) and `dtype` (a `torch.dtype` or its name, e.g. "float16") are
    checked before anything is read: `ConfigError` names an unknown or absent device or an unsupported dtype.
    `processing`: TransformerLens 2.18's `fold_ln=`, `center_writing_weights=`, … (`models.arch.weight_processing`)."""
    dtype = None if dtype is None else getattr(torch, dtype_name(dtype))
    device = None if device is None else available_device(device)
    folder = resolve(path_or_name)
    cfg = read_config(folder / CONFIG_FILE)
    step = checkpoint_step(folder)
    if step is not None:  # TransformerLens 2.x's labels of a checkpoint (its `cfg.checkpoint_value`)
        cfg.checkpoint_label_type, cfg.checkpoint_value = "step", step
    if device is not None:
        cfg.device = device
    check_size(cfg, read_safetensors_header(folder / WEIGHTS_FILE), str(folder / CONFIG_FILE))  # weights and layers
    state = read_safetensors(folder / WEIGHTS_FILE)
    with rng_kept():  # a seeded TransformerLens init_mode would reseed the process; the weights come from the file
        model = model_class(cfg)(cfg)
    load_state_dict(model, state, source=str(folder / WEIGHTS_FILE))
    if os.path.lexists(folder / TOKENIZER_FILE) and not (folder / TOKENIZER_FILE).is_file():
        raise CheckpointError(f"{folder / TOKENIZER_FILE}: not a file (a folder or a dangling link)")
    if (folder / TOKENIZER_FILE).is_file():
        from ..data.tokenizer import load_tokenizer

        model.tokenizer = load_tokenizer(folder / TOKENIZER_FILE, contained=True)
        for what, tok, d_vocab in _vocabularies(model):
            if tok.vocab_size > d_vocab:
                raise CheckpointError(f"{folder / TOKENIZER_FILE}: {what}tokenizer has {tok.vocab_size} ids but the "
                                      f"model's d_vocab{'_' + what.strip() if what else ''} is {d_vocab}")
    if dtype is not None:
        model.to(dtype)
        model.cfg.dtype = dtype
    if processing:
        process_loaded(model, processing)
    return model.eval()  # as TransformerLens' from_pretrained (transformer_lens.patching refuses training mode)


#: the folder of a training run that holds its checkpoints (`models.training.state`)
CHECKPOINTS = "checkpoints"


def checkpoint_step(folder: Path) -> int | None:
    """The step of a training checkpoint folder, `.../checkpoints/step-000500` → 500 (its own name; nothing else is
    read); None for any other folder."""
    match = re.fullmatch(r"step-(\d+)", folder.name)
    return int(match.group(1)) if match and folder.parent.name == CHECKPOINTS else None


def _vocabularies(model) -> list[tuple]:
    """`(label, tokenizer, d_vocab)` pairs to check: the source and target tokenizers of an encoder–decoder model,
    the one tokenizer otherwise."""
    tokenizer, cfg = model.tokenizer, model.cfg
    if model_kind(model) == ENCODER_DECODER:
        if not hasattr(tokenizer, "source"):
            raise CheckpointError(f"an encoder–decoder model needs a source and a target tokenizer, got "
                                  f"{type(tokenizer).__name__}")
        return [("src ", tokenizer.source, cfg.d_vocab_src), ("tgt ", tokenizer.target, cfg.d_vocab_tgt)]
    return [("", tokenizer, cfg.d_vocab)]


def available_device(device) -> str:
    """`device` (a name such as "cpu", "cuda:1", "mps", or a `torch.device`) as a string, checked to exist here;
    `ConfigError` otherwise."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ConfigError(f"device={device!r} is not a device name; use 'cpu', 'cuda', 'cuda:N' or 'mps'") from None
    if dev.type == "cuda" and (not torch.cuda.is_available() or (dev.index or 0) >= torch.cuda.device_count()):
        raise ConfigError(f"device={device!r} is not available here ({torch.cuda.device_count()} CUDA GPU(s)); "
                          "use 'cpu'")
    if dev.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ConfigError(f"device={device!r} is not available here (no MPS); use 'cpu'")
    if dev.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"device={device!r} is not supported; use 'cpu', 'cuda', 'cuda:N' or 'mps'")
    return str(dev)



"""Checkpoints as data: `config.json` + `model.safetensors` (+ `tokenizer.json`), written atomically.

The safetensors keys are TransformerLens' former `HookedTransformer` state-dict keys (`embed.W_E`,
`blocks.0.attn.W_Q [n_heads, d_model, d_head]`, ...), so one loader serves our folders and legacy
TransformerLens state dicts. Nothing here unpickles: `.pth` files go through `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from .config import ConfigError, HookedTransformerConfig
from .model import HookedTransformer

ZOO_DIR = Path(__file__).resolve().parent / "zoo"
CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE = "config.json", "model.safetensors", "tokenizer.json"


class CheckpointError(ValueError):
    """A checkpoint that cannot be read: the message names the file and, where it applies, the tensor."""


def zoo_names() -> list[str]:
    if not ZOO_DIR.is_dir():
        return []
    return sorted(p.name for p in ZOO_DIR.iterdir() if (p / CONFIG_FILE).is_file())


# --- writing ----------------------------------------------------------------------------------------
def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_dir(path, write_contents) -> Path:
    """Create folder `path` atomically: `write_contents(tmp_dir)` fills a temporary sibling folder, whose
    files are fsynced, then it replaces `path` by rename. A crash or error at any point leaves either the
    previous folder or the new one, never a half-written one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    old = None
    try:
        write_contents(tmp)
        for f in tmp.rglob("*"):
            if f.is_file():
                with open(f, "rb+") as fh:
                    os.fsync(fh.fileno())
        _fsync_dir(tmp)
        if path.exists():
            old = path.parent / f".{path.name}.old-{os.getpid()}"
            os.replace(path, old)
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not path.exists():
            os.replace(old, path)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return path


def save(model: HookedTransformer, path, extra_files: dict | None = None) -> Path:
    """Write `model` to folder `path` (config.json, model.safetensors, tokenizer.json if attached, and any
    `extra_files` {name: str | bytes}) atomically."""
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


# --- reading ----------------------------------------------------------------------------------------
def resolve(path_or_name) -> Path:
    """A saved-model folder for a zoo name or a path; raises `CheckpointError` listing the zoo names."""
    p = Path(path_or_name)
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


def read_config(path) -> HookedTransformerConfig:
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing ({CONFIG_FILE} is required in a model folder)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: cannot read: {e}") from None
    try:
        return HookedTransformerConfig.from_json(text)
    except (ConfigError, TypeError) as e:
        raise CheckpointError(f"{path}: invalid config: {e}") from None


def read_safetensors(path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: missing or not a file")
    try:
        return load_file(str(path))
    except Exception as e:  # safetensors raises its own error type for truncated/corrupt headers
        raise CheckpointError(f"{path}: not a readable safetensors file ({type(e).__name__}: {e})") from None


def load(path_or_name, device=None, dtype=None) -> HookedTransformer:
    """Load a model folder or a zoo model by name (`models.load("attn-only-2l")`), offline."""
    folder = resolve(path_or_name)
    cfg = read_config(folder / CONFIG_FILE)
    if device is not None:
        cfg.device = str(device)
    state = read_safetensors(folder / WEIGHTS_FILE)
    model = HookedTransformer(cfg)
    load_state_dict(model, state, source=str(folder / WEIGHTS_FILE))
    if (folder / TOKENIZER_FILE).is_file():
        from .tokenizer import load_tokenizer

        model.tokenizer = load_tokenizer(folder / TOKENIZER_FILE)
        if model.tokenizer.vocab_size > cfg.d_vocab:
            raise CheckpointError(
                f"{folder / TOKENIZER_FILE}: tokenizer has {model.tokenizer.vocab_size} ids but the model's "
                f"d_vocab is {cfg.d_vocab}"
            )
    if dtype is not None:
        model.to(dtype)
        model.cfg.dtype = str(dtype).replace("torch.", "")
    return model


def load_state_dict(model: HookedTransformer, state: dict, source: str = "state dict") -> None:
    """Copy `state` (TransformerLens layout) into `model`, checking every name and shape first."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing:
        raise CheckpointError(f"{source}: missing tensor(s) {missing[:8]}{' ...' if len(missing) > 8 else ''}")
    if unexpected:
        raise CheckpointError(
            f"{source}: unexpected tensor(s) {unexpected[:8]}{' ...' if len(unexpected) > 8 else ''} "
            "(does the config match the checkpoint?)"
        )
    for name, target in expected.items():
        t = state[name]
        if not isinstance(t, torch.Tensor):
            raise CheckpointError(f"{source}: {name} is a {type(t).__name__}, not a tensor")
        if tuple(t.shape) != tuple(target.shape):
            raise CheckpointError(
                f"{source}: tensor {name} has shape {tuple(t.shape)}, the config expects {tuple(target.shape)}"
            )
        if not t.dtype.is_floating_point:
            raise CheckpointError(f"{source}: tensor {name} has dtype {t.dtype}, expected a float tensor")
    buffers = {n for n, _ in model.named_buffers()}
    for name in sorted(buffers & set(expected)):
        if bool(state[name].ne(0).any()):
            raise CheckpointError(
                f"{source}: tensor {name} is non-zero but the config has use_bias=False; set use_bias=True"
            )
    with torch.no_grad():
        for name, target in expected.items():
            target.copy_(state[name].to(target.dtype))


# --- legacy TransformerLens state dicts ---------------------------------------------------------------
_DROPPED_SUFFIXES = (".mask", ".IGNORE", ".rotary_sin", ".rotary_cos")
#: TransformerLens config flags that change the computation in ways this model does not implement.
_UNSUPPORTED_TL_FLAGS = ("gated_mlp", "parallel_attn_mlp", "final_rms", "use_local_attn", "use_qk_norm")


def config_from_transformer_lens(d: dict) -> HookedTransformerConfig:
    """Our config from a TransformerLens `HookedTransformerConfig` dict (its JSON / `.to_dict()`).

    Parameter-free norms `LNPre` / `RMSPre` become `LN` / `RMS` with unit weights (the same function).
    Flags we do not implement raise `ConfigError` naming them; other TransformerLens-only fields are kept
    in `extra["transformer_lens"]`."""
    d = dict(d)
    bad = [k for k in _UNSUPPORTED_TL_FLAGS if d.get(k)]
    if bad:
        raise ConfigError(f"TransformerLens config uses {bad}, which this toolkit does not implement")
    if d.get("shortformer_pos"):
        d["positional_embedding_type"] = "shortformer"
    norm = d.get("normalization_type")
    if norm in ("LNPre", "RMSPre"):
        d["normalization_type"] = norm[: -len("Pre")]

    names = {f.name for f in dataclasses.fields(HookedTransformerConfig)}
    ours = {k: v for k, v in d.items() if k in names and k not in ("dtype", "device", "seed", "extra")}
    if not isinstance(ours.get("n_key_value_heads"), int):
        ours.pop("n_key_value_heads", None)
    if ours.get("act_fn") is None:  # TransformerLens writes act_fn=None for attention-only models
        ours.pop("act_fn", None)
    ours["extra"] = {"transformer_lens": {k: str(v) for k, v in d.items() if k not in names}}
    return HookedTransformerConfig(**ours)


def from_transformer_lens_state_dict(state_dict_or_path, cfg) -> HookedTransformer:
    """Build our model from a state dict in TransformerLens' former `HookedTransformer` layout.

    `state_dict_or_path`: a dict of tensors, or a `.pth`/`.pt` file (read with `weights_only=True`, never
    unpickling code) or a `.safetensors` file. `cfg`: our config (object or dict) or a TransformerLens
    config dict. Missing norm weights of `LNPre` models are filled with ones/zeros; missing zero biases
    of bias-free checkpoints are filled with zeros."""
    source = "state dict"
    if isinstance(state_dict_or_path, (str, os.PathLike)):
        path = Path(state_dict_or_path)
        source = str(path)
        if path.is_dir() or not path.exists():
            raise CheckpointError(f"{path}: not a state-dict file")
        if path.suffix == ".safetensors":
            state = read_safetensors(path)
        else:
            try:
                state = torch.load(path, map_location="cpu", weights_only=True)
            except Exception as e:  # UnpicklingError for code-carrying pickles, EOFError / RuntimeError for truncation
                raise CheckpointError(
                    f"{path}: refused or unreadable ({type(e).__name__}: {str(e).splitlines()[0][:200]}); "
                    "only plain tensors are loaded, never pickled code"
                ) from None
    else:
        state = state_dict_or_path
    if not isinstance(state, dict):
        raise CheckpointError(f"{source}: expected a dict of tensors, got {type(state).__name__}")
    if isinstance(cfg, dict):
        try:
            cfg = HookedTransformerConfig.from_dict(cfg)
        except (ConfigError, TypeError):
            cfg = config_from_transformer_lens(cfg)
    model = HookedTransformer(cfg)
    expected = model.state_dict()
    fixed = {}
    for k, v in state.items():
        if k.endswith(_DROPPED_SUFFIXES):
            continue
        k = k.replace("attn._W_K", "attn.W_K").replace("attn._W_V", "attn.W_V")
        k = k.replace("attn._b_K", "attn.b_K").replace("attn._b_V", "attn.b_V")
        fixed[k] = v
    for name, target in expected.items():
        if name not in fixed and (name.endswith((".b", ".b_U", ".b_O", ".b_Q", ".b_K", ".b_V", ".b_in", ".b_out"))):
            fixed[name] = torch.zeros_like(target)
        elif name not in fixed and name.endswith(".w"):
            fixed[name] = torch.ones_like(target)
    load_state_dict(model, fixed, source=source)
    return model


def read_json(path) -> dict:
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: not readable JSON ({e})") from None

"""Checkpoints as data: `config.json` + `model.safetensors` (+ `tokenizer.json`), written atomically; the model zoo.

The safetensors keys are TransformerLens' former `HookedTransformer` state-dict keys (`embed.W_E`,
`blocks.0.attn.W_Q [n_heads, d_model, d_head]`, ...), so one loader serves our folders and legacy
TransformerLens state dicts (`models.interop`). Nothing here unpickles.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch

from .config import HookedTransformerConfig
from .errors import CheckpointError, ConfigError
from .model import HookedTransformer

ZOO_DIR = Path(__file__).resolve().parent / "zoo"
CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE = "config.json", "model.safetensors", "tokenizer.json"


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
        cfg = json.loads((d / CONFIG_FILE).read_text())
        summary = json.loads((d / "summary.json").read_text()) if (d / "summary.json").is_file() else {}
        about = ""
        if (d / "card.md").is_file():
            lines = [ln.strip() for ln in (d / "card.md").read_text().splitlines()]
            about = next((ln for ln in lines if ln and not ln.startswith("#")), "")
        out.append({"name": name, "about": about, "n_layers": cfg["n_layers"], "n_heads": cfg["n_heads"],
                    "d_model": cfg["d_model"], "n_ctx": cfg["n_ctx"], "d_vocab": cfg["d_vocab"],
                    "attn_only": cfg["attn_only"], "positions": cfg["positional_embedding_type"],
                    "val_loss": summary.get("final_val_loss"), "path": str(d)})
    return out


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


_RENAMEAT2 = None


def _exchange(a: Path, b: Path) -> bool:
    """Swap the paths `a` and `b` in one atomic step (Linux `renameat2(RENAME_EXCHANGE)`); False where the
    platform or file system cannot (then the caller falls back to two renames)."""
    global _RENAMEAT2
    if not sys.platform.startswith("linux"):
        return False
    if _RENAMEAT2 is None:
        try:
            fn = ctypes.CDLL(None, use_errno=True).renameat2
            fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
            fn.restype = ctypes.c_int
            _RENAMEAT2 = fn
        except (OSError, AttributeError):  # a libc without renameat2 (glibc < 2.28, musl)
            _RENAMEAT2 = False
    if _RENAMEAT2 is False:
        return False
    at_fdcwd, rename_exchange = -100, 2
    if _RENAMEAT2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EPERM, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _recover(path: Path) -> None:
    """Where only the two-rename fallback of `atomic_write_dir` runs, a crash between its renames leaves `path`
    missing and the previous folder at `.{name}.old-PID`: put that back."""
    if path.exists() or path.is_symlink() or not path.parent.is_dir():
        return
    prefix = f".{path.name}.old-"
    olds = [p for p in path.parent.iterdir() if p.name.startswith(prefix) and p.is_dir()]
    if olds:
        os.replace(max(olds, key=lambda p: p.stat().st_mtime), path)


def atomic_write_dir(path, write_contents) -> Path:
    """Create folder `path` atomically: `write_contents(tmp_dir)` fills a temporary sibling folder, whose
    files are fsynced, then it takes `path`'s place in one atomic swap (`renameat2(RENAME_EXCHANGE)` on Linux;
    elsewhere two renames, and a crash between them is repaired by the next save or load). A crash or error at
    any point leaves either the previous folder or the new one, never a half-written one; what a crash can leave
    behind are hidden `.{name}.tmp-*` siblings, which nothing loads."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _recover(path)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    old = None
    try:
        write_contents(tmp)
        for f in tmp.rglob("*"):
            if f.is_file():
                with open(f, "rb+") as fh:
                    os.fsync(fh.fileno())
        _fsync_dir(tmp)
        if path.exists() and _exchange(tmp, path):
            old = tmp  # the swap put the previous folder at tmp
        else:
            if path.exists():
                old = path.parent / f".{path.name}.old-{os.getpid()}"
                os.replace(path, old)
            os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException:
        if old is not tmp:
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
    if not isinstance(path_or_name, (str, os.PathLike)):
        raise TypeError(f"a model is named by a zoo name or a folder path, got {type(path_or_name).__name__}")
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
    check_size(cfg, state, str(folder / CONFIG_FILE))
    model = HookedTransformer(cfg)
    load_state_dict(model, state, source=str(folder / WEIGHTS_FILE))
    if os.path.lexists(folder / TOKENIZER_FILE) and not (folder / TOKENIZER_FILE).is_file():
        raise CheckpointError(f"{folder / TOKENIZER_FILE}: not a file (a folder or a dangling link)")
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
        model.cfg.dtype = dtype
    return model.eval()  # as TransformerLens' from_pretrained (transformer_lens.patching refuses training mode)


def check_size(cfg: HookedTransformerConfig, state: dict, source: str) -> None:
    """Refuse a config that needs more weights than the file holds before allocating it (a corrupt or hostile
    config.json could otherwise ask for terabytes). A lower bound: W_E, W_U, W_Q, W_O and the MLP matrices. Small
    mismatches are left to `load_state_dict`, whose message names the tensor."""
    need = 2 * cfg.d_vocab * cfg.d_model + 2 * cfg.n_layers * cfg.n_heads * cfg.d_head * cfg.d_model
    if cfg.d_mlp:
        need += 2 * cfg.n_layers * cfg.d_model * cfg.d_mlp
    held = sum(t.numel() for t in state.values() if isinstance(t, torch.Tensor))
    if need > held and need > 2**26:  # > 64M weights missing: refuse before allocating them
        raise CheckpointError(f"{source}: the config describes at least {need:,} weights but the checkpoint holds "
                              f"{held:,}; does the config match the checkpoint?")


def load_state_dict(model: HookedTransformer, state: dict, source: str = "state dict") -> None:
    """Copy `state` (TransformerLens layout) into `model`, checking every name and shape first."""
    expected = model.state_dict()
    bad_keys = [k for k in state if not isinstance(k, str)]
    if bad_keys:
        raise CheckpointError(f"{source}: tensor names must be strings, got {bad_keys[:4]!r}")
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
        if t.device.type == "meta":
            raise CheckpointError(f"{source}: tensor {name} is on the meta device (it holds no data)")
    buffers = {n for n, _ in model.named_buffers()}
    for name in sorted(buffers & set(expected)):
        if bool(state[name].ne(0).any()):
            raise CheckpointError(
                f"{source}: tensor {name} is non-zero but the config has use_bias=False; set use_bias=True"
            )
    with torch.no_grad():
        for name, target in expected.items():
            target.copy_(state[name].to(target.dtype))

"""One reader per file kind: every file a command reads goes through the reader of its kind, here.

Each reader takes the file's path and either returns what the file holds, checked, or raises a named error
(`models.ToyCircuitsError`) whose message starts with the path. Every reader:

- reads regular files only (a FIFO would block forever, a device never end), bounded in size before anything is
  read, checked on the open descriptor (`models.files.safe_read`);
- refuses, with `contained=True` (files of a folder: the default), a symbolic link that leads out of the file's
  folder;
- parses JSON strictly (`models.files.safe_read.loads_strict`: no NaN or Infinity, no number that overflows a float,
  no key given twice);
- checks the schema: the JSON type of each field the toolkit reads, the keys it needs, integers in sane ranges.

`models.io.file_kinds.FILE_KINDS` registers every kind: its file name, its reader, a function that writes a valid
example into a folder and the command lines that read it; `tests/reliability/test_corruption.py` corrupts every
registered kind in every way it knows and runs every command listed. The tokenizer's reader is
`models.data.tokenizer.load_tokenizer`: tokenizers are read by the data layer too (the corpus cache), which sits below
this one.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from ..arch.persist import CONFIG_FILE, TOKENIZER_FILE, WEIGHTS_FILE  # noqa: F401  (re-exported: the file kinds)
from ..data.tokenizer import load_tokenizer
from ..errors import CheckpointError, ConfigError, InputError, SAEError, TrainConfigError
from ..files.safe_read import JSON_LIMIT, MiB, loads_strict, open_regular, read_bytes, read_json, read_text
from .registry import config_from_json

#: The reader of tokenizer.json (in the data layer, which reads tokenizers too: the corpus cache).
read_tokenizer = load_tokenizer

TRAIN_CONFIG_FILE, SUMMARY_FILE, STATE_FILE = "train_config.json", "summary.json", "trainer_state.json"
METRICS_FILE, SWEEP_FILE = "metrics.jsonl", "sweep.json"
SAE_CFG_FILE, SAE_WEIGHTS_FILE, SAE_TRAINING_FILE = "cfg.json", "sae_weights.safetensors", "training.json"

WEIGHTS_LIMIT = 1 << 40  # 1 TiB: a bound on a weight file's size, not a memory budget (it is memory-mapped)
HEADER_LIMIT = 100 * MiB  # a safetensors header (its JSON tensor table)
METRICS_LIMIT = 256 * MiB
SAE_CFG_LIMIT = 1 * MiB
MAX_STEP = 10**12  # steps, tokens and seeds beyond this are corruption, not a run
MAX_SAE_WIDTH = 1 << 24  # d_in and d_sae
MAX_SAE_WEIGHTS = 1 << 32  # d_in * d_sae


# --- schema checks ---------------------------------------------------------------------------------------------
def _type_name(types) -> str:
    names = {int: "an integer", float: "a number", str: "a string", bool: "true or false", list: "a list",
             dict: "an object", type(None): "null"}
    return " or ".join(names.get(t, t.__name__) for t in (types if isinstance(types, tuple) else (types,)))


def field_of(d: dict, key: str, types, path, error: type[Exception], required: bool = True, lo=None, hi=None):
    """`d[key]` checked to be of `types` (int excludes bool; float admits int) and within [`lo`, `hi`]; `error`
    naming the file and the key otherwise. A missing key: `error` when `required`, else None."""
    if key not in d:
        if required:
            raise error(f"{path}: the key {key!r} is missing")
        return None
    v = d[key]
    types = types if isinstance(types, tuple) else (types,)
    ok = any((isinstance(v, t) and not (t in (int, float) and isinstance(v, bool))) or (t is float and
             isinstance(v, int) and not isinstance(v, bool)) for t in types)
    if not ok:
        raise error(f"{path}: {key!r} must be {_type_name(types)}, got {type(v).__name__} {json.dumps(v)[:60]}")
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise error(f"{path}: {key!r} = {v} is outside [{lo}, {hi}]")
    return v


def _object(value, path, error: type[Exception], what: str) -> dict:
    if not isinstance(value, dict):
        raise error(f"{path}: {what} must be a JSON object, got a JSON {type(value).__name__}")
    return value


def _json_object(path, error: type[Exception], what: str, contained: bool, limit: int = JSON_LIMIT) -> dict:
    try:
        return _object(read_json(path, limit, error, what, contained), path, error, what)
    except FileNotFoundError:
        raise error(f"{path}: missing ({what})") from None


def _numbers(value, path, error: type[Exception], key: str) -> None:
    """`value` must be a number or a (nested) list of numbers."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, bool) or not isinstance(v, (int, float)):
            raise error(f"{path}: {key!r} must hold numbers only, got {type(v).__name__} {json.dumps(v)[:40]}")


# --- model folders -----------------------------------------------------------------------------------------------
def read_config(path, contained: bool = True):
    """The config object of a `config.json` (`models.io.registry.config_from_json`, by its `model_type`);
    `CheckpointError` naming the file for anything unreadable or invalid."""
    path = Path(path)
    try:
        text = read_text(path, JSON_LIMIT, CheckpointError, "the config", contained)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing ({CONFIG_FILE} is required in a model folder)") from None
    try:
        _object(loads_strict(text, CheckpointError), path, CheckpointError, "a config")
        return config_from_json(text)
    except CheckpointError as e:
        raise CheckpointError(f"{path}: invalid config: {str(e).removeprefix(f'{path}: ')}") from None
    except (ConfigError, TypeError) as e:
        raise CheckpointError(f"{path}: invalid config: {e}") from None


#: bytes per element of each safetensors dtype
SAFETENSORS_DTYPES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2,
                      "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}


def read_safetensors_header(path, contained: bool = True) -> dict[str, list[int]]:
    """`{name: shape}` of the tensors of a safetensors file, from its header alone, checked against the file: each
    entry names a known dtype, a shape of integers >= 0 and data offsets that lie in the file and span exactly
    the shape's bytes (a truncated or padded file is refused here, before the library maps it);
    `CheckpointError` naming the file otherwise."""
    path = Path(path)

    def bad(why: str) -> CheckpointError:
        return CheckpointError(f"{path}: not a readable safetensors file ({why})")

    if path.is_dir() or not os.path.lexists(path):
        raise CheckpointError(f"{path}: missing or not a file")
    try:
        with open_regular(path, WEIGHTS_LIMIT, CheckpointError, "the weight file", contained) as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            if not 0 < n <= min(HEADER_LIMIT, size - 8):
                raise bad(f"header length {n} in a file of {size:,} bytes")
            table = loads_strict(f.read(n), CheckpointError)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing or not a file") from None
    except CheckpointError as e:
        raise (e if str(e).startswith(str(path)) else bad(str(e))) from None
    except OSError as e:
        raise bad(f"{type(e).__name__}: {e}") from None
    if not isinstance(table, dict):
        raise bad(f"the header is a JSON {type(table).__name__}, not an object")
    data_size, shapes, end = size - 8 - n, {}, 0
    for name, entry in table.items():
        if name == "__metadata__":
            if not (isinstance(entry, dict) and all(isinstance(v, str) for v in entry.values())):
                raise bad("__metadata__ must map names to strings")
            continue
        if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= set(entry):
            raise bad(f"tensor {name!r}: an entry needs dtype, shape and data_offsets")
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if dtype not in SAFETENSORS_DTYPES:
            raise bad(f"tensor {name!r}: unknown dtype {str(dtype)[:20]!r}")
        if not (isinstance(shape, list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                                for d in shape)):
            raise bad(f"tensor {name!r}: shape must be a list of integers >= 0, got {json.dumps(shape)[:60]}")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) and not isinstance(o, bool)
                                                                       for o in offsets)):
            raise bad(f"tensor {name!r}: data_offsets must be two integers")
        a, b = offsets
        if not 0 <= a <= b <= data_size or b - a != math.prod(shape) * SAFETENSORS_DTYPES[dtype]:
            raise bad(f"tensor {name!r}: bytes {a}..{b} do not hold shape {shape} of {dtype} in the "
                      f"{data_size:,} data bytes (truncated or corrupt)")
        shapes[name], end = shape, max(end, b)
    return shapes


def safetensors_numel(path, contained: bool = True) -> int:
    """The number of weights a safetensors file holds, from its checked header (nothing else read)."""
    return sum(math.prod(shape) for shape in read_safetensors_header(path, contained).values())


def read_safetensors(path, contained: bool = True, finite: bool = False) -> dict:
    """The tensors of a safetensors file (its header checked first, `read_safetensors_header`); with `finite`, a
    floating-point tensor holding NaN or ±inf is refused. `CheckpointError` naming the file (and tensor)."""
    from safetensors.torch import load_file

    path = Path(path)
    read_safetensors_header(path, contained)
    try:
        tensors = load_file(str(path))
    except Exception as e:  # safetensors raises its own error type for truncated/corrupt files
        raise CheckpointError(f"{path}: not a readable safetensors file ({type(e).__name__}: {e})") from None
    if finite:
        refuse_non_finite(tensors, path, CheckpointError)
    return tensors


def refuse_non_finite(tensors: dict, path, error: type[Exception]) -> None:
    """`error` naming the file and the first floating-point tensor that holds NaN or ±inf."""
    import torch

    for name, t in tensors.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).sum())
            raise error(f"{path}: tensor {name!r} holds {bad} non-finite value(s) (NaN or ±inf)")


def read_pth(path) -> dict:
    """A legacy TransformerLens state dict (`.pth` / `.pt` / `.bin`): `torch.load(..., weights_only=True)` (plain
    tensors only, never pickled code) on a regular file opened without blocking (a FIFO is refused, not waited on);
    it must hold a dict of tensors. `CheckpointError` naming the file otherwise."""
    import torch

    path = Path(path)
    try:
        with open_regular(path, WEIGHTS_LIMIT, CheckpointError, "the state-dict file") as f:
            state = torch.load(f, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: not a state-dict file (missing)") from None
    except CheckpointError:
        raise
    except Exception as e:  # UnpicklingError for code-carrying pickles, EOFError / RuntimeError for truncation
        first = (str(e).splitlines() or [""])[0][:200]
        raise CheckpointError(f"{path}: refused or unreadable ({type(e).__name__}: {first}); only plain tensors are "
                              "loaded, never pickled code") from None
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                              for k, v in state.items()):
        raise CheckpointError(f"{path}: expected a dict of tensors, got {type(state).__name__}")
    return state


def read_summary(path, contained: bool = True) -> dict:
    """A run's `summary.json`: a JSON object with `steps` (an integer >= 0), `final_val_loss` a number or null
    and `corpus` an object of strings `name` and `sha256` where present. `CheckpointError` naming the file otherwise."""
    d = _json_object(path, CheckpointError, "a run summary", contained)
    field_of(d, "steps", int, path, CheckpointError, lo=0, hi=MAX_STEP)
    field_of(d, "final_val_loss", (float, type(None)), path, CheckpointError, required=False)
    corpus = field_of(d, "corpus", (dict, type(None)), path, CheckpointError, required=False) or {}
    for key in ("name", "sha256"):  # the text the card's numbers are measured on (models.data.corpora)
        field_of(corpus, key, (str, type(None)), f"{path}: corpus", CheckpointError, required=False)
    return d


def read_train_config(path, contained: bool = True) -> dict:
    """A run's `train_config.json` as a dict: a JSON object holding `data` (a string or a list of them: what commands
    read from it, the corpus) and, where present, `steps`, `batch_size`, `seed`, `tokenizer`, `seq_len` and `lr` of
    the right types (`models.training.config.TrainConfig.from_dict` checks the rest where a run is resumed).
    `TrainConfigError` naming the file otherwise."""
    d = _json_object(path, TrainConfigError, "a training config", contained)
    data = field_of(d, "data", (str, list), path, TrainConfigError)
    if isinstance(data, list) and not all(isinstance(x, str) for x in data):
        raise TrainConfigError(f"{path}: 'data' must be a string or a list of strings")
    field_of(d, "steps", int, path, TrainConfigError, required=False, lo=0, hi=MAX_STEP)
    field_of(d, "batch_size", int, path, TrainConfigError, required=False, lo=1, hi=MAX_STEP)
    field_of(d, "seed", int, path, TrainConfigError, required=False, lo=0, hi=2**64 - 1)
    field_of(d, "tokenizer", str, path, TrainConfigError, required=False)
    field_of(d, "seq_len", (int, type(None)), path, TrainConfigError, required=False, lo=1, hi=MAX_STEP)
    field_of(d, "lr", float, path, TrainConfigError, required=False, lo=0)
    return d


# --- circuit discovery -------------------------------------------------------------------------------------------
DISCOVERY_TASK_FILE = "task.json"
DISCOVERY_METRICS = ("loss", "logit_diff", "prob")
MAX_PROMPTS = 100_000


def _prompts(d: dict, key: str, path, required: bool = True) -> list | None:
    """A list of prompts under `key`: each a non-empty string or a non-empty list of integer ids >= 0."""
    v = field_of(d, key, list, path, InputError, required)
    if v is None:
        return None
    if not v or len(v) > MAX_PROMPTS:
        raise InputError(f"{path}: {key!r} must hold 1 to {MAX_PROMPTS} prompts, got {len(v)}")
    for i, x in enumerate(v):
        ok = (isinstance(x, str) and x) or (isinstance(x, list) and x and all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**31 for t in x))
        if not ok:
            raise InputError(f"{path}: {key}[{i}] must be non-empty text or a non-empty list of token ids >= 0")
    return v


def _answers(d: dict, key: str, n: int, path, required: bool = True):
    """One answer (a string or an id) for every prompt, or a list of `n`, under `key`."""
    v = field_of(d, key, (str, int, list), path, InputError, required)
    if v is None:
        return None
    items = v if isinstance(v, list) else [v]
    if isinstance(v, list) and len(v) != n:
        raise InputError(f"{path}: {key!r} holds {len(v)} answers for {n} prompts; give one or one per prompt")
    for x in items:
        if not ((isinstance(x, str) and x) or (isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2**31)):
            raise InputError(f"{path}: {key!r} must hold non-empty one-token strings or token ids >= 0")
    return v


def read_discovery_task(path, contained: bool = False) -> dict:
    """A user's circuit-discovery task (`circuits discover MODEL --task task.json`): a JSON object with `clean` and
    `corrupt`, lists of as many prompts (text, or lists of token ids), `answer` (one token — text or id — for every
    prompt, or one per prompt) read at each prompt's last position, and optionally `wrong` (likewise, for the logit
    difference), `metric` ("loss", "logit_diff" or "prob") and `name`. `InputError` naming the file otherwise; that
    the prompts tokenize to equal lengths is checked with the model."""
    path = Path(path)
    d = _json_object(path, InputError, "a discovery task", contained)
    clean, corrupt = _prompts(d, "clean", path), _prompts(d, "corrupt", path)
    if len(clean) != len(corrupt):
        raise InputError(f"{path}: 'clean' has {len(clean)} prompts but 'corrupt' has {len(corrupt)}; give pairs")
    _answers(d, "answer", len(clean), path)
    _answers(d, "wrong", len(clean), path, required=False)
    metric = field_of(d, "metric", str, path, InputError, required=False)
    if metric is not None and metric not in DISCOVERY_METRICS:
        raise InputError(f"{path}: 'metric' must be one of {', '.join(DISCOVERY_METRICS)}, got {metric!r}")
    if metric == "logit_diff" and "wrong" not in d:
        raise InputError(f"{path}: metric 'logit_diff' needs 'wrong' answers")
    field_of(d, "name", str, path, InputError, required=False)
    return d


def check_model_folder(folder) -> None:
    """Read, through their readers, the files of a model folder that commands read besides the model itself
    (`train_config.json`, `summary.json`, `metrics.jsonl`, where present), so a corrupt one is refused before a
    command writes anything."""
    folder = Path(folder)
    for name, reader in ((TRAIN_CONFIG_FILE, read_train_config), (SUMMARY_FILE, read_summary),
                         (METRICS_FILE, read_metrics)):
        if os.path.lexists(folder / name):
            reader(folder / name)


# --- training state -------------------------------------------------------------------------------------------------
def read_trainer_state(path, contained: bool = True) -> dict:
    """A checkpoint's `trainer_state.json`: `step`, `tokens_seen` (integers >= 0), `wall_time` (a number >= 0),
    `param_groups` (a list of objects) and `rng` (an object with `python` and `numpy` lists). `CheckpointError`
    naming the file otherwise."""
    d = _json_object(path, CheckpointError, "a trainer state", contained)
    field_of(d, "step", int, path, CheckpointError, lo=0, hi=MAX_STEP)
    field_of(d, "tokens_seen", int, path, CheckpointError, lo=0, hi=MAX_STEP * 2**20)
    field_of(d, "wall_time", float, path, CheckpointError, lo=0)
    groups = field_of(d, "param_groups", list, path, CheckpointError)
    if not all(isinstance(g, dict) for g in groups):
        raise CheckpointError(f"{path}: 'param_groups' must be a list of objects")
    rng = field_of(d, "rng", dict, path, CheckpointError)
    field_of(rng, "python", list, path, CheckpointError)
    field_of(rng, "numpy", list, path, CheckpointError)
    return d


#: metrics.jsonl fields read as numbers (or null) where present
METRIC_NUMBERS = ("lr", "wall_time", "loadavg_1min", "train_loss", "val_loss", "tokens_per_s", "icl_score")


def read_metrics(path, contained: bool = True) -> list[dict]:
    """The records of a `metrics.jsonl`, in order ([] where the file does not exist). A torn last line (no newline
    after it: what a killed run leaves) is dropped; any other line must be a JSON object (strict JSON) with `step`
    an integer >= 0, `tokens` an integer >= 0, the `METRIC_NUMBERS` numbers or null, and the head scores
    (`*_scores*`) lists of numbers. `CheckpointError` naming the file and line otherwise."""
    path = Path(path)
    if not os.path.lexists(path):
        return []
    try:
        data = read_bytes(path, METRICS_LIMIT, CheckpointError, "the metrics", contained)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: a dangling link") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CheckpointError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    lines = text.split("\n")
    torn = lines.pop()  # "" when the file ends with a newline
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}, line {n}"
        try:
            rec = loads_strict(line, CheckpointError)
        except CheckpointError as e:
            raise CheckpointError(f"{where}: {e}") from None
        out.append(_metrics_record(rec, where))
    if torn.strip():
        try:
            out.append(_metrics_record(loads_strict(torn, CheckpointError), f"{path}, line {len(lines) + 1}"))
        except CheckpointError:
            pass  # a torn last line: the run was killed while writing it
    return out


def _metrics_record(rec, where: str) -> dict:
    if not isinstance(rec, dict):
        raise CheckpointError(f"{where}: a record must be a JSON object, got a JSON {type(rec).__name__}")
    field_of(rec, "step", int, where, CheckpointError, lo=0, hi=MAX_STEP)
    field_of(rec, "tokens", int, where, CheckpointError, required=False, lo=0, hi=MAX_STEP * 2**20)
    for key in METRIC_NUMBERS:
        field_of(rec, key, (float, type(None)), where, CheckpointError, required=False)
    for key, v in rec.items():
        if "_scores" in key:
            _numbers(v, where, CheckpointError, key)
    field_of(rec, "failed", str, where, CheckpointError, required=False)
    field_of(rec, "resumed_with", dict, where, CheckpointError, required=False)
    return rec


def read_sweep(path, contained: bool = True) -> dict:
    """A seed sweep's `sweep.json`: an object with `status` (a string), `steps` (an integer >= 0) and `members`, a
    non-empty list of objects each with `seed` (an integer >= 0), `folder` (exactly `seed-<seed>`: a member lives
    inside the sweep) and `status` (a string); `seeds`, `train_config`, `model_config` and `notes` of the right
    types where present. `CheckpointError` naming the file otherwise."""
    path = Path(path)
    d = _json_object(path, CheckpointError, "a sweep summary", contained)
    field_of(d, "status", str, path, CheckpointError)
    field_of(d, "steps", int, path, CheckpointError, lo=0, hi=MAX_STEP)
    members = field_of(d, "members", list, path, CheckpointError)
    if not members:
        raise CheckpointError(f"{path}: 'members' is empty")
    for i, m in enumerate(members):
        where = f"{path}: member {i}"
        _object(m, path, CheckpointError, f"member {i}")
        seed = field_of(m, "seed", int, where, CheckpointError, lo=0, hi=2**63 - 1)
        folder = field_of(m, "folder", str, where, CheckpointError)
        field_of(m, "status", str, where, CheckpointError)
        if folder != f"seed-{seed}":
            raise CheckpointError(f"{where}: folder {folder!r} is not seed-{seed} (a member lives in the sweep "
                                  "folder, named by its seed)")
        field_of(m, "failed_at_step", (int, type(None)), where, CheckpointError, required=False, lo=0, hi=MAX_STEP)
    seeds = field_of(d, "seeds", list, path, CheckpointError, required=False)
    if seeds is not None and not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds):
        raise CheckpointError(f"{path}: 'seeds' must be a list of integers >= 0")
    tc = field_of(d, "train_config", (dict, type(None)), path, CheckpointError, required=False) or {}
    field_of(tc, "batch_size", int, f"{path}: train_config", CheckpointError, required=False, lo=1, hi=MAX_STEP)
    field_of(tc, "seq_len", (int, type(None)), f"{path}: train_config", CheckpointError, required=False, lo=1,
             hi=MAX_STEP)
    mc = field_of(d, "model_config", (dict, type(None)), path, CheckpointError, required=False) or {}
    for key in ("n_ctx", "n_heads"):
        field_of(mc, key, (int, type(None)), f"{path}: model_config", CheckpointError, required=False, lo=1,
                 hi=1 << 24)
    field_of(mc, "model_name", (str, type(None)), f"{path}: model_config", CheckpointError, required=False)
    field_of(d, "notes", (dict, type(None)), path, CheckpointError, required=False)
    return d


# --- sparse autoencoders (SAELens' folder) ----------------------------------------------------------------------------
SAE_DTYPES = ("float32", "float64", "float16", "bfloat16")


def read_sae_cfg(path, contained: bool = True) -> dict:
    """SAELens' `cfg.json` of an SAE folder: an object with `d_in` and `d_sae` (integers in [1, 2^24], their product
    at most 2^32), `architecture` (a string), `dtype` (one of `SAE_DTYPES`, where present) and a hook name (a
    non-empty string, under `metadata.hook_name` as SAELens 6 writes it, or `hook_name`). `SAEError` naming the
    file otherwise."""
    path = Path(path)
    d = _json_object(path, SAEError, "an SAE config", contained, SAE_CFG_LIMIT)
    d_in = field_of(d, "d_in", int, path, SAEError, lo=1, hi=MAX_SAE_WIDTH)
    d_sae = field_of(d, "d_sae", int, path, SAEError, lo=1, hi=MAX_SAE_WIDTH)
    if d_in * d_sae > MAX_SAE_WEIGHTS:
        raise SAEError(f"{path}: d_in {d_in} x d_sae {d_sae} is more than the {MAX_SAE_WEIGHTS:,} weights allowed")
    field_of(d, "architecture", str, path, SAEError)
    dtype = field_of(d, "dtype", str, path, SAEError, required=False)
    if dtype is not None and dtype not in SAE_DTYPES:
        raise SAEError(f"{path}: dtype {dtype[:20]!r} is not one of {', '.join(SAE_DTYPES)}")
    meta = field_of(d, "metadata", (dict, type(None)), path, SAEError, required=False) or {}
    hook = meta.get("hook_name", d.get("hook_name"))
    if not isinstance(hook, str) or not hook.strip() or len(hook) > 256:
        raise SAEError(f"{path}: the hook name (metadata.hook_name) must be a non-empty string, got "
                       f"{type(hook).__name__} {json.dumps(hook)[:40]}")
    return d


#: the tensors of SAELens' SAEs that every architecture has, with their shapes in terms of (d_in, d_sae)
SAE_TENSORS = {"W_enc": ("d_in", "d_sae"), "W_dec": ("d_sae", "d_in"), "b_dec": ("d_in",)}


def read_sae_weights(path, cfg: dict, contained: bool = True) -> dict:
    """The tensors of an SAE's `sae_weights.safetensors`, checked against its `cfg` (`read_sae_cfg`): `W_enc`
    `[d_in, d_sae]`, `W_dec` `[d_sae, d_in]`, `b_dec` `[d_in]`, no more weights in all than
    `2 d_in d_sae + 4 (d_in + d_sae)` (room for an architecture's biases and thresholds), and every value finite (an
    SAE with NaN weights would report every feature dead). `SAEError` naming the file otherwise."""
    path = Path(path)
    dims = {"d_in": cfg["d_in"], "d_sae": cfg["d_sae"]}
    try:
        shapes = read_safetensors_header(path, contained)
    except CheckpointError as e:
        raise SAEError(str(e)) from None
    for name, want in SAE_TENSORS.items():
        expect = [dims[k] for k in want]
        if shapes.get(name) != expect:
            raise SAEError(f"{path}: tensor {name!r} has shape {shapes.get(name)}, where {SAE_CFG_FILE} says "
                           f"{expect}")
    total, bound = sum(math.prod(s) for s in shapes.values()), 2 * dims["d_in"] * dims["d_sae"] + 4 * sum(dims.values())
    if total > bound:
        raise SAEError(f"{path}: {total:,} weights, more than the {bound:,} an SAE of these widths holds")
    try:
        tensors = read_safetensors(path, contained)
    except CheckpointError as e:
        raise SAEError(str(e)) from None
    refuse_non_finite(tensors, path, SAEError)
    return tensors


def read_sae_training(path, contained: bool = True) -> dict:
    """`training.json` beside an SAE (how `circuits sae train` trained it): a JSON object with `hook_name` (a string)
    and `steps` (an integer >= 1); `d_in`, `d_sae`, `expansion`, `batch_size` integers >= 1 and `l1`, `lr`, `seconds`
    numbers >= 0 where present. `SAEError` naming the file otherwise."""
    d = _json_object(path, SAEError, "an SAE's training record", contained)
    field_of(d, "hook_name", str, path, SAEError)
    field_of(d, "steps", int, path, SAEError, lo=1, hi=MAX_STEP)
    for key in ("steps", "d_in", "d_sae", "expansion", "batch_size"):
        field_of(d, key, int, path, SAEError, required=False, lo=1, hi=MAX_STEP)
    for key in ("l1", "lr", "seconds"):
        field_of(d, key, float, path, SAEError, required=False, lo=0)
    return d


def read_sae_folder(folder) -> tuple[dict, dict, dict | None]:
    """`(cfg, tensors, training settings or None)` of an SAE folder, each file through its reader."""
    folder = Path(folder)
    if not folder.is_dir():
        raise SAEError(f"{folder} is not a folder; give a folder `circuits sae train` (or SAELens) wrote")
    if not os.path.lexists(folder / SAE_CFG_FILE):
        raise SAEError(f"{folder} holds no SAE (no {SAE_CFG_FILE}); give a folder `circuits sae train` wrote")
    cfg = read_sae_cfg(folder / SAE_CFG_FILE)
    tensors = read_sae_weights(folder / SAE_WEIGHTS_FILE, cfg)
    training = read_sae_training(folder / SAE_TRAINING_FILE) if os.path.lexists(folder / SAE_TRAINING_FILE) else None
    return cfg, tensors, training

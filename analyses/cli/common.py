"""Shared pieces of the `circuits` command line (`analyses.cli`): the `Command` record, `UsageError`, output
(`emit`: text, `--json`, `--csv`, `--figure`), and the options of the grammar in docs/cli.md (MODEL, `--config`,
`--tokenizer`; `--json`, `--device`, `--seed`, `--no-progress` on every command, `--threads`, `--figure`, `--csv`),
model loading, head parsing and progress bars.

Nothing here imports torch at module level: `circuits --help` must answer at once. Heavy imports happen inside
the functions that need them.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from models.errors import ToyCircuitsError

STATE_DICT_SUFFIXES = (".pth", ".pt", ".bin", ".safetensors")


class UsageError(ToyCircuitsError):
    """Bad input from the user: reported as one line, exit code 2."""


@dataclass
class Command:
    """One `circuits` command: its name, one-line help and the function that adds its arguments, and what runs it.

    `run` is `run(args) -> int` for a command that reads no model (`zoo`, `train`, `sweep`), or, for one that reads
    MODEL, `{kind: run(args, loaded) -> int}` (kinds of `models.arch.kind.KINDS`): the kinds it serves, one function
    each. `run_command` loads the model, asks `models.model_kind` and calls the function of that kind, or refuses any
    other kind in one line (exit 2) naming the command, the kind and the kinds served (`why[kind]` adds the reason).
    `check(args)`, called before the model loads, checks the arguments that need no model; it may answer the command
    itself by returning an exit code (`circuits report` of a seed-sweep folder, which holds no model)."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int] | dict[str, Callable[[argparse.Namespace, Loaded], int]]
    check: Callable[[argparse.Namespace], int | None] | None = None
    why: dict[str, str] = field(default_factory=dict)


def run_command(command: Command, args) -> int:
    """Run `command` on `args`: the one place a model is loaded for a command and a kind it does not serve refused."""
    settle_figure(args, f"circuits {_command_name(args)}")
    if command.check is not None:
        code = command.check(args)
        if code is not None:
            return code
    if callable(command.run):
        return command.run(args)
    from models.arch.kind import KIND_NAMES, model_kind

    loaded = load_model(args, setup_torch(args))
    kind = model_kind(loaded.model)
    if kind not in command.run:
        served = " and ".join(KIND_NAMES[k] for k in command.run)
        why = command.why.get(kind)
        raise UsageError(f"`circuits {command.name}` serves {served} models, not {KIND_NAMES[kind]} ones "
                         f"({loaded.name}){': ' + why if why else ''}")
    return command.run[kind](args, loaded)


def _json_default(o):
    if hasattr(o, "tolist"):  # tensors, numpy arrays and scalars
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    if isinstance(o, (set, tuple)):
        return list(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def clean_json(o):
    """NaN and ±inf become None (JSON has no such numbers); tuples become lists."""
    if isinstance(o, float):
        return None if math.isnan(o) or math.isinf(o) else o
    if isinstance(o, dict):
        return {str(k): clean_json(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [clean_json(v) for v in o]
    return o


def rank() -> int:
    """This process's rank under `torchrun` (0 otherwise): only rank 0 prints results and errors."""
    import os

    return int(os.environ.get("RANK") or 0) if int(os.environ.get("WORLD_SIZE") or 1) > 1 else 0


def warn(line: str) -> None:
    """One line on stderr (rank 0 only under `torchrun`): what the command did that the user may not expect."""
    if rank() == 0:
        print(line, file=sys.stderr)


def emit(args, obj: dict, text: str, table: tuple[list[str], list[list]] | None = None,
         figure: Callable[[], object] | None = None) -> None:
    """A command's result: `--figure PATH` draws `figure()` (a matplotlib Figure of the main result) into PATH and
    names it in the output; then `obj` is printed as JSON with `--json`, `table` (headers, rows) as CSV with `--csv`,
    else `text` (rank 0 only under `torchrun`). A command given `--figure` / `--csv` without a figure / table to
    show refuses in one line (a model kind it draws nothing for)."""
    if getattr(args, "deprecated", None):
        warn(args.deprecated)
    path = getattr(args, "figure", None)
    if path is not None:
        if figure is None:
            raise UsageError(f"--figure: `circuits {_command_name(args)}` draws no figure for this model")
        if rank() == 0:
            import matplotlib

            matplotlib.use("Agg")  # figures go to files
            save_figure(figure(), Path(path))
        obj = dict(obj, figure=str(path))
        text += f"\n\nwrote {path}"
    if getattr(args, "csv", False) and table is None:
        raise UsageError(f"--csv: `circuits {_command_name(args)}` prints no table for this model; use --json")
    if rank() != 0:
        return
    if getattr(args, "json", False):
        print(json.dumps(clean_json(obj), indent=2, default=_json_default))
    elif getattr(args, "csv", False):
        print(csv_text(*table), end="")
    else:
        print(text)


def csv_text(headers: list[str], rows: list[list]) -> str:
    """`rows` under `headers` as CSV (RFC 4180; numbers in full precision, None and NaN as empty cells)."""
    import csv
    import io

    def cell(x):
        if x is None or (isinstance(x, float) and not math.isfinite(x)):
            return "" if x is None or math.isnan(x) else str(x)
        return x

    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(headers)
    w.writerows([[cell(x) for x in r] for r in rows])
    return buf.getvalue()


def _command_name(args) -> str:
    command = getattr(args, "_command", None)
    sub = getattr(args, "sae_command", None)
    return " ".join(x for x in (getattr(command, "name", None) or getattr(args, "command", "?"), sub) if x)


# --- options ------------------------------------------------------------------------------------------
def add_common(p: argparse.ArgumentParser, progress: bool = True, figure: bool = False, csv: bool = False,
               legacy_png_out: bool = False) -> None:
    """The options of the command-line grammar (docs/cli.md): `--json` (and `--csv` where the output is a table,
    `figure`: `--figure PATH` where the command has a figure of its main result), `--device`, `--seed` and
    `--no-progress` on every command; `--threads` where work runs (`progress`). `legacy_png_out`: the command took
    `--out FIG.png` before `--figure` (kept for one release, with a deprecation line: `settle_figure`)."""
    g = p.add_argument_group("common options")
    fmt = g.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="machine-readable output (JSON on stdout)")
    if csv:
        fmt.add_argument("--csv", action="store_true", help="the main table as CSV on stdout")
    if figure:
        g.add_argument("--figure", metavar="PATH.png", help="also draw the main result into this PNG file")
    if legacy_png_out:
        g.add_argument("--out", dest="legacy_out", metavar="FIG.png", help=argparse.SUPPRESS)
    g.add_argument("--device", default="auto", help="auto (default: cuda, then mps, then cpu), cpu, cuda[:N], mps")
    g.add_argument("--seed", type=seed_int, default=0, help="seed of random probe tokens and sampling (default 0)")
    if progress:
        g.add_argument("--threads", type=int, default=None,
                       help="torch CPU threads (default 1: these models are small and threads contend)")
    g.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def settle_figure(args, where: str) -> None:
    """Before anything runs: `--figure PATH` checked (a .png in an existing folder). `--out FIG.png` where a command
    took it before `--figure` (attention, patch, lens) is still read as `--figure FIG.png` for this release, with a
    deprecation line on stderr when the command succeeds; `--out` that is no .png there is refused: `--out` names a
    folder in every command."""
    legacy = getattr(args, "legacy_out", None)
    if legacy is not None:
        if Path(legacy).suffix.lower() != ".png":
            raise UsageError(f"--out {legacy}: `--out` names a folder, and `{where}` writes none; give --figure "
                             "FIG.png for its figure")
        if getattr(args, "figure", None) is not None:
            raise UsageError("--out FIG.png is the deprecated spelling of --figure; give only --figure")
        # said when the command succeeds (`emit`), so that bad input still gets its one line
        args.deprecated = f"{where}: --out FIG.png is deprecated and will be refused in the next release; use " \
                          f"--figure {legacy}"
        args.figure, args.legacy_out = legacy, None
    if getattr(args, "figure", None) is not None:
        check_png_out(args.figure, "--figure")


def add_model(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL",
                   help="a zoo name (see `circuits zoo`), a saved model folder, or a TransformerLens state dict "
                        "(.pth/.safetensors) with --config")
    p.add_argument("--config", metavar="CONFIG.json",
                   help="config of a state-dict MODEL: ours (config.json) or a TransformerLens config dict")
    p.add_argument("--tokenizer", metavar="TOKENIZER.json", help="attach this tokenizer (for a state-dict MODEL)")


def positive_int(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {s!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
    return v


MAX_SEED = 2**32 - 1  # as models.training.config.TrainConfig.MAX_SEED (not imported: --help stays fast)


def seed_int(s: str) -> int:
    """A seed, 0 … `MAX_SEED`, for argparse."""
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a seed (an integer), got {s!r}") from None
    if not 0 <= v <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"expected a seed in 0 … {MAX_SEED}, got {v}")
    return v


# --- setup --------------------------------------------------------------------------------------------
def setup_torch(args):
    """Seed torch, set its threads and return the `torch.device` that `--device` names (checked)."""
    import torch

    torch.manual_seed(args.seed)
    threads = getattr(args, "threads", None)
    if threads is not None and threads < 1:
        raise UsageError(f"--threads must be >= 1, got {threads}")
    torch.set_num_threads(threads or 1)
    return resolve_device(args.device)


def resolve_device(spec: str):
    import torch

    spec = (spec or "auto").lower()
    if spec == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        dev = torch.device(spec)
    except RuntimeError:
        raise UsageError(f"unknown device {spec!r}; use auto, cpu, cuda, cuda:N or mps") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(f"device {spec!r} is not available here (no CUDA GPU); use --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise UsageError(f"device {spec!r} does not exist; this machine has {torch.cuda.device_count()} GPU(s)")
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise UsageError(f"device {spec!r} is not available here; use --device cpu")
    elif dev.type not in ("cpu", "cuda", "mps"):
        raise UsageError(f"unsupported device {spec!r}; use auto, cpu, cuda, cuda:N or mps")
    return dev


def read_json_object(spec: str, what: str) -> dict:
    """A JSON object from a file path, or given inline when `spec` starts with `{`."""
    from models.files.safe_read import JSON_LIMIT, loads_strict, read_bytes

    inline = spec.lstrip().startswith("{")
    try:
        d = loads_strict(spec if inline else read_bytes(spec, JSON_LIMIT, UsageError, what), UsageError)
    except OSError as e:
        raise UsageError(f"cannot read {what} {spec}: {e.strerror}") from None
    except UsageError as e:  # strict JSON: no NaN, no overflowing number, no key given twice
        if str(e).startswith(str(spec)):
            raise
        raise UsageError(f"{what} {'(inline) ' if inline else ''}{spec} is {e}") from None
    if not isinstance(d, dict):
        raise UsageError(f"{what} {spec} must hold a JSON object")
    return d


@dataclass
class Loaded:
    """A loaded model, the name to show, its folder (None for a state-dict file) and the device it is on."""

    model: object
    name: str
    folder: Path | None
    device: object = None


def load_model(args, device) -> Loaded:
    """The model MODEL names: a zoo name, a folder, or a state-dict file with `--config` (see `add_model`)."""
    import models
    from models.io.checkpoint import resolve

    spec = args.model
    path = Path(spec)
    if path.is_file() or (path.suffix in STATE_DICT_SUFFIXES and not path.is_dir()):
        if not path.exists():
            raise UsageError(f"{spec}: no such file")
        if not args.config:
            raise UsageError(f"{spec} is a state-dict file: pass --config CONFIG.json (our config.json or a "
                             "TransformerLens config dict) to say its architecture")
        cfg = read_json_object(args.config, "config")
        model = models.from_transformer_lens_state_dict(path, cfg)
        model.to(device)
        model.cfg.device = str(device)
        folder, name = None, path.stem if path.stem not in ("model", "state_dict") else str(path)
    else:
        if args.config:
            raise UsageError("--config is only for a state-dict MODEL file; a model folder carries its config.json")
        folder = resolve(spec)  # CheckpointError (exit 2) for unknown names lists the zoo
        from models.io.readers import check_model_folder

        check_model_folder(folder)  # its train_config.json and summary.json, read before anything is written
        model = models.load(folder, device=device)
        name = spec
    if getattr(args, "tokenizer", None):
        from models.data.tokenizer import load_tokenizer

        if not Path(args.tokenizer).is_file():
            raise UsageError(f"{args.tokenizer}: no such tokenizer file")
        tok = load_tokenizer(args.tokenizer)
        if tok.vocab_size > model.cfg.d_vocab:
            raise UsageError(f"--tokenizer {args.tokenizer} has {tok.vocab_size} ids but the model's d_vocab is "
                             f"{model.cfg.d_vocab}: not this model's tokenizer")
        model.tokenizer = tok
    model.eval()
    return Loaded(model, name, folder, device)


def _given(args, option: str):
    return getattr(args, option.lstrip("-").replace("-", "_"), None)


def refuse_options(args, loaded: Loaded, options: tuple[str, ...], needed: str) -> None:
    """`UsageError` for any of `options` given (they are another kind's: e.g. an encoder–decoder's `--source`), and
    for `needed` missing or empty (e.g. `--text`)."""
    used = [o for o in options if _given(args, o) is not None]
    if used:
        raise UsageError(f"{'/'.join(used)}: only for encoder-decoder models; {loaded.name} takes {needed}")
    if not _given(args, needed):
        raise UsageError(f"{needed} is empty or missing")


def parameter_counts(model) -> dict[str, int]:
    """Parameter counts by component (embed, pos_embed, blocks.L.attn, blocks.L.mlp, norms, unembed) and total."""
    out: dict[str, int] = {}
    for name, p in model.named_parameters():
        parts = name.split(".")
        key = ".".join(parts[:3]) if parts[0] == "blocks" and parts[2] in ("attn", "mlp") else \
            ("norms" if parts[0] in ("ln_final",) or (parts[0] == "blocks" and parts[2].startswith("ln")) else parts[0])
        out[key] = out.get(key, 0) + p.numel()
    out["total"] = sum(v for k, v in out.items())
    return out


def parse_head(spec: str, cfg) -> tuple[int, int]:
    """`"L.H"` (ARENA's "1.4") or `"L1H4"` → (layer, head), checked against the model's shape."""
    s = spec.strip().upper()
    try:
        if s.startswith("L") and "H" in s:
            layer, head = (int(x) for x in s[1:].split("H", 1))
        else:
            layer, head = (int(x) for x in s.split(".", 1))
    except ValueError:
        raise UsageError(f"--head {spec!r}: expected LAYER.HEAD (e.g. 1.4) or L1H4") from None
    if cfg.n_layers == 0:
        raise UsageError(f"--head {spec}: this model has no attention layers (n_layers = 0)")
    if not (0 <= layer < cfg.n_layers and 0 <= head < cfg.n_heads):
        raise UsageError(f"--head {spec} is out of range: layers 0..{cfg.n_layers - 1}, heads "
                         f"0..{cfg.n_heads - 1} (e.g. --head {cfg.n_layers - 1}.0)")
    return layer, head


def need_layers(loaded: Loaded, n: int, what: str) -> None:
    L = loaded.model.cfg.n_layers
    if L < n:
        raise UsageError(f"{what} needs a model with at least {n} attention layer(s); {loaded.name} has {L}")


def progress(args, total: int, desc: str):
    """A tqdm bar on stderr that appears only when the work takes more than half a second."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, file=sys.stderr, delay=0.5, leave=False,
                disable=getattr(args, "no_progress", False))


# --- text -------------------------------------------------------------------------------------------------
TEXT_TOKENS = 400_000  # tokens of --text-file read (more when the windows need more)


def read_text_tokens(model, text_file: str, max_tokens: int = TEXT_TOKENS):
    """The first `max_tokens` token ids (1-D int64) of a text file, tokenized with the model's tokenizer. Only
    the bytes those tokens need are read (a token covers at least one byte), so memory does not grow with the
    file; a FIFO or device is refused."""
    import torch

    from models.files.safe_read import open_regular

    if model.tokenizer is None:
        raise UsageError("--text-file needs a tokenizer: this model has none (pass --tokenizer TOKENIZER.json)")
    try:
        with open_regular(text_file, 1 << 60, UsageError, "--text-file") as f:
            data = f.read(4 * max_tokens)
    except OSError as e:
        raise UsageError(f"cannot read --text-file {text_file}: {e.strerror}") from None
    if b"\x00" in data[:8192]:
        raise UsageError(f"--text-file {text_file} looks binary (NUL bytes); give a text file")
    raw = data.decode("utf-8", errors="replace")
    ids = torch.tensor(model.tokenizer.encode(raw)[:max_tokens], dtype=torch.long)
    ids = ids[ids < model.cfg.d_vocab]
    if ids.numel() < 2:
        raise UsageError(f"--text-file {text_file} holds {ids.numel()} tokens; need text to measure losses on")
    return ids


def validation_windows(loaded: Loaded, args, n: int, seed: int = 0, corpus=None):
    """`(tokens [n, n_ctx] with BOS first, description, vocabulary)`: windows of `--text-file` if given, else of
    the validation split of the corpus the model was trained on (`corpus`, when the caller has it already; else the
    folder's train_config.json, default the pinned standard library, tokenized once and cached), else
    `(None, reason, None)`. The vocabulary is the ids
    of the whole text read (up to 400k tokens), which random probes are drawn from, as in the report."""
    from models.files.size_checks import check_memory

    from ..sequences import bos_token_id
    from ..util import windows

    model = loaded.model
    n_ctx = model.cfg.n_ctx
    text_file = getattr(args, "text_file", None)
    cfg = model.cfg
    check_memory("--windows", n, n_ctx * (4 * cfg.d_vocab + 8 * cfg.d_model * max(cfg.n_layers, 1)
                                          + 4 * cfg.n_heads * n_ctx), UsageError)  # logits, residuals, patterns (f32)
    if text_file:
        ids = read_text_tokens(model, text_file, max(TEXT_TOKENS, n * n_ctx))
        if ids.numel() < n_ctx:
            raise UsageError(f"--text-file {text_file} holds {ids.numel()} tokens; need at least {n_ctx} (n_ctx)")
        return (windows(ids, n_ctx, n, seed, bos=bos_token_id(model)), f"{n} windows of {n_ctx} tokens of {text_file}",
                ids.unique())
    from ..report import corpus_note, training_corpus, validation_text

    corpus = corpus if corpus is not None else training_corpus(model, loaded.folder)
    text, vocab = validation_text(model, loaded.folder, 400_000, corpus)
    if text is None or text.numel() < n_ctx:
        return None, "no validation text (the model has no tokenizer or its corpus is unavailable)", None
    return (windows(text, n_ctx, n, seed, bos=bos_token_id(model)),
            f"{n} validation windows of {n_ctx} tokens ({corpus_note(corpus, loaded.folder)})", vocab)


def table(headers: list[str], rows: list[list], digits: int = 3) -> str:
    """A plain aligned text table (numbers with `digits` decimals, None as —, booleans yes/no)."""
    def cell(x):
        if x is None:
            return "—"
        if isinstance(x, bool):
            return "yes" if x else "no"
        if isinstance(x, float):
            return "—" if math.isnan(x) else f"{x:.{digits}f}"
        return str(x)

    cells = [[cell(c) for c in r] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    num = [all(isinstance(r[i], (int, float)) or r[i] is None for r in rows) for i in range(len(headers))]
    fmt = lambda vals: "  ".join(v.rjust(w) if n else v.ljust(w) for v, w, n in zip(vals, widths, num)).rstrip()
    return "\n".join([fmt(headers), fmt(["-" * w for w in widths])] + [fmt(r) for r in cells])


def check_png_out(out: str | None, option: str = "--figure") -> Path | None:
    """`option FIG.png` as a path whose folder exists (None when not given); a `UsageError` otherwise."""
    if out is None:
        return None
    path = Path(out)
    if path.suffix.lower() != ".png":
        raise UsageError(f"{option} {out}: expected a .png file name")
    if path.is_dir():
        raise UsageError(f"{option} {out} is a folder; give a .png file name")
    if not path.parent.is_dir():
        raise UsageError(f"{option} {out}: folder {path.parent} does not exist")
    return path


def save_figure(fig, path: Path, **savefig_kwargs) -> None:
    """Write a matplotlib figure atomically (`models.files.atomic.atomic_write`: a failed write leaves any earlier
    file untouched). Closes the figure."""
    import matplotlib.pyplot as plt

    from models.files.atomic import atomic_write

    savefig_kwargs.setdefault("format", path.suffix.lstrip(".") or "png")
    try:
        atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=100, **savefig_kwargs))
    finally:
        plt.close(fig)

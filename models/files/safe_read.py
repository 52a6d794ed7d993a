"""Reading a file we were pointed at, safely: it must be a regular file (a FIFO would block forever, a link to
`/dev/zero` would never end) no larger than a bound, checked on the open descriptor before reading anything.
Free of torch imports (the command line uses it before loading a model)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

MiB = 1 << 20
JSON_LIMIT = 64 * MiB  # config.json, trainer_state.json, train_config.json, summary.json, CLI JSON
TOKENIZER_LIMIT = 256 * MiB


def check_contained(path, error: type[Exception], what: str = "file") -> None:
    """`error` naming `path` when it is a symbolic link whose target lies outside the folder holding it (a folder we
    were given is read as it is, never what a link in it points at elsewhere)."""
    path = Path(path)
    if not path.is_symlink():
        return
    folder = os.path.realpath(path.parent)
    target = os.path.realpath(path)
    if os.path.commonpath([folder, target]) != folder:
        raise error(f"{path}: cannot read {what}: a symbolic link leading out of its folder (to {target})")


def open_regular(path, limit: int, error: type[Exception], what: str = "file", contained: bool = False):
    """An open binary file object for `path` after checking, on the descriptor, that it is a regular file of at most
    `limit` bytes; raises `error` naming the file otherwise (FileNotFoundError is left to the caller as is).
    `contained`: also refuse a symbolic link leading out of the file's folder (`check_contained`)."""
    path = Path(path)
    if contained:
        check_contained(path, error, what)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a FIFO opens without waiting for a writer
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "Is a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file (a FIFO, device or socket)"
            raise error(f"{path}: cannot read {what}: {kind}")
        if st.st_size > limit:
            raise error(f"{path}: cannot read {what}: {st.st_size:,} bytes, more than the {limit:,} allowed")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path, limit: int, error: type[Exception], what: str = "file", contained: bool = False) -> bytes:
    """The bytes of regular file `path`, at most `limit` of them (see `open_regular`); an unreadable file raises
    `error` naming it, except FileNotFoundError, which callers word themselves."""
    try:
        with open_regular(path, limit, error, what, contained) as f:
            data = f.read(limit + 1)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise error(f"{path}: cannot read {what}: {e.strerror or e}") from None
    if len(data) > limit:  # grew while we read it
        raise error(f"{path}: cannot read {what}: more than the {limit:,} bytes allowed")
    return data


def read_text(path, limit: int, error: type[Exception], what: str = "file", contained: bool = False) -> str:
    """`read_bytes` decoded as UTF-8; invalid UTF-8 raises `error`."""
    try:
        return read_bytes(path, limit, error, what, contained).decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{path}: cannot read {what}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number JSON allows (non-finite numbers are refused)")


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"{text[:40]} overflows a float (non-finite numbers are refused)")
    return value


def _unique(pairs: list) -> dict:
    d: dict = {}
    for k, v in pairs:
        if k in d:
            raise ValueError(f"key {k!r} appears twice in one JSON object")
        d[k] = v
    return d


def loads_strict(text: str | bytes, error: type[Exception]):
    """`json.loads(text)` refusing what Python's reader lets through: NaN and ±Infinity, numbers that overflow a
    float (`1e999`), a key given twice in one object, integers of more than 4300 digits and nesting deep enough to
    exhaust the stack; each raises `error` with the reason (the caller names the file)."""
    try:
        return json.loads(text, parse_constant=_no_constant, parse_float=_finite_float, object_pairs_hook=_unique)
    except json.JSONDecodeError as e:
        raise error(f"not valid JSON ({e})") from None
    except UnicodeDecodeError as e:
        raise error(f"not UTF-8 text ({e.reason} at byte {e.start})") from None
    except RecursionError:
        raise error("not valid JSON (RecursionError: nested too deeply)") from None
    except ValueError as e:
        raise error(f"not valid JSON ({e})") from None


def read_json(path, limit: int, error: type[Exception], what: str = "file", contained: bool = False):
    """The JSON value of regular file `path` (`read_bytes`, then `loads_strict`); `error` naming the file for anything
    unreadable, `FileNotFoundError` as it is."""
    data = read_bytes(path, limit, error, what, contained)
    try:
        return loads_strict(data, error)
    except error as e:
        raise error(f"{path}: cannot read {what}: {e}") from None

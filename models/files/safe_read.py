"""Reading a file we were pointed at, safely: it must be a regular file (a FIFO would block forever, a link to
`/dev/zero` would never end) no larger than a bound, checked on the open descriptor before reading anything.
Free of torch imports (the command line uses it before loading a model)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

MiB = 1 << 20
JSON_LIMIT = 64 * MiB  # config.json, trainer_state.json, train_config.json, summary.json, CLI JSON
TOKENIZER_LIMIT = 256 * MiB


def open_regular(path, limit: int, error: type[Exception], what: str = "file"):
    """An open binary file object for `path` after checking, on the descriptor, that it is a regular file of at most
    `limit` bytes; raises `error` naming the file otherwise (FileNotFoundError is left to the caller as is)."""
    path = Path(path)
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


def read_bytes(path, limit: int, error: type[Exception], what: str = "file") -> bytes:
    """The bytes of regular file `path`, at most `limit` of them (see `open_regular`); an unreadable file raises
    `error` naming it, except FileNotFoundError, which callers word themselves."""
    try:
        with open_regular(path, limit, error, what) as f:
            data = f.read(limit + 1)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise error(f"{path}: cannot read {what}: {e.strerror or e}") from None
    if len(data) > limit:  # grew while we read it
        raise error(f"{path}: cannot read {what}: more than the {limit:,} bytes allowed")
    return data


def read_text(path, limit: int, error: type[Exception], what: str = "file") -> str:
    """`read_bytes` decoded as UTF-8; invalid UTF-8 raises `error`."""
    try:
        return read_bytes(path, limit, error, what).decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{path}: cannot read {what}: not UTF-8 text ({e.reason} at byte {e.start})") from None

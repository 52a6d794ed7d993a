"""Folders written atomically: a crash or an error at any point leaves either the previous folder or the new one,
never a half-written one (checkpoints, run folders, corpus caches)."""

from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path


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


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_text(path, text: str) -> Path:
    """Write the file `path` atomically: `text` goes to a temporary file beside it (mode as a new file's, from the
    umask), which is then renamed into place; a crash leaves the previous file or the new one."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def atomic_write_json(path, data) -> Path:
    """`atomic_write_text` of `data` as indented JSON with a final newline."""
    return atomic_write_text(path, json.dumps(data, indent=1) + "\n")


def atomic_write_dir(path, write_contents) -> Path:
    """Create folder `path` atomically: `write_contents(tmp_dir)` fills a temporary sibling folder, whose
    files are fsynced, then it takes `path`'s place in one atomic swap (`renameat2(RENAME_EXCHANGE)` on Linux;
    elsewhere two renames, and a crash between them is repaired by the next save or load). A crash or error at
    any point leaves either the previous folder or the new one, never a half-written one; what a crash can leave
    behind are hidden `.{name}.tmp-*` siblings, which nothing loads.
    Folders and files get the modes the umask gives (0755 / 0644 under umask 022)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _recover(path)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    old = None
    try:
        write_contents(tmp)
        mask = _umask()
        for f in [tmp, *tmp.rglob("*")]:  # the modes a plain mkdir / open gives (mkdtemp makes 0700, some writers 0600)
            if f.is_symlink():
                continue
            os.chmod(f, (0o777 if f.is_dir() else 0o666) & ~mask)
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



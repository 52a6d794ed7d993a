"""The one atomic writer: every file and folder the toolkit writes goes through here, so a crash or an error at any
point leaves either the previous file (folder) or the new one, never a half-written one.

Durability policy, in one place (`sync_file`, `sync_folder`): a file's bytes are fsynced before it is renamed into
place, and the folder that holds the new name is fsynced after the rename; a file system that cannot fsync a folder
(some network file systems) is tolerated. Modes are those a plain `open` / `mkdir` gives under the umask (0644 /
0755 under umask 022), whatever the temporary file or folder was created with.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path


# --- the durability policy ------------------------------------------------------------------------------------------
def umask() -> int:
    """The process's umask (read without changing it for longer than the two calls)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def sync_file(path: Path, mask: int | None = None) -> None:
    """Give regular file `path` the mode a new file gets under the umask and flush its bytes to disk."""
    os.chmod(path, 0o666 & ~(umask() if mask is None else mask))
    with open(path, "rb+") as fh:
        os.fsync(fh.fileno())


def sync_folder(path: Path) -> None:
    """Flush folder `path`'s entries (the names renamed into it) to disk, where the file system can."""
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


def sync_tree(folder: Path) -> None:
    """`sync_file` every file under `folder`, folders to the umask's mode, then `sync_folder` each folder (links are
    left as they are)."""
    mask = umask()
    for f in [folder, *folder.rglob("*")]:
        if f.is_symlink():
            continue
        if f.is_dir():
            os.chmod(f, 0o777 & ~mask)
        elif f.is_file():
            sync_file(f, mask)
    for f in [*folder.rglob("*"), folder]:
        if f.is_dir() and not f.is_symlink():
            sync_folder(f)


# --- files ----------------------------------------------------------------------------------------------------------
def atomic_write(path, write: Callable[[Path], object]) -> Path:
    """Write the file `path` atomically: `write(tmp)` fills a temporary file beside it (a writer that takes a path:
    `fig.savefig`, a tokenizer's `save`), which is synced (`sync_file`) and renamed into place; the folder is synced
    after. A crash or error leaves the previous file or the new one, and no temporary file."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        sync_file(Path(tmp))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    sync_folder(path.parent)
    return path


def atomic_write_bytes(path, data: bytes) -> Path:
    """`atomic_write` of the bytes `data`."""
    return atomic_write(path, lambda tmp: tmp.write_bytes(data))


def atomic_write_text(path, text: str) -> Path:
    """`atomic_write` of `text` as UTF-8."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path, data) -> Path:
    """`atomic_write_text` of `data` as indented JSON with a final newline."""
    return atomic_write_text(path, json.dumps(data, indent=1) + "\n")


# --- folders --------------------------------------------------------------------------------------------------------
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
    behind are hidden `.{name}.tmp-*` siblings, which nothing loads.
    Folders and files get the modes the umask gives (0755 / 0644 under umask 022)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _recover(path)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    old = None
    try:
        write_contents(tmp)
        sync_tree(tmp)  # the modes a plain mkdir / open gives (mkdtemp makes 0700, some writers 0600), on disk
        if path.exists() and _exchange(tmp, path):
            old = tmp  # the swap put the previous folder at tmp
        else:
            if path.exists():
                old = path.parent / f".{path.name}.old-{os.getpid()}"
                os.replace(path, old)
            os.replace(tmp, path)
        sync_folder(path.parent)
    except BaseException:
        if old is not tmp:
            shutil.rmtree(tmp, ignore_errors=True)
            if old is not None and not path.exists():
                os.replace(old, path)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return path



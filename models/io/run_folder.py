"""Run folders: every folder a command writes (a training run, a seed sweep and its members, an SAE, a report, a
sweep report, the exposure-bias results) is checked, owned, locked, staged and published here.

- **Owned.** A folder carries a mark, the hidden file `MARK_FILE` (`{"kind": ..., "member_of": ...}`), saying which
  kind of command wrote it (`KINDS`) and, for a sweep's member, that it belongs to the folder above. A command writes
  only a folder that is new, empty or of its own kind (`check_folder`); a folder of another kind, a foreign folder of
  other files, or a member of a seed sweep (for anything but the sweep itself) is refused with `FolderError` before
  anything is written. Folders written before marks existed are recognised by the caller's `legacy(folder)`.
- **Locked.** While a command writes a folder it holds an exclusive lock (`lock`: `fcntl.flock` on the hidden file
  `.{name}.lock` beside the folder, holding the holder's PID; `filelock` where there is no `fcntl`). A second command
  on the same folder is refused naming that PID; a lock left by a killed process is free (the kernel drops a dead
  process's locks) and is taken over.
- **Staged and published.** `staged` yields a hidden sibling folder to write the new files into; at the end the
  folder's other files are carried over (hard links, else copies) and the staged folder takes the folder's place in
  one atomic swap (`models.files.atomic.atomic_write_dir`): a crash or an error at any point leaves the folder as it
  was, or complete. Stages of killed runs are removed by the next run that holds the lock.
- **Never deletes what it did not write.** Nothing here removes a file it did not create; files a user adds to a run
  folder survive every rewrite.
- **A full disk** (ENOSPC, EDQUOT) while a folder is written raises `DiskFullError` (an environment error) naming it.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..errors import DiskFullError, FolderError
from ..files.atomic import atomic_write_dir, atomic_write_json
from ..files.safe_read import read_text

__all__ = ["MARK_FILE", "KINDS", "Mark", "read_mark", "owner", "check_folder", "lock", "claim", "open_folder",
           "staged", "write_folder", "carry_over", "disk_full"]

MARK_FILE = ".toy-circuits.json"
_MARK_LIMIT = 1 << 16

#: The kinds of folder a command writes, each with the words a message uses for it.
KINDS = {"train": "a training run", "sweep": "a seed sweep", "sweep-member": "a member of a seed sweep",
         "sae": "a sparse-autoencoder folder", "sae-report": "an SAE report", "report": "a circuits report",
         "sweep-report": "a seed-sweep report",
         "exposure-bias": "exposure-bias results", "discovery": "a circuit-discovery result"}
#: The kinds a folder of this kind may hold as its sub-folders (a sweep holds its members and reports on it).
NESTED = {"sweep": ("sweep-member", "sweep-report", "report")}
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


@dataclass(frozen=True)
class Mark:
    """What wrote a folder: its `kind` (a key of `KINDS`) and, for a member, `member_of` (the owning folder, relative
    to this one: ".." for a sweep's member)."""

    kind: str
    member_of: str | None = None

    def to_dict(self) -> dict:
        return {"format": "toy-circuits folder", "kind": self.kind, "member_of": self.member_of}


Legacy = Callable[[Path], "Mark | None"]


def read_mark(folder) -> Mark | None:
    """The mark of `folder` (None where it has none); a mark that is not ours raises `FolderError`."""
    path = Path(folder) / MARK_FILE
    if not path.exists() and not path.is_symlink():
        return None
    try:
        d = json.loads(read_text(path, _MARK_LIMIT, FolderError, "the folder's mark"))
    except json.JSONDecodeError as e:
        raise FolderError(f"{path}: the folder's mark is not valid JSON ({e.msg}); the folder was changed by hand: "
                          "give a new folder (nothing was written)") from None
    if not isinstance(d, dict) or d.get("kind") not in KINDS or not isinstance(d.get("member_of"), (str, type(None))):
        raise FolderError(f"{path}: not a toy-circuits folder mark (kind one of {sorted(KINDS)}); give a new folder "
                          "(nothing was written)")
    return Mark(d["kind"], d["member_of"])


def owner(folder, legacy: Legacy | None = None) -> Mark | None:
    """The mark of `folder`, else what `legacy(folder)` recognises (a folder written before marks existed), else
    None (a foreign folder, or none at all)."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    mark = read_mark(folder)
    if mark is None and legacy is not None:
        mark = legacy(folder)
    return mark


def _describe(folder: Path, mark: Mark) -> str:
    if mark.member_of is not None:
        return f"{KINDS[mark.kind]} (the one in {os.path.normpath(folder / mark.member_of)})"
    return KINDS[mark.kind]


def check_folder(out, kind: str, legacy: Legacy | None = None) -> Path:
    """The real path of folder `out` (a link is followed: the folder is written at its target and the link stays),
    checked before any work and without writing anything: not the current folder or one holding it (a published
    folder takes its place in one swap), and new, empty or of `kind` (its mark, else `legacy`); not inside a folder
    whose kind does not hold `kind` (`NESTED`: a sweep's sub-folders are its members and reports on it). Raises
    `FolderError` naming the folder otherwise (`NotADirectoryError` where it, or a folder above it, is a file)."""
    if kind not in KINDS:
        raise ValueError(f"unknown folder kind {kind!r}; kinds: {sorted(KINDS)}")
    real = Path(os.path.realpath(out))
    cwd = Path.cwd().resolve()
    if real == cwd or real in cwd.parents:
        raise FolderError(f"{out} is the current folder or holds it; give a sub-folder (a finished folder takes "
                          "its place in one atomic swap)")
    above = next(p for p in (real, *real.parents) if p.exists())
    if not above.is_dir():  # the folder, or a folder on its way, is a file
        raise NotADirectoryError(f"{out} exists and is not a folder" if above == real else
                                 f"cannot write {out}: {os.strerror(errno.ENOTDIR)} ({above} is a file)")
    if real.is_dir() and any(real.iterdir()):
        mark = owner(real, legacy)
        if mark is None:
            raise FolderError(f"{out} is a non-empty folder that is not {KINDS[kind]}; give a new or empty folder "
                              "(nothing was written)")
        if mark.kind != kind:
            what = _describe(real, mark)
            hint = " (resume the sweep, or train into a new folder)" if mark.kind == "sweep-member" else ""
            raise FolderError(f"{out} is {what}, not {KINDS[kind]}{hint}; give a new or empty folder (nothing was "
                              "written)")
    parent = owner(real.parent, legacy)
    if parent is not None and parent.kind in NESTED and kind not in NESTED[parent.kind]:
        raise FolderError(f"{out} is inside {KINDS[parent.kind]} ({real.parent}), whose sub-folders are its own; "
                          f"give a folder outside it (nothing was written)")
    return real


def claim(folder, kind: str, member_of: str | None = None) -> Path:
    """Create `folder` if needed and mark it as `kind` (a member: `member_of`); call it when the command starts
    writing, after every check passed."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    mark = Mark(kind, member_of)
    if read_mark(folder) != mark:
        atomic_write_json(folder / MARK_FILE, mark.to_dict())
    return folder


# --- the lock -------------------------------------------------------------------------------------------------------
def _lock_path(folder: Path) -> Path:
    return folder.parent / f".{folder.name}.lock"


@contextmanager
def lock(folder, wait: bool = False):
    """Hold an exclusive lock on `folder` while the body runs (see the module docstring); a second holder raises
    `FolderError` naming the first one's PID, or with `wait` waits for it (processes that share a folder, each
    writing files of its own). Forked children share it (a report's section workers)."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    path = _lock_path(folder)
    try:
        import fcntl
    except ImportError:  # Windows: filelock's msvcrt lock (no PID to name)
        from filelock import FileLock, Timeout

        held = FileLock(str(path))
        try:
            held.acquire(timeout=-1 if wait else 0)
        except Timeout:
            raise _in_use(folder, "unknown") from None
        try:
            yield folder
        finally:
            held.release()
        return
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise _in_use(folder, holder) from None
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                break  # the lock file we hold is still the one at that path (not one a releasing holder unlinked)
        except FileNotFoundError:
            pass
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield folder
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
        os.close(fd)


def _in_use(folder: Path, holder: str) -> FolderError:
    return FolderError(f"{folder} is in use by another process (PID {holder}); wait for it to finish or choose "
                       "another folder (nothing was written)")


# --- a full disk ----------------------------------------------------------------------------------------------------
#: how the safetensors library (Rust) spells the operating system's "disk full" errors in its own error type
_RUST_DISK_FULL = {"code: 28,": errno.ENOSPC, "StorageFull": errno.ENOSPC, "code: 122,": errno.EDQUOT,
                   "QuotaExceeded": errno.EDQUOT}


def disk_full_errno(e: BaseException) -> int | None:
    """ENOSPC / EDQUOT where `e` says the disk (or the quota) is full: an `OSError` with that errno, or a library's
    own error type whose message carries it (safetensors' `SafetensorError`, SAELens' weights); None otherwise."""
    code = e.errno if isinstance(e, OSError) else \
        next((c for text, c in _RUST_DISK_FULL.items() if text in str(e)), None)
    return code if code in _DISK_FULL else None


@contextmanager
def disk_full(folder):
    """Turn a full disk in the body (`disk_full_errno`) into `DiskFullError` naming `folder` (other errors pass as
    they are)."""
    try:
        yield
    except DiskFullError:
        raise
    except Exception as e:
        code = disk_full_errno(e)
        if code is None:
            raise
        raise DiskFullError(code, f"the disk is full ({os.strerror(code)}) while writing {folder}; it holds what it "
                                  "held before: free some space and run again") from e


# --- writing a folder -----------------------------------------------------------------------------------------------
@contextmanager
def open_folder(out, kind: str, legacy: Legacy | None = None):
    """Check folder `out` (`check_folder`) and hold its lock while the body writes it in place (a training run, a
    sweep); yields its real path. The body marks it (`claim`) once its own checks pass. A full disk raises
    `DiskFullError`; a folder this call found missing is removed again if the body fails leaving nothing in it but
    its mark."""
    real = check_folder(out, kind, legacy)
    new = not real.exists()
    with lock(real), disk_full(real):
        try:
            yield real
        except BaseException:
            if new:  # a command that failed before writing anything leaves no folder behind
                _remove_if_unused(real)
            raise


def _remove_if_unused(folder: Path) -> None:
    """Remove `folder`, which this process created, if it holds nothing but its mark."""
    try:
        entries = list(folder.iterdir())
        if all(e.name == MARK_FILE and e.is_file() for e in entries):
            for e in entries:
                e.unlink()
            folder.rmdir()
    except OSError:
        pass


def carry_over(src: Path, dst: Path) -> None:
    """Give `dst` every entry of `src` that `dst` does not have yet (hard links, else copies; folders entry by
    entry, links as links): the files a new version of a folder keeps from the old one. An entry `dst` has (a file
    or a folder) is kept as it is."""
    for entry in src.iterdir():
        target = dst / entry.name
        taken = target.exists() or target.is_symlink()  # the new version's own entry of that name wins
        if entry.is_dir() and not entry.is_symlink():
            if not taken:
                target.mkdir()
            if target.is_dir() and not target.is_symlink():  # two folders: merged, entry by entry
                carry_over(entry, target)
        elif taken:
            continue
        elif entry.is_symlink():
            os.symlink(os.readlink(entry), target)
        else:
            try:
                os.link(entry, target)
            except OSError:
                shutil.copy2(entry, target)


_STAGE = ".{name}.stage-"


def _remove_dead_stages(real: Path) -> None:
    """Staging folders (and `atomic_write_dir`'s half-filled new versions) that killed runs left beside `real`: dead,
    since every stager holds `real`'s lock, which we hold. Names not of that form are left alone."""
    ours = re.compile(re.escape(_STAGE.format(name=real.name)) + r"\d+-\w+|" + re.escape(f".{real.name}.tmp-") + r"\w+")
    for p in real.parent.iterdir():
        if ours.fullmatch(p.name) and p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)


@contextmanager
def staged(out, kind: str, legacy: Legacy | None = None, wait: bool = False):
    """Write a new version of folder `out` of `kind`: check it (`check_folder`), hold its lock, and yield a hidden
    staging folder beside it to write the new files into; when the body returns, the old folder's other files are
    carried over (`carry_over`), the mark added, and the staging folder takes `out`'s place in one atomic swap. An
    error or a crash before the swap leaves `out` as it was (a full disk raises `DiskFullError`); the staging folder
    is removed in every case, and one a killed run left is removed by the next. `wait`: see `lock`."""
    real = check_folder(out, kind, legacy)
    with lock(real, wait), disk_full(real):
        _remove_dead_stages(real)
        stage = Path(tempfile.mkdtemp(prefix=f"{_STAGE.format(name=real.name)}{os.getpid()}-", dir=real.parent))
        try:
            yield stage
            _publish(stage, real, kind)
        finally:
            shutil.rmtree(stage, ignore_errors=True)


def _publish(stage: Path, real: Path, kind: str) -> None:
    def fill(tmp: Path) -> None:
        (tmp / MARK_FILE).write_text(json.dumps(Mark(kind).to_dict(), indent=1) + "\n")  # first: never a link
        for f in stage.iterdir():
            os.replace(f, tmp / f.name)
        if real.is_dir():
            carry_over(real, tmp)

    atomic_write_dir(real, fill)


def write_folder(out, kind: str, write_contents: Callable[[Path], object], legacy: Legacy | None = None) -> Path:
    """`staged` in one call: `write_contents(stage)` writes the new files (an SAE's weights and settings), which
    are published atomically into `out`; returns `out`."""
    with staged(out, kind, legacy) as stage:
        write_contents(stage)
    return Path(out)

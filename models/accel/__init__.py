"""Opt-in speed pieces: nothing on the default path imports this package, and a piece runs only when switched on,
by `enable(...)` in code, `--accel` on the `circuits` commands that take it, or `TOY_CIRCUITS_ACCEL=PIECE[,PIECE]`
read by those commands (`requested`).

A piece stays only while it beats the plain path by at least 1.2× on the work it targets and beats `torch.compile` of
the same work (benchmarks/README.md, "Opt-in speed pieces", has the measurements, kept and deleted). The pieces:

- `malloc` (`models.accel.allocator.keep_freed_memory`): glibc keeps freed memory for reuse instead of returning it
  to the kernel and faulting it in again page by page. A process-wide setting that changes no number.
"""

from __future__ import annotations

import os

from ..errors import ConfigError

ENV = "TOY_CIRCUITS_ACCEL"
PIECES = ("malloc",)


def requested(value: str | None = None) -> tuple[str, ...]:
    """The pieces named by `value` (default: `$TOY_CIRCUITS_ACCEL`): a comma-separated list, `all`, or empty for
    none. `ConfigError` naming the allowed pieces for anything else."""
    text = os.environ.get(ENV, "") if value is None else value
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    if names == ["all"]:
        return PIECES
    unknown = [n for n in names if n not in PIECES]
    if unknown:
        raise ConfigError(f"{ENV}/--accel: unknown piece(s) {unknown}; allowed: {', '.join(PIECES)} or all")
    return tuple(dict.fromkeys(names))


def enable(*pieces: str) -> dict[str, bool]:
    """Switch `pieces` on for this process (none given: every piece); returns whether each took effect (`malloc`
    applies on glibc only)."""
    chosen = requested(",".join(pieces)) if pieces else PIECES
    out = {}
    for name in chosen:
        if name == "malloc":
            from .allocator import keep_freed_memory

            out[name] = keep_freed_memory()
    return out

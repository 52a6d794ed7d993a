"""Where the toolkit caches what it builds (token streams, tokenizers): one small module, so that finding the folder
imports nothing heavy."""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_dir() -> Path:
    """`$CIRCUITS_CACHE`, else `$XDG_CACHE_HOME/toy-circuits`, else `~/.cache/toy-circuits`."""
    if os.environ.get("CIRCUITS_CACHE"):
        return Path(os.environ["CIRCUITS_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "toy-circuits"

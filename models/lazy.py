"""Package exports that load on first use, written as ordinary imports that readers and static tools follow.

A package lists its public names as imports inside `if TYPE_CHECKING:` (so go-to-definition, type checkers and readers
go straight to each definition) and ends with `__all__, __getattr__, __dir__ = lazy_exports(__name__, __file__)`:
a module `__getattr__` (PEP 562) that reads those imports and loads a module the first time one of its names is
asked for. Importing the package stays cheap: the `circuits` command answers `--help` without importing torch.

A module's `__getattr__` is asked only for names the normal look-up does not find. nnsight 0.8 mounts a `save`
method on every object, which that look-up finds first, so a package whose export is named like such a method binds
it in its namespace at import (models/__init__.py does so for `save`).
"""

from __future__ import annotations

import ast
import sys
from importlib import import_module
from pathlib import Path


def lazy_exports(package: str, init_file: str):
    """`(__all__, __getattr__, __dir__)` of the package whose `__init__.py` is `init_file` (module docstring)."""
    exports: dict[str, tuple[str, str]] = {}  # public name -> (relative module, name there)
    for node in ast.parse(Path(init_file).read_text(encoding="utf-8")).body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for imp in node.body:
                if isinstance(imp, ast.ImportFrom):
                    for alias in imp.names:
                        exports[alias.asname or alias.name] = ("." * imp.level + (imp.module or ""), alias.name)

    def __getattr__(name: str):
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, attr = exports[name]
        value = getattr(import_module(module, package), attr)
        setattr(sys.modules[package], name, value)  # later lookups skip __getattr__
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(exports))

    return sorted(exports), __getattr__, __dir__

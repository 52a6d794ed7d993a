"""TransformerLens' classes without its package `__init__` files: `defer_package_inits`.

TransformerLens 4.3's `transformer_lens/__init__.py` and those of `transformer_lens.utilities` and
`transformer_lens.conversion_utils` import Hugging Face `transformers`, `datasets`, `pandas` and pytest (1.3 s of CPU,
benchmarks/README.md), while the toolkit needs `hook_points`, `HookedRootModule`, `ActivationCache` and
`FactoredMatrix`, which need none of them. `import models` (and so the `circuits` command line) calls
`defer_package_inits(TRANSFORMER_LENS)`: `import models` and a first model then cost 1.09× `import torch` in CPU time
instead of 2.38× (benchmarks/import_cost.py, quiet Xeon). It puts
those packages into `sys.modules` as the module objects the import system would make (same spec, `__path__`,
`__file__`) with their `__init__` code not yet run:

- a name bound by one of the import statements that open the `__init__` (before any other statement, and bound
  nowhere else in it) is served by importing its submodule only: `from transformer_lens import FactoredMatrix`
  gives the class the `__init__` binds, and `import transformer_lens.hook_points` imports that module only;
- anything else (another name, `dir()`, a submodule those lines do not import, such as
  `transformer_lens.model_bridge`) first runs every deferred `__init__` in place, with the loader's own
  `exec_module` on the same module objects: from then on the packages are what `import transformer_lens` makes,
  side effects included (TransformerLens patches Hugging Face's config classes there).

The classes are TransformerLens' own, each imported once, so `isinstance` checks hold either way. Setting the
environment variable `TOY_CIRCUITS_EAGER_IMPORTS=1` turns the deferral off; it is skipped when TransformerLens is
already imported or its `__init__` has no readable source.
"""

from __future__ import annotations

import ast
import os
import sys
import threading
from importlib import import_module
from importlib.machinery import PathFinder
from importlib.util import find_spec, module_from_spec
from types import ModuleType

TRANSFORMER_LENS = ("transformer_lens", "transformer_lens.utilities", "transformer_lens.conversion_utils")
#: What the toolkit takes from `transformer_lens` before its `__init__` has run: these names and submodules only.
#: Anything else a program asks for (SAELens' `from transformer_lens import HookedTransformer`) first runs the
#: deferred `__init__`s, so that other libraries' imports happen in TransformerLens' own order (served early, 3.9's
#: `HookedTransformer` module would reach its `__init__` half-way through and meet itself half-initialised).
SERVED_EARLY = {"transformer_lens": frozenset({"ActivationCache", "FactoredMatrix", "HookedRootModule", "hook_points",
                                               "utilities", "conversion_utils"})}
SWITCH = "TOY_CIRCUITS_EAGER_IMPORTS"

_lock = threading.RLock()
_pending: dict[str, tuple[ModuleType, dict[str, tuple[str, str | None]], set[str]]] = {}


def leading_imports(source: str, package: str) -> tuple[dict[str, tuple[str, str | None]], set[str]]:
    """`(names, submodules)` of a package `__init__`'s opening import statements: `names` maps each name they bind
    to `(module, attribute)` (attribute None: the submodule itself), for names bound nowhere else in the file;
    `submodules` holds the first path component below `package` of every module they import from it."""
    body = ast.parse(source).body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    names: dict[str, tuple[str, str | None]] = {}
    submodules: set[str] = set()
    for node in body:
        if isinstance(node, ast.Import):  # `import package.sub as s`: a submodule, no name served early
            submodules.update(a.name[len(package) + 1:].split(".")[0] for a in node.names
                              if a.name.startswith(package + "."))
            continue
        if not isinstance(node, ast.ImportFrom):
            break
        base = package.rsplit(".", node.level - 1)[0] if node.level else ""
        module = ".".join(p for p in (base, node.module) if p)
        if module == package:  # from . import a, b
            for a in node.names:
                names[a.asname or a.name] = (f"{package}.{a.name}", None)
                submodules.add(a.name)
        elif module.startswith(package + "."):
            submodules.add(module[len(package) + 1:].split(".")[0])
            for a in node.names:
                names[a.asname or a.name] = (module, a.name)
    bindings = _binding_counts(source)
    return {n: t for n, t in names.items() if bindings.get(n) == 1 and n != "*"}, submodules


def _binding_counts(source: str) -> dict[str, int]:
    """How many statements of a module bind each module-level name (function and class bodies only through
    `global`)."""
    counts: dict[str, int] = {}
    add = lambda n: counts.__setitem__(n, counts.get(n, 0) + 1)  # noqa: E731
    todo = list(ast.parse(source).body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            add(node.name)
            todo += [n for n in ast.walk(node) if isinstance(n, ast.Global)]
            continue
        if isinstance(node, ast.Global):
            for n in node.names:
                counts[n] = counts.get(n, 0) + 2  # assigned somewhere else: never served early
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                add(a.asname or a.name.split(".")[0])
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            add(node.id)
        elif isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
            add(node.name)
        todo += list(ast.iter_child_nodes(node))
    return counts


class _Deferred(ModuleType):
    """The class of a package whose `__init__` has not run yet (restored to `ModuleType` when it runs)."""

    def __getattr__(self, name: str):
        entry = _pending.get(self.__name__)
        if entry is not None and name in entry[1]:
            module, attr = entry[1][name]
            try:  # the import system's own module locks make this thread-safe
                value = import_module(module)
                value = value if attr is None else getattr(value, attr)
            except (ImportError, AttributeError):
                value = None
            if value is not None:
                ModuleType.__setattr__(self, name, value)
                return value
        complete_all()
        return getattr(self, name)

    def __dir__(self):
        complete_all()
        return dir(self)

    def __setattr__(self, name: str, value) -> None:
        # The import system sets `package.sub = <module sub>` after loading a submodule; where the `__init__`
        # rebinds that name (`from .ActivationCache import ActivationCache`), keep the `__init__`'s binding.
        entry = _pending.get(self.__name__)
        target = entry[1].get(name) if entry is not None else None
        if (isinstance(value, ModuleType) and target is not None and target[1] is not None
                and target[0] == value.__name__ == f"{self.__name__}.{name}"):
            value = getattr(value, target[1], value)
        ModuleType.__setattr__(self, name, value)


class _Finder:
    """A `sys.meta_path` entry that runs the deferred `__init__`s before code outside the package imports a
    submodule they do not import. Imports made while one of the package's own modules is executing (found by
    the import system's `spec._initializing` flag) are its own dependencies, as in a normal import."""

    @staticmethod
    def find_spec(fullname: str, path=None, target=None):
        parent, _, child = fullname.rpartition(".")
        while parent:
            entry = _pending.get(parent)
            if entry is not None:
                if child not in entry[2] and not _executing(fullname.partition(".")[0]):
                    complete_all()
                return None
            parent, _, child = parent.rpartition(".")
        return None


def _executing(top: str) -> bool:
    """Whether a submodule of package `top` is being executed by the import system right now."""
    return any(name.startswith(top + ".") and getattr(getattr(m, "__spec__", None), "_initializing", False)
               for name, m in list(sys.modules.items()))


_FINDER = _Finder()


def defer_package_inits(packages: tuple[str, ...]) -> bool:
    """Install `packages` (a top-level package, then sub-packages of it, parents first) as deferred modules; False
    (nothing changed) when the switch is set, the package is already imported or missing, or a source is
    unreadable."""
    if os.environ.get(SWITCH, "") not in ("", "0") or packages[0] in sys.modules:
        return False
    with _lock:
        made: list[tuple[ModuleType, tuple]] = []
        try:
            for name in packages:
                parent = name.rpartition(".")[0]
                spec = find_spec(name) if not parent else PathFinder.find_spec(name, _path_of(made, parent))
                if spec is None or spec.submodule_search_locations is None:
                    return False
                source = spec.loader.get_source(name)
                if source is None:
                    return False
                names, subs = leading_imports(source, name)
                if name in SERVED_EARLY:
                    names = {n: t for n, t in names.items() if n in SERVED_EARLY[name]}
                    subs = subs & SERVED_EARLY[name]
                made.append((module_from_spec(spec), (names, subs)))
        except (ImportError, OSError, SyntaxError, AttributeError, ValueError):
            return False
        for module, (names, subs) in made:
            _pending[module.__name__] = (module, names, subs)
            module.__class__ = _Deferred
            sys.modules[module.__name__] = module
            parent, _, child = module.__name__.rpartition(".")
            if parent:
                setattr(sys.modules[parent], child, module)
        sys.meta_path.insert(0, _FINDER)
        return True


def _path_of(made: list, package: str) -> list[str]:
    for module, _ in made:
        if module.__name__ == package:
            return module.__path__
    raise ImportError(f"{package} must come before its sub-packages")


def complete_all() -> None:
    """Run every deferred `__init__` in place, innermost package first (the order in which a normal import finishes
    them), and remove the finder. Re-entrant: an `__init__` that triggers it again skips those already started."""
    with _lock:
        for name in sorted(_pending, key=lambda n: -n.count(".")):
            entry = _pending.pop(name, None)
            if entry is None:
                continue
            module = entry[0]
            module.__class__ = ModuleType
            spec = module.__spec__
            spec._initializing = True
            try:
                spec.loader.exec_module(module)
            except BaseException:
                sys.modules.pop(name, None)
                raise
            finally:
                spec._initializing = False
        if not _pending and _FINDER in sys.meta_path:
            sys.meta_path.remove(_FINDER)


def pending() -> list[str]:
    """The packages whose `__init__` has not run yet."""
    return sorted(_pending)

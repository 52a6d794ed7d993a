"""TransformerLens' classes without its package `__init__` files: `defer_package_inits`.

TransformerLens 4.3's `transformer_lens/__init__.py` and those of `transformer_lens.utilities` and
`transformer_lens.conversion_utils` import Hugging Face `transformers`, `datasets`, `pandas` and pytest (1.3 s of CPU,
benchmarks/README.md), while the toolkit needs `hook_points`, `HookedRootModule`, `ActivationCache` and
`FactoredMatrix`, which need none of them. `import models` calls `defer_package_inits(TRANSFORMER_LENS)`, which puts
those packages into `sys.modules` as the plain module objects the import system would make
(`importlib.util.module_from_spec`: same spec, `__path__`, `__file__`) with their `__init__` code not yet run and a
module `__getattr__` / `__dir__` (PEP 562) in their namespace:

- a name bound by one of the import statements that open the `__init__` (before any other statement, and bound
  nowhere else in it) is served by importing its submodule only: `from transformer_lens import FactoredMatrix`
  gives the class the `__init__` binds (`models.arch.tl_compat` takes TransformerLens' classes this way);
- anything else (another name, `dir()`) first runs every deferred `__init__` in place, with the loader's own
  `exec_module` on the same module objects: from then on the packages are what `import transformer_lens` makes,
  side effects included (TransformerLens patches Hugging Face's config classes there). So does a program's import
  of a submodule not loaded yet (`import transformer_lens.model_bridge`, SAELens importing TransformerLens' model
  classes): a `sys.meta_path` finder (the import system's public hook, `importlib.abc.MetaPathFinder`) runs the
  `__init__`s first, so that other libraries' imports happen in TransformerLens' own order, and leaves
  `sys.meta_path` when they have run.

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
from importlib.abc import Loader, MetaPathFinder
from importlib.machinery import PathFinder
from importlib.util import find_spec, module_from_spec, spec_from_loader
from types import ModuleType

TRANSFORMER_LENS = ("transformer_lens", "transformer_lens.utilities", "transformer_lens.conversion_utils")
#: What the toolkit takes from `transformer_lens` before its `__init__` has run: these names only. Anything else a
#: program asks for (SAELens' `from transformer_lens import HookedTransformer`) first runs the deferred `__init__`s,
#: so that other libraries' imports happen in TransformerLens' own order (served early, 3.9's `HookedTransformer`
#: module would reach its `__init__` half-way through and meet itself half-initialised).
SERVED_EARLY = {"transformer_lens": frozenset({"ActivationCache", "FactoredMatrix", "HookedRootModule", "hook_points",
                                               "utilities", "conversion_utils"})}
SWITCH = "TOY_CIRCUITS_EAGER_IMPORTS"

_lock = threading.RLock()
#: package name -> (its module, {served name: (module, attribute or None)})
_pending: dict[str, tuple[ModuleType, dict[str, tuple[str, str | None]]]] = {}
#: per thread: how deep this thread is in serving a name or running the `__init__`s (imports made then are
#: TransformerLens' own, which the finder leaves alone)
_busy = threading.local()


def leading_imports(source: str, package: str) -> dict[str, tuple[str, str | None]]:
    """The names a package `__init__`'s opening import statements bind, each mapped to `(module, attribute)`
    (attribute None: the submodule itself), for names bound nowhere else in the file."""
    body = ast.parse(source).body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    names: dict[str, tuple[str, str | None]] = {}
    for node in body:
        if isinstance(node, ast.Import):  # `import package.sub as s`: no name served early
            continue
        if not isinstance(node, ast.ImportFrom):
            break
        base = package.rsplit(".", node.level - 1)[0] if node.level else ""
        module = ".".join(p for p in (base, node.module) if p)
        if module == package:  # from . import a, b
            for a in node.names:
                names[a.asname or a.name] = (f"{package}.{a.name}", None)
        elif module.startswith(package + "."):
            for a in node.names:
                names[a.asname or a.name] = (module, a.name)
    bindings = _binding_counts(source)
    return {n: t for n, t in names.items() if bindings.get(n) == 1 and n != "*"}


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


def _depth() -> int:
    return getattr(_busy, "depth", 0)


class _Busy:
    """`with _Busy():` marks this thread as serving or completing (re-entrant)."""

    def __enter__(self):
        _busy.depth = _depth() + 1

    def __exit__(self, *exc):
        _busy.depth = _depth() - 1


def _module_getattr(package: str):
    """The PEP 562 `__getattr__` of deferred package `package`."""

    def __getattr__(name: str):
        entry = _pending.get(package)
        if entry is not None and name in entry[1]:
            module, attr = entry[1][name]
            with _Busy():  # the import system's own module locks make the import thread-safe (no lock of ours held)
                try:
                    value = import_module(module)
                    value = value if attr is None else getattr(value, attr)
                except (ImportError, AttributeError):
                    value = None
                if value is not None:
                    _rebind_served()
                    setattr(sys.modules[package], name, value)
                    return value
        complete_all()
        return getattr(sys.modules[package], name)

    return __getattr__


def _module_dir(package: str):
    def __dir__() -> list[str]:
        complete_all()
        return dir(sys.modules[package])

    return __dir__


def _rebind_served() -> None:
    """After a submodule import, the import system has set `package.sub = <module sub>`; where the `__init__` binds
    that name to something the submodule defines (`from .ActivationCache import ActivationCache`), bind that."""
    for module, names in list(_pending.values()):
        for name, (source, attr) in names.items():
            value = vars(module).get(name)
            if attr is not None and isinstance(value, ModuleType) and value.__name__ == source and \
                    hasattr(value, attr):
                setattr(module, name, getattr(value, attr))


def _served_module(fullname: str) -> bool:
    """Whether `fullname` is a submodule the deferred packages serve early (`hook_points`, `ActivationCache`, ...):
    imported on its own, as a served name imports it, without running the `__init__`s."""
    return any(fullname == module for _, names in _pending.values() for module, _ in names.values())


class _Handover(Loader):
    """A one-shot loader that hands the import system `module`, already in `sys.modules` (the `__init__`s imported
    it while the finder ran them), instead of a second copy made from the file. The module's own spec is put back
    as it runs."""

    def __init__(self, module: ModuleType, spec):
        self.module, self.spec = module, spec

    def create_module(self, spec):
        return self.module

    def exec_module(self, module) -> None:
        module.__spec__ = self.spec


class _Own(Loader):
    """The loader of a served submodule a program imports by its path: the file's own loader, with the imports its
    body makes marked as TransformerLens' own (the finder leaves them alone), as when a served name imports it."""

    def __init__(self, loader):
        self.loader = loader

    def __getattr__(self, name):  # get_source, get_filename, ...: the file's loader answers
        return getattr(self.loader, name)

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        with _Busy():
            self.loader.exec_module(module)


class _Finder(MetaPathFinder):
    """Runs the deferred `__init__`s before a program imports a submodule of a deferred package that is not loaded
    yet, unless the import is TransformerLens' own (made while a name is served or the `__init__`s run) or the
    submodule is one the packages serve early (`import transformer_lens.hook_points` imports that module only, as
    before any `__init__` ran). Where the `__init__`s imported that very submodule, the import system is handed
    that module: a second copy would hold second copies of its classes (a second `HookPoint`, and
    `HookedRootModule.setup` would find no hook point in a model built from the first)."""

    def find_spec(self, fullname: str, path=None, target=None):
        if _depth() > 0 or fullname.partition(".")[0] not in _pending:
            return None
        if _served_module(fullname):
            spec = PathFinder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Own(spec.loader)
            return spec
        complete_all()
        module = sys.modules.get(fullname)
        if module is None:
            return None
        # The import system takes the spec of a module already in `sys.modules` in place of the finder's unless it
        # has none: for the length of this import, the module's spec is the hand-over's.
        spec = spec_from_loader(fullname, _Handover(module, module.__spec__), origin=getattr(module, "__file__", None),
                                is_package=hasattr(module, "__path__"))
        module.__spec__ = None
        return spec


_FINDER = _Finder()


def defer_package_inits(packages: tuple[str, ...]) -> bool:
    """Install `packages` (a top-level package, then sub-packages of it, parents first) as deferred modules; False
    (nothing changed) when the switch is set, the package is already imported or missing, or a source is
    unreadable."""
    if os.environ.get(SWITCH, "") not in ("", "0") or packages[0] in sys.modules:
        return False
    with _lock:
        made: list[tuple[ModuleType, dict]] = []
        try:
            for name in packages:
                parent = name.rpartition(".")[0]
                spec = find_spec(name) if not parent else PathFinder.find_spec(name, _path_of(made, parent))
                if spec is None or spec.submodule_search_locations is None:
                    return False
                source = spec.loader.get_source(name)
                if source is None:
                    return False
                names = leading_imports(source, name)
                if name in SERVED_EARLY:
                    names = {n: t for n, t in names.items() if n in SERVED_EARLY[name]}
                made.append((module_from_spec(spec), names))
        except (ImportError, OSError, SyntaxError, AttributeError, ValueError):
            return False
        for module, names in made:
            _pending[module.__name__] = (module, names)
            module.__getattr__ = _module_getattr(module.__name__)
            module.__dir__ = _module_dir(module.__name__)
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
    with _lock, _Busy():
        for name in sorted(_pending, key=lambda n: -n.count(".")):
            entry = _pending.pop(name, None)
            if entry is None:
                continue
            module = entry[0]
            for hook in ("__getattr__", "__dir__"):  # the `__init__` defines its own, or none
                vars(module).pop(hook, None)
            try:
                module.__spec__.loader.exec_module(module)
            except BaseException:
                sys.modules.pop(name, None)
                raise
        if not _pending and _FINDER in sys.meta_path:
            sys.meta_path.remove(_FINDER)


def pending() -> list[str]:
    """The packages whose `__init__` has not run yet."""
    return sorted(_pending)

"""The import graphs of `models/`, `circuits/` and `analyses/`, read with `ast`, and the rules they keep: no import
cycle of any length in any of them, and in `models/` the layers below, with no exemption.

Every run-time import between two modules of a package is an edge, inside functions too (a module that imports
another inside a function needs it as much as one that imports it at the top). `if TYPE_CHECKING:` blocks load
nothing, except in a package's `__init__.py`, where they list the lazy exports (`models.lazy`) that load on first use:
those count.

    python docs/import_graph.py          # each layer of models/, its modules and what each imports
    python docs/import_graph.py --check  # exit 1 naming every import against the layers and every cycle

`tests/test_structure.py` runs the same checks.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("models", "circuits", "analyses")

#: Bottom to top: a module of `models` may import its own layer and the layers below it, never one above.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("models.errors", "models.lazy", "models.files")),
    # the models and the decoding and persistence they offer as methods: `generation` needs no model class, so the
    # model classes' `generate` / `beam_search` call it directly
    ("arch", ("models.arch", "models.generation")),
    ("data", ("models.data",)),
    ("io", ("models.io",)),
    ("training", ("models.training", "models.sae")),
    ("accel", ("models.accel",)),  # opt-in speed code, on top of everything; none has earned its place today
    # TransformerLens 2.x's module paths under our name: re-exports that users import, nothing in models does
    ("tl_paths", ("models.utils", "models.hook_points", "models.patching", "models.past_key_value_caching",
                  "models.evals", "models.components")),
    ("package", ("models",)),  # models/__init__.py (this entry: that module only): its lazy exports reach every layer
]
TOP = "models"


def layer_of(module: str) -> int:
    """Index in `LAYERS` of `module` (the longest matching prefix wins, so `models.files.atomic` is base)."""
    best, best_len = -1, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or (module.startswith(p + ".") and p != TOP)) and len(p) > best_len:
                best, best_len = i, len(p)
    if best < 0:
        raise KeyError(f"{module} is in no layer of docs/import_graph.py")
    return best


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(node: ast.ImportFrom | ast.Import, module: str, is_package: bool, known: set[str]) -> list[str]:
    """The modules of `known` an import statement in `module` loads."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        parts = module.split(".") + ([] if not is_package else ["__init__"])
        base = parts[: len(parts) - node.level] if node.level else []
        stem = ".".join(base + ([node.module] if node.module else []))
        subs = [f"{stem}.{a.name}" for a in node.names]
        # `from package import submodule` loads the submodule (the package is its parent, loaded first anyway);
        # any other name is read from `stem` itself
        names = [n for n in subs if n in known] + ([stem] if any(n not in known for n in subs) else [])
    return [n for n in names if n in known]


def _is_type_checking(node) -> bool:
    return isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")


def imports(package: str = "models") -> list[tuple[str, str, str | None]]:
    """`(importer, imported, enclosing function or None)` for every run-time import between modules of `package`."""
    paths = sorted((ROOT / package).rglob("*.py"))
    known = {_module_name(p) for p in paths}
    out = []
    for path in paths:
        module, is_package = _module_name(path), path.name == "__init__.py"

        def visit(node, function, module=module, is_package=is_package):
            for child in ast.iter_child_nodes(node):
                if _is_type_checking(child) and not is_package:
                    continue
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    out.extend((module, m, function) for m in _resolve(child, module, is_package, known)
                               if m != module)
                inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
                visit(child, inner)

        visit(ast.parse(path.read_text(encoding="utf-8")), None)
    return out


def upward(edges) -> list[str]:
    """Imports from a lower layer of `models` into a higher one."""
    return sorted({f"{a} -> {b}" + (f" (in {f})" if f else "") for a, b, f in edges if layer_of(b) > layer_of(a)})


def cycles(edges) -> list[list[str]]:
    """Every import cycle, as the modules of each strongly connected component of two or more modules (Tarjan)."""
    graph: dict[str, set[str]] = {}
    for a, b, _ in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            strong(v)
    return found


def problems(package: str) -> list[str]:
    """What `--check` reports for `package`: its cycles, and for `models` the imports against the layers."""
    edges = imports(package)
    return (upward(edges) if package == "models" else []) + [" <-> ".join(c) for c in cycles(edges)]


def main(argv: list[str]) -> int:
    if "--check" in argv:
        found = [f"{p}: {line}" for p in PACKAGES for line in problems(p)]
        print("\n".join(found) or "layers kept, no import cycle in " + ", ".join(PACKAGES))
        return 1 if found else 0
    by_module: dict[str, set[str]] = {}
    for a, b, _ in imports():
        by_module.setdefault(a, set()).add(b)
    modules = sorted({_module_name(p) for p in (ROOT / "models").rglob("*.py")})
    for i, (name, _) in reversed(list(enumerate(LAYERS))):
        print(f"== {name}")
        for m in (m for m in modules if layer_of(m) == i):
            deps = sorted(d.removeprefix("models.") for d in by_module.get(m, ()))
            print(f"  {m.removeprefix('models.') or m}: {', '.join(deps)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

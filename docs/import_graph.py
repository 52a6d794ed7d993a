"""The import graph of `models/`, read with `ast` (in-function imports included, `if TYPE_CHECKING:` blocks and package
`__init__` files left out: those load nothing at run time), and the layers it must keep.

    python docs/import_graph.py          # each layer, its modules and what each imports
    python docs/import_graph.py --check  # exit 1 naming every import against the layers and every cycle

`tests/test_structure.py` runs the same checks.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: modules imported as `models.<name>` (TransformerLens 2.x's module paths; models/__init__.py puts the folder on the
#: package's search path)
TL_PATHS = ROOT / "models" / "tl_paths"

#: Bottom to top: a module may import its own layer and the layers below it, never one above.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("models.errors", "models.lazy", "models.deferred_import", "models.files.safe_read",
              "models.files.size_checks", "models.files.cache_dir", "models.files.atomic")),
    ("arch", ("models.arch",)),
    ("generation", ("models.generation",)),
    ("data", ("models.data",)),
    ("io", ("models.io",)),
    ("training", ("models.training", "models.sae")),
    ("accel", ("models.accel",)),  # opt-in speed code, on top of everything; none has earned its place today
    ("tl_paths", tuple(f"models.{p.stem}" for p in sorted(TL_PATHS.glob("*.py")))),  # re-exports, read by users only
]

#: The written exceptions: a model's own conveniences that call down the stack (in-function imports only):
#: `save` (models.io.checkpoint) and `generate` / `beam_search` (models.generation).
CONVENIENCES = {("models.arch.model", "save"), ("models.arch.model", "generate"),
                ("models.arch.model", "beam_search"), ("models.arch.encoder_decoder", "save"),
                ("models.arch.encoder_decoder", "generate")}


def layer_of(module: str) -> int:
    """Index in `LAYERS` of `module` (the longest matching prefix wins, so `models.files.atomic` is base)."""
    best, best_len = -1, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best_len:
                best, best_len = i, len(p)
    if best < 0:
        raise KeyError(f"{module} is in no layer of docs/import_graph.py")
    return best


def _module_name(path: Path) -> str:
    if path.parent == TL_PATHS:
        return f"models.{path.stem}"
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def _resolve(node: ast.ImportFrom | ast.Import, module: str, known: set[str]) -> list[str]:
    """The modules of `known` an import statement in `module` loads."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = module.split(".")[: len(module.split(".")) - node.level] if node.level else []
        stem = ".".join(base + ([node.module] if node.module else []))
        names = [stem] + [f"{stem}.{a.name}" for a in node.names]
    return [n for n in names if n in known]


def imports(package: str = "models") -> list[tuple[str, str, str | None]]:
    """`(importer, imported, enclosing function or None)` for every run-time import between modules of `package`."""
    paths = [p for p in sorted((ROOT / package).rglob("*.py")) if p.name != "__init__.py"]
    known = {_module_name(p) for p in paths}
    out = []
    for path in paths:
        module = _module_name(path)

        def visit(node, function, module=module):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.If) and ast.unparse(child.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
                    continue
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    out.extend((module, m, function) for m in _resolve(child, module, known) if m != module)
                inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
                visit(child, inner, module)

        visit(ast.parse(path.read_text(encoding="utf-8")), None)
    return out


def upward(edges) -> list[str]:
    """Imports from a lower layer into a higher one, less the written conveniences."""
    return sorted({f"{a} -> {b}" + (f" (in {f})" if f else "") for a, b, f in edges
                   if layer_of(b) > layer_of(a) and (a, f) not in CONVENIENCES})


def cycles(edges, longer_than: int = 2) -> list[list[str]]:
    """Strongly connected components of more than `longer_than` modules (Tarjan), the conveniences left out."""
    graph: dict[str, set[str]] = {}
    for a, b, f in edges:
        if (a, f) not in CONVENIENCES:
            graph.setdefault(a, set()).add(b)
            graph.setdefault(b, set())
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
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
            if len(comp) > longer_than:
                found.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            strong(v)
    return found


def main(argv: list[str]) -> int:
    edges = imports()
    if "--check" in argv:
        problems = upward(edges) + [" <-> ".join(c) for c in cycles(edges)]
        print("\n".join(problems) or "layers kept, no cycle of more than two modules")
        return 1 if problems else 0
    by_module: dict[str, set[str]] = {}
    for a, b, _ in edges:
        by_module.setdefault(a, set()).add(b)
    modules = sorted({_module_name(p) for p in (ROOT / "models").rglob("*.py") if p.name != "__init__.py"})
    for i, (name, _) in reversed(list(enumerate(LAYERS))):
        print(f"== {name}")
        for m in (m for m in modules if layer_of(m) == i):
            deps = sorted(d.removeprefix("models.") for d in by_module.get(m, ()))
            print(f"  {m.removeprefix('models.')}: {', '.join(deps)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

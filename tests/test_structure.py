"""Rules of the code's shape that a change can break without any other test noticing: one error base class, the
command line's modules import no private names, the layering `analyses → circuits → models`."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("models", "circuits", "analyses")


def _modules(package: str) -> list[str]:
    pkg = importlib.import_module(package)
    return [package] + [m.name for m in pkgutil.walk_packages(pkg.__path__, package + ".")
                        if not m.name.endswith("__main__")]


def _sources(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def test_every_named_error_derives_from_the_one_base():
    """So the command line catches one class; each also keeps the built-in base it had (`except ValueError`)."""
    from models.errors import ToyCircuitsError

    found = {}
    for package in PACKAGES:
        for name in _modules(package):
            module = importlib.import_module(name)
            for obj in vars(module).values():
                if inspect.isclass(obj) and issubclass(obj, Exception) and not issubclass(obj, Warning) and \
                        obj.__module__ == name:
                    found[f"{name}.{obj.__name__}"] = obj
    assert len(found) >= 8, sorted(found)
    assert [n for n, c in found.items() if not issubclass(c, ToyCircuitsError)] == []
    builtins = {"ToyCircuitsError": Exception, "UsageError": Exception,
                "UnsupportedByTransformerLens": NotImplementedError, "MissingDependencyError": ImportError,
                "DiskFullError": OSError}
    for name, cls in found.items():
        base = builtins.get(cls.__name__, ValueError)
        assert issubclass(cls, base), name


@pytest.mark.parametrize("path", sorted((ROOT / "analyses" / "cli").glob("*.py")), ids=lambda p: p.name)
def test_cli_modules_import_no_private_names(path):
    tree = ast.parse(path.read_text())
    private = [f"{node.module}.{a.name}" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
               for a in node.names if a.name.startswith("_")]
    assert private == []


@pytest.mark.parametrize("package,forbidden", [("models", ("circuits", "analyses")), ("circuits", ("analyses",))])
def test_imports_flow_one_way(package, forbidden):
    """analyses → circuits → models: a lower layer never imports a higher one."""
    bad = []
    for path in _sources(package):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            bad += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] in forbidden]
    assert bad == []


@pytest.mark.parametrize("package", PACKAGES)
def test_package_exports_are_one_hop_from_their_definitions(package):
    """Each public name is written as an import from its defining module (under TYPE_CHECKING, loaded on first use),
    so go-to-definition and static tools find it; no string table maps names to modules."""
    pkg = importlib.import_module(package)
    for mod in _modules(package):  # importing every submodule must not shadow an export (a module of the same name)
        importlib.import_module(mod)
    tree = ast.parse((ROOT / package / "__init__.py").read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING")
    imports = {a.asname or a.name: node.module for node in block.body for a in node.names}
    assert sorted(imports) == pkg.__all__
    for name, module in imports.items():
        value = getattr(pkg, name)
        if module == "arch.tl_compat":  # TransformerLens' own classes (ActivationCache), re-exported: defined there
            assert getattr(value, "__module__", "").startswith("transformer_lens."), name
            continue
        assert getattr(value, "__module__", None) == f"{package}.{module}", name
    assert callable(pkg.__getattr__)


def test_no_string_table_of_circuits_functions():
    """The name of the removed look-up table, spelled in two parts so that grep over the tree finds nothing."""
    needle = "circuits" + "_api"
    hits = [str(p.relative_to(ROOT)) for pkg in PACKAGES for p in _sources(pkg) if needle in p.read_text()]
    assert hits == []


def _import_graph():
    import importlib.util

    spec = importlib.util.spec_from_file_location("import_graph", ROOT / "docs" / "import_graph.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_models_keeps_its_layers_and_has_no_knot():
    """`models/`: base → arch → generation → data → io → training, bottom to top (docs/import_graph.py),
    in-function imports counted; the only calls up the stack are the models' own `save` and `generate` conveniences;
    no import cycle of more than two modules."""
    graph = _import_graph()
    edges = graph.imports()
    assert len(edges) > 60  # the graph was read
    assert graph.upward(edges) == []
    assert graph.cycles(edges) == []


def test_the_import_graph_sees_a_planted_upward_import_and_cycle():
    graph = _import_graph()
    edges = graph.imports() + [("models.arch.attention", "models.training.loop", None),
                               ("models.training.loop", "models.data.corpora", None),
                               ("models.data.corpora", "models.arch.attention", "f")]
    assert "models.arch.attention -> models.training.loop" in graph.upward(edges)
    assert any({"models.arch.attention", "models.training.loop", "models.data.corpora"} <= set(c)
               for c in graph.cycles(edges))


def test_models_top_level_holds_few_loose_modules():
    loose = sorted(p.name for p in (ROOT / "models").glob("*.py") if p.name != "__init__.py")
    assert len(loose) <= 4, loose


def test_no_private_torch_api_or_process_wide_switch_on_the_default_path():
    """Nowhere (but `models/files`, which calls libc's renameat2 for atomic folder swaps): no private torch operator, no
    process-wide precision switch, no ctypes, no compiler at run time."""
    import re

    pattern = re.compile(r"torch\._[a-z]|torch\.ops\.mkldnn|fp32_precision|set_flush_denormal|ctypes\.|"
                         r"cpp_extension|subprocess\.run\(\[.*(g\+\+|CXX)")
    bad = [f"{p.relative_to(ROOT)}:{i}" for package in PACKAGES for p in _sources(package)
           if "files" not in p.relative_to(ROOT).parts
           for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert bad == []

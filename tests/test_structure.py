"""Rules of the code's shape that a change can break without any other test noticing: one error base class, the
command line's modules import no private names, the layering `analyses → circuits → models`."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
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


@pytest.mark.parametrize("package", [
    "models", "circuits", "analyses",
])
def test_no_import_cycle(package):
    """No import cycle of any length (two modules included) in `package`, imports inside functions counted, and no
    exemption: docs/import_graph.py has no list of allowed edges."""
    graph = _import_graph()
    edges = graph.imports(package)
    assert len(edges) > 20  # the graph was read
    assert graph.cycles(edges) == []


def test_models_keeps_its_layers():
    """`models/`: base → arch (with generation beside it) → data → io → training, bottom to top
    (docs/import_graph.py), in-function imports counted, no call up the stack."""
    graph = _import_graph()
    edges = graph.imports("models")
    assert len(edges) > 60
    assert graph.upward(edges) == []
    assert not hasattr(graph, "CONVENIENCES")  # no written exceptions


def test_the_import_graph_sees_a_planted_upward_import_and_cycle():
    graph = _import_graph()
    edges = graph.imports() + [("models.arch.attention", "models.training.loop", None),
                               ("models.training.loop", "models.data.corpora", None),
                               ("models.data.corpora", "models.arch.attention", "f")]
    assert "models.arch.attention -> models.training.loop" in graph.upward(edges)
    assert any({"models.arch.attention", "models.training.loop", "models.data.corpora"} <= set(c)
               for c in graph.cycles(edges))
    # a model's own convenience calling up the stack inside a method is an upward import like any other
    planted = graph.imports() + [("models.arch.model", "models.io.checkpoint", "save")]
    assert "models.arch.model -> models.io.checkpoint (in save)" in graph.upward(planted)
    # two modules importing each other, one of them inside a function, is a cycle
    two = graph.imports("circuits") + [("circuits.eigen", "circuits.paths", None),
                                       ("circuits.paths", "circuits.eigen", "expand")]
    assert ["circuits.eigen", "circuits.paths"] in graph.cycles(two)


def test_the_import_graph_reads_in_function_and_package_imports():
    """Imports inside functions are edges; a package's lazy exports (its `TYPE_CHECKING` block) are edges of the
    package; `from package import submodule` is an edge to the submodule."""
    graph = _import_graph()
    edges = graph.imports("models")
    assert any(f is not None for _, _, f in edges)
    assert ("models", "models.io.checkpoint", None) in edges
    assert all(b != "models" for a, b, _ in edges if a != "models")


#: a model's kind tested other than by `models.model_kind`: attributes only one kind has, an `is_encoder_decoder` of
#: its own, an isinstance check on a model class
KIND_TESTS = re.compile(r"hasattr\([^)]*[\"'](cross_W_Q|W_E_src|d_vocab_src|n_encoder_layers|mlm_head|cross_attn)[\"']"
                        r"|def is_encoder_decoder"
                        r"|isinstance\([^)]*\b(HookedEncoder|HookedEncoderDecoder|HookedTransformer)\b")


@pytest.mark.parametrize("package", [
    "models", "circuits", "analyses",
])
def test_model_kind_is_asked_not_tested_by_attributes(package):
    """`models.model_kind` (models/arch/kind.py) is the one test of a model's kind (decoder-only, encoder-only,
    encoder-decoder)."""
    hits = [f"{p.relative_to(ROOT)}:{i}" for p in _sources(package) if p != ROOT / "models" / "arch" / "kind.py"
            for i, line in enumerate(p.read_text().splitlines(), 1) if KIND_TESTS.search(line)]
    assert hits == []


def test_import_machinery_is_plain_python():
    """Every module of ours and of TransformerLens is a plain module object (lazy exports are module `__getattr__`s,
    PEP 562), no import hook of ours is installed, no private import-system flag is set and the `models` package's
    search path is its folder (TransformerLens 2.x's paths are real files). Before: models.lazy gave modules classes
    of their own, a deferred-import module put a `sys.meta_path` finder and modules of TransformerLens' into the
    import system, models/__init__.py appended models/tl_paths to `__path__`."""
    import sys
    import types

    import analyses
    import circuits
    import models

    assert analyses.__all__ and circuits.__all__  # both packages imported
    odd = [name for name, m in list(sys.modules.items()) if name.split(".")[0] in (*PACKAGES, "transformer_lens")
           and type(m) is not types.ModuleType]
    assert odd == []
    assert [Path(p) for p in models.__path__] == [ROOT / "models"]
    ours = [f for f in sys.meta_path if type(f).__module__.split(".")[0] in PACKAGES]
    assert ours == []
    machinery = [f"{p.relative_to(ROOT)}:{i}" for package in PACKAGES for p in _sources(package)
                 for i, line in enumerate(p.read_text().splitlines(), 1) if "sys.meta_path" in line]
    assert machinery == []
    private = [f"{p.relative_to(ROOT)}:{i}" for package in PACKAGES for p in _sources(package)
               for i, line in enumerate(p.read_text().splitlines(), 1) if "._initializing" in line]
    assert private == []


#: TransformerLens 2.x's module paths (`transformer_lens.utils` → `models.utils`, …): re-export files that must sit at
#: the top of the package, beside the modules of the package itself
TL_PATHS = {"utils.py", "hook_points.py", "patching.py", "past_key_value_caching.py", "evals.py", "components.py"}


def test_models_top_level_holds_few_loose_modules():
    loose = {p.name for p in (ROOT / "models").glob("*.py") if p.name != "__init__.py"}
    assert len(loose - TL_PATHS) <= 4, sorted(loose - TL_PATHS)
    assert TL_PATHS <= loose


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

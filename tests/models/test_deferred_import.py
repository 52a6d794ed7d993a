"""`models.deferred_import`: packages whose `__init__` runs late. Checked on a package built here (what runs when,
against the same package imported normally) and on TransformerLens itself (the report path imports none of
`transformers`, `datasets`, `pandas`; the classes are TransformerLens' own; once completed, the package is the
one a normal import makes). Each check runs in a fresh interpreter, so `sys.modules` starts clean."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from models.deferred_import import leading_imports

pytestmark = pytest.mark.e2e  # fresh interpreters importing the toolkit

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("transformers", "datasets", "pandas")

FAKE = {
    "__init__.py": '''"""A package whose __init__ has a side effect and binds names several ways."""
from . import light
from .Thing import Thing
from .sub import helper
from .rebound import name_x
import fakepkg.side as _side
_side.ran.append("init")
name_x = 2
from .late import Late
''',
    "light.py": "VALUE = 1\n",
    "Thing.py": "from fakepkg.dep import D\n\nclass Thing:\n    pass\n",
    "dep.py": "D = 3\n",
    "side.py": "ran = []\n",
    "rebound.py": "name_x = 1\n",
    "late.py": "class Late:\n    pass\n",
    "heavy.py": "import fakepkg.side as s\ns.ran.append('heavy')\n",
    "sub/__init__.py": "from .helper_mod import helper\nimport fakepkg.side as s\ns.ran.append('sub')\n",
    "sub/helper_mod.py": "def helper():\n    return 'h'\n",
}


def _run(code: str, cwd: Path, eager: bool = False, prefix: str = "") -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(cwd), str(ROOT)])}
    env.pop("TOY_CIRCUITS_EAGER_IMPORTS", None)
    if eager:
        env["TOY_CIRCUITS_EAGER_IMPORTS"] = "1"
    out = subprocess.run([sys.executable, "-c", prefix + textwrap.dedent(code)], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture
def fake(tmp_path):
    for name, text in FAKE.items():
        (tmp_path / "fakepkg" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "fakepkg" / name).write_text(text)
    return tmp_path


def test_leading_imports_takes_opening_imports_bound_once():
    names = leading_imports(FAKE["__init__.py"], "fakepkg")
    assert names == {"light": ("fakepkg.light", None), "Thing": ("fakepkg.Thing", "Thing"),
                     "helper": ("fakepkg.sub", "helper")}  # name_x is rebound, Late comes after a statement
    src = ("import os\nfrom .a import x\ntry:\n    from .b import y\nexcept ImportError:\n    y = None\n"
           "from .c import z\n")
    assert leading_imports(src, "p") == {"x": ("p.a", "x")}
    src = "from ..up import u\nfrom p.s.q import w\ndef f():\n    global w\n    w = 1\n"
    assert leading_imports(src, "p.s") == {}


DEFER = "from models.deferred_import import defer_package_inits, pending\n" \
        "assert defer_package_inits(('fakepkg', 'fakepkg.sub'))\n"


def test_light_names_import_their_submodule_only(fake):
    """Names the `__init__` binds from its opening imports are served from their submodule alone."""
    got = _run("""
        import sys, types
        from fakepkg import Thing, helper
        from fakepkg import light
        import fakepkg
        import json
        print(json.dumps({"thing": isinstance(Thing, type) and Thing.__module__, "helper": helper(),
                          "attr": type(fakepkg.Thing).__name__, "light": fakepkg.light.VALUE,
                          "plain": [type(sys.modules[m]) is types.ModuleType for m in ("fakepkg", "fakepkg.sub")],
                          "loaded": sorted(m for m in sys.modules if m.startswith("fakepkg")),
                          "pending": [p for p in pending() if p.startswith("fakepkg")]}))
    """, fake, prefix=DEFER)
    assert got["thing"] == "fakepkg.Thing" and got["helper"] == "h" and got["light"] == 1
    assert got["attr"] == "type"  # the class the __init__ binds, not the submodule of the same-named import
    assert got["plain"] == [True, True]  # plain module objects (PEP 562 `__getattr__`), no class of our own
    assert got["loaded"] == ["fakepkg", "fakepkg.Thing", "fakepkg.dep", "fakepkg.light", "fakepkg.sub",
                             "fakepkg.sub.helper_mod"]  # no side.py: neither __init__ has run
    assert got["pending"] == ["fakepkg", "fakepkg.sub"]


@pytest.mark.parametrize("trigger", ["import fakepkg.heavy", "fakepkg.name_x", "dir(fakepkg)", "fakepkg.Late"])
def test_anything_else_runs_the_inits_first_and_matches_a_normal_import(fake, trigger):
    report = """
        import fakepkg, fakepkg.heavy, fakepkg.side, json
        def kinds(m):
            return {k: type(v).__name__ + ":" + str(getattr(v, "__name__", v)) for k, v in vars(m).items()
                    if k not in ("__builtins__", "__loader__", "__spec__", "__cached__")}
        print(json.dumps({"ran": fakepkg.side.ran, "top": kinds(fakepkg), "sub": kinds(fakepkg.sub),
                          "name_x": fakepkg.name_x, "pending": [p for p in pending() if p.startswith("fakepkg")]}))
    """
    late = _run(report, fake, prefix=DEFER + f"import fakepkg\nfrom fakepkg import Thing\n{trigger}\n")
    normal = _run(report, fake, prefix="def pending():\n    return []\n")
    assert late["ran"] == ["sub", "init", "heavy"] == normal["ran"]
    assert late == normal


def test_switch_turns_the_deferral_off(fake):
    got = _run("""
        from models.deferred_import import defer_package_inits
        import json
        print(json.dumps(defer_package_inits(("fakepkg", "fakepkg.sub"))))
    """, fake, eager=True)
    assert got is False


def test_report_path_leaves_out_hugging_face_and_keeps_transformer_lens_classes(tmp_path):
    got = _run(f"""
        import sys, json
        import analyses.cli, models  # the command line defers TransformerLens' package __init__
        from analyses.report import build_report
        import transformer_lens
        from transformer_lens import ActivationCache, FactoredMatrix, HookedRootModule
        from transformer_lens.hook_points import HookPoint
        report = build_report(models.load("attn-only-2l"), {str(tmp_path / "r")!r}, sections=["overview", "attention",
                              "copying", "composition", "path_patching", "term_importance"], progress=False)
        m = models.load("attn-only-2l")
        _, cache = m.run_with_cache(m.to_tokens("def f(x):"))
        before = [h for h in {HEAVY!r} if h in sys.modules]
        checks = [isinstance(m, HookedRootModule), isinstance(m.hook_dict["hook_embed"], HookPoint),
                  type(cache) is ActivationCache, isinstance(m.OV, FactoredMatrix), not report.failed]
        bridge = transformer_lens.TransformerBridge  # completes the package
        from transformer_lens.ActivationCache import ActivationCache as again
        fm = sys.modules["transformer_lens.FactoredMatrix"].FactoredMatrix
        checks += [again is ActivationCache, fm is FactoredMatrix, transformer_lens.FactoredMatrix is FactoredMatrix,
                   transformer_lens.HookedRootModule is HookedRootModule]
        print(json.dumps({{"before": before, "after": [h for h in {HEAVY!r} if h in sys.modules],
                          "checks": checks, "pending": models.deferred_import.pending()}}))
    """, ROOT)
    assert got["before"] == [] and got["after"] == ["transformers", "datasets", "pandas"]
    assert all(got["checks"]) and got["pending"] == []


def test_completed_transformer_lens_is_the_normally_imported_one():
    code = """
        import json, sys
        import analyses.cli
        import transformer_lens as tl
        tl.TransformerBridge
        out = {}
        for name in ("transformer_lens", "transformer_lens.utilities", "transformer_lens.conversion_utils"):
            m = sys.modules[name]
            out[name] = {k: type(v).__name__ + ":" + str(getattr(v, "__qualname__", getattr(v, "__name__", "")))
                         for k, v in vars(m).items() if k not in ("__builtins__", "__loader__", "__spec__",
                                                                  "__cached__", "_mps_warned")}
        print(json.dumps(out))
    """
    assert _run(code, ROOT) == _run(code, ROOT, eager=True)


def test_library_import_defers_transformer_lens_too():
    """`import models` defers as the command line does: a program that loads and runs a zoo model imports no Hugging
    Face `transformers` (TransformerLens 4.x: its `__init__`s stay pending)."""
    from models.arch.tl_compat import TL_VERSION, version_tuple

    if version_tuple(TL_VERSION) < (4, 0):
        pytest.skip(f"transformer-lens {TL_VERSION}: its classes import transformers themselves")
    got = _run("""
        import json, sys
        import models
        m = models.load("attn-only-2l")
        m(m.to_tokens("def f(x): return x"))
        from models import deferred_import
        print(json.dumps({"pending": deferred_import.pending(), "hf": "transformers" in sys.modules}))
    """, ROOT)
    assert got == {"pending": ["transformer_lens", "transformer_lens.conversion_utils", "transformer_lens.utilities"],
                   "hf": False}


def test_a_program_importing_another_transformer_lens_module_gets_the_package_first():
    """Why `models.deferred_import` keeps its one import hook (a `sys.meta_path` finder): after `import models`, a
    program that imports a TransformerLens module by path (`transformer_lens.model_bridge`, as SAELens imports the
    model classes) finds TransformerLens' package `__init__`s run before that module, side effects included, as
    without the deferral; TransformerLens' own imports while a name is served do not trigger it."""
    from models.arch.tl_compat import TL_VERSION, version_tuple

    if version_tuple(TL_VERSION) < (4, 0):
        pytest.skip(f"transformer-lens {TL_VERSION}: its classes import transformers themselves")
    got = _run("""
        import json, sys
        import models
        m = models.load("attn-only-1l")
        m(m.to_tokens("ab"))
        before = models.deferred_import.pending()
        import transformer_lens.model_bridge
        print(json.dumps({"before": before, "after": models.deferred_import.pending(),
                          "finder": any(type(f).__name__ == "_Finder" for f in sys.meta_path)}))
    """, ROOT)
    assert got == {"before": ["transformer_lens", "transformer_lens.conversion_utils", "transformer_lens.utilities"],
                   "after": [], "finder": False}


@pytest.mark.parametrize("module", ["transformer_lens.hook_points", "transformer_lens.model_bridge"])
def test_a_program_importing_a_transformer_lens_module_gets_the_one_copy(module):
    """After `import models`, a program's `import transformer_lens.<module>` of a module TransformerLens' `__init__`
    imports too (SAELens imports `transformer_lens.hook_points`) gives the one module object: a second copy made
    from the file held a second `HookPoint` class, and a model built afterwards had no hook points at all
    (`hook_dict` empty; notebook 07 failed with "not a hook point of this model that fires"). `hook_points` is
    served early (imported on its own); `model_bridge` runs the `__init__`s first and is handed over."""
    from models.arch.tl_compat import TL_VERSION, version_tuple

    if module.endswith("model_bridge") and version_tuple(TL_VERSION) < (4, 0):
        pytest.skip(f"transformer-lens {TL_VERSION} has no model_bridge")
    got = _run(f"""
        import gc, json, sys, types
        import models
        import {module} as imported
        import transformer_lens.hook_points as hp
        from models import HookedTransformer, HookedTransformerConfig
        m = HookedTransformer(HookedTransformerConfig(n_layers=1, d_model=8, n_ctx=4, d_vocab=5, n_heads=2,
                                                      attn_only=True))
        gc.collect()
        copies = {{}}
        for o in gc.get_objects():
            if isinstance(o, types.ModuleType) and (o.__name__ or "").startswith("transformer_lens"):
                copies[o.__name__] = copies.get(o.__name__, 0) + 1
        print(json.dumps({{"hooks": len(m.hook_dict), "one": imported is sys.modules["{module}"],
                          "spec": imported.__spec__.name, "copies": sorted(k for k, v in copies.items() if v > 1),
                          "own_class": all(type(h) is hp.HookPoint for h in m.hook_dict.values())}}))
    """, ROOT)
    assert got == {"hooks": 20, "one": True, "spec": module, "copies": [], "own_class": True}

"""One name, one definition: no two modules of `models/`, `circuits/` and `analyses/` define a public top-level
function or class (a name not starting with `_`) of the same name, so a name says which concept it is wherever it
is imported. No exemption list: on main before issue 38 (54033e6) it found 22 such names."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("models", "circuits", "analyses")

def public_definitions(root: Path, packages=PACKAGES) -> dict[str, set[str]]:
    """name → the modules (paths relative to `root`) whose top level defines a public function or class `name`."""
    found: dict[str, set[str]] = defaultdict(set)
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            for node in ast.parse(path.read_text(encoding="utf-8")).body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) \
                        and not node.name.startswith("_"):
                    found[node.name].add(path.relative_to(root).as_posix())
    return found


def duplicates(root: Path, packages=PACKAGES) -> dict[str, set[str]]:
    return {name: where for name, where in public_definitions(root, packages).items() if len(where) > 1}


def test_no_public_name_is_defined_in_two_modules():
    assert duplicates(ROOT) == {}


def test_the_finder_finds_a_duplicate(tmp_path):
    """The check above is not vacuous: two modules defining `f`, one a private `_g`, one a method `m` and a nested
    function are told apart."""
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "a.py").write_text("def f():\n    def inner():\n        pass\n\n\ndef _g():\n    pass\n")
    (tmp_path / "pkg" / "sub" / "b.py").write_text("class f:\n    def m(self):\n        pass\n\n\ndef _g():\n    pass\n"
                                                   "\n\ndef inner():\n    pass\n")
    assert duplicates(tmp_path, ("pkg",)) == {"f": {"pkg/a.py", "pkg/sub/b.py"}}

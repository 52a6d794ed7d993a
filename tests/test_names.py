"""One name, one definition: no two modules of `models/`, `circuits/` and `analyses/` define a public top-level
function or class (a name not starting with `_`) of the same name, so a name says which concept it is wherever it
is imported. The names still defined twice are listed in `PENDING` with the modules that define them; the list may
only shrink (a listed name defined once fails too, so it is taken off when fixed)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("models", "circuits", "analyses")

#: name → the modules that define it today, each pending a rename or a merge by the work named
PENDING: dict[str, set[str]] = {
    # models/ layout (issue 38): one decoding entry per concept, one bounded reader, weight processing as functions
    "read_text": {"models/data/corpora.py", "models/files/safe_read.py"},
    # the exposure-bias experiment and the SAE report (their owners' modules): a script's entry point and a result's
    # markdown under names the command line and the SAE report use
    "main": {"analyses/cli/__init__.py", "analyses/exposure_bias_experiment.py"},
    "markdown": {"analyses/exposure_bias_experiment.py", "analyses/sae_report.py"},
    "t_interval": {"analyses/exposure_bias.py", "analyses/stats.py"},
}


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
    assert duplicates(ROOT) == PENDING


def test_the_finder_finds_a_duplicate(tmp_path):
    """The check above is not vacuous: two modules defining `f`, one a private `_g`, one a method `m` and a nested
    function are told apart."""
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "a.py").write_text("def f():\n    def inner():\n        pass\n\n\ndef _g():\n    pass\n")
    (tmp_path / "pkg" / "sub" / "b.py").write_text("class f:\n    def m(self):\n        pass\n\n\ndef _g():\n    pass\n"
                                                   "\n\ndef inner():\n    pass\n")
    assert duplicates(tmp_path, ("pkg",)) == {"f": {"pkg/a.py", "pkg/sub/b.py"}}

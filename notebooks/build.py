"""Build the research notebooks from their sources, execute them, and save them with their outputs.

    python notebooks/build.py                 # every notebook in notebooks/src/
    python notebooks/build.py 02              # the ones whose name starts with 02
    python notebooks/build.py --check         # is every committed .ipynb fresh? (no execution; exit 1 if not)

Each notebook is written as a plain Python file in the "percent" format (`notebooks/src/NAME.py`): a line
`# %% [markdown]` starts a markdown cell (its lines are comments), `# %%` starts a code cell. The source is the
truth; the `.ipynb` beside this file is generated with nbformat, executed top to bottom with nbclient (a fresh
kernel, CPU, offline) and saved with its outputs (figures as inline PNGs), so a code host shows them.

Freshness: every code cell stores the SHA-256 of its source in `cell.metadata.toy_circuits.source_sha256`, and
the notebook stores the hash of the whole source file and the build's run time in
`metadata.toy_circuits`. `check()` (used by tests/test_notebooks.py) reports a notebook as stale when its source
file changed since the build, a cell's source no longer matches its stored hash, or a code cell was never run.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE / "src"
ROOT = HERE.parent
META = "toy_circuits"
TIMEOUT_PER_CELL = 600
KERNEL = "python3"

_CELL = re.compile(r"^# %%(?P<md> \[markdown\])?\s*$")


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def sources() -> list[Path]:
    return sorted(SRC.glob("[0-9]*.py"))


def notebook_path(src: Path) -> Path:
    return HERE / f"{src.stem}.ipynb"


def parse(text: str) -> list[tuple[str, str]]:
    """Percent-format text → [(kind, source)], kind "markdown" or "code"; text before the first marker is dropped
    (the file's docstring / licence lines)."""
    cells: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        m = _CELL.match(line)
        if m:
            cells.append(("markdown" if m.group("md") else "code", []))
        elif cells:
            cells[-1][1].append(line)
    out = []
    for kind, lines in cells:
        while lines and not lines[-1].strip():
            lines.pop()
        while lines and not lines[0].strip():
            lines.pop(0)
        if kind == "markdown":
            lines = [ln[2:] if ln.startswith("# ") else ln.lstrip("#") for ln in lines]
        if lines:
            out.append((kind, "\n".join(lines)))
    return out


def make_notebook(src: Path):
    import nbformat
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

    src = Path(src).resolve()
    text = src.read_text()
    nb = new_notebook()
    for kind, body in parse(text):
        if kind == "markdown":
            nb.cells.append(new_markdown_cell(body))
        else:
            cell = new_code_cell(body)
            cell.metadata[META] = {"source_sha256": sha256(body)}
            nb.cells.append(cell)
    nb.metadata["kernelspec"] = {"name": KERNEL, "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    rel = src.relative_to(ROOT) if src.is_relative_to(ROOT) else src
    nb.metadata[META] = {"source": str(rel), "source_sha256": sha256(text)}
    nbformat.validate(nb)
    return nb


#: Run by the kernel before the first cell (an IPython startup file): every figure the notebook shows is checked by
#: `analyses.figure_checks` and its problems recorded in the PNG output's metadata (tests/test_notebooks.py).
STARTUP = "from analyses.figure_checks import watch_notebook_figures\nwatch_notebook_figures()\n"


def execute(nb, timeout: int = TIMEOUT_PER_CELL):
    """Run every cell in a fresh kernel started in the repository root, figures checked as they are shown
    (`STARTUP`); raises on the first failing cell."""
    import os
    import tempfile

    from nbclient import NotebookClient

    with tempfile.TemporaryDirectory() as ipython_dir:
        startup = Path(ipython_dir) / "profile_default" / "startup"
        startup.mkdir(parents=True)
        (startup / "00-figure-checks.py").write_text(STARTUP)
        old = os.environ.get("IPYTHONDIR")
        os.environ["IPYTHONDIR"] = ipython_dir  # the kernel inherits it
        try:
            client = NotebookClient(nb, timeout=timeout, kernel_name=KERNEL,
                                    resources={"metadata": {"path": str(ROOT)}})
            t0 = time.perf_counter()
            client.execute()
            return time.perf_counter() - t0
        finally:
            if old is None:
                os.environ.pop("IPYTHONDIR", None)
            else:
                os.environ["IPYTHONDIR"] = old


def _strip_volatile(nb) -> None:
    """Drop per-run metadata that would churn the diff (execution timestamps)."""
    for cell in nb.cells:
        cell.metadata.pop("execution", None)


def build(src: Path, run: bool = True) -> float | None:
    import nbformat

    nb = make_notebook(src)
    seconds = None
    if run:
        seconds = execute(nb)
        _strip_volatile(nb)
        nb.metadata[META]["seconds"] = round(seconds, 1)
        nb.metadata[META]["python"] = sys.version.split()[0]
    nbformat.write(nb, notebook_path(src))
    return seconds


def check(src: Path) -> list[str]:
    """Why the committed notebook of `src` is stale (empty list: fresh)."""
    import nbformat

    path = notebook_path(src)
    if not path.is_file():
        return [f"{path.name} missing: run python notebooks/build.py {src.stem[:2]}"]
    nb = nbformat.read(path, as_version=4)
    problems = []
    meta = nb.metadata.get(META, {})
    if meta.get("source_sha256") != sha256(src.read_text()):
        problems.append(f"{src.relative_to(ROOT)} changed since {path.name} was built")
    expected = [body for kind, body in parse(src.read_text()) if kind == "code"]
    code = [c for c in nb.cells if c.cell_type == "code"]
    if [c.source for c in code] != expected:
        problems.append(f"{path.name}: its code cells differ from {src.relative_to(ROOT)}")
    counts = []
    for i, c in enumerate(code):
        stored = c.metadata.get(META, {}).get("source_sha256")
        if stored != sha256(c.source):
            problems.append(f"{path.name}: code cell {i + 1} edited after the build (source hash differs)")
        if c.execution_count is None:
            problems.append(f"{path.name}: code cell {i + 1} was never executed")
        counts.append(c.execution_count)
        for out in c.get("outputs", []):
            if out.get("output_type") == "error":
                problems.append(f"{path.name}: code cell {i + 1} has an error output ({out.get('ename')})")
    if all(n is not None for n in counts) and counts != list(range(1, len(counts) + 1)):
        problems.append(f"{path.name}: cells were not run once, top to bottom (execution counts {counts})")
    if "seconds" not in meta:
        problems.append(f"{path.name}: built without executing")
    return problems


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("names", nargs="*", help="notebook name prefixes (default: all)")
    p.add_argument("--check", action="store_true", help="only check that the committed notebooks are fresh")
    p.add_argument("--no-execute", action="store_true", help="write the notebooks without running them")
    args = p.parse_args(argv)
    chosen = [s for s in sources() if not args.names or any(s.stem.startswith(n) for n in args.names)]
    if not chosen:
        print(f"no notebook source matches {args.names}; sources: {[s.stem for s in sources()]}", file=sys.stderr)
        return 2
    if args.check:
        problems = [msg for s in chosen for msg in check(s)]
        print("\n".join(problems) or f"{len(chosen)} notebook(s) fresh")
        return 1 if problems else 0
    for s in chosen:
        print(f"building {notebook_path(s).name} ...", flush=True)
        seconds = build(s, run=not args.no_execute)
        print(f"  wrote {notebook_path(s).relative_to(ROOT)}" + (f" (ran in {seconds:.0f} s)" if seconds else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())

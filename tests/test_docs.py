"""Docs that run as written: every fenced ```python, ```bash / ```shell block of README.md and docs/*.md, and every
```text block that shows a `$ command` with its output, is executed in a fresh interpreter / shell (a temporary
folder as the working directory, this checkout on PYTHONPATH, `circuits` on PATH), and where the block shows what it
prints (a `# ...` comment under a `print(...)` line, or the lines under a `$ command`) the printed output is compared
with it.

A block that cannot run here says so in the markdown itself, by an HTML comment on the line before its fence:

    <!-- docs-test: skip (installs packages from the network) -->     never run here, the reason given
    <!-- docs-test: slow (trains for about a minute) -->              run in the slow tier (`pytest -m slow`)
    <!-- docs-test: ecosystem (needs SAELens) -->                     run where SAELens / nnsight are installed

The fast suite checks that every block is runnable or marked with a reason and that every Python block compiles;
the e2e tier (`pytest -m e2e`) runs the rest.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN = {"python": "python", "bash": "shell", "shell": "shell", "sh": "shell"}
MARKER = re.compile(r"<!--\s*docs-test:\s*(skip|slow|ecosystem)\s*\((.+?)\)\s*-->")
#: a block's limit: generous, as the slow and ecosystem blocks train (minutes on a quiet CPU, more on a loaded one)
TIMEOUT = 3600
FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)


@dataclass(frozen=True)
class Block:
    file: str
    line: int
    lang: str  # python, shell or console (a text block of `$ command` lines and their output)
    code: str
    tier: str  # run (e2e), slow, ecosystem or skip
    reason: str

    @property
    def id(self) -> str:
        return f"{self.file}:{self.line}"


def doc_blocks() -> list[Block]:
    """Every fenced block of the docs that this test runs or skips (others: text, tables of files, diagrams)."""
    out = []
    for path in DOCS:
        text = path.read_text()
        for m in FENCE.finditer(text):
            lang, code = m.group(1).lower(), m.group(2)
            if lang in RUN:
                kind = RUN[lang]
            elif lang in ("text", "console", "") and code.lstrip().startswith("$ "):
                kind = "console"
            else:
                continue
            before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
            marker = MARKER.search(before)
            out.append(Block(str(path.relative_to(ROOT)), text[: m.start()].count("\n") + 1, kind, code,
                             marker.group(1) if marker else "run", marker.group(2) if marker else ""))
    return out


BLOCKS = doc_blocks()


def expected_prints(code: str) -> list[str] | None:
    """What a Python block says it prints: the `# ` comment lines right under each `print(...)` line, or None when
    it shows nothing."""
    lines, out, shown = code.splitlines(), [], False
    for i, ln in enumerate(lines):
        if ln.lstrip().startswith("print("):
            j = i + 1
            while j < len(lines) and lines[j].lstrip().startswith("#"):
                out.append(lines[j].lstrip()[2:].rstrip())
                shown = True
                j += 1
    return out if shown else None


def console_steps(code: str) -> list[tuple[str, list[str]]]:
    """A console block as (command, the output lines shown under it)."""
    steps: list[tuple[str, list[str]]] = []
    for ln in code.splitlines():
        if ln.startswith("$ "):
            steps.append((ln[2:], []))
        elif steps:
            steps[-1][1].append(ln.rstrip())
    return steps


def test_every_block_runs_or_says_why_not():
    """Each block is run, or marked with a reason; Python blocks compile; the counts are what the report quotes."""
    assert BLOCKS, "no code blocks found"
    for b in BLOCKS:
        if b.lang == "python":
            compile(b.code, b.id, "exec")
        if b.tier != "run":
            assert b.reason.strip(), f"{b.id}: a docs-test marker needs a reason in parentheses"
    # the markers parse: a comment that looks like one but does not match is an error, not a silent run
    for path in DOCS:
        for ln in path.read_text().splitlines():
            if "docs-test:" in ln:
                assert MARKER.search(ln), f"{path.name}: unreadable docs-test marker {ln!r}"


def _shim(tmp: Path) -> dict:
    """The environment a reader has after `pip install -e .`: this checkout importable, `circuits` on PATH."""
    bin_ = tmp / ".bin"
    bin_.mkdir(exist_ok=True)
    exe = bin_ / "circuits"
    exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m analyses.cli "$@"\n')
    exe.chmod(0o755)
    python = bin_ / "python"
    if not python.exists():
        python.symlink_to(sys.executable)
    return dict(os.environ, PYTHONPATH=str(ROOT), PATH=f"{bin_}{os.pathsep}{os.environ.get('PATH', '')}",
                OMP_NUM_THREADS="1", MPLBACKEND="Agg", PYTHONWARNINGS="ignore")


def run_block(b: Block, tmp: Path) -> None:
    env = _shim(tmp)
    if b.lang == "python":
        script = tmp / "block.py"
        script.write_text(b.code)
        r = subprocess.run([sys.executable, str(script)], cwd=tmp, env=env, capture_output=True, text=True,
                           timeout=TIMEOUT)
        assert r.returncode == 0, f"{b.id} failed (exit {r.returncode}):\n{r.stderr[-3000:]}"
        want = expected_prints(b.code)
        if want is not None:
            assert [ln.rstrip() for ln in r.stdout.splitlines()] == want, f"{b.id} prints:\n{r.stdout}"
    elif b.lang == "shell":
        r = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", b.code], cwd=tmp, env=env, capture_output=True,
                           text=True, timeout=TIMEOUT)
        assert r.returncode == 0, f"{b.id} failed (exit {r.returncode}):\n{r.stderr[-3000:]}"
    else:
        for command, want in console_steps(b.code):
            r = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", command], cwd=tmp, env=env,
                               capture_output=True, text=True, timeout=TIMEOUT)
            assert r.returncode == 0, f"{b.id}: `{command}` failed (exit {r.returncode}):\n{r.stderr[-3000:]}"
            got = [ln.rstrip() for ln in r.stdout.splitlines()]
            while want and not want[-1]:
                want = want[:-1]
            assert got == want, f"{b.id}: `{command}` printed:\n{r.stdout}"


def _params(tier: str, *marks):
    return [pytest.param(b, id=b.id, marks=marks) for b in BLOCKS if b.tier == tier]


@pytest.mark.parametrize("block", _params("run", pytest.mark.e2e))
def test_block_runs_as_written(block, tmp_path):
    run_block(block, tmp_path)


@pytest.mark.parametrize("block", _params("slow", pytest.mark.slow))
def test_slow_block_runs_as_written(block, tmp_path):
    run_block(block, tmp_path)


@pytest.mark.parametrize("block", _params("ecosystem", pytest.mark.ecosystem))
def test_ecosystem_block_runs_as_written(block, tmp_path):
    pytest.importorskip("sae_lens", reason="the ecosystem blocks need SAELens (pip install -e '.[dev,sae]')")
    run_block(block, tmp_path)


def counts() -> dict:
    """Blocks found / run per tier / skipped by reason (`python tests/test_docs.py` prints them)."""
    by = {}
    for b in BLOCKS:
        key = b.tier if b.tier != "skip" else f"skip: {b.reason}"
        by[key] = by.get(key, 0) + 1
    return {"found": len(BLOCKS), **dict(sorted(by.items()))}


if __name__ == "__main__":
    for k, v in counts().items():
        print(f"{v:3d}  {k}")

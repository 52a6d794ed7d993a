"""The legacy-reference harness: build (or find) the TransformerLens 2.18 environment, generate its references once
per version of the generator, load a reference case into OUR model the documented way, and compare tensors.

`references()` runs tests/tl2/make_legacy_venv.sh (a no-op once built) and then tests/tl2/make_references.py inside
that environment, into `.venv-tl2/refs-<hash of the generator and the pins>/` (gitignored, beside the environment it
came from); a finished folder has `manifest.json` and is reused. It raises `LegacyUnavailable` (the tests skip with
its message) only when the environment cannot be built, e.g. offline on a machine that never built it.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
VENV = Path(os.environ.get("TL2_VENV", ROOT / ".venv-tl2"))
TOL = 1e-5  # relative error, float32 (issue 14)


class LegacyUnavailable(RuntimeError):
    """The TransformerLens 2.18 environment could not be built here."""


def _digest(script: str) -> str:
    h = hashlib.sha256()
    for name in dict.fromkeys((script, "make_references.py", "legacy-requirements.txt")):
        h.update((HERE / name).read_bytes())
    return h.hexdigest()[:16]


def references_or_skip(script: str = "make_references.py", prefix: str = "refs") -> Path:
    """`references(script, prefix)`, or the calling test skipped with the reason where TransformerLens 2.18 cannot be
    set up here (`LegacyUnavailable`)."""
    import pytest

    try:
        return references(script, prefix)
    except LegacyUnavailable as e:
        pytest.skip(str(e))


def references(script: str = "make_references.py", prefix: str = "refs") -> Path:
    """The folder of reference cases written by `script` (built on first use): make_references.py's into
    `refs-<hash>/`, make_process_references.py's (prefix "proc-refs") into `proc-refs-<hash>/`."""
    try:
        done = subprocess.run(["bash", str(HERE / "make_legacy_venv.sh"), str(VENV)], capture_output=True,
                              text=True, timeout=1800)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise LegacyUnavailable(f"building the TransformerLens 2.18 environment failed: {e}") from None
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        raise LegacyUnavailable(f"the TransformerLens 2.18 environment cannot be built here (make_legacy_venv.sh "
                                f"exit {done.returncode}: {tail})")
    python = done.stdout.strip().splitlines()[-1]
    out = VENV / f"{prefix}-{_digest(script)}"
    if not (out / "manifest.json").is_file():
        gen = subprocess.run([python, str(HERE / script), str(out)], capture_output=True, text=True, timeout=1800,
                             cwd=HERE)
        if gen.returncode != 0:  # the environment exists, so this is a defect of the generator: fail, don't skip
            raise RuntimeError(f"{script} failed (exit {gen.returncode}):\n{gen.stderr[-4000:]}")
    return out


def case_names(folder: Path) -> list[str]:
    return json.loads((folder / "manifest.json").read_text())["cases"]


def section(ref: dict, prefix: str) -> dict[str, torch.Tensor]:
    """The entries of a reference file under `prefix/`, keyed by the rest of their names."""
    return {k[len(prefix) + 1:]: v for k, v in ref.items() if k.startswith(prefix + "/")}


class Case:
    """One reference: `meta` (the JSON), `state` (the TransformerLens state dict file), `ref` (its tensors)."""

    def __init__(self, folder: Path, name: str):
        from safetensors.torch import load_file

        self.name = name
        self.meta = json.loads((folder / f"{name}.json").read_text())
        self.state_path = folder / f"{name}.state.safetensors"
        self.ref = load_file(str(folder / f"{name}.ref.safetensors"))
        self.tokens = self.ref["tokens"]

    @property
    def cfg(self) -> dict:
        return self.meta["cfg"]

    def section(self, prefix: str) -> dict[str, torch.Tensor]:
        return section(self.ref, prefix)

    def load_ours(self):
        """Our model from the saved state dict and the TransformerLens config dict (README: 'Old TransformerLens
        state dicts load directly'), in eval mode."""
        import models

        model = models.from_transformer_lens_state_dict(self.state_path, dict(self.cfg))
        return model.eval()


def rel_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    """‖ours − ref‖ / ‖ref‖ (Frobenius) over the finite entries; ±inf entries must sit at the same places with the
    same sign (masked attention scores), else the error is inf. Shapes must match exactly."""
    ours, ref = ours.detach().to(torch.float64).cpu(), ref.detach().to(torch.float64).cpu()
    if ours.shape != ref.shape:
        return float("inf")
    finite = torch.isfinite(ref)
    if not torch.equal(finite, torch.isfinite(ours)) or not torch.equal(ours[~finite], ref[~finite]):
        return float("inf")
    a, b = ours[finite], ref[finite]
    denom = float(b.norm())
    return float((a - b).norm()) / denom if denom > 0 else float((a - b).norm())


def compare_dicts(ours: dict, ref: dict, what: str, tol: float = TOL) -> None:
    """Same names, and every tensor within `tol` relative error; one AssertionError listing every difference."""
    problems = []
    missing, extra = sorted(set(ref) - set(ours)), sorted(set(ours) - set(ref))
    if missing:
        problems.append(f"missing from ours: {missing}")
    if extra:
        problems.append(f"only in ours: {extra}")
    for name in sorted(set(ref) & set(ours)):
        e = rel_err(ours[name], ref[name])
        if not e <= tol:
            shape = "" if tuple(ours[name].shape) == tuple(ref[name].shape) else \
                f" shape ours {tuple(ours[name].shape)} vs {tuple(ref[name].shape)}"
            problems.append(f"{name}: rel err {e:.3g}{shape}")
    assert not problems, f"{what}: " + "; ".join(problems)


def match_eigenvalues(ours: torch.Tensor, ref: torch.Tensor) -> float:
    """Largest distance between two multisets of eigenvalues `[..., n]` (complex), matched greedily per leading
    index (each reference value to its nearest unused one of ours), over the largest |λ| of the reference."""
    ours, ref = ours.to(torch.complex128), ref.to(torch.complex128)
    if ours.shape != ref.shape:
        return float("inf")
    worst = 0.0
    for a, b in zip(ours.reshape(-1, ours.shape[-1]), ref.reshape(-1, ref.shape[-1])):
        free = list(range(len(a)))
        for lam in b:
            d = (a[free] - lam).abs()
            i = int(d.argmin())
            worst = max(worst, float(d[i]))
            free.pop(i)
    return worst / max(float(ref.abs().max()), 1e-30)

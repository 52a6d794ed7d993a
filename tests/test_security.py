"""Untrusted files: nothing in the toolkit unpickles, and a code-carrying .pth is refused."""

import pickle
import re
from pathlib import Path

import pytest
import torch

import models

ROOT = Path(__file__).resolve().parents[1]
CODE_DIRS = ("models", "circuits", "analyses", "benchmarks")


def _sources():
    for d in CODE_DIRS:
        yield from sorted((ROOT / d).rglob("*.py"))


def test_no_pickle_or_unsafe_torch_load_in_code():
    offenders = []
    for path in _sources():
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\bimport pickle\b|\bpickle\.loads?\(|\bdill\b|\bjoblib\.load\(", line):
                offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
            if "torch.load(" in line and "weights_only=True" not in line:
                offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not offenders, "unsafe deserialisation:\n" + "\n".join(offenders)


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (Path(self.marker), "pwned"))


@pytest.mark.parametrize("wrap", ["bare", "in_dict"])
def test_malicious_pth_is_refused_and_runs_no_code(tmp_path, tiny_cfg, wrap):
    marker = tmp_path / "marker.txt"
    payload = _Evil(str(marker))
    obj = payload if wrap == "bare" else {"embed.W_E": torch.zeros(3), "evil": payload}
    path = tmp_path / "evil.pth"
    with open(path, "wb") as f:
        pickle.dump(obj, f)
    with pytest.raises(models.CheckpointError, match="refused or unreadable"):
        models.from_transformer_lens_state_dict(path, tiny_cfg)
    assert not marker.exists()


def test_own_format_never_pickles(tmp_path, tiny_model):
    tiny_model.save(tmp_path / "m")
    for f in (tmp_path / "m").iterdir():
        head = f.read_bytes()[:2]
        assert head != b"\x80\x04" and head != b"\x80\x02", f"{f.name} looks like a pickle"
        assert not f.name.endswith((".pt", ".pth", ".pkl", ".bin"))

"""Every registered file kind (`models.io.file_kinds.FILE_KINDS`) x every corruption that applies to its format x
every command registered as reading it: the command exits 2 with one line on stderr that names the file, no
traceback, writes nothing, and the folder is byte for byte as it was; the kind's reader raises a named error
(`ToyCircuitsError`) naming the file. A new file kind or a new command that reads one joins by registering in
`models/io/file_kinds.py`, not by a test here.

The commands run in-process (`analyses.cli.main`); `-m e2e` runs a sample of them as subprocesses.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from analyses.cli import main
from models.errors import ToyCircuitsError
from models.io.file_kinds import FILE_KINDS

ROOT = Path(__file__).resolve().parents[2]


# --- corruptions: each writes a corrupt version of `path` in place (the valid bytes given) ---------------------------
def _map_numbers(value, fn):
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return fn(value)
    if isinstance(value, list):
        return [_map_numbers(v, fn) for v in value]
    if isinstance(value, dict):
        return {k: _map_numbers(v, fn) for k, v in value.items()}
    return value


def _wrong_type(v):
    """A JSON value of another type than `v`'s."""
    if isinstance(v, bool) or v is None:
        return "x"
    if isinstance(v, (int, float)):
        return "x"
    if isinstance(v, str):
        return 7
    if isinstance(v, list):
        return {"x": 1}
    return [1]


def _json_records(data: bytes, jsonl: bool) -> list:
    return [json.loads(line) for line in data.decode().splitlines() if line.strip()] if jsonl else [json.loads(data)]


def _dump(records: list, jsonl: bool) -> bytes:
    text = "".join(json.dumps(r) + "\n" for r in records) if jsonl else json.dumps(records[0])
    return text.encode()


def _json_mutation(fn):
    def corrupt(path: Path, data: bytes, kind) -> bytes | None:
        jsonl = kind.format == "jsonl"
        records = _json_records(data, jsonl)
        return _dump([fn(r) for r in records], jsonl)
    return corrupt


def _truncated(path, data, kind):
    if kind.format == "jsonl":  # a torn last line is what a killed run leaves, and is read as the end: tear the first
        first, rest = data.split(b"\n", 1)
        return first[: len(first) // 2] + b"\n" + rest
    return data[: len(data) // 2]


def _garbage(path, data, kind):
    rng = random.Random(hash(kind.name) & 0xFFFF)
    return bytes(rng.randrange(256) for _ in range(max(64, min(len(data), 400))))


def _safetensors_header(data: bytes) -> tuple[dict, bytes]:
    n = int.from_bytes(data[:8], "little")
    return json.loads(data[8: 8 + n]), data[8 + n:]


def _with_header(header: dict, body: bytes) -> bytes:
    raw = json.dumps(header).encode()
    return len(raw).to_bytes(8, "little") + raw + body


def _header_mutation(fn):
    def corrupt(path, data, kind):
        header, body = _safetensors_header(data)
        for name, entry in header.items():
            if name != "__metadata__":
                fn(entry)
        return _with_header(header, body)
    return corrupt


def _missing_tensor(path, data, kind):
    from safetensors.torch import load, save

    tensors = load(data)
    tensors.pop(sorted(tensors)[0])
    return save(tensors)


def _nan_weights(path, data, kind):
    from safetensors.torch import load, save

    tensors = load(data)
    name = sorted(k for k, t in tensors.items() if t.is_floating_point())[0]
    tensors[name] = tensors[name].clone()
    tensors[name].view(-1)[0] = float("nan")
    return save(tensors)


def _pth_not_a_state_dict(path, data, kind):
    import io

    buf = io.BytesIO()
    torch.save([torch.zeros(2)], buf)
    return buf.getvalue()


CONTENT = {  # format -> {corruption: function(path, valid bytes, kind) -> corrupt bytes}
    "json": {
        "truncated": _truncated,
        "garbage": _garbage,
        "wrong types": _json_mutation(lambda d: {k: _wrong_type(v) for k, v in d.items()}),
        "huge numbers": _json_mutation(lambda d: _map_numbers(d, lambda v: "HUGE")),
        "NaN": _json_mutation(lambda d: _map_numbers(d, lambda v: "NAN")),
        "missing keys": _json_mutation(lambda d: {}),
    },
    "safetensors": {
        "truncated": _truncated,
        "garbage": _garbage,
        "wrong types": _header_mutation(lambda e: e.update(shape="x")),
        "huge numbers": _header_mutation(lambda e: e.update(shape=[d * 10**9 for d in e["shape"]])),
        "missing keys": _missing_tensor,
    },
    "pth": {
        "truncated": _truncated,
        "garbage": _garbage,
        "wrong types": _pth_not_a_state_dict,
    },
}
CONTENT["jsonl"] = {**CONTENT["json"], "missing keys": _json_mutation(lambda d: {})}
# JSON has no NaN or overflowing numbers; the mutations above write markers that become them as text
_MARKERS = {b'"HUGE"': b"1e999", b'"NAN"': b"NaN"}
FILE_TYPE = ("FIFO", "symlink out of the folder", "oversized")


def corruptions(kind) -> list[str]:
    names = list(CONTENT[kind.format]) + (["NaN"] if kind.finite and kind.format == "safetensors" else [])
    return names + [c for c in FILE_TYPE if c != "symlink out of the folder" or kind.contained]


def corrupt(kind, path: Path, how: str, outside: Path) -> None:
    """Replace the valid file `path` by its `how` corruption (`outside`: a folder outside the example)."""
    if how == "FIFO":
        path.unlink()
        os.mkfifo(path)
        return
    if how == "symlink out of the folder":  # a valid file, but not the folder's own
        outside.mkdir(parents=True, exist_ok=True)
        target = outside / path.name
        shutil.copyfile(path, target)
        path.unlink()
        path.symlink_to(target)
        return
    if how == "oversized":  # sparse: one byte over the kind's bound, nothing read to find out
        with open(path, "r+b") as f:
            f.truncate(kind.limit + 1)
        return
    data = path.read_bytes()
    fn = _nan_weights if (how == "NaN" and kind.format == "safetensors") else CONTENT[kind.format][how]
    new = fn(path, data, kind)
    for marker, text in _MARKERS.items():
        new = new.replace(marker, text)
    if new == data:
        pytest.skip(f"{how} does not change this {kind.name}")
    path.write_bytes(new)


def snapshot(folder: Path) -> dict:
    """Every entry under `folder`: its type, and a hash of a regular file's bytes (a FIFO is not opened; a sparse
    oversized file is hashed by its size)."""
    out = {}
    for p in sorted(folder.rglob("*")):
        st = os.lstat(p)
        if stat.S_ISREG(st.st_mode) and st.st_size < (1 << 26):
            out[str(p.relative_to(folder))] = hashlib.sha256(p.read_bytes()).hexdigest()
        else:
            out[str(p.relative_to(folder))] = (stat.S_IFMT(st.st_mode), st.st_size, os.readlink(p)
                                               if stat.S_ISLNK(st.st_mode) else None)
    return out


CASES = [(key, how) for key, kind in FILE_KINDS.items() for how in corruptions(kind)]


@pytest.fixture(scope="module")
def examples(tmp_path_factory):
    """One folder per kind holding its valid example, written once."""
    root = tmp_path_factory.mktemp("examples")
    return {key: (root / f"k{i}", kind.example(root / f"k{i}").relative_to(root / f"k{i}"))
            for i, (key, kind) in enumerate(FILE_KINDS.items())}


def _case(examples, tmp_path, key, how):
    kind = FILE_KINDS[key]
    template, rel = examples[key]
    root = tmp_path / "case"
    shutil.copytree(template, root, symlinks=True)
    corrupt(kind, root / rel, how, tmp_path / "outside")
    return kind, root, root / rel


@pytest.mark.parametrize("key,how", CASES, ids=[f"{k}-{h}" for k, h in CASES])
def test_every_command_refuses_a_corrupt_file_in_one_line(examples, tmp_path, capsys, key, how):
    kind, root, path = _case(examples, tmp_path, key, how)
    with pytest.raises(ToyCircuitsError, match=f"{path.name}"):
        kind.read(path)
    before = snapshot(tmp_path)
    for command in kind.commands:
        out = tmp_path / "out"
        argv = [a.format(root=root, out=out) for a in command]
        try:
            code = main(argv)
        except SystemExit as e:  # argparse: a bad command line in the registry itself
            code = e.code
        err = capsys.readouterr().err
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert code == 2, (argv, err)
        assert len(lines) == 1 and "Traceback" not in err, (argv, err)
        assert path.name in lines[0], (argv, lines[0])
        assert not out.exists(), argv
        assert snapshot(tmp_path) == before, argv


def test_every_kind_is_registered_with_a_valid_example_its_reader_accepts(examples):
    """The examples are valid: each reader accepts its own, so every refusal above is the corruption's."""
    for key, kind in FILE_KINDS.items():
        template, rel = examples[key]
        kind.read(template / rel)


def test_the_table(capsys):
    """Print the table of file kinds x corruptions x commands (`pytest -s` shows it)."""
    rows = [(key, len(corruptions(kind)), len(kind.commands)) for key, kind in FILE_KINDS.items()]
    with capsys.disabled():
        print("\nfile kind | corruptions | commands | command runs")
        for key, c, n in rows:
            print(f"{key} | {c} | {n} | {c * n}")
        print(f"total | {sum(c for _, c, _ in rows)} | | {sum(c * n for _, c, n in rows)}")


# --- a subprocess sample ---------------------------------------------------------------------------------------------
SAMPLE = [("config.json", "truncated"), ("tokenizer.json", "FIFO"), ("model.safetensors", "huge numbers"),
          ("sweep.json", "wrong types"), ("metrics.jsonl", "NaN"), ("cfg.json (SAE)", "oversized"),
          ("sae_weights.safetensors", "NaN"), ("legacy .pth", "FIFO"), ("summary.json", "symlink out of the folder")]


@pytest.mark.e2e
@pytest.mark.parametrize("key,how", SAMPLE, ids=[f"{k}-{h}" for k, h in SAMPLE])
def test_sample_as_subprocesses(examples, tmp_path, key, how):
    kind, root, path = _case(examples, tmp_path, key, how)
    before = snapshot(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for command in kind.commands[:3]:
        out = tmp_path / "out"
        argv = [a.format(root=root, out=out) for a in command]
        r = subprocess.run([sys.executable, "-m", "analyses.cli", *argv], capture_output=True, text=True, env=env,
                           timeout=300)
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode == 2 and len(lines) == 1 and path.name in lines[0], (argv, r.stderr)
        assert not out.exists() and snapshot(tmp_path) == before


@pytest.mark.e2e
def test_every_registered_command_accepts_the_valid_examples(examples, tmp_path, capsys):
    """The other side of the table: on the valid examples every command registered runs (exit 0), so the refusals
    above are the corruptions'. `sae` needs SAELens (CI's ecosystem job): without it, it says so in one line."""
    try:
        import sae_lens  # noqa: F401

        have_sae_lens = True
    except ImportError:
        have_sae_lens = False
    seen = set()
    for key, kind in FILE_KINDS.items():
        root = examples[key][0]
        for command in kind.commands:
            if command in seen:
                continue
            seen.add(command)
            out = tmp_path / f"out{len(seen)}"
            code = main([a.format(root=root, out=out) for a in command])
            err = capsys.readouterr().err
            if command[0] == "sae" and not have_sae_lens:
                assert code == 2 and "pip install sae-lens" in err
            else:
                assert code == 0, (command, err)

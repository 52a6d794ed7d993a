"""The command line's exits and messages (issue 12, "Wrong results without an error" and "Exit codes and messages"):
over-long prompts and texts, devices, invalid UTF-8, read-only folders and full disks, closed pipes, SIGTERM and
torchrun ranks. What needs a process of its own runs the real command in a subprocess (argv bytes, a closed pipe,
signals, torchrun, a device refusal end to end); the rest calls `analyses.cli.main` in this process (the same code
after the process starts; seconds instead of a torch import each). Faults the machine cannot be made to produce on
demand (EROFS, ENOSPC) are injected by a patch that raises the same `OSError`."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from models import HookedTransformer, HookedTransformerConfig, load, save
from models.data.tokenizer import ByteTokenizer

pytestmark = pytest.mark.e2e  # exit codes and signals of the command line in subprocesses

ROOT = Path(__file__).resolve().parents[2]
N_CTX = 64
LONG = "".join(chr(97 + (i * 7) % 26) for i in range(150))  # 151 tokens with BOS, n_ctx 64
TINY_TRAIN = {"model": {"n_layers": 1, "d_model": 16, "n_heads": 2, "n_ctx": 16, "d_vocab": 259, "attn_only": True,
                        "normalization_type": None},
              "train": {"data": "synthetic:repeat", "tokenizer": "bytes", "steps": 4, "batch_size": 4,
                        "checkpoint_every": 2, "log_checkpoints": 0, "eval_every": 2, "val_sequences": 4}}


def _env(**extra) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", PYTHONPATH=str(ROOT))
    env.pop("RANK", None), env.pop("WORLD_SIZE", None)
    env.update(extra)
    return env


def circuits(*args, fault: str = "", env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """`circuits ARGS` in a subprocess; `fault` is Python run first in that process (a patch injecting an error)."""
    code = f"import sys\n{fault}\nfrom analyses.cli import main\nsys.exit(main())"
    argv = [a if isinstance(a, bytes) else str(a) for a in args]
    return subprocess.run([sys.executable, "-c", code, *argv], cwd=ROOT, env=env or _env(), capture_output=True,
                          timeout=timeout)


def main(*args, capsys) -> subprocess.CompletedProcess:
    """`circuits ARGS` in this process: its exit code, stdout and stderr (as bytes, like `circuits`)."""
    from analyses import cli

    capsys.readouterr()
    code = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, out.encode(), err.encode())


def one_line(r: subprocess.CompletedProcess, code: int, match: str) -> str:
    err = r.stderr.decode(errors="replace")
    assert r.returncode == code, f"exit {r.returncode}\n{err}"
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and match in lines[0], err
    return lines[0]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A 2-layer attention-only model with learned (shortformer) positions, n_ctx 64, bytes tokenizer."""
    cfg = HookedTransformerConfig(n_layers=2, d_model=32, n_ctx=N_CTX, d_vocab=259, n_heads=2, attn_only=True,
                                  normalization_type=None, positional_embedding_type="shortformer", seed=0)
    path = tmp_path_factory.mktemp("exits") / "tiny"
    save(HookedTransformer(cfg, tokenizer=ByteTokenizer()), path)
    return path


# --- prompts and texts longer than n_ctx ----------------------------------------------------------------
def test_generate_long_prompt_continues_from_its_end(tiny, capsys):
    r = main("generate", tiny, "--prompt", LONG, "--temperature", "0", "--max-new-tokens", "4", "--json",
             "--no-progress", capsys=capsys)
    line = one_line(r, 0, "the model sees its last 64")
    assert "151 tokens" in line
    out = json.loads(r.stdout)
    assert out["context"] == {"prompt_tokens": 151, "prompt_tokens_seen": 64, "first_token_seen": 87, "n_ctx": 64}
    model = load(tiny)  # reference: greedy steps on the last n_ctx tokens, written out here
    ids = model.to_tokens(LONG, truncate=False)
    with torch.no_grad():
        for _ in range(4):
            ids = torch.cat([ids, model(ids[:, -N_CTX:])[:, -1].argmax(-1, keepdim=True)], 1)
    assert out["samples"][0]["tokens"] == ids[0].tolist()


def test_attention_long_text_shows_its_end(tiny, tmp_path, capsys):
    r = main("attention", tiny, "--text", LONG, "--head", "1.0", "--figure", tmp_path / "a.png", "--json",
             "--no-progress", capsys=capsys)
    one_line(r, 0, "showing its last 64")
    out = json.loads(r.stdout)
    assert (out["text_tokens"], out["dropped_tokens"], len(out["tokens"])) == (151, 87, 64)
    assert "".join(out["tokens"]) == LONG[-64:]


# --- devices ------------------------------------------------------------------------------------------
ABSENT = [d for d, here in (("cuda", torch.cuda.is_available()), ("cuda:1", torch.cuda.device_count() > 1),
                            ("mps", torch.backends.mps.is_available())) if not here] + ["cuda:abc", "banana"]


def test_train_refuses_an_absent_device_end_to_end(tmp_path):
    r = circuits("train", "--config", json.dumps(TINY_TRAIN), "--device", ABSENT[0], "--out", tmp_path / "run")
    one_line(r, 2, ABSENT[0])
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("device", ABSENT)
def test_train_refuses_an_absent_device_in_one_line(device, tmp_path, capsys):
    r = main("train", "--config", json.dumps(TINY_TRAIN), "--device", device, "--out", tmp_path / "run",
             capsys=capsys)
    one_line(r, 2, device)
    assert not (tmp_path / "run").exists()


def test_train_accepts_device_in_capitals(tmp_path, capsys):
    r = main("train", "--config", json.dumps(TINY_TRAIN), "--device", "CPU", "--out", tmp_path / "run", "--json",
             "--no-scores", capsys=capsys)
    assert r.returncode == 0, r.stderr.decode()
    assert json.loads(r.stdout)["device"] == "cpu"


# --- text that is not UTF-8, read-only folders, full disks, closed pipes ---------------------------------------
def test_invalid_utf8_prompt_and_text(tiny, tmp_path, capsys):
    one_line(circuits("generate", tiny, "--prompt", b"ab\xff"), 2, "--prompt is not valid UTF-8 (byte 0xff")
    # argv bytes that are not UTF-8 reach Python surrogate-escaped: "\udcc3" is the byte 0xc3
    one_line(main("attention", tiny, "--text", "\udcc3(", "--figure", tmp_path / "a.png", capsys=capsys), 2,
             "--text is not valid UTF-8 (byte 0xc3")
    one_line(main("patch", tiny, "--clean", "ab", "--corrupt", "a\udcff", "--answer", "c", capsys=capsys), 2,
             "--corrupt is not valid UTF-8 (byte 0xff at character 1)")


def _raise(err: int, name: str):
    def fail(*args, **kwargs):
        raise OSError(err, os.strerror(err), name)
    return fail


def test_read_only_output_folder_exits_2(tiny, tmp_path, monkeypatch, capsys):
    mkdir = os.mkdir  # under Path.mkdir and tempfile's folders alike
    monkeypatch.setattr(os, "mkdir", lambda path, *a, **k: _raise(errno.EROFS, str(path))() if "readonly" in
                        str(path) else mkdir(path, *a, **k))
    one_line(main("report", tiny, "--out", tmp_path / "readonly", "--no-progress", capsys=capsys), 2,
             "Read-only file system")
    one_line(main("train", "--config", json.dumps(TINY_TRAIN), "--out", tmp_path / "readonly", capsys=capsys), 2,
             "Read-only file system")


def test_full_disk_during_train_exits_1_in_one_line(tmp_path, monkeypatch, capsys):
    import models.training.state as ts

    monkeypatch.setattr(ts, "append_metrics", _raise(errno.ENOSPC, "metrics.jsonl"))
    r = main("train", "--config", json.dumps(TINY_TRAIN), "--out", tmp_path / "run", "--no-progress", capsys=capsys)
    line = one_line(r, 1, "No space left on device")
    assert line.startswith("circuits train: failed:")


def test_closed_stdout_ends_quietly_with_141(tiny):
    """`circuits heads ... | head -3` where head has gone: the reader's end is closed before anything is written."""
    read, write = os.pipe()
    code = "import sys\nfrom analyses.cli import main\nsys.exit(main())"
    p = subprocess.Popen([sys.executable, "-c", code, "heads", str(tiny), "--no-progress"], cwd=ROOT, env=_env(),
                         stdout=write, stderr=subprocess.PIPE)
    os.close(write)
    os.close(read)
    err = p.communicate(timeout=300)[1].decode()
    assert p.returncode == 128 + signal.SIGPIPE, err
    assert err == "", err


# --- SIGTERM --------------------------------------------------------------------------------------------
def _start(*args) -> subprocess.Popen:
    code = "import sys\nfrom analyses.cli import main\nsys.exit(main())"
    return subprocess.Popen([sys.executable, "-c", code, *map(str, args)], cwd=ROOT, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _terminate_when(p: subprocess.Popen, ready, timeout: float = 120) -> tuple[int, str]:
    t0 = time.monotonic()
    while not ready() and p.poll() is None and time.monotonic() - t0 < timeout:
        time.sleep(0.02)
    assert p.poll() is None, "finished before the signal: " + p.stderr.read().decode()
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=120)
    return p.returncode, err.decode()


@pytest.mark.slow
def test_sigterm_during_report_leaves_no_figures_without_report(tiny, tmp_path):
    out = tmp_path / "rep"
    p = _start("report", tiny, "--out", out, "--no-progress", "--windows", "8")
    # figures are written into a hidden staging folder beside it, published with report.md in one swap at the end
    code, err = _terminate_when(p, lambda: any(tmp_path.glob(".rep.stage-*/*.png")))
    assert code == 143, err
    assert [ln for ln in err.splitlines() if ln.strip()] == ["circuits report: terminated (SIGTERM)"], err
    files = sorted(f.name for f in out.iterdir()) if out.exists() else []
    assert "report.md" in files or not any(f.endswith(".png") for f in files), files


@pytest.mark.slow
def test_sigterm_during_train_keeps_resumable_checkpoints(tmp_path):
    cfg = json.loads(json.dumps(TINY_TRAIN))
    cfg["train"].update(steps=3000, checkpoint_every=100, eval_every=1000, log_every=100)
    out = tmp_path / "run"
    p = _start("train", "--config", json.dumps(cfg), "--out", out, "--no-progress", "--no-scores")
    ckpts = out / "checkpoints"
    code, err = _terminate_when(p, lambda: ckpts.is_dir() and len(list(ckpts.iterdir())) >= 2)
    assert code == 143, err
    assert [ln for ln in err.splitlines() if ln.strip()] == ["circuits train: terminated (SIGTERM)"], err
    cfg["train"]["steps"] = 300  # resume from a checkpoint the SIGTERM left: each must be whole
    r = circuits("train", "--config", json.dumps(cfg), "--out", out, "--resume", "--no-progress", "--no-scores",
                 "--json")
    assert r.returncode == 0, r.stderr.decode()
    assert json.loads(r.stdout)["steps"] == 300 and load(out).cfg.n_layers == 1


# --- torchrun: only rank 0 speaks -------------------------------------------------------------------------------
def test_only_rank_0_prints(tiny, monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setattr(time, "sleep", lambda s: None)  # rank 1 waits for rank 0 to report a shared error
    r = main("info", tiny, "--json", capsys=capsys)
    assert (r.returncode, r.stdout, r.stderr) == (0, b"", b"")
    r = main("info", "no-such-model", capsys=capsys)
    assert (r.returncode, r.stdout, r.stderr) == (2, b"", b"")
    monkeypatch.setenv("RANK", "0")
    one_line(main("info", "no-such-model", capsys=capsys), 2, "unknown model")


def _torchrun(args, tmp_path) -> subprocess.CompletedProcess:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
                           "--master_addr", "127.0.0.1", "--master_port", str(port), "-m", "analyses.cli", *args],
                          cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_torchrun_prints_one_summary_and_one_error(tmp_path):
    r = _torchrun(["train", "--config", json.dumps(TINY_TRAIN), "--device", "cpu", "--json", "--no-scores",
                   "--out", str(tmp_path / "ddp")], tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["world_size"] == 2  # one JSON document: json.loads refuses two
    if torch.cuda.is_available():
        return
    r = _torchrun(["train", "--config", json.dumps(TINY_TRAIN), "--device", "cuda", "--out", str(tmp_path / "g")],
                  tmp_path)
    ours = [ln for ln in r.stderr.splitlines() if ln.startswith("circuits train")]
    assert ours == ["circuits train: error: device 'cuda' is not available here (no CUDA GPU); use --device cpu"], \
        r.stderr
    assert "analyses/cli" not in r.stderr and r.stdout == ""  # no traceback from our ranks (torchrun prints its own)


# --- an empty model name --------------------------------------------------------------------------------------
def test_info_with_an_empty_name_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    one_line(main("info", "", capsys=capsys), 2, "empty model name")


def test_long_ids_generate_through_the_api(tiny):
    """The API side of the window, text and ids alike: the whole prompt comes back, continued from its end."""
    from models.generation.generate import ContextWindowWarning

    model = load(tiny)
    ids = model.to_tokens(LONG, truncate=False)
    with pytest.warns(ContextWindowWarning, match="last 64"):
        text = model.generate(LONG, max_new_tokens=3, temperature=0)
    with pytest.warns(ContextWindowWarning):
        out = model.generate(ids, max_new_tokens=3, temperature=0)
    assert out.shape == (1, 151 + 3) and torch.equal(out[:, :151], ids)
    with torch.no_grad():
        first = model(ids[:, -N_CTX:])[:, -1].argmax(-1)
    assert int(out[0, 151]) == int(first)
    assert text == model.to_string(out[0, 1:])  # text out without the BOS, as TransformerLens' generate

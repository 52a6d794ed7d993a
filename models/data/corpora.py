"""Training corpora: text sources and their tokenised, cached, memory-mapped token arrays (batches:
`models.data.batches`).

- Text sources (`TextSource`): the pinned snapshot the zoo is measured on (`"stdlib"`, the default: a versioned,
  checksummed archive of Python 3.11.7's standard-library `*.py` files shipped in `models/data/corpus/`, the
  `test`/`tests` packages held out as validation text), the running Python's own standard library
  (`"python-stdlib"`, which differs between Python builds and releases), a user folder, or a list of text files.
- Checksums: every text corpus carries one (`TokenCorpus.sha256`): a snapshot's archive sha256 (its manifest's),
  otherwise the sha256 over the files' names and contents (`source_fingerprint`); cards, summaries, reports and
  sweep records name it.
- Token arrays: a source is tokenized once, streaming file by file, into `train.bin` / `val.bin`
  (uint16 or uint32 ids, documents separated by EOS) under a cache folder keyed by a hash of the files'
  contents and the tokenizer; they are read back as `np.memmap`, so a corpus larger than memory trains.
- Tokenizers trained on a source (`get_tokenizer("bpe-N", source)`) are cached the same way.
"""

from __future__ import annotations

import hashlib
import json
import os
import sysconfig
import tarfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import CorpusChecksumError, CorpusError
from ..files.atomic import atomic_write, atomic_write_dir
from ..files.cache_dir import default_cache_dir
from ..files.safe_read import JSON_LIMIT, open_regular, read_json

_ANY_SIZE = 1 << 62  # corpus files are streamed: the bound that matters is "a regular file"


# --- text sources ---------------------------------------------------------------------------------
@dataclass
class TextSource:
    """Files of one corpus, in a fixed order. With no `val_files`, the last `val_fraction` of the training
    tokens is held out as validation text."""

    name: str
    train_files: list
    val_files: list
    val_fraction: float = 0.05
    sha256: str | None = None  # a pinned snapshot's archive checksum (its manifest's); None: computed from the files

    def describe(self) -> str:
        return f"{self.name}: {len(self.train_files)} training files, {len(self.val_files)} validation files"


def _is_test_path(rel_parts: tuple) -> bool:
    return any(p in ("test", "tests") for p in rel_parts[:-1])


def _tree_split(root: Path) -> tuple[list, list]:
    """The `*.py` files under `root` (site-packages / dist-packages never entered), in sorted `Path` order, split
    into (training, validation): validation = files under a `test` or `tests` package."""
    found = []
    for folder, dirs, files in os.walk(root):  # as root.rglob("*.py"), never entering installed packages
        dirs[:] = [d for d in dirs if d not in ("site-packages", "dist-packages")]
        found += [Path(folder, f) for f in files if f.endswith(".py")]
    train, val = [], []
    for p in sorted(found):
        if p.is_file():
            (val if _is_test_path(p.relative_to(root).parts) else train).append(p)
    return train, val


def stdlib_source() -> TextSource:
    """`"python-stdlib"`: the `*.py` files of the running Python's standard library (site-packages skipped), in
    sorted order; files under a `test` or `tests` package (`Lib/test`, `*/tests/*`) are the validation split.
    Another build or release of Python ships other files: numbers measured on it hold only on that Python (the
    pinned snapshot, `pinned_source`, is the default corpus for that reason)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    if not root.is_dir():
        raise CorpusError(f"the standard library folder {root} does not exist; pass a text folder instead")
    train, val = _tree_split(root)
    if not train:
        raise CorpusError(f"no *.py files found under the standard library folder {root}")
    return TextSource(f"python{sysconfig.get_python_version()}-stdlib", train, val)


# --- the pinned snapshot --------------------------------------------------------------------------------------------
SNAPSHOT_DIR = Path(__file__).resolve().parent / "corpus"
PINNED = "python3.11-stdlib-v1"  # what "stdlib" means: the text the zoo's cards are measured on
_ARCHIVE_LIMIT = 64 << 20
_VERIFIED: set = set()  # extracted snapshot folders whose text checksum this process has verified


def text_digest(root: Path, files) -> str:
    """sha256 of a tree's text: for each file in order, its path relative to `root` (POSIX, UTF-8), NUL, its size as
    8 little-endian bytes, then its bytes. Equal digests: the same files, the same names, the same order."""
    h = hashlib.sha256()
    for p in files:
        data = Path(p).read_bytes()
        h.update(Path(p).relative_to(root).as_posix().encode() + b"\0" + len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


def file_sha256(path: Path, limit: int = _ARCHIVE_LIMIT) -> str:
    """sha256 of a regular file's bytes (read through `open_regular`, at most `limit` bytes)."""
    h = hashlib.sha256()
    with open_regular(path, limit, CorpusError, "corpus snapshot") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def snapshot_manifest(name: str = PINNED) -> dict:
    """The manifest of a shipped snapshot (`models/data/corpus/<name>.json`): name, version, archive (file name),
    sha256 (of the archive), text_sha256 (`text_digest` of the extracted files), file and token counts."""
    path = SNAPSHOT_DIR / f"{name}.json"
    if not path.is_file():
        known = sorted(p.stem for p in SNAPSHOT_DIR.glob("*.json"))
        raise CorpusError(f"no corpus snapshot {name!r} in {SNAPSHOT_DIR} (shipped: {', '.join(known) or 'none'})")
    man = read_json(path, JSON_LIMIT, CorpusError, "corpus snapshot manifest")
    keys = {"name": str, "version": int, "archive": str, "sha256": str, "text_sha256": str, "files": int}
    if not (isinstance(man, dict) and all(isinstance(man.get(k), t) for k, t in keys.items())
            and "/" not in man["archive"]):
        raise CorpusError(f"{path}: not a corpus snapshot manifest (needs {', '.join(keys)})")
    return man


def _extract(archive: Path, man: dict, tmp: Path) -> None:
    """Write the archive's regular-file members under `tmp` (relative paths only), then check the text checksum."""
    with tarfile.open(archive, "r:xz") as tar:
        for m in tar:
            parts = Path(m.name).parts
            if not m.isfile() or Path(m.name).is_absolute() or ".." in parts or not parts:
                raise CorpusChecksumError(f"{archive}: member {m.name!r} is not a relative regular file")
            dst = tmp.joinpath(*parts)
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(tar.extractfile(m).read())
    train, val = _tree_split(tmp)
    if text_digest(tmp, train + val) != man["text_sha256"]:
        raise CorpusChecksumError(f"{archive}: its text does not match the manifest's text_sha256 "
                                  f"{man['text_sha256'][:16]}…")


def pinned_source(name: str = PINNED, cache_dir=None) -> TextSource:
    """The shipped snapshot `name` as a `TextSource` (the split and order of `stdlib_source` on the machine that made
    it). The archive's sha256 is checked against the manifest on every call (`CorpusChecksumError`: a corrupted or
    replaced archive is refused); it is extracted once, atomically, into `cache_dir/snapshots/<name>-<sha256[:16]>/`
    and that folder's text checksum is checked once per process (a changed folder is extracted again)."""
    man = snapshot_manifest(name)
    archive = SNAPSHOT_DIR / man["archive"]
    if not archive.is_file():
        raise CorpusError(f"the corpus snapshot {archive} is missing (its manifest {name}.json names it)")
    got = file_sha256(archive)
    if got != man["sha256"]:
        raise CorpusChecksumError(f"{archive}: sha256 {got[:16]}… is not the manifest's {man['sha256'][:16]}…; "
                                  "the archive is corrupted or replaced (reinstall the package)")
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    folder = cache / "snapshots" / f"{name}-{man['sha256'][:16]}"
    split = None
    if folder not in _VERIFIED:
        if folder.is_dir():
            split = _tree_split(folder)
            if text_digest(folder, split[0] + split[1]) != man["text_sha256"]:
                split = None
        if split is None:
            atomic_write_dir(folder, lambda tmp: _extract(archive, man, tmp))
        _VERIFIED.add(folder)
    train, val = split or _tree_split(folder)
    if len(train) + len(val) != man["files"]:
        raise CorpusChecksumError(f"{folder}: {len(train) + len(val)} files, the manifest says {man['files']}")
    return TextSource(man["name"], train, val, sha256=man["sha256"])


def write_snapshot(source: TextSource, root, out_dir, name: str, version: int, about: str, extra=None) -> dict:
    """Ship `source` (files under `root`) as the snapshot `name`: `out_dir/<name>.tar.xz`, a deterministic archive
    (members in the source's order, relative POSIX paths, mtime 0, uid/gid 0, no owner names, mode 0644; xz preset
    9), and its manifest `out_dir/<name>.json` (returned). `extra`: more manifest fields (e.g. token counts)."""
    import io
    import lzma

    root, out_dir = Path(root), Path(out_dir)
    files = list(source.train_files) + list(source.val_files)
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for p in files:
            data = Path(p).read_bytes()
            info = tarfile.TarInfo(Path(p).relative_to(root).as_posix())
            info.size, info.mtime, info.mode, info.uid, info.gid, info.uname, info.gname = \
                len(data), 0, 0o644, 0, 0, "", ""
            tar.addfile(info, io.BytesIO(data))
    packed = lzma.compress(raw.getvalue(), format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, preset=9)
    archive = out_dir / f"{name}.tar.xz"
    atomic_write(archive, lambda tmp: tmp.write_bytes(packed))
    man = {"name": name, "version": version, "about": about, "archive": archive.name,
           "sha256": hashlib.sha256(packed).hexdigest(), "text_sha256": text_digest(root, files),
           "files": len(files), "train_files": len(source.train_files), "val_files": len(source.val_files),
           "text_bytes": sum(Path(p).stat().st_size for p in files), **(extra or {})}
    atomic_write(out_dir / f"{name}.json", lambda tmp: tmp.write_text(json.dumps(man, indent=1) + "\n"))
    return man


def _looks_like_text(path: Path) -> bool:
    """A regular file (a FIFO or device is never opened for reading) whose first 8 KiB hold no NUL byte."""
    try:
        with open_regular(path, _ANY_SIZE, CorpusError, "corpus file") as f:
            head = f.read(8192)
    except (OSError, CorpusError):
        return False
    return b"\x00" not in head


def folder_source(spec, val_fraction: float = 0.05) -> TextSource:
    """A folder (every non-hidden text file below it, sorted) or a list of text files. Binary files
    (a NUL byte in the first 8 KiB) are skipped. Validation = the last `val_fraction` of the tokens."""
    if isinstance(spec, (str, os.PathLike)):
        root = Path(spec)
        if root.is_file():
            files = [root]
        elif root.is_dir():
            files = [p for p in sorted(root.rglob("*")) if p.is_file()
                     and not any(part.startswith(".") for part in p.relative_to(root).parts)]
        else:
            raise CorpusError(f"corpus path {str(root)!r} does not exist")
        name = root.name or str(root)
    else:
        files = [Path(p) for p in spec]
        missing = [str(p) for p in files if not p.is_file()]
        if missing:
            raise CorpusError(f"corpus file(s) not found: {missing[:5]}")
        name = f"{len(files)}-files"
    files = [p for p in files if _looks_like_text(p)]
    if not files:
        raise CorpusError(f"corpus {str(spec)!r} has no text files (empty folder, or only binary files)")
    if not 0 < val_fraction < 1:
        raise CorpusError(f"val_fraction must be in (0, 1), got {val_fraction}")
    return TextSource(name, files, [], val_fraction)


def resolve_source(data, cache_dir=None) -> TextSource:
    """`"stdlib"` (or None) → the pinned snapshot (`pinned_source()`); `"python-stdlib"` → the running Python's
    library (`stdlib_source()`); a path or a list of paths → `folder_source`."""
    if isinstance(data, TextSource):
        return data
    if data is None or (isinstance(data, str) and data == "stdlib"):
        return pinned_source(PINNED, cache_dir)
    if isinstance(data, str) and data == "python-stdlib":
        return stdlib_source()
    if not isinstance(data, (str, os.PathLike, list, tuple)):
        raise CorpusError("a corpus is 'stdlib', 'python-stdlib', a folder or file path, or a list of paths; got "
                          f"{type(data).__name__}")
    return folder_source(data)


BUILT_IN = ("stdlib", "python-stdlib")
BUILT_IN_PREFIXES = ("synthetic:", "seq2seq:")


def recorded_data(folder, data):
    """The corpus a model folder's `train_config.json` names (`data`), resolved without leaving the folder: a
    built-in name (`"stdlib"`, the default; `"python-stdlib"`; `"synthetic:…"`, `"seq2seq:…"`) as it is, or regular
    files inside `folder` (a relative name or a list of them, links followed only where they stay inside) as paths.
    Anything else (a path elsewhere, a folder, a FIFO or device) raises `CorpusError` naming it: a handed-over folder's
    metadata must not make us read outside it; text from elsewhere is the user's to name (`--text-file`)."""
    import stat

    folder = Path(folder)
    where = folder / "train_config.json"
    if data is None or data == "":
        return "stdlib"
    if isinstance(data, str) and (data in BUILT_IN or data.startswith(BUILT_IN_PREFIXES)):
        return data
    names = [data] if isinstance(data, str) else data
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
        raise CorpusError(f"{where}: data {data!r} is not a corpus name or a list of file names")
    root, files = folder.resolve(), []
    for name in names:
        path = (folder / name).resolve()
        try:
            inside = path.is_relative_to(root) and path != root
            regular = inside and stat.S_ISREG(os.stat(path).st_mode)
        except OSError:
            inside = regular = False
        if not (inside and regular):
            why = "is outside the model folder" if not inside else "is not a regular file inside the model folder"
            raise CorpusError(f"{where}: data {name!r} {why}; a model folder may name only a built-in corpus "
                              f"({', '.join(BUILT_IN)}, {', '.join(p + '…' for p in BUILT_IN_PREFIXES)}) or regular "
                              "files inside it (give other text with --text-file)")
        files.append(path)
    return files


def read_corpus_file(path: Path) -> str:
    with open_regular(path, _ANY_SIZE, CorpusError, "corpus file") as f:
        return f.read().decode("utf-8", errors="replace")


def iter_texts(files):
    for p in files:
        yield read_corpus_file(p)


# --- token arrays on disk -------------------------------------------------------------------------
def tokenizer_fingerprint(tokenizer) -> str:
    """sha256 of the tokenizer's serialised form (identical tokenizers → identical fingerprints)."""
    if hasattr(tokenizer, "tok"):
        text = tokenizer.tok.to_str()
    else:
        text = json.dumps({"kind": tokenizer.kind, "vocab_size": tokenizer.vocab_size})
    return hashlib.sha256(text.encode()).hexdigest()


def _files_digest(files, h) -> None:
    for p in files:
        h.update(str(Path(p).name).encode() + b"\0")
        with open_regular(p, _ANY_SIZE, CorpusError, "corpus file") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        h.update(b"\1")


def corpus_sha256(source: TextSource, fingerprint: str | None = None) -> str:
    """The checksum a corpus is named by: a pinned snapshot's archive sha256 (`sha256sum` of the shipped file),
    otherwise `source_fingerprint` (sha256 over the files' names and contents)."""
    return source.sha256 or fingerprint or source_fingerprint(source)


def source_fingerprint(source: TextSource) -> str:
    """sha256 over the file names and contents of both splits (and the held-out fraction)."""
    h = hashlib.sha256()
    _files_digest(source.train_files, h)
    h.update(b"--val--")
    _files_digest(source.val_files, h)
    h.update(str(source.val_fraction if not source.val_files else "").encode())
    return h.hexdigest()


def _encode_to_file(files, tokenizer, path: Path, dtype, batch_files: int = 64) -> int:
    """Stream-tokenize `files` into a flat binary array at `path` (EOS after each document)."""
    eos = tokenizer.eos_token_id
    n = 0
    with open(path, "wb") as out:
        for i in range(0, len(files), batch_files):
            texts = [read_corpus_file(p) for p in files[i : i + batch_files]]
            if hasattr(tokenizer, "tok"):
                encoded = [e.ids for e in tokenizer.tok.encode_batch(texts, add_special_tokens=False)]
            else:
                encoded = [tokenizer.encode(t) for t in texts]
            for ids in encoded:
                if not ids:
                    continue
                arr = np.asarray(ids + [eos], dtype=dtype)
                out.write(arr.tobytes())
                n += arr.size
    return n


@dataclass
class TokenCorpus:
    """Memory-mapped token ids of a corpus: `train` and `val` are 1-D arrays (documents separated by EOS)."""

    name: str
    train: np.ndarray
    val: np.ndarray
    tokenizer: object
    folder: Path | None = None
    sha256: str | None = None  # the text's checksum (`corpus_sha256`)

    def record(self) -> dict:
        """`{"name", "sha256"}`: what cards, summaries, reports and sweep records name the corpus by."""
        return {"name": self.name, "sha256": self.sha256}

    @property
    def bos_id(self) -> int:
        return self.tokenizer.bos_token_id

    def special_ids(self) -> list[int]:
        ids = {self.tokenizer.bos_token_id, self.tokenizer.pad_token_id, self.tokenizer.eos_token_id}
        return sorted(i for i in ids if i is not None)

    def unigram_counts(self, split: str = "train") -> np.ndarray:
        """Occurrences of each id in a split (streamed in 16M-token chunks), `[vocab_size]` int64."""
        arr = self.train if split == "train" else self.val
        counts = np.zeros(self.tokenizer.vocab_size, dtype=np.int64)
        for i in range(0, arr.size, 1 << 24):
            counts += np.bincount(np.asarray(arr[i : i + (1 << 24)]), minlength=counts.size)[: counts.size]
        return counts

    def seen_ids(self) -> np.ndarray:
        """Ids that occur in the training split, specials excluded: the pool for 'random tokens'."""
        counts = self.unigram_counts("train")
        counts[self.special_ids()] = 0
        return np.flatnonzero(counts).astype(np.int64)

    def check(self, seq_len: int) -> None:
        for split, arr in (("training", self.train), ("validation", self.val)):
            if arr.size < seq_len:
                raise CorpusError(
                    f"corpus {self.name!r} has {arr.size} {split} tokens, fewer than one sequence of "
                    f"{seq_len}; give more text or a shorter seq_len"
                )


def build_token_corpus(source, tokenizer, cache_dir=None) -> TokenCorpus:
    """Tokenize `source` (see `resolve_source`) with `tokenizer`, cached on disk under
    `cache_dir/corpora/<hash of contents + tokenizer>/`, and return memory-mapped arrays."""
    source = resolve_source(source, cache_dir)
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    # a pinned snapshot is named by its archive's sha256, its extracted text checked against the manifest on load
    # (`pinned_source`): reading every file again for a fingerprint would only hash the same text a second time
    fingerprint = source.sha256 or source_fingerprint(source)
    key = hashlib.sha256((fingerprint + tokenizer_fingerprint(tokenizer)).encode()).hexdigest()[:24]
    folder = cache / "corpora" / key
    dtype = np.uint16 if tokenizer.vocab_size <= 1 << 16 else np.uint32
    if not (folder / "meta.json").is_file():
        def write(tmp: Path) -> None:
            n_train = _encode_to_file(source.train_files, tokenizer, tmp / "train.bin", dtype)
            n_val = _encode_to_file(source.val_files, tokenizer, tmp / "val.bin", dtype)
            meta = {"name": source.name, "dtype": np.dtype(dtype).name, "n_train": n_train, "n_val": n_val,
                    "val_fraction": None if source.val_files else source.val_fraction,
                    "n_train_files": len(source.train_files), "n_val_files": len(source.val_files)}
            (tmp / "meta.json").write_text(json.dumps(meta, indent=2))

        atomic_write_dir(folder, write)
    meta = read_corpus_meta(folder / "meta.json")
    if meta["n_train"] == 0:
        raise CorpusError(f"corpus {source.name!r} contains no text (0 tokens after tokenization)")
    train = np.memmap(folder / "train.bin", dtype=meta["dtype"], mode="r", shape=(meta["n_train"],))
    if meta["n_val"]:
        val = np.memmap(folder / "val.bin", dtype=meta["dtype"], mode="r", shape=(meta["n_val"],))
    else:  # hold out the tail of the training stream
        cut = int(round(meta["n_train"] * (1 - meta["val_fraction"])))
        train, val = train[:cut], train[cut:]
    return TokenCorpus(source.name, train, val, tokenizer, folder, corpus_sha256(source, fingerprint))


def read_corpus_meta(path) -> dict:
    """The reader of a tokenized corpus cache's `meta.json`: a JSON object with `dtype` ("uint16" or "uint32"),
    `n_train` and `n_val` (integers >= 0) and `val_fraction` (a number in [0, 1) or null; needed when `n_val` is 0).
    `CorpusError` naming the file otherwise (delete the cache folder to rebuild it)."""
    path = Path(path)
    try:
        meta = read_json(path, JSON_LIMIT, CorpusError, "the corpus cache's meta.json", contained=True)
    except FileNotFoundError:
        raise CorpusError(f"{path}: missing (delete {path.parent} to rebuild the cache)") from None
    ok = (isinstance(meta, dict) and meta.get("dtype") in ("uint16", "uint32") and
          all(isinstance(meta.get(k), int) and not isinstance(meta.get(k), bool) and 0 <= meta[k] < 1 << 48
              for k in ("n_train", "n_val")) and
          (meta["n_val"] > 0 or (isinstance(meta.get("val_fraction"), (int, float)) and
                                 not isinstance(meta.get("val_fraction"), bool) and 0 <= meta["val_fraction"] < 1)))
    if not ok:
        raise CorpusError(f"{path}: not a corpus cache record (dtype uint16/uint32, n_train and n_val integers >= 0, "
                          f"val_fraction in [0, 1) when n_val is 0); delete {path.parent} to rebuild the cache")
    return meta


# --- baselines ------------------------------------------------------------------------------------
def unigram_baseline_loss(corpus: TokenCorpus, smoothing: float = 1.0) -> float:
    """Cross-entropy (nats/token) of the validation split under the training split's add-`smoothing`
    unigram distribution (the loss of a model that ignores context)."""
    counts = corpus.unigram_counts("train").astype(np.float64) + smoothing
    logp = np.log(counts / counts.sum())
    val = corpus.unigram_counts("val").astype(np.float64)
    return float(-(val * logp).sum() / val.sum())


def get_tokenizer(spec: str, source=None, cache_dir=None):
    """`make_tokenizer(spec)`, with trained BPE tokenizers cached under `cache_dir/tokenizers/` by a hash of
    the source's training files (training BPE on the stdlib takes seconds, so it is done once)."""
    from .tokenizer import load_tokenizer, make_tokenizer

    if not (isinstance(spec, str) and spec.startswith("bpe-")):
        return make_tokenizer(spec)
    source = resolve_source(source, cache_dir)
    h = hashlib.sha256()
    if source.sha256:  # a pinned snapshot: its checked archive names its training files (see build_token_corpus)
        h.update(f"{source.sha256}:train".encode())
    else:
        _files_digest(source.train_files, h)
    cache = (Path(cache_dir) if cache_dir is not None else default_cache_dir()) / "tokenizers"
    path = cache / f"{h.hexdigest()[:24]}-{spec}.json"
    if path.is_file():
        return load_tokenizer(path)
    tok = make_tokenizer(spec, iter_texts(source.train_files))
    cache.mkdir(parents=True, exist_ok=True)
    atomic_write(path, tok.save)
    return tok

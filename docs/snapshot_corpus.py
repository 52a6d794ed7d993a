"""Make the pinned corpus snapshot from the running Python's standard library (issue 40):
`python docs/snapshot_corpus.py [--tokens]` writes `models/data/corpus/python3.11-stdlib-v1.tar.xz` and its manifest
`python3.11-stdlib-v1.json` (`models.data.corpora.write_snapshot`): exactly the files `stdlib_source()` selects here,
in its order and split. It was run once, on Python 3.11.7 (pyenv build); the shipped archive is the record, and
rerunning it elsewhere makes another snapshot (a new version, never the same name). `--tokens` adds the zoo
tokenizers' train / validation token counts of the snapshot to the manifest (tokenizing it once per tokenizer).
"""

from __future__ import annotations

import json
import platform
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

NAME, VERSION = "python3.11-stdlib-v1", 1
ZOO_TOKENIZERS = {"bpe-512": "attn-only-2l", "bpe-2048": "attn-only-1l", "bytes": "gelu-2l"}


def token_counts() -> dict:
    """{tokenizer: {"zoo model": name, "train": n, "val": n}} of the shipped snapshot, with each zoo model's own
    tokenizer."""
    import models
    from models.data.corpora import build_token_corpus, pinned_source

    out = {}
    for spec, name in ZOO_TOKENIZERS.items():
        corpus = build_token_corpus(pinned_source(NAME), models.load(name).tokenizer)
        out[spec] = {"zoo model": name, "train": int(corpus.train.size), "val": int(corpus.val.size)}
    return out


def main(argv: list[str]) -> int:
    from models.data.corpora import SNAPSHOT_DIR, stdlib_source, write_snapshot

    manifest = SNAPSHOT_DIR / f"{NAME}.json"
    if "--tokens" in argv:
        man = json.loads(manifest.read_text())
        man["tokens"] = token_counts()
        manifest.write_text(json.dumps(man, indent=1) + "\n")
        print(json.dumps(man["tokens"], indent=1))
        return 0
    source = stdlib_source()
    about = (f"the *.py files of the standard library of Python {platform.python_version()} "
             f"({sysconfig.get_paths()['stdlib']} on the machine that made it; site-packages skipped), in sorted "
             "order; validation = the files under a test or tests package. It is the text the zoo's cards are "
             "measured on; the zoo itself was trained on another build's library (a few validation files differ)")
    SNAPSHOT_DIR.mkdir(exist_ok=True)
    man = write_snapshot(source, sysconfig.get_paths()["stdlib"], SNAPSHOT_DIR, NAME, VERSION, about)
    print(json.dumps(man, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

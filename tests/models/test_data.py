"""Corpora: sources, on-disk token arrays, deterministic sampling, synthetic repeats, clear failures."""

import numpy as np
import pytest

from models.data.batches import Curriculum, Mixture, RepeatBatches, TextBatches, insert_repeats, step_rng
from models.data.corpora import (
    CorpusError,
    build_token_corpus,
    folder_source,
    get_tokenizer,
    stdlib_source,
    unigram_baseline_loss,
)
from models.data.tokenizer import ByteTokenizer

TEXT = "".join(f"def f{i}(x):\n    return x * {i} + {i % 7}\n\n" for i in range(400))


@pytest.fixture
def corpus(tmp_path):
    d = tmp_path / "corpus"
    d.mkdir()
    (d / "a.py").write_text(TEXT)
    (d / "b.txt").write_text(TEXT[::-1])
    (d / "blob.bin").write_bytes(b"\x00\x01\x02" * 100)  # binary: skipped
    return build_token_corpus(d, ByteTokenizer(), cache_dir=tmp_path / "cache")


def test_stdlib_source_holds_out_tests():
    src = stdlib_source()
    assert len(src.train_files) > 100 and src.val_files  # a Debian-style Python ships only part of its tests
    assert src.train_files == sorted(src.train_files)
    assert all("site-packages" not in p.parts for p in src.train_files + src.val_files)
    assert all(any(x in ("test", "tests") for x in p.parts) for p in src.val_files)
    assert not any(p.parts[-2] in ("test", "tests") for p in src.train_files)


def test_stdlib_source_lists_what_rglob_lists(tmp_path, monkeypatch):
    """The walk that skips installed packages finds the files of the definition: every `*.py` file below the
    standard library by `Path.rglob`, in sorted order, less those under site-packages / dist-packages."""
    import sysconfig

    for rel in ["a/x.py", "a-b/y.py", "a/b/.h.py", "site-packages/p/z.py", "q/dist-packages/w.py", "test/t.py",
                "tests/u/v.py", "d.py/m.py", "A.PY", "n.pyc", "top.py"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x = 1\n")
    (tmp_path / "linked").symlink_to(tmp_path / "a", target_is_directory=True)
    (tmp_path / "f-link.py").symlink_to(tmp_path / "top.py")
    monkeypatch.setattr(sysconfig, "get_paths", lambda: {"stdlib": str(tmp_path)})
    src = stdlib_source()
    want = [p for p in sorted(tmp_path.rglob("*.py")) if p.is_file()
            and not {"site-packages", "dist-packages"} & set(p.relative_to(tmp_path).parts)]
    assert src.train_files + src.val_files == sorted(want, key=lambda p: "test" in p.parts or "tests" in p.parts)
    assert [p.name for p in src.val_files] == ["t.py", "v.py"]


def test_token_corpus_memmap_cache(corpus, tmp_path):
    assert isinstance(corpus.train, np.memmap) and corpus.train.dtype == np.uint16
    n = corpus.train.size + corpus.val.size
    assert n == 2 * len(TEXT.encode()) + 2  # two text files (+ EOS each), the binary file skipped
    assert corpus.val.size == pytest.approx(0.05 * n, abs=2)
    again = build_token_corpus(corpus.folder.parent.parent.parent / "corpus", ByteTokenizer(),
                               cache_dir=tmp_path / "cache")
    assert again.folder == corpus.folder  # same contents + tokenizer → same cache entry
    assert np.array_equal(np.asarray(again.train), np.asarray(corpus.train))


def test_unusable_corpora_fail_clearly(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(CorpusError, match="no text files"):
        folder_source(tmp_path / "empty")
    with pytest.raises(CorpusError, match="does not exist"):
        folder_source(tmp_path / "nope")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "x").write_bytes(b"\x00" * 10)
    with pytest.raises(CorpusError, match="no text files"):
        folder_source(tmp_path / "bin")
    (tmp_path / "blank").mkdir()
    (tmp_path / "blank" / "x.txt").write_text("")
    with pytest.raises(CorpusError, match="no text"):
        build_token_corpus(tmp_path / "blank", ByteTokenizer(), cache_dir=tmp_path / "c")
    (tmp_path / "short").mkdir()
    (tmp_path / "short" / "x.txt").write_text("a few bytes of text, not many")
    c = build_token_corpus(tmp_path / "short", ByteTokenizer(), cache_dir=tmp_path / "c")
    with pytest.raises(CorpusError, match="fewer than one sequence"):
        TextBatches(c, 64)


def test_batches_are_a_function_of_seed_and_step(corpus):
    b = TextBatches(corpus, 32, Mixture(repeat_fraction=0.5, min_len=3, max_len=10))
    x = b.batch(seed=1, step=7, batch_size=8)
    assert x.shape == (8, 32) and x.dtype == np.int64 and (x[:, 0] == corpus.bos_id).all()
    assert np.array_equal(x, b.batch(1, 7, 8))
    assert not np.array_equal(x, b.batch(1, 8, 8)) and not np.array_equal(x, b.batch(2, 7, 8))
    halves = [b.batch(1, 7, 8, rank=r, world_size=2) for r in range(2)]
    assert np.array_equal(np.concatenate(halves), x)  # ranks split the same global batch
    v = b.val_batch(4)
    assert np.array_equal(v, b.val_batch(4)) and v.shape == (4, 32)


def _repeat_of(row, L):
    """(a, b) with row[a:a+L] == row[b:b+L], b >= a+L, or None."""
    for a in range(1, len(row) - L):
        for b in range(a + L, len(row) - L + 1):
            if np.array_equal(row[a : a + L], row[b : b + L]):
                return a, b
    return None


def test_repeated_segments_vary_period_and_offset():
    rng = step_rng(0, 0)
    pool = np.arange(1000, 5000)
    seqs = np.zeros((200, 64), dtype=np.int64)
    seqs[:, 1:] = np.random.default_rng(0).integers(10, 20, (200, 63))  # low-entropy "text"
    insert_repeats(seqs, rng, Mixture(repeat_fraction=1.0, min_len=4, max_len=20, random_fraction=1.0), pool)
    periods, offsets = set(), set()
    for row in seqs:
        big = np.flatnonzero(row >= 1000)  # the random segment and its copy
        assert big.size >= 8 and big.size % 2 == 0
        L = big.size // 2
        a, b = big[0], big[L]
        assert np.array_equal(row[a : a + L], row[b : b + L])
        periods.add(int(b - a))
        offsets.add(int(a))
    assert len(periods) > 20 and len(offsets) > 20
    assert (seqs[:, 0] == 0).all()  # position 0 (BOS) untouched


def test_mixture_fraction_and_validation(corpus):
    b = TextBatches(corpus, 64, Mixture(repeat_fraction=0.0))
    x = b.batch(0, 0, 4)
    train = np.asarray(corpus.train)
    for row in x:  # without repeats every row is BOS + a contiguous window of the training stream
        starts = np.flatnonzero(train[: train.size - 62] == row[1])
        assert any(np.array_equal(train[s : s + 63], row[1:]) for s in starts)
    with pytest.raises(ValueError, match="repeat_fraction"):
        Mixture(repeat_fraction=1.5).validate(64)
    with pytest.raises(ValueError, match="too long"):
        Mixture(repeat_fraction=0.5, min_len=40, max_len=50).validate(64)


def test_repeat_tasks():
    rb = RepeatBatches(np.arange(3, 50), bos_id=0, seq_len=41, min_len=4, max_len=10)
    x = rb.batch(0, 3, 16)
    assert (x[:, 0] == 0).all() and np.array_equal(x, rb.batch(0, 3, 16))
    for row in x:
        L = next(L for L in range(4, 11) if np.array_equal(row[1 : 1 + L], row[1 + L : 1 + 2 * L]))
        assert np.array_equal(row[1:][L:], row[1:][:-L])  # periodic with period L


def test_unigram_baseline_and_seen_ids(corpus):
    seen = corpus.seen_ids()
    assert corpus.bos_id not in seen and corpus.tokenizer.eos_token_id not in seen
    assert set(seen.tolist()) == set(np.unique(np.asarray(corpus.train)).tolist()) - {corpus.tokenizer.eos_token_id}
    u = unigram_baseline_loss(corpus)
    assert 1.0 < u < np.log(len(seen) + 3)


def test_get_tokenizer_caches_bpe(tmp_path):
    d = tmp_path / "c"
    d.mkdir()
    (d / "a.txt").write_text(TEXT)
    t1 = get_tokenizer("bpe-300", str(d), cache_dir=tmp_path / "cache")
    assert len(list((tmp_path / "cache" / "tokenizers").glob("*.json"))) == 1
    t2 = get_tokenizer("bpe-300", str(d), cache_dir=tmp_path / "cache")
    assert t1.tok.to_str() == t2.tok.to_str()
    assert isinstance(get_tokenizer("bytes"), ByteTokenizer)


def test_fill_repeats_segment_to_the_end():
    rng = step_rng(0, 1)
    seqs = np.zeros((50, 64), dtype=np.int64)
    seqs[:, 1:] = np.random.default_rng(1).integers(10, 20, (50, 63))
    insert_repeats(seqs, rng, Mixture(repeat_fraction=1.0, min_len=4, max_len=12, random_fraction=1.0, fill=True),
                   np.arange(1000, 5000))
    periods = set()
    for row in seqs:
        big = np.flatnonzero(row >= 1000)
        a = big[0]
        assert (row[a:] >= 1000).all()  # random segment tiled from a to the end
        L = next(L for L in range(4, 13) if np.array_equal(row[a + L :], row[a : 64 - L]))
        periods.add(L)
    assert len(periods) > 5


def test_curriculum_switches_source_at_the_step(corpus):
    text = TextBatches(corpus, 32)
    synth = RepeatBatches(corpus.seen_ids(), corpus.bos_id, 32, min_len=4, max_len=8)
    c = Curriculum(synth, text, switch_step=5)
    assert np.array_equal(c.batch(0, 4, 8), synth.batch(0, 4, 8))
    assert np.array_equal(c.batch(0, 5, 8), text.batch(0, 5, 8))
    assert np.array_equal(c.batch(0, 3, 8, rank=1, world_size=2), synth.batch(0, 3, 8)[4:])
    assert np.array_equal(c.val_batch(6), text.val_batch(6))  # validation is always the natural text
    assert not np.array_equal(c.batch(0, 4, 8), text.batch(0, 4, 8))

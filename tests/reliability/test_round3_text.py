"""Round three (issue 32), text and sizes: text longer than n_ctx at every command and API entry point that takes
text (row 1), empty prompts and an answer equal to the wrong answer in patching (row 2), `--beams` / `num_beams`
bounds (row 13), meta tensors at the `circuits.checks` entry points (row 15) and the Python `train()` API's size
bounds (row 16). Each test failed on the code before the change (docs/RELIABILITY.md, round three)."""

from __future__ import annotations

import json
import subprocess
import warnings
from pathlib import Path

import pytest
import torch

import models
from models import HookedTransformer, HookedTransformerConfig, save
from models.data.tokenizer import ByteTokenizer
from models.generation.generate import ContextWindowWarning

N_CTX = 32
LONG = "".join(chr(97 + (i * 7) % 26) for i in range(70))  # 71 tokens with BOS, n_ctx 32
LONG2 = "".join(chr(97 + (i * 5) % 26) for i in range(70))  # as long, other letters (a corrupted prompt)
SRC_LONG = "abcdefghijabcdefghij"  # 20 source symbols, n_ctx_src 8 (enc-dec-reverse)


def _main(capsys, *args) -> subprocess.CompletedProcess:
    from analyses import cli

    capsys.readouterr()
    code = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, out, err)


def _lines(r) -> list[str]:
    assert "Traceback" not in r.stderr, r.stderr
    return [ln for ln in r.stderr.splitlines() if ln.strip()]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """2 layers, learned positions, n_ctx 32, bytes tokenizer."""
    cfg = HookedTransformerConfig(n_layers=2, d_model=32, n_ctx=N_CTX, d_vocab=259, n_heads=2, attn_only=True,
                                  normalization_type=None, seed=0)
    path = tmp_path_factory.mktemp("round3") / "tiny"
    save(HookedTransformer(cfg, tokenizer=ByteTokenizer()), path)
    return path


# --- row 1: text longer than n_ctx --------------------------------------------------------------------------------
TEXT_OPTIONS = ("--text", "--prompt", "--clean", "--corrupt", "--source", "--target")

# every (command, text option) of the command line, and how each is run here: decoder-only text longer than n_ctx
# is read from its end with one notice line (exit 0); an encoder-decoder's source or target is a whole input and is
# refused in one line (exit 2)
CLI_CASES = {
    ("attention", "--text"): ("tiny", ["--text", LONG, "--head", "1.0", "--json"], 0),
    ("generate", "--prompt"): ("tiny", ["--prompt", LONG, "--temperature", "0", "--max-new-tokens", "2", "--json"], 0),
    ("lens", "--text"): ("tiny", ["--text", LONG, "--json"], 0),
    ("patch", "--clean"): ("tiny", ["--clean", LONG, "--corrupt", LONG2, "--answer", "a", "--what", "resid",
                                    "--json"], 0),
    ("patch", "--corrupt"): ("tiny", ["--clean", LONG, "--corrupt", LONG2, "--answer", "a", "--what", "resid",
                                      "--json"], 0),
    ("attention", "--source"): ("enc-dec-reverse", ["--source", SRC_LONG], 2),
    ("attention", "--target"): ("enc-dec-reverse", ["--source", "abc", "--target", SRC_LONG], 2),
    ("generate", "--source"): ("enc-dec-reverse", ["--source", SRC_LONG], 2),
    ("paths", "--source"): ("enc-dec-reverse", ["--source", SRC_LONG, "--target", "cba"], 2),
    ("paths", "--target"): ("enc-dec-reverse", ["--source", "abc", "--target", SRC_LONG], 2),
}


def test_the_cases_cover_every_text_option_of_every_command():
    from analyses.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    found = {(name, opt) for name, sp in sub.choices.items() for a in sp._actions for opt in a.option_strings
             if opt in TEXT_OPTIONS}
    assert found == set(CLI_CASES)


def _last_window_ids(path) -> list[int]:
    model = models.load(path)
    return model.to_tokens(LONG, truncate=False)[0, -N_CTX:].tolist()


@pytest.mark.parametrize("case", [pytest.param(c, marks=[pytest.mark.tl4] if c[0] == "lens" else [])
                                  for c in CLI_CASES], ids=lambda c: f"{c[0]}{c[1]}")  # the lens: 4.x only
def test_every_command_reads_long_text_from_its_end_or_refuses(case, tiny, tmp_path, capsys):
    model_spec, argv, code = CLI_CASES[case]
    model_arg = tiny if model_spec == "tiny" else model_spec
    extra = ["--figure", tmp_path / "a.png"] if case[0] == "attention" else []
    r = _main(capsys, case[0], model_arg, *argv, *extra, "--no-progress")
    lines = _lines(r)
    assert r.returncode == code, r.stderr
    assert len(lines) == 1, r.stderr
    if code == 2:
        assert "n_ctx" in lines[0], lines
        return
    assert "last 32" in lines[0] and "71" in lines[0], lines
    out = json.loads(r.stdout)
    want = _last_window_ids(tiny)
    if case[0] == "lens":
        assert out["tokens"] == want
    elif case[0] == "attention":
        assert "".join(out["tokens"]) == LONG[-N_CTX:]
    elif case[0] == "patch":  # the clean run's metric is that of the last window; --pos -1 is the text's end
        model = models.load(tiny)
        with torch.no_grad():
            logits = model(torch.tensor([want]))[0, -1].float()
        loss = float(torch.nn.functional.cross_entropy(logits[None], torch.tensor([97])))
        assert out["clean"] == pytest.approx(loss, rel=1e-5)


def _api_cases(model):
    """Every Python entry point that takes text, as (name, call(text) -> ids it analysed or a result)."""
    from analyses.patching import activation_patching, answers, direct_logit_attribution, logit_lens, metric
    from analyses.scores import attention_patterns
    from circuits.paths import path_expansion
    from models.arch.tl_compat import TL_VERSION, version_tuple  # TransformerLens' logit lens is 4.x only

    def patched(text):
        met = metric("loss", answers(model, 1, "a"))
        corrupt = LONG2 if isinstance(text, str) else model.to_tokens(LONG2, truncate=False)[:, -N_CTX:]
        return activation_patching(model, text, corrupt, met, kind="resid_pre", progress=False).clean

    return {
        "forward": lambda t: model(t)[0, -1],
        "run_with_cache": lambda t: model.run_with_cache(t)[0][0, -1],
        "validate_tokens": lambda t: model.validate_tokens(t)[0],
        "to_str_tokens": lambda t: model.to_str_tokens(t),
        **({"logit_lens": lambda t: logit_lens(model, t).tokens} if version_tuple(TL_VERSION) >= (4, 0) else {}),
        "activation_patching": patched,
        "direct_logit_attribution": lambda t: direct_logit_attribution(model, t, "a"),
        "attention_patterns": lambda t: attention_patterns(model, t),
        "path_expansion": lambda t: path_expansion(model, t, max_order=1).logits,
        "generate": lambda t: model.generate(t, max_new_tokens=1, temperature=0, verbose=False,
                                              return_type="tokens")[0, -1],
    }


def _same(a, b):
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if hasattr(a, "__dataclass_fields__") or hasattr(a, "__dict__"):
        return all(_same(getattr(a, k), getattr(b, k)) for k in vars(a) if isinstance(getattr(a, k), torch.Tensor))
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def test_every_api_entry_point_reads_long_text_from_its_end(tiny):
    model = models.load(tiny).eval()
    ids = model.to_tokens(LONG, truncate=False)[:, -N_CTX:]
    cases = _api_cases(model)
    for name, call in cases.items():
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            got = call(LONG)
        assert any(issubclass(w.category, ContextWindowWarning) and "last 32" in str(w.message) for w in seen), name
        if name == "generate":  # the whole prompt is kept and the model conditions on its last n_ctx
            with torch.no_grad():
                want = model(ids)[0, -1].argmax()
            assert int(got) == int(want), name
            continue
        if name == "to_str_tokens":
            want = [model.tokenizer.decode([i]) for i in ids[0].tolist()]
        elif name == "validate_tokens":
            want = ids[0]
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("error", ContextWindowWarning)  # ids of n_ctx tokens: no notice
                want = call(ids)
        assert _same(got, want), name


# --- row 2: empty prompts, answer == wrong --------------------------------------------------------------------------
@pytest.mark.parametrize("argv", [
    ["--clean", "", "--corrupt", ""],
    ["--clean", "ab", "--corrupt", ""],
    ["--clean", "ab", "--corrupt", "ac", "--answer", "b", "--wrong", "b"],
    ["--clean", "ab", "--corrupt", "ac", "--answer", "98", "--wrong", "b"],
], ids=["both-empty", "corrupt-empty", "answer-is-wrong", "answer-id-is-wrong"])
def test_patch_refuses_empty_prompts_and_an_answer_equal_to_the_wrong_one(argv, tiny, capsys):
    if "--answer" not in argv:
        argv = argv + ["--answer", "a"]
    r = _main(capsys, "patch", tiny, *argv, "--what", "resid", "--no-progress")
    lines = _lines(r)
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert ("empty" in lines[0]) if "" in argv else ("equals the answer" in lines[0]), lines
    assert r.stdout == ""


def test_patching_api_refuses_empty_text_and_equal_answers(tiny):
    from analyses.patching import PatchingError, activation_patching, answers, metric

    model = models.load(tiny).eval()
    met = metric("loss", answers(model, 1, "a"))
    with pytest.raises(PatchingError, match="empty"):
        activation_patching(model, "", "", met, kind="resid_pre", progress=False)
    with pytest.raises(PatchingError, match="equals the answer"):
        answers(model, 1, "a", "a")
    with pytest.raises(PatchingError, match="equals the answer"):
        answers(model, 2, torch.tensor([97, 98]), torch.tensor([99, 98]))


# --- row 13: --beams / beams bounded as the other size options -------------------------------------------------------
HUGE_BEAMS = 10**8  # about 2 TB of search state for enc-dec-reverse: beyond half the memory of any machine


@pytest.mark.e2e  # a subprocess under a memory limit
def test_generate_refuses_beams_beyond_memory_in_one_line():
    import resource
    import sys

    def limit():  # before the bound: allocation failed under this limit with a traceback (exit 1)
        resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))

    r = subprocess.run([sys.executable, "-m", "analyses.cli", "generate", "enc-dec-reverse", "--source", "abc",
                        "--beams", str(HUGE_BEAMS)], capture_output=True, text=True, timeout=300,
                       cwd=Path(__file__).resolve().parents[2], preexec_fn=limit)
    lines = _lines(r)
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert "--beams" in lines[0] and "<=" in lines[0] and "GiB" in lines[0], lines


def test_beam_search_api_refuses_beams_beyond_memory(tiny):
    from models.errors import InputError

    encdec = models.load("enc-dec-reverse")
    with pytest.raises(InputError, match=r"beams 100000000 needs .* use beams <= \d+"):
        encdec.generate(encdec.to_tokens_src("abc"), 5, method="beam", beams=HUGE_BEAMS)
    model = models.load(tiny)
    with pytest.raises(InputError, match=r"beams 100000000 needs .* use beams <= \d+"):
        model.beam_search(torch.tensor([[1, 2, 3]]), beams=HUGE_BEAMS, max_new_tokens=4)
    seqs, _ = model.beam_search(torch.tensor([[1, 2, 3]]), beams=3, max_new_tokens=2)  # small ones still run
    assert seqs.shape == (3, 5)


# --- row 15: meta (non-materialised) tensors at the circuits entry points --------------------------------------------
def test_circuits_entry_points_refuse_meta_models_by_name():
    from circuits.composition import composition_score, composition_scores
    from circuits.diagonal import diagonal_rank_stats
    from circuits.eigen import copying_score, copying_scores, eigenvalues, positive_eigenvalue_fraction
    from circuits.factored import ov_circuit, qk_circuit
    from circuits.paths import path_expansion
    from circuits.score_decomposition import attention_score_decomposition
    from models.arch.tl_compat import FactoredMatrix

    model = models.load("attn-only-2l").to("meta")
    fm = FactoredMatrix(torch.randn(6, 3, device="meta"), torch.randn(3, 6, device="meta"))
    calls = {
        "copying_scores": lambda: copying_scores(model),
        "composition_scores": lambda: composition_scores(model, "k"),
        "qk_circuit": lambda: qk_circuit(model, 1, 0),
        "ov_circuit": lambda: ov_circuit(model, 1, 0),
        "attention_score_decomposition": lambda: attention_score_decomposition(model, torch.tensor([[1, 2, 3]]), 1, 0),
        "path_expansion": lambda: path_expansion(model, torch.tensor([[1, 2, 3]])),
        "eigenvalues": lambda: eigenvalues(fm),
        "copying_score": lambda: copying_score(fm),
        "positive_eigenvalue_fraction": lambda: positive_eigenvalue_fraction(fm),
        "diagonal_rank_stats": lambda: diagonal_rank_stats(fm),
        "composition_score": lambda: composition_score(fm, fm),
        "eigenvalues (dense)": lambda: eigenvalues(torch.randn(5, 5, device="meta")),
    }
    for name, call in calls.items():
        with pytest.raises((ValueError, TypeError), match="meta tensor") as info:
            call()
        assert not isinstance(info.value, NotImplementedError), name


# --- row 16: the Python train() API bounds sizes where the command line does ------------------------------------------
@pytest.mark.parametrize("model_over,train_over,option", [
    ({}, {"batch_size": 10**9}, "batch_size"),
    ({}, {"seq_len": 10**9}, "seq_len"),
    ({"d_model": 2**20, "d_head": 2**19, "n_heads": 2}, {}, "weights"),
])
def test_train_api_refuses_sizes_beyond_memory_before_building(model_over, train_over, option, tmp_path):
    from models.errors import TrainConfigError
    from models.training.config import TrainConfig
    from models.training.loop import train

    model_cfg = dict(dict(n_layers=1, d_model=16, n_ctx=16, d_vocab=259, n_heads=2, attn_only=True,
                          normalization_type=None), **model_over)
    cfg = TrainConfig(**dict(dict(steps=2, batch_size=4, data="synthetic:repeat", tokenizer="bytes", progress=False,
                                  out_dir=str(tmp_path / "run")), **train_over))
    with pytest.raises(TrainConfigError, match=rf"{option}.*allowed") as info:
        train(model_cfg, cfg)
    assert "<=" in str(info.value) or "more than" in str(info.value)
    assert not (tmp_path / "run").exists()

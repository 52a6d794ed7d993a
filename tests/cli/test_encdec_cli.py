"""The `circuits` command on encoder–decoder models, in a subprocess: the commands that apply answer (with `--json`),
the others refuse by name with exit code 2 and one line. The zoo model `enc-dec-reverse` is the model read."""

from __future__ import annotations

import json

import pytest
from test_cli import ZOO, circuits, ok

M = "enc-dec-reverse"
pytestmark = [pytest.mark.e2e,  # the command line on the encoder-decoder zoo model
              pytest.mark.skipif(not (ZOO / M / "model.safetensors").is_file(), reason=f"zoo model {M} not present")]


def refused(*args, words: tuple[str, ...]) -> str:
    r = circuits(*args)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    line = r.stderr.strip()
    assert "\n" not in line and "Traceback" not in line
    for w in words:
        assert w in line, line
    return line


def test_info_heads_and_a_refusal():
    refused("compose", M, words=("`circuits compose` serves", "not encoder–decoder ones", M))
    info = json.loads(ok("info", M, "--json"))
    assert info["model_type"] == "encoder_decoder" and "decoder.0.cross_attn.hook_pattern" in info["hooks"]
    heads = json.loads(ok("heads", M, "--json"))
    by = {h["head"]: h for h in heads["heads"]}
    assert set(by) == {"C0H0", "C0H1"}
    assert max(h["alignment"] for h in by.values()) >= 0.9 and max(h["ov_copying"] for h in by.values()) >= 0.9
    from circuits.cross_attention import cross_diagonal_accuracy
    from models import load

    acc = cross_diagonal_accuracy(load(M), range(3, 13), k=(1, 5))  # the 10 letters after PAD, BOS, EOS
    for h in range(2):
        rec = by[f"C0H{h}"]
        assert (rec["ov_top1"], rec["ov_top5"]) == (float(acc[1][0, h]), float(acc[5][0, h]))
        assert ("copying" in rec["verdict"]) == (rec["ov_copying"] >= 0.4 and rec["ov_top1"] >= 0.5)


@pytest.mark.slow
def test_paths_generate_and_refusals():
    paths = json.loads(ok("paths", M, "--source", "abcdefgh", "--target", "hgfedcba", "--json"))
    assert paths["reconstruction_error"] < 1e-5 and paths["top_terms"][0]["term"].startswith("C0H")
    gen = json.loads(ok("generate", M, "--source", "jihgfedc", "--json"))
    assert gen["method"] == "greedy" and gen["samples"][0]["text"] == "cdefghij" and gen["samples"][0]["ended"]
    refused("generate", M, "--prompt", "ab", words=("--source",))


@pytest.mark.slow
def test_eigen_attention_report_beam_and_more_refusals(tmp_path):
    eig = json.loads(ok("eigen", M, "--eigenvalues", "3", "--json"))
    assert {h["head"] for h in eig["heads"]} == {"C0H0", "C0H1", "D0H0", "D0H1"}
    assert all(len(h["eigenvalues"]) == 3 for h in eig["heads"])
    beam = json.loads(ok("generate", M, "--source", "abcdefgh", "--beams", "3", "--json"))
    assert beam["method"] == "beam" and beam["samples"][0]["text"] == "hgfedcba"
    att = json.loads(ok("attention", M, "--source", "abcdefgh", "--head", "C0H1", "--figure", tmp_path / "a.png",
                        "--json"))
    assert att["heads"]["C0H1"]["argmax_source"][:8] == [7, 6, 5, 4, 3, 2, 1, 0]
    assert (tmp_path / "a.png").stat().st_size > 1000
    rep = json.loads(ok("report", M, "--out", tmp_path / "r", "--sections", "alignment,cross_copying", "--json"))
    assert rep["sections"] == ["alignment", "cross_copying"] and rep["failed"] == {}
    refused("trigrams", M, "--head", "0.0", words=("`circuits trigrams` serves",))
    refused("lens", M, "--text", "ab", words=("`circuits lens` serves",))
    refused("attention", M, "--text", "ab", "--figure", tmp_path / "b.png", words=("--source",))
    refused("attention", M, "--source", "abcdefghij", "--figure", tmp_path / "b.png", words=("n_ctx_src=8",))


@pytest.mark.slow
def test_encoder_only_refusals(tmp_path):
    from models import save
    from models.arch.encoder import EncoderConfig, HookedEncoder

    save(HookedEncoder(EncoderConfig(n_layers=1, d_model=16, n_ctx=8, d_vocab=20, n_heads=2, seed=0)), tmp_path / "e")
    refused("generate", tmp_path / "e", "--prompt", "ab", words=("`circuits generate` serves", "not encoder-only"))
    refused("paths", tmp_path / "e", words=("`circuits paths` serves", "not encoder-only"))

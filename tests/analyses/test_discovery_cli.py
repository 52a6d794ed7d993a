"""`circuits discover`: a run writes its folder (JSON that matches the library call, two figures that pass the figure
checks), and bad input gets one line and exit 2 with nothing written."""

from __future__ import annotations

import json

import pytest

from analyses.cli import main


def _run(capsys, *argv):
    capsys.readouterr()
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_run_writes_its_folder_and_agrees_with_the_library(capsys, tmp_path):
    import matplotlib.image

    import models
    from analyses.discovery import discover, discovery_task

    out = tmp_path / "d"
    code, stdout, err = _run(capsys, "discover", "attn-only-2l", "--method", "eap", "--n-prompts", "6",
                             "--out", out, "--json", "--no-progress")
    assert code == 0, err
    obj = json.loads(stdout)
    m = models.load("attn-only-2l")
    ref = discover(m, discovery_task(m, "induction", n_prompts=6), "eap")
    assert [tuple(e) for e in obj["circuit"]] == ref.circuit
    assert obj["faithfulness"] == pytest.approx(ref.faithfulness, abs=1e-9)
    assert sorted(p.name for p in out.iterdir()) == [".toy-circuits.json", "circuit.json", "circuit.png",
                                                      "faithfulness.png", "result.json"]
    assert json.loads((out / "result.json").read_text())["scores"]["L0H1->L1H1.k"] == pytest.approx(
        ref.scores[("L0H1", "L1H1.k")], abs=1e-9)
    for png in ("circuit.png", "faithfulness.png"):
        assert matplotlib.image.imread(out / png).shape[0] > 200


def test_the_figures_pass_the_figure_checks():
    import models
    from analyses.discovery import discover, discovery_task
    from analyses.discovery.plots import plot_circuit, plot_faithfulness
    from analyses.figure_checks import figure_problems

    m = models.load("attn-only-2l")
    r = discover(m, discovery_task(m, "induction", n_prompts=4, seq_len=8), "acdc")
    for fig in (plot_circuit(r), plot_faithfulness(r)):
        assert figure_problems(fig) == []


def _task_file(tmp_path, **d):
    p = tmp_path / "task.json"
    p.write_text(json.dumps(d))
    return p


def test_an_encoder_decoder_run_writes_its_folder_and_agrees_with_the_library(capsys, tmp_path):
    import models
    from analyses.discovery import discover, discovery_task

    out = tmp_path / "d"
    code, stdout, err = _run(capsys, "discover", "enc-dec-reverse", "--method", "eap-ig", "--n-prompts", "6",
                             "--out", out, "--json", "--no-progress")  # the model's own task: reversal
    assert code == 0, err
    obj = json.loads(stdout)
    m = models.load("enc-dec-reverse")
    ref = discover(m, discovery_task(m, "reversal", n_prompts=6), "eap-ig")
    assert obj["task"]["name"] == "reversal" and [tuple(e) for e in obj["circuit"]] == ref.circuit
    assert obj["faithfulness"] == pytest.approx(ref.faithfulness, abs=1e-9)
    assert (out / "circuit.png").is_file() and (out / "faithfulness.png").is_file()


def test_the_encoder_decoder_figures_pass_the_figure_checks():
    import models
    from analyses.discovery import discover, discovery_task
    from analyses.discovery.plots import plot_circuit, plot_faithfulness
    from analyses.figure_checks import figure_problems

    m = models.load("enc-dec-sort")
    r = discover(m, discovery_task(m, "sorting", n_prompts=4), "eap-ig")
    for fig in (plot_circuit(r), plot_faithfulness(r)):
        assert figure_problems(fig) == []


@pytest.mark.parametrize("case", ["unknown task", "empty pairs", "mismatched pairs", "mismatched lengths",
                                  "negative threshold", "nan threshold", "decoder task on an encoder-decoder",
                                  "task file on an encoder-decoder", "another seq2seq task",
                                  "seq2seq task on a decoder", "foreign folder"])
def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path, case):
    out = tmp_path / "out"
    argv = ["discover", "attn-only-2l", "--out", out]
    if case == "unknown task":
        argv += ["--task", "greater-than"]
    elif case == "empty pairs":
        argv += ["--task", _task_file(tmp_path, clean=[], corrupt=[], answer=1)]
    elif case == "mismatched pairs":
        argv += ["--task", _task_file(tmp_path, clean=[[1, 2]], corrupt=[[1, 2], [3, 4]], answer=1)]
    elif case == "mismatched lengths":
        argv += ["--task", _task_file(tmp_path, clean=[[1, 2, 3]], corrupt=[[1, 2]], answer=1)]
    elif case == "negative threshold":
        argv += ["--method", "acdc", "--threshold", "-1"]
    elif case == "nan threshold":
        argv += ["--threshold", "nan"]
    elif case == "decoder task on an encoder-decoder":
        argv[1:2] = ["enc-dec-reverse", "--task", "induction"]
    elif case == "task file on an encoder-decoder":
        argv[1:2] = ["enc-dec-reverse", "--task", _task_file(tmp_path, clean=[[3, 4]], corrupt=[[4, 3]], answer=3)]
    elif case == "another seq2seq task":
        argv[1:2] = ["enc-dec-reverse", "--task", "sorting"]
    elif case == "seq2seq task on a decoder":
        argv += ["--task", "reversal"]
    elif case == "foreign folder":
        out.mkdir()
        (out / "mine.txt").write_text("x")
    code, _, err = _run(capsys, *argv, "--no-progress")
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("circuits discover: error: "), lines[0]
    if case != "foreign folder":
        assert not out.exists()
    else:
        assert sorted(p.name for p in out.iterdir()) == ["mine.txt"]


def test_a_user_task_file_runs(capsys, tmp_path):
    task = _task_file(tmp_path, clean=[[0, 5, 6, 7, 5], [0, 9, 10, 11, 9]], corrupt=[[0, 8, 12, 7, 5],
                                                                                      [0, 13, 14, 11, 9]],
                      answer=[6, 10], wrong=[12, 14], name="mine")
    code, stdout, err = _run(capsys, "discover", "attn-only-2l", "--task", task, "--method", "acdc", "--json",
                             "--no-progress")
    assert code == 0, err
    obj = json.loads(stdout)
    assert obj["task"]["name"] == "mine" and obj["task"]["metric"] == "logit_diff" and obj["n_edges"] == 97

"""The numbers that README.md, the model cards and analyses/REPRODUCTION.md quote agree with the cards' JSON
(`measured.json`, written with the card): per-head score lists, maxima, verdict counts and the formation step, at
the precision each text prints them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from models.io.checkpoint import ZOO_DIR

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
REPRO = (ROOT / "analyses" / "REPRODUCTION.md").read_text()
NUM = r"[−+-]?\d+\.\d+"


def measured(name: str) -> dict:
    return json.loads((ZOO_DIR / name / "measured.json").read_text())


def card(name: str) -> str:
    return (ZOO_DIR / name / "card.md").read_text()


def floats(text: str) -> list[float]:
    return [float(x.replace("−", "-")) for x in re.findall(NUM, text)]


def fmt(values, digits: int) -> list[float]:
    return [round(float(v), digits) for v in values]


def card_line(name: str, start: str) -> str:
    lines = [ln for ln in card(name).splitlines() if ln.startswith(start)]
    assert len(lines) == 1, (name, start, lines)
    return lines[0]


def heads_and_max(line: str, layer: int) -> tuple[list[float], float]:
    m = re.search(rf"layer {layer} heads: ((?:{NUM}, )*{NUM}) \(max \*\*({NUM})\*\*\)", line)
    assert m, line
    return floats(m.group(1)), float(m.group(2))


@pytest.mark.parametrize("name", ["attn-only-1l", "attn-only-2l", "gelu-2l"])
def test_card_scores_are_the_json(name):
    js = measured(name)
    L = len(js["previous_token_scores"]) - 1
    for key, start in [("previous_token_scores", "- previous-token scores"),
                       ("induction_scores_50", "- induction scores (second copy of [BOS]+R+R → the token after the "
                                               "first occurrence), |R| = 50 "),
                       ("induction_scores_arena_50", "- ARENA's induction score")]:
        line_layer = 0 if key == "previous_token_scores" else L
        got, top = heads_and_max(card_line(name, start), line_layer)
        assert got == fmt(js[key][line_layer], 2) and top == round(max(js[key][line_layer]), 3), (name, key)
    if "induction_onset_step" in js:
        line = card_line(name, "- induction heads formed")
        step = js["induction_onset_step"]
        assert (f"by checkpoint step {step} " in line) if step is not None else "not within this run" in line


def test_one_layer_copying_in_card_readme_and_reproduction():
    js = measured("attn-only-1l")
    cs, top1 = js["copying_scores"][0], js["ov_top1"][0]
    passing = sum(v >= 0.5 for v in cs)
    both = sum(c >= 0.5 and t >= 0.5 for c, t in zip(cs, top1))
    line = card_line("attn-only-1l", "- copying scores Σλ/Σ|λ|")
    assert floats(line.split(":", 1)[1])[:len(cs)] == fmt(cs, 2) and f"**{passing} of {len(cs)}**" in line
    line = card_line("attn-only-1l", "- top-1 / top-5 diagonal accuracy")
    assert floats(line.split("top-1 ", 2)[2].split(";")[0]) == fmt(top1, 2) and f"**{both} of {len(cs)}**" in line
    row = next(r for r in README.splitlines() if r.startswith("| [`attn-only-1l`]"))
    assert floats(row.split("full-OV copying scores", 1)[1])[:len(cs)] == fmt(cs, 2)
    assert f"**{passing} of {len(cs)} heads ≥ 0.5**" in row
    lo, hi = (round(100 * v, 1) for v in (min(top1), max(top1)))
    assert f"{lo}–{hi} %" in row and (both == 0) == ("none copies by both" in row)
    rrow = next(r for r in REPRO.splitlines() if r.startswith("| 1L: most heads copy"))
    assert f"{passing} of {len(cs)} heads pass the eigenvalue score (scores " in rrow
    assert floats(rrow.split("(scores ", 1)[1].split(")")[0]) == fmt(cs, 2)
    pct = rrow.split("ids seen in training ", 1)[1].split(", so")[0]
    assert floats(pct) == [round(100 * v, 1) for v in top1] and f"so {both} of {len(cs)} copy by both" in rrow


def test_two_layer_induction_quotes_in_readme():
    js = measured("attn-only-2l")
    ind, arena = js["induction_scores_50"][1], js["induction_scores_arena_50"][1]
    heads = sorted(range(len(ind)), key=lambda h: -ind[h])[:2]
    row = next(r for r in README.splitlines() if r.startswith("| [`attn-only-2l`]"))
    quoted = ", ".join(f"L1H{h} {ind[h]:.2f}" for h in sorted(heads))
    assert f"induction heads **{quoted}**" in row, row
    assert "whole-stripe score, R over all ids: " + ", ".join(f"{arena[h]:.2f}" for h in sorted(heads)) in row
    assert f"formed by checkpoint step {js['induction_onset_step']} " in row
    prev = js["previous_token_scores"][0]
    assert f"**L0H{prev.index(max(prev))} {max(prev):.2f}**" in row


def test_gelu_and_encoder_decoder_rows():
    g = measured("gelu-2l")
    row = next(r for r in README.splitlines() if r.startswith("| [`gelu-2l`]"))
    assert f"no induction head (best {max(g['induction_scores_50'][1]):.2f})" in row
    for name in ("enc-dec-reverse", "enc-dec-sort"):
        js = measured(name)
        line = card_line(name, "- top-1 / top-5 diagonal accuracy of the same circuits")
        t1, t5 = line.split("top-1 ", 2)[2].split("; top-5 ")
        assert floats(re.sub(r"layer \d+:", "", t1)) == fmt(sum(js["cross_top1_diagonal_accuracy"], []), 3)
        assert floats(re.sub(r"layer \d+:", "", t5)) == fmt(sum(js["cross_top5_diagonal_accuracy"], []), 3)
    rev, srt = measured("enc-dec-reverse"), measured("enc-dec-sort")
    row = next(r for r in README.splitlines() if r.startswith("| [`enc-dec-reverse`]"))
    assert "top-1 diagonal accuracy " + ", ".join(f"{v:.3f}" for v in rev["cross_top1_diagonal_accuracy"][0]) in row
    assert ", ".join(f"{v:.3f}" for v in rev["cross_copying_scores"][0]) in row
    row = next(r for r in README.splitlines() if r.startswith("| [`enc-dec-sort`]"))
    top1 = {round(v, 2) for v in sum(srt["cross_top1_diagonal_accuracy"], [])}
    cs = sum(srt["cross_copying_scores"], [])
    assert len(top1) == 1 and f"top-1 diagonal accuracy {top1.pop():.2f} for every head" in row
    assert f"copying {min(cs):.2f}–{max(cs):.2f}" in row


def test_seed_sweep_section_quotes_its_record():
    """README's "Seed sweeps and Olsson et al." against docs/sweep-attn-only-2l/sweep.json."""
    s = json.loads((ROOT / "docs" / "sweep-attn-only-2l" / "sweep.json").read_text())
    a, x = s["analysis"], s["analysis"]["across_seeds"]
    start = README.index("## Seed sweeps and Olsson et al. (2022)")
    section = " ".join(README[start:README.index("\n## ", start + 10)].split())  # lines joined
    assert s["status"] == "finished" and a["steps_reached"] == s["steps"] == 6000 and a["n_seeds"] == 8
    assert f"{s['wall_time']:,.0f} s" in section
    assert f"**Every seed forms induction heads: {a['formed']['k']} of {a['formed']['n']}**" in section
    assert f"Wilson 95 %: {a['formed']['low']:.2f}–{a['formed']['high']:.2f}" in section
    # the first sweep's formation, re-read from its shipped curves by interpolation (its record predates `crossing`)
    from analyses.stats import t_interval
    from analyses.sweep import crossing

    cross = [crossing(r["induction_curve"]) for r in a["seeds"]]
    c = t_interval([k["step"] for k in cross])
    assert f"step {c['mean']:,.0f}\n  [{c['low']:,.0f}, {c['high']:,.0f}]" in README[README.index("## Seed sweeps"):]
    lo, hi = (sum(k["bracket"][i] for k in cross) / len(cross) for i in (0, 1))
    assert f"bound the mean only to ({lo:,.0f}, {hi:,.0f}]" in section
    assert min(k["bracket"][0] for k in cross) == 1500 and max(k["bracket"][1] for k in cross) == 1875
    assert "between 1,500 and 1,875" in section
    for key in ("loss_bump_tokens", "rise_tokens"):
        v = x[key]
        assert f"{v['mean'] / 1e6:.2f} M tokens [{v['low'] / 1e6:.2f} M, {v['high'] / 1e6:.2f} M]" in section, key
    # the dense re-run (issue 40.3): checkpoints every 25 steps from 1,500 to 2,200
    d = json.loads((ROOT / "docs" / "sweep-attn-only-2l-dense" / "sweep.json").read_text())
    da, dx = d["analysis"], d["analysis"]["across_seeds"]
    assert d["train_config"]["dense_checkpoints"] == [1500, 2200, 25] and da["n_seeds"] == 8
    assert f"stopped at step {da['steps_reached']:,} of {d['steps']:,}" in section
    assert f"{da['formed']['k']} of {da['formed']['n']} seeds formed again" in section
    brackets = [r["crossing_bracket"] for r in da["seeds"]]
    assert f"between steps {min(b[0] for b in brackets):,} and {max(b[1] for b in brackets):,}" in section
    assert {b[1] - b[0] for b in brackets} == {25} and "25-step bracket" in section
    c, t = dx["crossing_step"], dx["crossing_tokens"]
    assert f"mean step {c['mean']:,.0f} [{c['low']:,.0f}, {c['high']:,.0f}]" in section
    lo, hi = da["formation_bound_steps"]
    assert f"the checkpoints alone bound the mean to ({lo:,.0f}, {hi:,.0f}]" in section
    assert f"{t['mean'] / 1e6:.2f} M tokens [{t['low'] / 1e6:.2f} M, {t['high'] / 1e6:.2f} M]" in section
    b, r = dx["loss_bump_tokens"], dx["rise_tokens"]
    assert f"{b['mean'] / 1e6:.2f} M [{b['low'] / 1e6:.2f} M, {b['high'] / 1e6:.2f} M] in the re-run" in section
    assert f"{r['mean'] / 1e6:.2f} M tokens [{r['low'] / 1e6:.2f} M, {r['high'] / 1e6:.2f} M] of the\n" \
           f"  re-run's {da['steps_reached']:,} steps" in README
    for key, digits in (("previous_token_score", 3), ("best_induction_score", 3), ("final_icl_score", 3),
                        ("final_val_loss", 3), ("copying_score_best_induction_head", 3)):
        v = x[key]
        quoted = f"{v['mean']:.{digits}f} [{v['low']:.{digits}f}, {v['high']:.{digits}f}]".replace("-", "−")
        assert quoted in section, key
    heads = a["previous_token_heads"]
    assert "L0H1 in 5 seeds, L0H0 in 2, L0H3 in 1" in section and heads == {"L0H0": 2, "L0H1": 5, "L0H3": 1}
    assert f"p = {a['most_common_previous_token_head']['p_uniform']:.2f}" in section
    ind = ", ".join(f"{h} in {n}" for h, n in a["induction_heads"].items())
    assert ind.replace("in 5,", "in 5 seeds,", 1) in section
    seed0 = next(r for r in a["seeds"] if r["seed"] == 0)
    assert f"final validation loss {seed0['final_val_loss']:.4f}" in section
    shipped = [json.loads(x) for x in (ROOT / "models" / "zoo" / "attn-only-2l" / "metrics.jsonl").read_text()
               .splitlines()]
    assert f"the shipped run's {next(r['val_loss'] for r in shipped if r['step'] == 6000):.4f}" in section


def _minus(text: str) -> str:
    return text.replace("-", "−")


LANGUAGE_MODELS = ["attn-only-0l", "attn-only-1l", "attn-only-2l", "gelu-2l"]


@pytest.mark.parametrize("name", LANGUAGE_MODELS)
def test_zoo_table_validation_loss_and_icl_are_the_cards(name):
    """Issue 40: the README's zoo table quotes each language model's card numbers as re-measured on the pinned
    corpus (validation loss, unigram baseline, ICL score), and the card prints the same."""
    js = measured(name)
    row = next(r for r in README.splitlines() if r.startswith(f"| [`{name}`]"))
    assert f"| {js['final_val_loss']:.3f} ({js['unigram_val_loss']:.3f}) |" in row
    assert f"final validation loss: **{js['final_val_loss']:.4f}**" in card_line(name, "- final validation loss")
    assert f"**{js['icl_score']:+.3f}** nats" in card_line(name, "- in-context-learning score")
    icl = _minus(format(js["icl_score"], ".2f"))
    if name == "attn-only-2l":
        assert f"ICL score **{icl}** nats" in row
        assert f"the card's\n{icl} is the checkpoint evaluation's" in README
    if name == "gelu-2l":
        assert f"ICL {icl} |" in row


def test_readme_icl_scores_are_reproductions():
    """The README's 2L ICL numbers (clean and with L1H1, L1H2 ablated; at step 1500) are REPRODUCTION.md's."""
    row = next(r for r in REPRO.splitlines() if r.startswith("| 2L: pattern-preserving ablation"))
    m = re.search(rf"ICL score ({NUM}) ± ({NUM}) clean → ({NUM}) ± ({NUM}) with L1H1, L1H2 ablated", row)
    clean, se, abl, se_abl = (float(x) for x in m.groups())
    text = " ".join(README.split())
    assert _minus(f"takes the ICL score from {clean:.2f} ± {se:.2f} to {abl:.2f} ± {se_abl:.2f}") in text
    assert _minus(f"scaled): {clean:.2f} ± {se:.2f} (one standard error) over 1024 windows") in text
    row = next(r for r in REPRO.splitlines() if r.startswith("| 2L: ICL score (loss at token 125"))
    m = re.search(rf"({NUM}) ± ({NUM}) at step 1500", row)
    assert _minus(f"against {float(m.group(1)):.2f} ± {float(m.group(2)):.2f} at step 1500") in text
    card = measured("attn-only-2l")["icl_score"]
    assert _minus(f"disagree by {abs(clean - card):.2f} nats") in text


@pytest.mark.e2e
def test_readme_heads_example_is_a_fresh_run():
    """README's `circuits heads attn-only-2l` block is what the command prints today (on the pinned corpus)."""
    import contextlib
    import io

    from analyses import cli

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert cli.main(["heads", "attn-only-2l", "--no-progress"]) == 0
    block = README.split("$ circuits heads attn-only-2l\n", 1)[1].split("```", 1)[0]
    assert buf.getvalue().strip() == block.strip()


ZOO_SAES = [("gelu-2l", "blocks.1.hook_mlp_out"), ("attn-only-2l", "blocks.1.attn.hook_z")]


def sae_measured(model: str, hook: str) -> dict:
    """measured.json of a shipped SAE: the numbers of `circuits sae report` on it, the command that gave them
    (tests/models/test_zoo_saes.py re-runs it in the ecosystem tier)."""
    return json.loads((ZOO_DIR / model / "saes" / hook / "measured.json").read_text())


def test_sae_section_quotes_the_shipped_saes_measured_json():
    """README's SAE section: each shipped SAE's row is its measured.json at the precision printed, the command shown
    is the one that measured it, and no other decimal number stands in the section's prose (the numbers once quoted
    there came from another machine's text and did not reproduce)."""
    start = README.index("### Sparse autoencoders on the zoo (SAELens)")
    section = README[start:README.index("\n## ", start)]
    prose = " ".join(re.sub(r"```.*?```", "", section, flags=re.S).split())  # lines joined
    allowed = set()
    for model, hook in ZOO_SAES:
        m, lo = sae_measured(model, hook), sae_measured(model, hook)["losses"]
        cells = [f"{m['fvu']:.3f}", f"{m['l0']:.1f}", f"{lo['clean']:.3f}", f"{lo['spliced']:.3f}",
                 f"{lo['zero_ablated']:.3f}", f"{100 * lo['recovered']:.1f}"]
        row = (f"| {model} `{hook}` | {cells[0]} | {cells[1]} | {m['dead']} of {m['d_sae']} | {cells[2]} / {cells[3]} "
               f"/ {cells[4]} | {cells[5]} % |")
        assert row in section.splitlines(), row
        folder = f"models/zoo/{model}/saes/{hook}"
        assert m["command"] == f"circuits sae report {model} {folder} --out DIR --windows 128 --json"
        assert m["windows"] == 128 and f"{m['windows']} validation windows, {m['tokens']:,} token positions" in prose
        allowed |= set(cells)
    assert "circuits sae report MODEL models/zoo/MODEL/saes/HOOK --out DIR --windows 128" in prose
    stray = [x for x in re.findall(r"(?<![\w.])\d+\.\d+(?![\w.])", prose) if x not in allowed]
    assert stray == [], stray


def test_notebook_07_shows_the_shipped_saes_numbers():
    """Notebook 07 measures the shipped SAEs on their cards' windows: its committed summary lines are measured.json's
    numbers."""
    nb = json.loads((ROOT / "notebooks" / "07_sparse_autoencoders.ipynb").read_text())
    printed = "".join("".join(o.get("text", "")) for c in nb["cells"] if c["cell_type"] == "code"
                      for o in c.get("outputs", []))
    for model, hook in ZOO_SAES:
        m = sae_measured(model, hook)
        lo = m["losses"]
        line = (f"{model} {hook}: d_sae {m['d_sae']}, FVU {m['fvu']:.3f}, L0 {m['l0']:.1f}, dead {m['dead']}, "
                f"loss clean {lo['clean']:.3f} / spliced {lo['spliced']:.3f} / zero-ablated {lo['zero_ablated']:.3f} "
                f"(recovered {lo['recovered']:.1%})")
        assert line in printed, line

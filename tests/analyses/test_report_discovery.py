"""The report's circuit-discovery sections (`analyses.report.discovery_section`): their numbers against the library
computed another way (plain forward passes and `run_subgraph`), and the hand-found structure they check."""

from __future__ import annotations

import pytest
import torch

import models
from analyses.discovery import discovery_task, run_subgraph, single_edge_effects
from analyses.discovery.faithfulness import normalized_recovery
from analyses.discovery.patching import EdgePatcher
from analyses.discovery.tasks import DiscoveryTask
from analyses.patching.metrics import next_token_answers
from analyses.patching.report_section import induction_probe
from analyses.report import build_report
from analyses.report.discovery_section import ranked_circuit


@pytest.fixture(scope="module")
def aol2():
    return models.load("attn-only-2l").eval()


def test_the_faithfulness_points_are_the_subgraphs_own_metric(aol2):
    """Each k's faithfulness is the top-k subgraph's loss (`run_subgraph`) normalised between the plain clean and
    corrupted forward passes; the circuit is the fewest listed top-k edges reaching the target."""
    clean, corrupt, _, n = induction_probe(aol2, None, 0, batch=4, period=12)
    task = DiscoveryTask("induction", clean, corrupt, next_token_answers(clean, range(n + 1, 2 * n)), "loss")
    r = ranked_circuit(aol2, task, None, "attn-only-2l", ks=(3, 6, 12))
    with torch.no_grad():
        full, empty = float(task.value(aol2(clean))), float(task.value(aol2(corrupt)))
    ranked = r.ranked()
    for k, f, fc in zip(r.curve["k"], r.curve["circuit_faithfulness"], r.curve["complement_faithfulness"]):
        alone = float(task.value(run_subgraph(aol2, clean, corrupt, ranked[:k])))
        rest = float(task.value(run_subgraph(aol2, clean, corrupt, ranked[k:])))
        assert f == pytest.approx(normalized_recovery(alone, full, empty), abs=1e-4)
        assert fc == pytest.approx(normalized_recovery(rest, full, empty), abs=1e-4)
    reach = [k for k, f in zip(r.curve["k"], r.curve["circuit_faithfulness"]) if f >= 0.9]
    assert r.circuit == ranked[:reach[0] if reach else len(r.edges)]


def test_query_edges_carry_exactly_nothing_in_the_one_layer_skip_trigram_task():
    """The one-layer section's check, by exact patching: the last token is the same in both prompts, so no edge into
    a query changes the last position's logits."""
    m = models.load("attn-only-1l").eval()
    task = discovery_task(m, "skip-trigram", n_prompts=6, seq_len=10)
    p = EdgePatcher(m, task.clean, task.corrupt)
    effects = single_edge_effects(p, task)
    q = torch.tensor([r.endswith(".q") for _, r in p.graph.edges])
    assert effects[q].abs().max() == 0 and effects[~q].abs().max() > 0.1


@pytest.mark.parametrize("name, sections, lines", [
    ("attn-only-2l", ["discovery"], ["previous-token head → induction head K 2/2: yes",
                                     "token embedding → induction head V 2/2: yes",
                                     "induction head → logits 2/2: yes"]),
    ("enc-dec-reverse", ["alignment", "encdec_discovery"], ["head → logits 2/2: yes",
                                                            "values from the encoder 2/2: yes"]),
    ("enc-dec-sort", ["alignment", "encdec_discovery"], ["head → logits 2/2: yes", "values from the encoder 2/2: yes",
                                                         "keys from the encoder 2/2"]),
])
def test_the_section_finds_the_hand_found_structure(tmp_path, name, sections, lines):
    rep = build_report(models.load(name), tmp_path / "r", sections=sections, progress=False, parallel=False)
    assert not rep.failed
    text = (tmp_path / "r" / "report.md").read_text()
    for line in lines:
        assert line in text
    assert (tmp_path / "r" / "discovery_circuit.png").is_file()

"""EAP, EAP-IG and ACDC against independent references (autograd through hand-written hooks, a literal sequential
ACDC loop, path patching), and against the induction circuit found by hand in attn-only-2l."""

from __future__ import annotations

import pytest
import torch

import models
from analyses.discovery import (
    EdgePatcher,
    acdc,
    discover,
    discovery_task,
    edge_scores,
    kl_divergence,
    single_edge_effects,
    user_task,
)
from analyses.discovery.patching import split_inputs
from analyses.patching import PatchingError, path_patching

#: the induction circuit of attn-only-2l found by hand (README, report: L0H1 previous-token head, L1H1 and L1H2
#: induction heads): the token embedding into the previous-token head's values, its output into the induction heads'
#: keys, the token embedding into their values, and their outputs into the logits
KNOWN = [("embed", "L0H1.v"), ("L0H1", "L1H1.k"), ("L0H1", "L1H2.k"), ("embed", "L1H1.v"), ("embed", "L1H2.v"),
         ("L1H1", "logits"), ("L1H2", "logits")]


@pytest.fixture(scope="module")
def aol2():
    return models.load("attn-only-2l").eval()


@pytest.fixture(scope="module")
def aol2_64():
    return models.load("attn-only-2l").to(torch.float64).eval()


def _hook_of(receiver, L):
    if receiver == "logits":
        return f"blocks.{L - 1}.hook_resid_post", None
    head, comp = receiver.split(".")
    l, h = (int(x) for x in head[1:].split("H"))
    return f"blocks.{l}.hook_{comp}_input", h


def _directional_derivative(m, task, edge, alpha=None):
    """d/dε of the task metric when the receiver's input gets ε·(ablated − clean output of the sender), at ε = 0,
    by autograd through one plain hook (and, with `alpha`, the token embedding interpolated between the corrupted
    and the clean one)."""
    with split_inputs(m):
        _, cc = m.run_with_cache(task.clean)
        _, cx = m.run_with_cache(task.corrupt)
    s, r = edge
    out = (lambda c: c["hook_embed"]) if s == "embed" else \
        (lambda c: c[f"blocks.{s[1]}.attn.hook_result"][:, :, int(s[3:])])
    diff = out(cx) - out(cc)
    name, head = _hook_of(r, m.cfg.n_layers)
    eps = torch.zeros((), dtype=torch.float64, requires_grad=True)

    def receiver(x, hook):
        add = eps * diff
        if head is None:
            return x + add
        return torch.cat([x[:, :, :head], (x[:, :, head] + add)[:, :, None], x[:, :, head + 1:]], 2)

    hooks = [(name, receiver)]
    if alpha is not None:
        hooks.append(("hook_embed", lambda x, hook: cx["hook_embed"] + alpha * (x - cx["hook_embed"])))
    with split_inputs(m):
        value = task.value(m.run_with_hooks(task.clean, fwd_hooks=hooks))
    return float(torch.autograd.grad(value, eps)[0])


def test_eap_score_is_the_directional_derivative_of_the_metric(aol2_64):
    task = discovery_task(aol2_64, "induction", n_prompts=3, seq_len=8)
    p = EdgePatcher(aol2_64, task.clean, task.corrupt)
    scores = edge_scores(p, task)
    assert (p.forwards, p.backwards) == (3, 1)
    for e in [("embed", "L0H1.v"), ("L0H1", "L1H1.k"), ("embed", "L1H2.q"), ("L1H2", "logits")]:
        assert float(scores[p.graph.index(e)]) == pytest.approx(_directional_derivative(aol2_64, task, e), abs=1e-9)


def test_eap_ig_averages_the_derivative_over_the_interpolation_points(aol2_64):
    task = discovery_task(aol2_64, "induction", n_prompts=3, seq_len=8)
    p = EdgePatcher(aol2_64, task.clean, task.corrupt)
    scores = edge_scores(p, task, steps=3)
    for e in [("embed", "L0H1.v"), ("L0H1", "L1H1.k")]:
        ref = sum(_directional_derivative(aol2_64, task, e, a) for a in (1 / 3, 2 / 3, 1.0)) / 3
        assert float(scores[p.graph.index(e)]) == pytest.approx(ref, abs=1e-9)
    # one point, at the clean input: EAP itself
    torch.testing.assert_close(edge_scores(p, task, steps=1), edge_scores(p, task), atol=1e-12, rtol=0)


def _sequential_acdc(patcher, task, tau):
    """ACDC as Conmy et al.'s Algorithm 1 reads, one forward pass per tried edge, no batching, no node pruning."""
    n = len(patcher.graph)
    clean_lp = task.answers.log_probs(patcher.run(torch.zeros(1, n, dtype=torch.bool))[0])

    def d(removed):
        return float(kl_divergence(clean_lp.double(), task.answers.log_probs(patcher.run(removed)[0]).double()))

    removed = torch.zeros(n, dtype=torch.bool)
    now = d(removed)
    for r in sorted(patcher.graph.receivers, key=lambda r: r.stage)[::-1]:
        for i in patcher.graph.incoming(r.name)[::-1]:
            trial = removed.clone()
            trial[i] = True
            new = d(trial)
            if new - now < tau:
                removed, now = trial, new
    return ~removed


def test_batched_acdc_keeps_what_the_sequential_algorithm_keeps():
    """Node pruning (inputs of a head that no longer reaches the logits) only skips edges whose removal cannot
    change the output, so on a model where it fires the kept sets agree; attn-only-1l, 4 prompts."""
    m = models.load("attn-only-1l").to(torch.float64).eval()
    task = discovery_task(m, "skip-trigram", n_prompts=4, seq_len=8)
    p = EdgePatcher(m, task.clean, task.corrupt)
    tau = 0.02
    kept_batched, _ = acdc(p, task, tau, batch=16)
    kept_seq = _sequential_acdc(EdgePatcher(m, task.clean, task.corrupt), task, tau)
    assert kept_batched.any() and not kept_batched.all()
    # the sequential loop may keep inputs of a head whose outputs it removed; they change nothing
    alive = {s for s, _ in (p.graph.edges[i] for i in kept_seq.nonzero().reshape(-1).tolist())}
    seq = {p.graph.edges[i] for i in kept_seq.nonzero().reshape(-1).tolist()}
    seq = {(s, r) for s, r in seq if r == "logits" or r.split(".")[0] in alive}
    assert {p.graph.edges[i] for i in kept_batched.nonzero().reshape(-1).tolist()} == seq


def test_removing_the_k_edges_is_path_patching_through_k(aol2_64):
    """Removing L0H1 → L1H1.k and L0H1 → L1H2.k is path patching (noising) from L0H1 to the induction heads' keys,
    an independent implementation (analyses.patching.paths): same prompts, same loss, to 1e-9."""
    task = discovery_task(aol2_64, "induction", n_prompts=4, seq_len=10)
    p = EdgePatcher(aol2_64, task.clean, task.corrupt)
    edges = [("L0H1", "L1H1.k"), ("L0H1", "L1H2.k")]
    got = task.value(p.run(p.mask(edges))[0])
    from analyses.patching import metric
    pp = path_patching(aol2_64, task.clean, task.corrupt, metric("loss", task.answers), ["L0H1"], ["L1H1", "L1H2"],
                       "k")
    assert float(got) == pytest.approx(float(pp.per_prompt.mean()), abs=1e-9)


@pytest.mark.parametrize("method", ["eap", "eap-ig", "acdc"])
def test_each_method_finds_the_hand_found_induction_circuit(aol2, method):
    task = discovery_task(aol2, "induction", n_prompts=8)
    r = discover(aol2, task, method)
    missing = [e for e in KNOWN if e not in r.circuit]
    assert not missing, f"{method} misses {missing}"
    assert r.faithfulness > 0.85  # the circuit alone recovers the behaviour
    assert r.complement < 0.1  # the graph without it loses it
    assert r.passes["backward"] == (0 if method == "acdc" else 1)
    if method != "acdc":
        assert r.passes["forward"] == 3


def test_corrupting_the_second_copy_shows_the_induction_heads_queries(aol2):
    """With the second copy resampled the queries change, and the token embedding → induction-head query edges
    rank among the strongest (EAP)."""
    task = discovery_task(aol2, "induction", n_prompts=8, corrupt="second")
    p = EdgePatcher(aol2, task.clean, task.corrupt)
    scores = edge_scores(p, task)
    top = [p.graph.edges[i] for i in scores.abs().argsort(descending=True)[:6].tolist()]
    assert {("embed", "L1H1.q"), ("embed", "L1H2.q")} & set(top)


def test_eap_agrees_with_exact_single_edge_patching_on_the_top_edges(aol2):
    task = discovery_task(aol2, "induction", n_prompts=8)
    p = EdgePatcher(aol2, task.clean, task.corrupt)
    est, exact = edge_scores(p, task), single_edge_effects(p, task)
    top = lambda v: set(v.abs().argsort(descending=True)[:6].tolist())
    assert len(top(est) & top(exact)) >= 4
    assert float(torch.corrcoef(torch.stack([est, exact]))[0, 1]) > 0.8


def test_user_task_and_bad_input(aol2):
    clean = [[0, 5, 6, 7, 5, 6], [0, 9, 10, 11, 9, 10]]
    corrupt = [[0, 8, 12, 7, 5, 6], [0, 13, 14, 11, 9, 10]]
    t = user_task(aol2, clean, corrupt, answer=[7, 11], wrong=[8, 13])
    assert t.metric == "logit_diff" and t.answers.positions.tolist() == [[-1], [-1]]
    with pytest.raises(PatchingError, match="same number of prompts"):
        user_task(aol2, clean, corrupt[:1], answer=7)
    with pytest.raises(PatchingError, match="at least one"):
        user_task(aol2, [], [], answer=7)
    with pytest.raises(PatchingError, match="same number of tokens"):
        user_task(aol2, clean, [c[:4] for c in corrupt], answer=7)
    with pytest.raises(PatchingError, match="unknown task"):
        discover(aol2, "greater-than")
    for bad in (-0.1, float("nan"), float("inf"), True):
        with pytest.raises(PatchingError, match="threshold"):
            discover(aol2, t, "acdc", threshold=bad)
    with pytest.raises(PatchingError, match="unknown method"):
        discover(aol2, t, "sp")
    with pytest.raises(PatchingError, match="decoder input"):  # a decoder-only task: no target for the decoder
        discover(models.load("enc-dec-reverse"), t)


def test_the_readme_number_removing_the_k_edges_on_the_reports_probe(aol2):
    """README (notebook 08's row): removing L0H1 → L1H1.k and L0H1 → L1H2.k on the report's path-patching probe
    loses 0.889 of the loss increase, the report's path-patching share."""
    from analyses.patching.report_section import induction_probe
    from models.data.corpora import build_token_corpus

    seen = torch.from_numpy(build_token_corpus("stdlib", aol2.tokenizer).seen_ids())
    clean, corrupt, loss, _ = induction_probe(aol2, seen, 0)
    p = EdgePatcher(aol2, clean, corrupt)
    v = [float(loss(x).mean()) for x in p.run(torch.stack([p.mask([]), p.mask([("L0H1", "L1H1.k"),
                                                                                ("L0H1", "L1H2.k")]),
                                                          ~p.mask([])]))]
    assert round((v[1] - v[0]) / (v[2] - v[0]), 3) == 0.889


def test_shipped_tasks_hold_what_their_docstrings_say(aol2):
    ind = discovery_task(aol2, "induction", n_prompts=5, seq_len=7)
    assert torch.equal(ind.clean[:, 1:8], ind.clean[:, 8:]) and torch.equal(ind.corrupt[:, 8:], ind.clean[:, 8:])
    assert not torch.equal(ind.corrupt[:, 1:8], ind.clean[:, 1:8])
    assert torch.equal(ind.answers.correct, ind.clean[:, 9:15])  # the token after each second-copy position
    second = discovery_task(aol2, "induction", n_prompts=5, seq_len=7, corrupt="second")
    assert torch.equal(second.corrupt[:, :8], second.clean[:, :8])
    assert (second.corrupt[:, 8:] != second.clean[:, 8:]).any()
    prev = discovery_task(aol2, "previous-token", n_prompts=5, seq_len=7)
    assert torch.equal(prev.corrupt[:, 1:8].sort(1).values, prev.clean[:, 1:8].sort(1).values)  # same tokens
    assert torch.equal(prev.corrupt[:, 8:], prev.clean[:, 8:])
    one = models.load("attn-only-1l").eval()
    tri = discovery_task(one, "skip-trigram", n_prompts=5, seq_len=6)
    assert torch.equal(tri.clean[:, -1], tri.corrupt[:, -1]) and tri.metric == "logit_diff"
    with torch.no_grad():
        assert torch.equal(one(tri.clean)[:, -1].argmax(-1), tri.answers.correct[:, 0])
        assert torch.equal(one(tri.corrupt)[:, -1].argmax(-1), tri.answers.wrong[:, 0])
    with pytest.raises(PatchingError, match="n_ctx"):
        discovery_task(aol2, "induction", seq_len=100)
    pool = torch.arange(40, 80)
    few = discovery_task(aol2, "induction", n_prompts=3, seq_len=7, tokens_from=pool)
    assert torch.isin(torch.cat([few.clean[:, 1:], few.corrupt[:, 1:]]), pool).all()

"""Circuit discovery, ours (`analyses.discovery.discover`) against AutoCircuit 1.0.1 (Miller et al.; `auto-circuit` on
the package index), on the same weights, the same prompts and the same metric.

    python benchmarks/discovery_vs_autocircuit.py [--python ACVENV/bin/python] [--json OUT.json]
        [--model models/zoo/attn-only-2l] [--n-prompts 20] [--seed 0] [--corrupt first] [--steps 5] [--tau 0.01]
        [--threads 1] [--side-json AUTOCIRCUIT_RESULT.json]

AutoCircuit needs TransformerLens' `HookedTransformer`, which TransformerLens 4.x (this toolkit's) no longer has, so it
runs in its own virtual environment (`benchmarks/make_autocircuit_venv.sh` builds it; `--python` or
`$AUTOCIRCUIT_PYTHON` names its interpreter, default `.venv-autocircuit/bin/python`) through
`benchmarks/autocircuit_side.py`, which loads the zoo folder's config.json + model.safetensors into TransformerLens
2.18 and exchanges JSON with this script (offline; no pickles).

The task is ours (`analyses.discovery.discovery_task(model, "induction")`: clean `[BOS] + R + R`, the corrupted
prompts and the answers of that task, the induction loss); its tokens are sent to AutoCircuit as they are. Compared:

- the weights: AutoCircuit's TransformerLens 2.18 logits on the clean prompts against ours (max |Δ|);
- edge scores: EAP, EAP-IG, exact edge patching (every edge patched alone) by both implementations; Spearman rank
  correlation over the edges both graphs have, top-k overlap |A ∩ B| / k for k in --ks, largest |Δ score|;
- ACDC: the circuits both find at the same τ (KL distance), their overlap and faithfulness; AutoCircuit's ACDC twice,
  in its own visiting order (within a layer a Python set's: a different one in every process) and in ours;
- faithfulness of each top-k (the circuit alone, every other edge corrupted, normalised to 0 = corrupted run,
  1 = clean run), each edge set measured by both implementations (a check of the patching itself);
- time: CPU seconds per method (ours in this process; AutoCircuit's in its own).

`--side-json PATH` keeps AutoCircuit's result file (or reads it back when it exists, to redo the comparison alone).

Not a test: no number here is asserted; it needs AutoCircuit's venv, which the project does not install.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
SIDE = Path(__file__).resolve().parent / "autocircuit_side.py"
# benchmarks/circuits.py would shadow the `circuits` package: drop the script's folder; the repository comes after
# $PYTHONPATH, so a checkout named there wins
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != SIDE.parent] + [str(ROOT)]
DEFAULT_PYTHON = os.environ.get("AUTOCIRCUIT_PYTHON", ".venv-autocircuit/bin/python")


def ranks(values: list[float]) -> list[float]:
    """Ranks 1…n of `values`, ties sharing their average rank (what Spearman's ρ correlates)."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    r = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for t in range(i, j + 1):
            r[order[t]] = (i + j) / 2 + 1
        i = j + 1
    return r


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's rank correlation: Pearson's correlation of the average ranks (Spearman 1904)."""
    ra, rb = torch.tensor(ranks(a), dtype=torch.float64), torch.tensor(ranks(b), dtype=torch.float64)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = float(ra.norm() * rb.norm())
    return float(ra @ rb) / den if den > 0 else float("nan")


def top(scores: dict[str, float], k: int) -> list[str]:
    """The k edges of largest |score| (ties by name, as the side script breaks them)."""
    return sorted(scores, key=lambda e: (-abs(scores[e]), e))[:k]


def edge_key(e) -> str:
    return f"{e[0]}->{e[1]}"


def run_ours(model, task, steps: int, tau: float) -> dict:
    """Our three methods through `discover` (scores, circuits), each method's own work timed apart from the
    faithfulness curve `discover` also draws (EdgePatcher + edge_scores / acdc, as AutoCircuit's side times its
    prune-score functions), exact single-edge patching, and a faithfulness function for any edge set."""
    from analyses.discovery import acdc, discover, edge_scores
    from analyses.discovery.faithfulness import set_values
    from analyses.discovery.patching import EdgePatcher

    out = {"scores": {}, "seconds": {}, "passes": {}, "circuit": {}, "faithfulness": {}}
    for method, kw in (("eap", {}), ("eap-ig", {"steps": steps}), ("acdc", {"threshold": tau, "metric": "kl"})):
        r = discover(model, task, method=method, **kw)
        out["scores"][method] = {edge_key(e): s for e, s in r.scores.items()}
        out["passes"][method] = r.passes
        out["circuit"][method] = [edge_key(e) for e in r.circuit]
        out["faithfulness"][method] = r.faithfulness
        c = time.process_time()
        patcher = EdgePatcher(model, task.clean, task.corrupt)
        if method == "acdc":
            acdc(patcher, task, tau, "kl")
        else:
            edge_scores(patcher, task, kw.get("steps"))
        out["seconds"][method] = time.process_time() - c
    patcher = EdgePatcher(model, task.clean, task.corrupt)
    n = len(patcher.graph)
    c = time.process_time()
    vals = set_values(patcher, task, torch.cat([torch.zeros(1, n, dtype=torch.bool), torch.eye(n, dtype=torch.bool)]))
    out["seconds"]["exact"] = time.process_time() - c
    out["scores"]["exact"] = {edge_key(e): float(vals[1 + i] - vals[0]) for i, e in enumerate(patcher.graph.edges)}
    ends = set_values(patcher, task, torch.tensor([[False] * n, [True] * n]))
    full, empty = float(ends[0]), float(ends[1])
    out["ends"] = {"full": full, "empty": empty}

    def faith(edges: list[str]) -> float:
        kept = torch.zeros(n, dtype=torch.bool)
        for e in edges:
            kept[patcher.graph.index(tuple(e.split("->")))] = True
        v = set_values(patcher, task, (~kept)[None])
        return (float(v[0]) - empty) / (full - empty)

    out["faith"] = faith
    return out


def acdc_visit_order(model) -> list[str]:
    """The order in which our ACDC tries the edges (`analyses.discovery.acdc`: receivers from the logits back, each
    receiver's incoming edges latest sender first), for AutoCircuit's ACDC to visit them in the same order."""
    from circuits.graph import edge_graph

    g = edge_graph(model)
    order = []
    for r in sorted(g.receivers, key=lambda r: r.stage)[::-1]:
        order += [edge_key(g.edges[i]) for i in g.incoming(r.name)[::-1]]
    return order


def run_autocircuit(python: str, model_dir: Path, task, steps: int, tau: float, ks: list[int], circuits: dict,
                    threads: int, acdc_order: list[str]) -> dict:
    pos = task.answers.positions
    if not bool((pos == pos[:1]).all()):
        raise SystemExit("the task's answer positions differ between prompts; AutoCircuit slices one window")
    req = {"model_dir": str(model_dir), "clean": task.clean.tolist(), "corrupt": task.corrupt.tolist(),
           "answer_positions": pos[0].tolist(), "answers": task.answers.correct.tolist(), "ig_samples": steps,
           "acdc_tau": tau, "ks": ks, "circuits": circuits, "threads": threads, "acdc_order": acdc_order}
    with tempfile.TemporaryDirectory() as d:
        rq, rs = Path(d) / "request.json", Path(d) / "result.json"
        rq.write_text(json.dumps(req))
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
        env.pop("PYTHONPATH", None)
        p = subprocess.run([python, str(SIDE), str(rq), str(rs)], env=env, capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit(f"autocircuit_side.py failed ({p.returncode}):\n{p.stderr[-3000:]}")
        return json.loads(rs.read_text())


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", default=DEFAULT_PYTHON, help="AutoCircuit's venv interpreter")
    ap.add_argument("--model", default=str(ROOT / "models" / "zoo" / "attn-only-2l"))
    ap.add_argument("--n-prompts", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--corrupt", default="first", choices=("first", "second", "both"),
                    help="which copy of R the corrupted prompts resample (the induction task's `corrupt`)")
    ap.add_argument("--steps", type=int, default=5, help="EAP-IG steps (ours) = integrated_grad_samples (theirs)")
    ap.add_argument("--tau", type=float, default=0.01, help="ACDC's τ (KL), both implementations")
    ap.add_argument("--ks", default="5,10,20")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", help="write the full comparison here")
    ap.add_argument("--side-json", help="AutoCircuit's result file: read it if it exists (same settings assumed), "
                                        "else run AutoCircuit and keep its result there")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    ks = [int(k) for k in a.ks.split(",")]

    import models
    from analyses.discovery import discovery_task

    model_dir = Path(a.model).resolve()
    model = models.load(model_dir)
    task = discovery_task(model, "induction", n_prompts=a.n_prompts, seed=a.seed, corrupt=a.corrupt)
    ours = run_ours(model, task, a.steps, a.tau)
    faith = ours.pop("faith")
    our_topk = {f"ours:{m}:top{k}": top(ours["scores"][m], k) for m in ("eap", "eap-ig", "exact") for k in ks}
    our_topk["ours:acdc:circuit"] = ours["circuit"]["acdc"]
    if a.side_json and Path(a.side_json).exists():
        theirs = json.loads(Path(a.side_json).read_text())
    else:
        theirs = run_autocircuit(a.python, model_dir, task, a.steps, a.tau, ks, our_topk, a.threads,
                                 acdc_visit_order(model))
        if a.side_json:
            Path(a.side_json).write_text(json.dumps(theirs))

    with torch.no_grad():
        lg = model(task.clean[: len(theirs["clean_logits_head"])])
    logit_diff = float((lg - torch.tensor(theirs["clean_logits_head"])).abs().max())
    shared = sorted(set(theirs["edges"]))
    only_ours = sorted(set(ours["scores"]["eap"]) - set(shared))
    only_ours_max = {m: max((abs(ours["scores"][m][e]) for e in only_ours), default=0.0) for m in ours["scores"]}

    comparisons = {}
    pairs = [("eap", "eap"), ("eap-ig", "eap-ig"), ("exact", "exact"), ("eap", "exact"), ("eap-ig", "exact")]
    for mine, their in pairs + [("autocircuit:eap-ig", "exact")]:
        mine_scores = theirs["scores"]["eap-ig"] if mine.startswith("autocircuit:") else ours["scores"][mine]
        s_o = {e: mine_scores[e] for e in shared}
        s_t = {e: theirs["scores"][their][e] for e in shared}
        row = {"spearman": spearman([s_o[e] for e in shared], [s_t[e] for e in shared]),
               "spearman_abs": spearman([abs(s_o[e]) for e in shared], [abs(s_t[e]) for e in shared]),
               "max_abs_diff": max(abs(s_o[e] - s_t[e]) for e in shared),
               "max_abs_score": max(abs(s_t[e]) for e in shared)}
        for k in ks:
            row[f"top{k}_overlap"] = len(set(top(s_o, k)) & set(top(s_t, k))) / k
        comparisons[f"{mine if ':' in mine else 'ours:' + mine} vs autocircuit:{their}"] = row

    faithfulness = {}
    for m in ("eap", "eap-ig", "exact"):
        for k in ks:
            t_edges = theirs["top_k"][m][str(k)]
            faithfulness[f"{m} top{k}"] = {
                "ours_edges": {"ours": faith(our_topk[f"ours:{m}:top{k}"]),
                               "autocircuit": theirs["circuit_faithfulness"][f"ours:{m}:top{k}"]},
                "autocircuit_edges": {"ours": faith(t_edges), "autocircuit": theirs["faithfulness"][m][str(k)]}}
    a_ours = set(ours["circuit"]["acdc"])
    acdc = {"tau": a.tau, "ours_edges": len(a_ours), "ours_faithfulness": {
        "ours": ours["faithfulness"]["acdc"], "autocircuit": theirs["circuit_faithfulness"]["ours:acdc:circuit"]}}
    # AutoCircuit's own visiting order (a Python set's, different in every process) and ours
    for name, key in (("autocircuit_order", "acdc"), ("our_order", "acdc_our_order")):
        a_theirs = set(theirs[f"{key}_circuit"])
        acdc[name] = {"autocircuit_edges": len(a_theirs), "both": len(a_ours & a_theirs),
                      "jaccard": len(a_ours & a_theirs) / max(1, len(a_ours | a_theirs)),
                      "only_ours": sorted(a_ours - a_theirs), "only_autocircuit": sorted(a_theirs - a_ours),
                      "faithfulness": {"ours": faith(sorted(a_theirs)),
                                       "autocircuit": theirs["faithfulness"][key]["circuit"]}}
    pairs_measured = [v[side] for v in faithfulness.values() for side in ("ours_edges", "autocircuit_edges")]
    pairs_measured += [acdc["ours_faithfulness"]]
    pairs_measured += [acdc[n]["faithfulness"] for n in ("autocircuit_order", "our_order")]
    faith_gap = max(abs(p["ours"] - p["autocircuit"]) for p in pairs_measured)
    result = {
        "model": model_dir.name, "task": task.to_json() | {"corrupt": a.corrupt}, "cpu": cpu_name(),
        "threads": a.threads,
        "versions": {"ours_torch": torch.__version__, **{f"autocircuit_venv_{k}": v
                                                          for k, v in theirs["versions"].items()}},
        "max_abs_logit_diff": logit_diff,
        "edges": {"ours": len(ours["scores"]["eap"]), "autocircuit": theirs["n_edges"], "shared": len(shared),
                  "only_ours": only_ours, "only_ours_max_abs_score": only_ours_max},
        "loss": {"ours": ours["ends"], "autocircuit": {"clean": theirs["clean_loss"], "corrupt": theirs["corrupt_loss"],
                                                       **theirs["faithfulness_ends"]}},
        # completeness: IG over a path from clean to corrupted sums to the total effect m(∅) − m(G)
        "total_effect": ours["ends"]["empty"] - ours["ends"]["full"],
        "score_sums": {f"{side}:{m}": {"all": sum(v for v in sc.values() if v is not None),
                                        "into_logits": sum(v for e, v in sc.items() if e.endswith("->logits"))}
                       for side, d in (("ours", ours["scores"]), ("autocircuit", theirs["scores"]))
                       for m, sc in d.items() if not m.startswith("acdc")},
        "comparisons": comparisons, "faithfulness": faithfulness, "acdc": acdc,
        # the same edge set's faithfulness by our EdgePatcher and by AutoCircuit's run_circuits, largest gap
        "faithfulness_max_abs_diff_between_implementations": faith_gap,
        "seconds_cpu": {"ours": ours["seconds"], "autocircuit": {m: v["cpu"] for m, v in theirs["seconds"].items()}},
        "passes_ours": ours["passes"],
        "top5": {f"ours:{m}": top(ours["scores"][m], 5) for m in ("eap", "eap-ig", "exact")}
        | {f"autocircuit:{m}": theirs["top_k"][m]["5"] for m in ("eap", "eap-ig", "exact")},
        "scores": {"ours": ours["scores"], "autocircuit": theirs["scores"]},
    }
    report(result, ks)
    if a.json:
        from models.files.atomic import atomic_write_json

        atomic_write_json(a.json, result)
    return result


def report(r: dict, ks: list[int]) -> None:
    f = "{:.3g}".format
    print(f"model {r['model']}, task {r['task']}, CPU {r['cpu']}, {r['threads']} thread(s)")
    print(f"versions: {r['versions']}")
    print(f"max |logit difference| ours vs TransformerLens 2.18 (AutoCircuit's venv): {r['max_abs_logit_diff']:.2e}")
    e = r["edges"]
    print(f"edges: ours {e['ours']}, AutoCircuit {e['autocircuit']}, shared {e['shared']}; only ours: "
          f"{len(e['only_ours'])} (largest |score| there: {e['only_ours_max_abs_score']})")
    print(f"loss: ours {r['loss']['ours']}, AutoCircuit {r['loss']['autocircuit']}")
    print("\nscores (shared edges)      spearman  |s| spearman  max|Δ|    max|s|  " + "  ".join(f"top{k}" for k in ks))
    for name, row in r["comparisons"].items():
        print(f"{name:27s} {row['spearman']:8.4f}  {row['spearman_abs']:11.4f}  {row['max_abs_diff']:8.2e} "
              f"{row['max_abs_score']:8.3g}  " + "  ".join(f"{row[f'top{k}_overlap']:.2f}" for k in ks))
    print(f"\ntotal effect m(corrupted) − m(clean) = {r['total_effect']:.4f}; sums of scores "
          "(all edges / into logits):")
    for k, v in r["score_sums"].items():
        print(f"  {k:20s} {v['all']:8.4f} / {v['into_logits']:8.4f}")
    print(f"\nfaithfulness (measured by ours / by AutoCircuit; largest gap between the two measurements of one edge "
          f"set {r['faithfulness_max_abs_diff_between_implementations']:.1e})")
    for name, v in r["faithfulness"].items():
        print(f"  {name:13s} our edges {f(v['ours_edges']['ours'])} / {f(v['ours_edges']['autocircuit'])}   "
              f"AutoCircuit's edges {f(v['autocircuit_edges']['ours'])} / {f(v['autocircuit_edges']['autocircuit'])}")
    c = r["acdc"]
    print(f"\nACDC τ={c['tau']} (KL): ours {c['ours_edges']} edges, faithfulness {f(c['ours_faithfulness']['ours'])} / "
          f"{f(c['ours_faithfulness']['autocircuit'])}")
    for name in ("autocircuit_order", "our_order"):
        v = c[name]
        print(f"  AutoCircuit, {name.replace('_', ' ')}: {v['autocircuit_edges']} edges, both {v['both']} (Jaccard "
              f"{v['jaccard']:.2f}), only ours {v['only_ours']}, only AutoCircuit {v['only_autocircuit']}; "
              f"faithfulness {f(v['faithfulness']['ours'])} / {f(v['faithfulness']['autocircuit'])}")
    print(f"\nCPU seconds: ours {json.dumps({k: round(v, 2) for k, v in r['seconds_cpu']['ours'].items()})}, "
          f"AutoCircuit {json.dumps({k: round(v, 2) for k, v in r['seconds_cpu']['autocircuit'].items()})}")
    print(f"passes (ours): {r['passes_ours']}")
    for k, v in r["top5"].items():
        print(f"  top 5 {k:20s} {v}")


if __name__ == "__main__":
    main()
    sys.exit(0)

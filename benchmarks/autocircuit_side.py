"""AutoCircuit's side of `benchmarks/discovery_vs_autocircuit.py`: runs inside AutoCircuit's own virtual environment
(`benchmarks/make_autocircuit_venv.sh`: auto-circuit 1.0.1, TransformerLens 2.18, torch 2.13 CPU), never imports
this toolkit, and talks to the caller through two JSON files:

    python benchmarks/autocircuit_side.py REQUEST.json RESULT.json

REQUEST: `model_dir` (a zoo folder: config.json + model.safetensors, TransformerLens names), `clean` / `corrupt`
token ids `[n_prompts][n_pos]`, `answer_positions` `[n]` (the same in every prompt) and `answers`
`[n_prompts][n]` (the token each of those positions should predict), `ig_samples`, `acdc_tau`, `ks`, and `circuits`
(name → list of edges in this toolkit's names, whose faithfulness AutoCircuit measures too).

RESULT: the edge scores of AutoCircuit's EAP (`mask_gradient_prune_scores`, mask 0, gradient of the task loss),
EAP-IG (the same with `integrated_grad_samples`), ACDC (`acdc_prune_scores` at one τ) and exact edge patching (each
edge patched alone through `patch_mode`), all keyed by this toolkit's edge names; the faithfulness of every top-k
and of each requested circuit, measured with `run_circuits` (PatchType.TREE_PATCH: the clean prompt with every edge
outside the circuit carrying the corrupted prompt's sender output); the task loss of the clean and corrupted runs;
the clean logits of the first prompts (for the caller's check that the weights load the same); time per method.

The task metric is the toolkit's induction loss: the mean over prompts and answer positions of −log p(answer).
AutoCircuit reads it as `grad_function="logprob"`, `answer_function="avg_val"` (its loss is −mean log-prob at the
answers) with the model's output cut to the answer positions by `PatchableModel.out_slice`; the per-position
answers are `[n, 1]` per prompt, so its `gather` over the last axis picks one token per position.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import math
import sys
import time
from pathlib import Path

import torch
from ordered_set import OrderedSet
from safetensors.torch import load_file
from transformer_lens import HookedTransformer, HookedTransformerConfig

# AutoCircuit node names → this toolkit's (circuits.graph): the token embedding is the only thing in TransformerLens'
# blocks.0.hook_resid_pre under Shortformer positions (the positional table is added to the q/k inputs inside
# attention, after the hook_q_input / hook_k_input AutoCircuit patches), so "Resid Start" is our `embed`.


def our_node(name: str) -> str:
    """'Resid Start' → 'embed', 'A1.2' → 'L1H2', 'A1.2.K' → 'L1H2.k', 'MLP 0' → 'L0.mlp', 'Resid End' → 'logits'."""
    if name == "Resid Start":
        return "embed"
    if name == "Resid End":
        return "logits"
    if name.startswith("MLP "):
        return f"L{int(name[4:])}.mlp"
    parts = name[1:].split(".")
    head = f"L{int(parts[0])}H{int(parts[1])}"
    return head if len(parts) == 2 else f"{head}.{parts[2].lower()}"


def our_edge(edge) -> str:
    return f"{our_node(edge.src.name)}->{our_node(edge.dest.name)}"


def load_model(model_dir: Path) -> HookedTransformer:
    """The zoo model in TransformerLens 2.18's `HookedTransformer`, set up as AutoCircuit's factorized graph needs
    (`use_attn_result`, `use_split_qkv_input`). Refuses a config this loader does not translate."""
    c = json.loads((model_dir / "config.json").read_text())
    supported = {"positional_embedding_type": ("standard", "shortformer"), "attention_dir": ("causal",),
                 "normalization_type": (None,), "attn_only": (True,), "dtype": ("float32",)}
    for key, allowed in supported.items():
        if c.get(key) not in allowed:
            raise SystemExit(f"autocircuit_side: {key}={c.get(key)!r} is not translated (allowed: {allowed})")
    cfg = HookedTransformerConfig(
        n_layers=c["n_layers"], d_model=c["d_model"], d_head=c["d_head"], n_heads=c["n_heads"], d_vocab=c["d_vocab"],
        n_ctx=c["n_ctx"], act_fn=c["act_fn"], attn_only=True, normalization_type=None,
        positional_embedding_type=c["positional_embedding_type"], default_prepend_bos=c["default_prepend_bos"],
        use_attn_result=True, use_split_qkv_input=True, seed=0, device="cpu", dtype=torch.float32)
    model = HookedTransformer(cfg)
    state = load_file(str(model_dir / "model.safetensors"))
    missing, unexpected = model.load_state_dict(state, strict=False)
    # TransformerLens' masks (`.mask`, `.IGNORE`) are recomputed buffers, not weights
    if unexpected or any(not k.endswith((".mask", ".IGNORE")) for k in missing):
        raise SystemExit(f"autocircuit_side: state dict mismatch: missing {missing}, unexpected {unexpected}")
    return model.eval()


def task_loss(logits: torch.Tensor, answers: torch.Tensor) -> torch.Tensor:
    """−mean log p(answer) over prompts and answer positions; `logits [batch, n, vocab]` already at the answer
    positions, `answers [batch, n, 1]`."""
    return -logits.log_softmax(-1).gather(-1, answers).mean()


def flat(model, prune_scores) -> dict[str, float]:
    """AutoCircuit's `PruneScores` (dest module → tensor) as our edge name → float."""
    return {our_edge(e): float(e.prune_score(prune_scores)) for e in model.edges}


def main(request_path: str, result_path: str) -> None:
    from auto_circuit.data import PromptDataLoader, PromptDataset
    from auto_circuit.prune import run_circuits
    from auto_circuit.prune_algos.ACDC import acdc_prune_scores
    from auto_circuit.prune_algos.mask_gradient import mask_gradient_prune_scores
    from auto_circuit.types import AblationType, PatchType
    from auto_circuit.utils.ablation_activations import src_ablations
    from auto_circuit.utils.graph_utils import patch_mode, patchable_model, set_all_masks

    req = json.loads(Path(request_path).read_text())
    torch.set_num_threads(int(req.get("threads", 1)))
    clean = torch.tensor(req["clean"], dtype=torch.long)
    corrupt = torch.tensor(req["corrupt"], dtype=torch.long)
    positions = torch.tensor(req["answer_positions"], dtype=torch.long)
    answers = torch.tensor(req["answers"], dtype=torch.long)[..., None]  # [batch, n, 1]
    out: dict = {"versions": {pkg: md.version(pkg) for pkg in ("auto-circuit", "transformer-lens", "torch")}}

    model = load_model(Path(req["model_dir"]))
    with torch.no_grad():
        logits = model(clean)
        out["clean_logits_head"] = logits[: req.get("n_logit_prompts", 2)].tolist()
        out["clean_loss"] = float(task_loss(logits[:, positions], answers))
        out["corrupt_loss"] = float(task_loss(model(corrupt)[:, positions], answers))

    # Contiguous answer positions: AutoCircuit slices the output with one index tuple.
    lo, hi = int(positions[0]), int(positions[-1]) + 1
    if not torch.equal(positions, torch.arange(lo, hi)):
        raise SystemExit("autocircuit_side: answer positions must be contiguous")
    pm = patchable_model(model, factorized=True, slice_output=None, separate_qkv=True, device=torch.device("cpu"))
    pm.out_slice = (slice(None), slice(lo, hi))
    n = clean.shape[0]
    wrong = torch.zeros_like(answers)  # unused by avg_val and KL; PromptDataset requires it
    data = PromptDataset(list(clean), list(corrupt), list(answers), list(wrong))
    loader = PromptDataLoader(data, seq_len=None, diverge_idx=0, batch_size=n, shuffle=False)
    batch = next(iter(loader))
    out["n_edges"] = len(pm.edges)
    out["edges"] = sorted(our_edge(e) for e in pm.edges)
    times = out["seconds"] = {}
    scores = out["scores"] = {}

    def timed(name, fn):
        w, c = time.perf_counter(), time.process_time()
        r = fn()
        times[name] = {"wall": time.perf_counter() - w, "cpu": time.process_time() - c}
        return r

    ps = timed("eap", lambda: mask_gradient_prune_scores(
        pm, loader, None, grad_function="logprob", answer_function="avg_val", mask_val=0.0))
    scores["eap"] = flat(pm, ps)
    k_ig = int(req["ig_samples"])
    ps = timed("eap-ig", lambda: mask_gradient_prune_scores(
        pm, loader, None, grad_function="logprob", answer_function="avg_val", integrated_grad_samples=k_ig))
    scores["eap-ig"] = flat(pm, ps)

    # Exact edge patching: each edge alone carries the corrupted prompt's sender output, one forward per edge.
    def exact():
        patch = src_ablations(pm, batch.corrupt, AblationType.RESAMPLE)
        res = {}
        with torch.inference_mode():
            base = float(task_loss(pm(batch.clean)[pm.out_slice], answers))
            for e in sorted(pm.edges, key=lambda e: e.name):
                with patch_mode(pm, patch, edges=[e]):
                    res[our_edge(e)] = float(task_loss(pm(batch.clean)[pm.out_slice], answers)) - base
        set_all_masks(pm, 0.0)
        return res
    scores["exact"] = timed("exact", exact)

    tau = float(req["acdc_tau"])
    mant, exp = f"{tau:e}".split("e")
    if float(mant) != round(float(mant)):
        raise SystemExit(f"autocircuit_side: τ {tau} must be a·10^b with an integer a (AutoCircuit's tao grid)")
    by_name = {our_edge(e): e for e in pm.edges}

    def acdc(order):
        """AutoCircuit's ACDC at one τ. It visits `sorted(model.edges, key=dest layer, reverse=True)`: within a layer
        the order of a Python set of frozen dataclasses, whose hashes include hash(None), an address in Python
        3.11 (so it changes from process to process whatever PYTHONHASHSEED says). `order` (our edge names)
        replaces that set by an ordered one for the run (edges AutoCircuit lacks are skipped); None keeps
        AutoCircuit's own."""
        edges = pm.edges
        if order is not None:
            order = [e for e in order if e in by_name]  # our pos_embed edges: no such node here
            if sorted(order) != sorted(by_name):
                raise SystemExit("autocircuit_side: acdc_order must list every edge of AutoCircuit's graph once")
            pm.edges = OrderedSet(by_name[e] for e in order)
        try:
            ps = acdc_prune_scores(pm, loader, None, tao_exps=[int(exp)], tao_bases=[round(float(mant))])
        finally:
            pm.edges = edges
            set_all_masks(pm, 0.0)
        # ACDC's score: τ where the edge was removed, +inf where it was kept
        return {e: (None if math.isinf(s) else s) for e, s in flat(pm, ps).items()}

    scores["acdc"] = timed("acdc", lambda: acdc(None))
    out["acdc_circuit"] = sorted(e for e, s in scores["acdc"].items() if s is None)
    if req.get("acdc_order"):
        scores["acdc_our_order"] = timed("acdc_our_order", lambda: acdc(req["acdc_order"]))
        out["acdc_our_order_circuit"] = sorted(e for e, s in scores["acdc_our_order"].items() if s is None)

    # Faithfulness with run_circuits: the circuit's edges keep their clean value, every other edge is corrupted.

    def circuit_loss(edge_names) -> float:
        unknown = [e for e in edge_names if e not in by_name]
        if unknown:
            raise SystemExit(f"autocircuit_side: edges not in AutoCircuit's graph: {unknown}")
        keep = set(edge_names)
        p = pm.new_prune_scores()
        for name, e in by_name.items():
            if name in keep:
                p[e.dest.module_name][e.patch_idx] = 1.0
        outs = run_circuits(pm, loader, [len(keep)], p, patch_type=PatchType.TREE_PATCH)
        (count, batches), = outs.items()
        if count != len(keep):
            raise SystemExit(f"autocircuit_side: run_circuits kept {count} edges, asked {len(keep)}")
        return float(task_loss(batches[batch.key], answers))

    full, empty = circuit_loss(list(by_name)), circuit_loss([])
    out["faithfulness_ends"] = {"full": full, "empty": empty}

    def faith(edge_names):
        return (circuit_loss(edge_names) - empty) / (full - empty)

    ranked = {m: sorted(s, key=lambda e: (-abs(s[e]), e)) for m, s in scores.items() if not m.startswith("acdc")}
    out["top_k"] = {m: {str(k): r[:k] for k in req["ks"]} for m, r in ranked.items()}
    out["faithfulness"] = {m: {str(k): faith(r[:k]) for k in req["ks"]} for m, r in ranked.items()}
    out["faithfulness"]["acdc"] = {"circuit": faith(out["acdc_circuit"])}
    if "acdc_our_order_circuit" in out:
        out["faithfulness"]["acdc_our_order"] = {"circuit": faith(out["acdc_our_order_circuit"])}
    out["circuit_faithfulness"] = {name: faith(edges) for name, edges in req.get("circuits", {}).items()}
    Path(result_path).write_text(json.dumps(out))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: autocircuit_side.py REQUEST.json RESULT.json")
    main(sys.argv[1], sys.argv[2])

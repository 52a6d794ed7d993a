"""Parity with the real legacy TransformerLens 2.18 `HookedTransformer` (issue 14), slow job.

Each case of tests/tl2/make_references.py's grid (random-weight TransformerLens 2.18 models) is loaded into our model
the documented way (`models.from_transformer_lens_state_dict(state_dict_file, tl_config_dict)`) and compared check
by check: logits, loss, every cached activation under the same name (and the same set of names), every backward-hook
gradient, the caches with TransformerLens' opt-in hooks switched on, OV/QK eigenvalues, in-place and replacing hook
edits (and a clean run after them), and greedy generation with and without the key/value cache. Tensors agree to
relative error ≤ 1e-5 (float32); generated tokens exactly (each reference records its smallest top-1/top-2 logit
margin, asserted far above that tolerance).

A check that fails today for a known gap of issue 14 is `xfail(strict=True)` with the gap as its reason (see
`tl2_gaps.expected_gap`): fixing the gap turns it into an XPASS, which fails until the marker's rule is removed.
The whole module skips, with the reason, only when the legacy environment cannot be built here.
"""

from __future__ import annotations

import functools
import os

import pytest
import torch
from make_references import BASE, apply_recipe, grid
from tl2_gaps import CHECKS, expected_gap, not_in_tl
from tl2_legacy import TOL, Case, compare_dicts, match_eigenvalues, references_or_skip, rel_err

pytestmark = pytest.mark.slow


def _params():
    out = []
    for name, overrides in grid().items():
        cfg = {**BASE, **overrides}
        for check in CHECKS:
            if not_in_tl(cfg, check):  # TransformerLens 2.18 itself refuses it: there is no reference
                continue
            gap = expected_gap({**cfg, "_case": name}, check)
            show = os.environ.get("TL2_SHOW_GAPS")  # =1: no xfail markers, to read each gap's actual failure
            marks = [pytest.mark.xfail(strict=True, reason=gap)] if gap and not show else []
            out.append(pytest.param(name, check, id=f"{name}:{check}", marks=marks))
    return out


@pytest.fixture(scope="module")
def folder():
    return references_or_skip()


@functools.cache
def _case(folder, name) -> Case:
    return Case(folder, name)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _close(ours, ref, what):
    e = rel_err(ours, ref)
    assert e <= TOL, f"{what}: rel err {e:.3g} (ours {tuple(ours.shape)}, TransformerLens {tuple(ref.shape)})"


def _kvs(gen: dict, model) -> list[bool]:
    # TL 2.18's cache fails on gqa-ungrouped; ours refuses a cache under bidirectional attention (check generate_kv)
    bidirectional = model.cfg.attention_dir == "bidirectional"
    return [kv for kv in (True, False) if f"kv={kv}" in gen and not (kv and bidirectional)]


def _greedy(model, prompt, gen, kv: bool | None, **kw):
    with torch.no_grad():
        return model.generate(prompt, max_new_tokens=gen["max_new_tokens"], do_sample=False, stop_at_eos=False,
                              use_past_kv_cache=kv, verbose=False, **kw)


@pytest.mark.parametrize("name, check", _params())
def test_legacy_parity(folder, name, check):
    case = _case(folder, name)
    model = case.load_ours()
    tokens = case.tokens
    if check == "load":
        from safetensors.torch import load_file

        state = load_file(str(case.state_path))
        ours = model.state_dict()
        for k, v in ours.items():
            if k in state:
                _close(v, state[k], f"state {k}")
    elif check == "logits":
        with torch.no_grad():
            _close(model(tokens), case.ref["logits"], "logits")
    elif check == "loss":
        with torch.no_grad():
            _close(model(tokens, return_type="loss"), case.ref["loss"], "loss")
            _close(model(tokens, return_type="loss", loss_per_token=True), case.ref["loss_per_token"],
                   "per-token loss")
    elif check in ("cache", "grad"):
        loss, cache = model.run_with_cache(tokens, return_type="loss", incl_bwd=True)
        fwd = {k: v for k, v in cache.items() if not k.endswith("_grad")}
        bwd = {k[: -len("_grad")]: v for k, v in cache.items() if k.endswith("_grad")}
        compare_dicts(fwd if check == "cache" else bwd, case.section(check),
                      "activations" if check == "cache" else "backward-hook gradients")
    elif check == "grad_bwd_only":  # backward hooks alone, no forward hook anywhere (issue 14 bug 5)
        ref = case.section("grad")
        grads = {}
        for name in ref:
            model.add_hook(name, lambda g, hook: grads.__setitem__(hook.name, g.detach().clone()), dir="bwd")
        model(tokens, return_type="loss").backward()
        model.reset_hooks()
        compare_dicts(grads, ref, "gradients seen by backward hooks alone")
    elif check in ("cache_split", "cache_attn_in"):
        setters = {"cache_split": ("set_use_attn_result", "set_use_split_qkv_input", "set_use_hook_mlp_in"),
                   "cache_attn_in": ("set_use_attn_in",)}[check]
        for s in setters:
            if not (s == "set_use_hook_mlp_in" and case.cfg["attn_only"]):
                getattr(model, s)(True)
        with torch.no_grad():
            _, cache = model.run_with_cache(tokens)
        compare_dicts(dict(cache.items()), case.section(check), f"activations with {', '.join(setters)}")
    elif check == "eigen":
        with torch.no_grad():
            for circuit in ("OV", "QK"):
                ref = torch.complex(case.ref[f"eig/{circuit}.real"], case.ref[f"eig/{circuit}.imag"])
                e = match_eigenvalues(getattr(model, circuit).eigenvalues, ref)
                assert e <= TOL, f"{circuit} eigenvalues: max |Δλ| / max |λ| = {e:.3g}"
    elif check in ("edit_inplace", "edit_replace"):
        kind = check.split("_")[1]
        recipes = case.meta["edits"][kind]
        assert recipes, "the reference applied no edit"
        with torch.no_grad():
            edited = model.run_with_hooks(tokens, fwd_hooks=[(k, apply_recipe(r)) for k, r in recipes.items()])
            _close(edited, case.ref[f"edit/{kind}"], f"logits under {kind} edits {recipes}")
            _close(model(tokens), case.ref[f"edit/{kind}_after"], f"clean logits after the {kind} edits")
    elif check in ("generate_kv", "generate_nokv"):
        kv = check == "generate_kv"
        gen = case.meta["generation"]
        assert gen["min_margin"] > 100 * TOL, "reference has a near-tie: greedy tokens could flip on rounding"
        if kv and model.cfg.attention_dir == "bidirectional":
            # A key/value cache is stale under bidirectional attention (2.18 uses it and generates other tokens than
            # its own forward): ours refuses it by name and recomputes by default, giving 2.18's cache-free tokens.
            from models.errors import InputError

            with pytest.raises(InputError, match="bidirectional"):
                _greedy(model, torch.tensor(gen["prompt"]), gen, True)
            out = _greedy(model, torch.tensor(gen["prompt"]), gen, None)
            assert out.tolist() == gen["kv=False"], "greedy tokens (default: recomputed)"
            return
        out = _greedy(model, torch.tensor(gen["prompt"]), gen, kv)
        assert out.tolist() == gen[f"kv={kv}"], f"greedy tokens (use_past_kv_cache={kv})"
    elif check == "generate_embeds":  # embeddings in; embeddings and (new) tokens out
        gen = case.meta["generation"]
        assert gen["embeds_margin"] > 100 * TOL, "reference has a near-tie: greedy tokens could flip on rounding"
        embeds = case.ref["gen_embeds/input"]
        for kv in _kvs(gen, model):
            _close(_greedy(model, embeds, gen, kv), case.ref[f"gen_embeds/kv={kv}"], f"embeddings (kv={kv})")
            tokens = _greedy(model, embeds, gen, kv, return_type="tokens")
            assert tokens.tolist() == gen[f"embeds/kv={kv}"], f"greedy tokens from embeddings (kv={kv})"
    elif check == "generate_pad0":  # TL 2.18 with pad id 0 = ours without positional table (README, tl2_gaps)
        gen = case.meta["generation"]
        assert gen["pad0_margin"] > 100 * TOL, "reference has a near-tie: greedy tokens could flip on rounding"
        if model.cfg.positional_embedding_type in ("standard", "shortformer"):
            with torch.no_grad():
                model.pos_embed.W_pos.zero_()
        for kv in _kvs(gen, model):
            out = _greedy(model, torch.tensor(gen["prompt"]), gen, kv)
            assert out.tolist() == gen[f"pad0/kv={kv}"], f"greedy tokens, W_pos zeroed (kv={kv})"
    else:  # pragma: no cover
        raise AssertionError(check)

"""Reference outputs of the legacy TransformerLens 2.18 `HookedTransformer`, for tests/tl2/test_legacy_parity.py.

Run INSIDE the legacy environment (tests/tl2/make_legacy_venv.sh builds it):

    .venv-tl2/bin/python tests/tl2/make_references.py OUT_DIR

For every configuration of `GRID` (a covering design, see `grid()`) it builds a random-weight TransformerLens 2.18
model and writes, under OUT_DIR:
- `NAME.json`: the TransformerLens config dict (`cfg.to_dict()`, JSON-safe: dtype as "torch.float32"), the
  input tokens, the greedy generations (with and without `use_past_kv_cache`; from ids, from embeddings, and
  from ids with pad id 0: see `generation`) with their prompt and smallest top-1/top-2 logit margins, and which
  hook-edit recipes were applied;
- `NAME.state.safetensors`: `model.state_dict()` exactly as a user would save it;
- `NAME.ref.safetensors`: logits, mean and per-token loss, every activation of `run_with_cache` (`cache/…`),
  every gradient of `run_with_cache(return_type="loss", incl_bwd=True)` (`grad/…`), the caches with the opt-in
  hooks switched on (`cache_split/…`: use_attn_result + use_split_qkv_input + use_hook_mlp_in; `cache_attn_in/…`:
  use_attn_in), the OV and QK eigenvalues (`eig/OV.real`, …), the logits of the hook-edit runs, and the
  embeddings generation starts from and returns (`gen_embeds/…`).
Also `fields.json` (every `HookedTransformerConfig` field with its default) and `manifest.json` (the case names,
written last: a folder without it is incomplete). Only torch, transformer_lens and safetensors are used.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

BASE = dict(n_layers=2, d_model=16, d_head=4, n_heads=4, n_ctx=12, d_vocab=23, d_mlp=32, act_fn="gelu",
            normalization_type="LN", positional_embedding_type="standard", default_prepend_bos=False)
BATCH, N_POS, PROMPT, NEW = 2, 8, 4, 6
MIN_MARGIN = 2.5e-3  # top-1/top-2 logit gap of every greedy step, far above float32 rounding (test_legacy_parity)
POSITIONS = ("standard", "shortformer", "rotary", "alibi")  # every positional type TransformerLens 2.18 has
NORMS = (None, "LN", "LNPre", "RMS", "RMSPre")
BLOCKS = {
    "attn": dict(attn_only=True, d_mlp=None, act_fn=None),
    "gelu": dict(),
    "gated": dict(gated_mlp=True, act_fn="silu"),
    "parallel": dict(parallel_attn_mlp=True),
}


def grid() -> dict[str, dict]:
    """Case name -> TransformerLens config overrides of `BASE`.

    The core: positional type × normalization × block kind, with block = BLOCKS[(i + j) mod 4] for the i-th
    positional type and j-th norm, so that 20 cases cover every (position, norm), (position, block) and
    (norm, block) pair. Then grouped-query attention and bidirectional attention across positional types, each
    option of issue 14's bug 6 (and every activation function TransformerLens 2.18 has) on a standard/LN/GELU
    base, rotary variants, a d_head that does not divide d_model, and 1- and 3-layer models."""
    cases: dict[str, dict] = {}
    blocks = list(BLOCKS)
    for i, pos in enumerate(POSITIONS):
        for j, norm in enumerate(NORMS):
            block = blocks[(i + j) % len(blocks)]
            cases[f"{pos}-{norm or 'none'}-{block}"] = dict(positional_embedding_type=pos, normalization_type=norm,
                                                         **BLOCKS[block])
    for pos, norm, block in (("standard", "LN", "gelu"), ("rotary", "RMS", "gated"), ("shortformer", None, "attn"),
                             ("alibi", "LNPre", "parallel")):
        cases[f"gqa-{pos}-{norm or 'none'}-{block}"] = dict(positional_embedding_type=pos, normalization_type=norm,
                                                            n_key_value_heads=2, **BLOCKS[block])
    for pos, norm, block in (("standard", "LN", "gelu"), ("shortformer", "LN", "attn"), ("rotary", "RMS", "gelu"),
                             ("alibi", None, "attn")):
        cases[f"bidir-{pos}-{norm or 'none'}-{block}"] = dict(positional_embedding_type=pos, normalization_type=norm,
                                                              attention_dir="bidirectional", **BLOCKS[block])
    options = {
        "no-attn-scale": dict(use_attn_scale=False),
        "attn-scale": dict(attn_scale=2.5),
        "inverse-layer-idx": dict(scale_attn_by_inverse_layer_idx=True),
        "scores-soft-cap": dict(attn_scores_soft_cap=0.5),
        "logits-soft-cap": dict(output_logits_soft_cap=1.0),
        "d-vocab-out": dict(d_vocab_out=17),
        "final-rms": dict(final_rms=True),
        "final-rms-lnpre": dict(final_rms=True, normalization_type="LNPre"),
        "solu-ln": dict(act_fn="solu_ln"),
        "solu-ln-lnpre": dict(act_fn="solu_ln", normalization_type="LNPre"),
        "act-solu": dict(act_fn="solu"),
        "act-relu": dict(act_fn="relu"),
        "act-silu": dict(act_fn="silu"),
        "act-gelu-new": dict(act_fn="gelu_new"),
        "act-gelu-fast": dict(act_fn="gelu_fast"),
        "act-gelu-pytorch-tanh": dict(act_fn="gelu_pytorch_tanh"),
        "gated-parallel": dict(gated_mlp=True, parallel_attn_mlp=True, act_fn="silu", normalization_type="RMS"),
        "rotary-dim-2": dict(positional_embedding_type="rotary", rotary_dim=2),
        "rotary-adjacent": dict(positional_embedding_type="rotary", rotary_adjacent_pairs=True),
        "rotary-base-500": dict(positional_embedding_type="rotary", rotary_base=500),
        "d-head-6": dict(n_heads=3, d_head=6),
        "one-layer-hook-tokens": dict(n_layers=1, use_hook_tokens=True),
        "three-layer-shortformer-ln-attn": dict(n_layers=3, positional_embedding_type="shortformer",
                                                **BLOCKS["attn"]),
        "gqa-ungrouped": dict(n_key_value_heads=2, ungroup_grouped_query_attention=True),
        "gated-solu-ln": dict(gated_mlp=True, act_fn="solu_ln"),
        "caps-alibi-bidir-parallel": dict(positional_embedding_type="alibi", attention_dir="bidirectional",
                                          parallel_attn_mlp=True, attn_scores_soft_cap=0.5,
                                          output_logits_soft_cap=2.0, normalization_type="RMSPre"),
        "scales-shortformer-rms-gated": dict(positional_embedding_type="shortformer", normalization_type="RMS",
                                             use_attn_scale=False, scale_attn_by_inverse_layer_idx=True,
                                             gated_mlp=True, act_fn="gelu_new", d_vocab_out=19),
    }
    cases.update(options)
    return cases


def json_safe(d: dict) -> dict:
    return {k: v if isinstance(v, (bool, int, float, str, type(None), list)) else str(v) for k, v in d.items()}


def local_tokenizer(d_vocab: int, pad_id: int):
    """A word-level tokenizer `t0 … t{d_vocab-1}`, t0 = BOS = EOS and `t{pad_id}` = pad: TransformerLens 2.18's
    `generate` needs one, and the hub is out of reach. Greedy generation from token ids never reads its text, but
    the pad id matters: TL 2.18's `generate` derives the attention mask of its absolute positions from a tensor of
    zeros (`tokens = torch.zeros(...)`, HookedTransformer.py), so with pad id 0 every position counts as padding
    and `W_pos` is dropped while generating (see `generation`)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(d_vocab)}, unk_token="t1"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, name_or_path="local-wordlevel", add_bos_token=True,
                                   bos_token="t0", eos_token="t0", pad_token=f"t{pad_id}", unk_token="t1")


def randomize(model, seed: int) -> None:
    """Every parameter gets seeded noise on top of TransformerLens' init, so biases and norm weights matter too."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            scale = 0.3 if leaf.startswith("W_") else 0.2
            p.add_(torch.randn(p.shape, generator=g) * scale)


def edit_recipes(names: set[str], n_layers: int) -> tuple[dict, dict]:
    """Hook edits, keyed by hook name: in-place edits (the hook returns None) and replacements (it returns a new
    tensor). Only hooks the model fires (`names`) are used. The same recipes are applied to our model."""
    last = n_layers - 1
    inplace = {"hook_pos_embed": "mul_0", "blocks.0.attn.hook_v": "zero_feature_0",
               f"blocks.{last}.hook_resid_mid": "mul_0.5", "blocks.0.ln1.hook_normalized": "add_0.1",
               "hook_embed": "mul_0.5"}
    replace = {"blocks.0.attn.hook_attn_scores": "times_0.7", "blocks.0.attn.hook_z": "times_2",
               f"blocks.{last}.hook_mlp_out": "plus_0.1", "ln_final.hook_normalized": "times_1.5",
               f"blocks.{last}.attn.hook_pattern": "times_0.5", "blocks.0.attn.hook_q": "times_1.1"}
    return ({k: v for k, v in inplace.items() if k in names}, {k: v for k, v in replace.items() if k in names})


def apply_recipe(recipe: str):
    """The hook function of a recipe name (shared with the parity test, which imports this module)."""
    op, arg = recipe.split("_", 1)

    def hook(x, hook):
        if op == "mul":
            x.mul_(float(arg))
        elif op == "add":
            x.add_(float(arg))
        elif op == "zero":
            x[..., 0] = 0
        elif op == "times":
            return x * float(arg)
        elif op == "plus":
            return x + float(arg)
        else:
            raise ValueError(recipe)

    return hook


def greedy_margin(logits: torch.Tensor) -> float:
    """The smallest gap between the top two logits `[batch, steps, vocab]` the greedy tokens were chosen from (a step
    with a near-tie could flip on rounding; the parity test checks the margin is far above the tolerance)."""
    top2 = logits.topk(2, dim=-1).values
    return float((top2[..., 0] - top2[..., 1]).min())


def fresh_alibi(model) -> None:
    """TL 2.18 keeps each layer's ALiBi bias (`attn.alibi`) from the longest input so far and reads its last rows:
    after a longer input a shorter one gets a later query's rows (a constant per row for causal attention, so
    harmless there; another bias for bidirectional attention). Each generation starts from a fresh model's state."""
    for block in model.blocks:
        if hasattr(block.attn, "alibi"):
            block.attn.alibi = None


def generation(model, prompt: torch.Tensor, seed: int) -> tuple[dict, dict]:
    """Greedy generations (with and without `use_past_kv_cache`; TL 2.18's KV cache fails on
    ungroup_grouped_query_attention) and the smallest top-1/top-2 margin of each kind:
    - `kv=…`: from token ids, tokenizer pad id d_vocab−1 (not 0, as GPT-2's 50256);
    - `embeds/…`: from perturbed token embeddings `[batch, pos, d_model]`, returned as embeddings (tensors
      `gen_embeds/…`) and as tokens (the new ones only, as TL 2.18);
    - `pad0/kv=…`: from token ids with pad id 0 (BOS = EOS = pad = 0: what TL's `set_tokenizer` makes of a tokenizer
      without a pad token whose EOS is id 0, such as GPT-NeoX-20B's): TL 2.18 then drops `W_pos`
      (`local_tokenizer`). Its margin is that of the model with `W_pos` zeroed."""
    cfg, n_prompt = model.cfg, prompt.shape[1]
    kvs = [kv for kv in (True, False) if not (kv and cfg.ungroup_grouped_query_attention)]

    def run(inp, kv, **kw):
        fresh_alibi(model)
        return model.generate(inp, max_new_tokens=NEW, do_sample=False, stop_at_eos=False, use_past_kv_cache=kv,
                              verbose=False, **kw)

    def token_margin(tokens):
        fresh_alibi(model)
        return greedy_margin(model(tokens[:, :-1])[:, n_prompt - 1:])

    model.set_tokenizer(local_tokenizer(cfg.d_vocab, cfg.d_vocab - 1))
    gen = {f"kv={kv}": run(prompt, kv).tolist() for kv in kvs}
    gen["min_margin"] = token_margin(torch.tensor(gen["kv=False"]))
    g = torch.Generator().manual_seed(seed)
    embeds = model.embed(prompt) + 0.3 * torch.randn(*prompt.shape, cfg.d_model, generator=g)
    tensors = {"gen_embeds/input": embeds}
    for kv in kvs:
        tensors[f"gen_embeds/kv={kv}"] = run(embeds, kv)
        gen[f"embeds/kv={kv}"] = run(embeds, kv, return_type="tokens").tolist()
    fresh_alibi(model)
    resid, shortformer = model.get_residual(tensors["gen_embeds/kv=False"][:, :-1].contiguous(), 0)
    gen["embeds_margin"] = greedy_margin(model(resid, start_at_layer=0, shortformer_pos_embed=shortformer)
                                         [:, n_prompt - 1:])
    model.set_tokenizer(local_tokenizer(cfg.d_vocab, 0))
    for kv in kvs:
        gen[f"pad0/kv={kv}"] = run(prompt, kv).tolist()
    saved = model.pos_embed.W_pos.clone() if cfg.positional_embedding_type in ("standard", "shortformer") else None
    if saved is not None:
        model.pos_embed.W_pos.zero_()
    gen["pad0_margin"] = token_margin(torch.tensor(gen["pad0/kv=False"]))
    if saved is not None:
        model.pos_embed.W_pos.copy_(saved)
    return gen, tensors


def make_model(overrides: dict, seed: int):
    """`(cfg, model, tokens)`: a case's random-weight TransformerLens 2.18 model (eval mode) and its input tokens
    (also used by make_process_references.py)."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    torch.manual_seed(seed)
    cfg = HookedTransformerConfig(**{**BASE, **overrides})
    model = HookedTransformer(cfg)
    randomize(model, seed + 1)
    model.eval()
    g = torch.Generator().manual_seed(seed + 2)
    tokens = torch.randint(0, min(cfg.d_vocab, cfg.d_vocab_out), (BATCH, N_POS), generator=g)
    return cfg, model, tokens


def build_case(name: str, overrides: dict, seed: int):
    cfg, model, tokens = make_model(overrides, seed)
    cfg_dict = json_safe(dataclasses.asdict(cfg))
    out: dict[str, torch.Tensor] = {"tokens": tokens}
    with torch.no_grad():
        out["logits"] = model(tokens)
        out["loss"] = model(tokens, return_type="loss")
        out["loss_per_token"] = model(tokens, return_type="loss", loss_per_token=True)
    loss, cache = model.run_with_cache(tokens, return_type="loss", incl_bwd=True)
    for k, v in cache.items():
        out[("grad/" + k[: -len("_grad")]) if k.endswith("_grad") else "cache/" + k] = v
    model.zero_grad(set_to_none=True)
    variants = {}
    for variant, setters in (("cache_split", ("set_use_attn_result", "set_use_split_qkv_input", "set_use_hook_mlp_in")),
                             ("cache_attn_in", ("set_use_attn_in",))):
        try:
            for s in setters:
                if not (s == "set_use_hook_mlp_in" and cfg.attn_only):
                    getattr(model, s)(True)
            with torch.no_grad():
                _, vcache = model.run_with_cache(tokens)
            for k, v in vcache.items():
                out[f"{variant}/{k}"] = v
            variants[variant] = {k: v for k, v in cfg.to_dict().items()
                                 if k.startswith("use_") and isinstance(v, bool)}
        except (AssertionError, ValueError, RuntimeError) as e:  # TransformerLens refuses the combination
            variants[variant] = {"unsupported": f"{type(e).__name__}: {e}"}
        for s in setters:  # back to TransformerLens' defaults (its setters assert on some combinations)
            setattr(model.cfg, s[len("set_"):], False)
    with torch.no_grad():
        for circuit in ("OV", "QK"):
            eig = getattr(model, circuit).eigenvalues
            out[f"eig/{circuit}.real"], out[f"eig/{circuit}.imag"] = eig.real, eig.imag
        names = {k for k in out if k.startswith("cache/")}
        inplace, replace = edit_recipes({k[len("cache/"):] for k in names}, cfg.n_layers)
        for kind, recipes in (("inplace", inplace), ("replace", replace)):
            hooks = [(k, apply_recipe(r)) for k, r in recipes.items()]
            out[f"edit/{kind}"] = model.run_with_hooks(tokens, fwd_hooks=hooks)
            out[f"edit/{kind}_after"] = model(tokens)  # a clean run after the edit: nothing persisted
        for start in range(N_POS - PROMPT + 1):  # the first prompt window without a near-tie in any generation
            prompt = tokens[:, start:start + PROMPT]
            gen, gen_tensors = generation(model, prompt, seed + 3)
            if min(v for k, v in gen.items() if k.endswith("margin")) >= MIN_MARGIN:
                break
        out.update(gen_tensors)
    state = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    meta = dict(name=name, seed=seed, overrides=json_safe(overrides), cfg=cfg_dict, variants=variants,
                generation=dict(prompt=prompt.tolist(), max_new_tokens=NEW, **gen),
                edits=dict(inplace=inplace, replace=replace))
    return meta, state, {k: v.detach().contiguous().clone() for k, v in out.items()}


def field_defaults() -> dict:
    from transformer_lens import HookedTransformerConfig

    fields = {}
    for f in dataclasses.fields(HookedTransformerConfig):
        default = f.default if f.default is not dataclasses.MISSING else (
            "<required>" if f.default_factory is dataclasses.MISSING else repr(f.default_factory()))
        fields[f.name] = default if isinstance(default, (bool, int, float, str, type(None))) else str(default)
    return fields


def reference_folder(out_dir: str, script: str) -> Path:
    """The output folder of a reference script, made ready (its manifest removed until the script writes it again),
    after checking that the script runs under TransformerLens 2.18.0, one thread."""
    import importlib.metadata

    version = importlib.metadata.version("transformer-lens")
    if version != "2.18.0":
        raise SystemExit(f"{script}: needs transformer-lens 2.18.0, found {version} (run it in .venv-tl2)")
    torch.set_num_threads(1)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "manifest.json").unlink(missing_ok=True)
    return out


def write_manifest(out: Path, **fields) -> None:
    """manifest.json (the versions that made the references, and `fields`), written last and atomically: its presence
    says the folder is complete."""
    import importlib.metadata

    tmp = out / f".manifest.{os.getpid()}"
    tmp.write_text(json.dumps({"transformer_lens": importlib.metadata.version("transformer-lens"),
                               "torch": torch.__version__, **fields}))
    os.replace(tmp, out / "manifest.json")


def main(out_dir: str) -> None:
    from tqdm import tqdm

    out = reference_folder(out_dir, "make_references")
    cases = grid()
    for seed, (name, overrides) in enumerate(tqdm(cases.items(), desc="TL 2.18 references", file=sys.stderr)):
        meta, state, tensors = build_case(name, overrides, 1000 + 10 * seed)
        save_file(state, str(out / f"{name}.state.safetensors"))
        save_file(tensors, str(out / f"{name}.ref.safetensors"))
        (out / f"{name}.json").write_text(json.dumps(meta, indent=1))
    (out / "fields.json").write_text(json.dumps(field_defaults(), indent=1))
    write_manifest(out, cases=list(cases))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: .venv-tl2/bin/python tests/tl2/make_references.py OUT_DIR")
    main(sys.argv[1])

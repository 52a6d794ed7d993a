"""The migration gaps real TransformerLens 2.x code hits (issue 33), one test each: TL 2.x state dicts through
`load_state_dict`, Hugging Face tokenizers, `decode` / `to_string` of one id, `loss_fn`, checkpoint folders with
their tokenizer, the bridge's tokenizer, the ungrouped-GQA key/value cache, and decoding under bidirectional
attention."""

from __future__ import annotations

import math

import pytest
import torch

import models
from models import HookedTransformer, HookedTransformerConfig
from models.arch.positions import SCHEMES
from models.errors import CheckpointError, InputError

BASE = dict(n_layers=2, d_model=16, n_heads=4, d_head=4, n_ctx=24, d_vocab=23, d_mlp=32, act_fn="gelu", seed=1,
            init_range=0.5)


def _cfg(**kw) -> HookedTransformerConfig:
    if kw.get("positional_embedding_type") == "rotary":
        kw.setdefault("rotary_dim", 4)
    return HookedTransformerConfig(**{**BASE, **kw})


def _tl2_rotary(n_ctx: int, rotary_dim: int, base: float, adjacent: bool, which: str) -> torch.Tensor:
    """TransformerLens 2.18's `calculate_sin_cos_rotary` table, written out loop by loop in float64."""
    out = torch.zeros(n_ctx, rotary_dim, dtype=torch.float64)
    for p in range(n_ctx):
        for j in range(rotary_dim):
            i = j // 2 if adjacent else j % (rotary_dim // 2)
            angle = p / base ** (2 * i / rotary_dim)
            out[p, j] = math.sin(angle) if which == "sin" else math.cos(angle)
    return out.float()


def _tl2_state(model) -> dict:
    """`model`'s state dict as TransformerLens 2.18 saves it: every layer's `attn.mask` / `attn.IGNORE` buffers (and
    rotary tables), grouped-query keys and values under `attn._W_K`-style names."""
    cfg, sd = model.cfg, dict(model.state_dict())
    for l in range(cfg.n_layers):
        sd[f"blocks.{l}.attn.mask"] = torch.ones(cfg.n_ctx, cfg.n_ctx).tril().bool()
        sd[f"blocks.{l}.attn.IGNORE"] = torch.tensor(-torch.inf)
        if cfg.positional_embedding_type == "rotary":
            for which in ("sin", "cos"):
                sd[f"blocks.{l}.attn.rotary_{which}"] = _tl2_rotary(cfg.n_ctx, cfg.rotary_dim, cfg.rotary_base,
                                                                     cfg.rotary_adjacent_pairs, which)
        if cfg.n_key_value_heads:
            for name in ("W_K", "W_V", "b_K", "b_V"):
                sd[f"blocks.{l}.attn._{name}"] = sd.pop(f"blocks.{l}.attn.{name}")
    return sd


@pytest.mark.parametrize("kw", [{}, dict(positional_embedding_type="rotary"),
                                dict(positional_embedding_type="rotary", rotary_adjacent_pairs=True),
                                dict(n_key_value_heads=2), dict(attention_dir="bidirectional")],
                         ids=["standard", "rotary", "rotary-adjacent", "gqa", "bidirectional"])
def test_load_state_dict_takes_a_tl2_state_dict(kw):
    source = HookedTransformer(_cfg(**kw))
    target = HookedTransformer(_cfg(**{**kw, "seed": 2}))
    tokens = torch.tensor([[1, 5, 7, 3, 9]])
    assert not torch.equal(target(tokens), source(tokens))
    result = target.load_state_dict(_tl2_state(source))
    assert not result.missing_keys and not result.unexpected_keys
    assert torch.equal(target(tokens), source(tokens))


@pytest.mark.parametrize("key, value, match", [
    ("blocks.0.attn.mask", torch.ones(24, 24).triu().bool(), "causal mask"),
    ("blocks.0.attn.mask", torch.ones(12, 12).tril().bool(), "causal mask"),
    ("blocks.1.attn.IGNORE", torch.tensor(0.0), "fill value"),
])
def test_load_state_dict_refuses_buffers_that_differ(key, value, match):
    model = HookedTransformer(_cfg())
    sd = _tl2_state(model)
    sd[key] = value
    with pytest.raises(CheckpointError, match=f"{key}.*{match}"):
        model.load_state_dict(sd)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_load_state_dict_takes_rotary_tables_stored_in_reduced_precision(dtype):
    """TransformerLens 2.18 stores a bfloat16 / float16 model's rotary tables in that dtype (up to 1.9e-3 / 2.4e-4
    off the exact values); the check compared them with the float64 tables at atol 1e-4 and refused a valid state
    dict. A table of another base in that dtype is still refused."""
    model = HookedTransformer(_cfg(positional_embedding_type="rotary"))
    sd = {k: (v.to(dtype) if k.endswith(("rotary_sin", "rotary_cos")) else v) for k, v in _tl2_state(model).items()}
    model.load_state_dict(sd)
    sd["blocks.0.attn.rotary_sin"] = _tl2_rotary(24, 4, 500.0, False, "sin").to(dtype)
    with pytest.raises(CheckpointError, match="rotary_sin"):
        model.load_state_dict(sd)


def test_load_state_dict_refuses_a_rotary_table_of_another_base_and_unknown_keys():
    model = HookedTransformer(_cfg(positional_embedding_type="rotary"))
    sd = _tl2_state(model)
    sd["blocks.0.attn.rotary_sin"] = _tl2_rotary(24, 4, 500.0, False, "sin")
    with pytest.raises(CheckpointError, match="rotary_sin"):
        model.load_state_dict(sd)
    sd = _tl2_state(model)
    sd["blocks.0.attn.W_X"] = torch.zeros(1)
    with pytest.raises(RuntimeError, match="W_X"):  # strict, as nn.Module
        model.load_state_dict(sd)
    assert model.load_state_dict(sd, strict=False).unexpected_keys == ["blocks.0.attn.W_X"]


@pytest.mark.parametrize("name", ["attn-only-2l", "gelu-2l", "attn-only-1l"])
def test_decode_and_to_string_take_one_id(name):
    model = models.load(name)
    tok = model.tokenizer
    for i in (5, 100, tok.bos_token_id):
        one = tok.decode([i])
        assert tok.decode(i) == one and tok.decode(torch.tensor(i)) == one
        assert model.to_string(i) == one and model.to_string(torch.tensor(i)) == one
    import numpy as np

    assert tok.decode(np.int64(5)) == tok.decode([5]) == tok.hf.decode(5)


def test_char_vocab_decodes_one_id():
    model = models.load("enc-dec-reverse")
    for vocab in (model.tokenizer.source, model.tokenizer.target):
        assert vocab.decode(4) == vocab.decode([4]) == vocab.decode(torch.tensor(4))


def test_loss_fn_is_the_forward_loss():
    model = models.load("attn-only-2l")
    tokens = model.to_tokens(["def f(x):\n    return x", "import os"], padding_side="right")
    mask = (tokens != model.tokenizer.pad_token_id).long()
    logits = model(tokens)
    assert torch.equal(model.loss_fn(logits, tokens), model(tokens, return_type="loss"))
    per = model.loss_fn(logits, tokens, per_token=True)
    assert per.shape == (2, tokens.shape[1] - 1)
    masked = model.loss_fn(logits, tokens, attention_mask=mask)
    keep = (mask[:, :-1] * mask[:, 1:]).bool()
    assert torch.allclose(masked, per[keep].mean(), atol=1e-6)
    assert torch.equal(model.loss_fn(logits[0], tokens[0]), model.loss_fn(logits[:1], tokens[:1]))


def _hf(path, **specials):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_file=str(path), **specials)


def test_set_tokenizer_takes_a_hugging_face_tokenizer():
    zoo = models.load("attn-only-2l")
    folder = models.io.checkpoint.resolve("attn-only-2l")
    hf = _hf(folder / "tokenizer.json", bos_token="<|bos|>", pad_token="<|pad|>", eos_token="<|endoftext|>")
    model = HookedTransformer(zoo.cfg)
    model.load_state_dict(zoo.state_dict())
    assert model.tokenizer is None
    model.set_tokenizer(hf)
    assert model.tokenizer.hf is hf and len(model.tokenizer) == 512
    texts = ["def f(x):\n    return x", "import os"]
    assert torch.equal(model.to_tokens(texts), zoo.to_tokens(texts))
    assert model.to_str_tokens(texts[0]) == zoo.to_str_tokens(texts[0])
    assert model.to_single_token("x") == zoo.to_single_token("x")
    assert model.to_string(model.to_tokens(texts[1])[0]) == zoo.to_string(zoo.to_tokens(texts[1])[0])
    assert torch.equal(model(texts[0]), zoo(texts[0]))
    other = HookedTransformer(zoo.cfg)
    other.tokenizer = hf  # plain assignment attaches it the same way
    assert torch.equal(other.to_tokens(texts), zoo.to_tokens(texts))


def test_hugging_face_tokenizer_adding_specials_and_without_bos(tmp_path):
    """A tokenizer whose encode adds specials (BERT-style post-processor) gets no second BOS; one without a BOS token
    uses its EOS token, as TransformerLens 2.x's set_tokenizer; a model saved with it loads it back."""
    from tokenizers import processors

    zoo = models.load("attn-only-2l")
    raw = zoo.tokenizer.tokenizers_object()
    bos = zoo.tokenizer.bos_token_id
    raw.post_processor = processors.TemplateProcessing(single="<|bos|> $A <|endoftext|>",
                                                       special_tokens=[("<|bos|>", bos), ("<|endoftext|>", 2)])
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<|bos|>")  # no bos_token: EOS stands in
    model = HookedTransformer(zoo.cfg, tokenizer=hf)
    model.load_state_dict(zoo.state_dict())
    assert hf.encode("import os")[0] == bos  # it adds specials itself ...
    assert torch.equal(model.to_tokens("import os"), zoo.to_tokens("import os"))  # ... but not through us
    model.save(tmp_path / "m")
    back = models.load(tmp_path / "m")
    assert back.tokenizer.encode("import os") == zoo.tokenizer.encode("import os")


def test_zoo_checkpoint_folders_load_with_their_tokenizer():
    root = models.io.checkpoint.resolve("attn-only-2l")
    final = models.load("attn-only-2l")
    for folder in sorted((root / "checkpoints").iterdir()):
        m = models.load(folder)
        assert m.tokenizer is not None, folder
        assert torch.equal(m.to_tokens("def f(x): pass"), final.to_tokens("def f(x): pass"))


def test_training_checkpoints_carry_the_tokenizer(tmp_path):
    from models.training.loop import TrainConfig, train

    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.py").write_text("def f(x):\n    return x\n" * 200)
    cfg = _cfg(n_ctx=16, d_vocab=259, attn_only=True, d_mlp=None, n_layers=1, normalization_type=None)
    train(cfg, TrainConfig(device="cpu", steps=4, batch_size=2, tokenizer="bytes", data=str(tmp_path / "corpus"),
                           cache_dir=str(tmp_path / "cache"), checkpoint_every=2, eval_every=2, log_every=2,
                           progress=False, num_threads=1, out_dir=str(tmp_path / "run")))
    steps = sorted((tmp_path / "run" / "checkpoints").iterdir())
    assert steps and all((s / "tokenizer.json").is_file() for s in steps)
    assert models.load(steps[-1]).to_tokens("ab").tolist() == [[256, 97, 98]]


@pytest.mark.tl4
def test_bridge_carries_the_tokenizer():
    model = models.load("gelu-2l")
    bridge = models.to_transformer_lens(model)
    texts = ["Hello world, def f(x): return x", "short"]
    assert torch.equal(bridge.to_tokens(texts), model.to_tokens(texts))
    assert bridge.to_str_tokens(texts[0]) == model.to_str_tokens(texts[0])
    assert torch.allclose(bridge(texts[0]), model(texts[0]), atol=1e-4)


def _argmax_loop(model, tokens, n):
    for _ in range(n):
        tokens = torch.cat([tokens, model(tokens)[:, -1].argmax(-1, keepdim=True)], 1)
    return tokens


def test_ungrouped_gqa_generates_with_the_cache():
    """TransformerLens 2.18 sizes the cache by n_key_value_heads and fails here; ours keeps every query head's."""
    model = HookedTransformer(_cfg(n_key_value_heads=2, ungroup_grouped_query_attention=True)).eval()
    prompt = torch.tensor([[1, 5, 7, 3], [2, 2, 9, 4]])
    cached = model.generate(prompt, max_new_tokens=10, temperature=0, use_past_kv_cache=True)
    assert torch.equal(cached, _argmax_loop(model, prompt, 10))
    assert torch.equal(cached, model.generate(prompt, max_new_tokens=10, temperature=0, use_past_kv_cache=False))


@pytest.mark.parametrize("direction", ["causal", "bidirectional"])
@pytest.mark.parametrize("positions", sorted(SCHEMES))
def test_generation_under_each_attention_direction(direction, positions):
    """Greedy generation equals an argmax loop over `forward` for every direction × positional type; under
    bidirectional attention by recomputing (a cache is stale there), and asking for the cache is refused by name."""
    model = HookedTransformer(_cfg(attention_dir=direction, positional_embedding_type=positions)).eval()
    prompt = torch.tensor([[1, 5, 7, 3], [2, 2, 9, 4]])
    want = _argmax_loop(model, prompt, 8)
    assert torch.equal(model.generate(prompt, max_new_tokens=8, temperature=0), want)
    assert torch.equal(model.generate(prompt, max_new_tokens=8, temperature=0, use_past_kv_cache=False), want)
    seqs, _ = model.beam_search(prompt[:1], beams=1, max_new_tokens=8)
    assert torch.equal(seqs[0], want[0])
    if direction == "bidirectional":
        with pytest.raises(InputError, match="bidirectional"):
            model.generate(prompt, max_new_tokens=8, temperature=0, use_past_kv_cache=True)
    else:
        assert torch.equal(model.generate(prompt, max_new_tokens=8, temperature=0, use_past_kv_cache=True), want)


def test_a_tl2_notebook_needs_only_the_package_name_changed():
    """The imports of ARENA 1.2 and TransformerLens 2.18's demos with `transformer_lens` replaced by `models`: the
    same TransformerLens objects (utils, hook points) or ours (model, config, cache), and TransformerLens' patching
    run on our model equals patching by hand."""
    import transformer_lens

    import models.patching as patching
    import models.utils as utils
    from models import ActivationCache, FactoredMatrix, HookedTransformerConfig  # noqa: F401
    from models import utils as same_utils
    from models.hook_points import HookedRootModule, HookPoint
    from models.past_key_value_caching import HookedTransformerKeyValueCache

    assert same_utils is utils and HookPoint is transformer_lens.hook_points.HookPoint
    assert HookedRootModule is transformer_lens.HookedRootModule and FactoredMatrix is transformer_lens.FactoredMatrix
    assert HookedTransformerKeyValueCache is models.HookedTransformerKeyValueCache
    assert utils.get_act_name("pattern", 1) == "blocks.1.attn.hook_pattern"
    from models import evals

    assert evals.induction_loss is __import__("transformer_lens.evals").evals.induction_loss
    assert utils.lm_cross_entropy_loss is getattr(transformer_lens, "utilities", transformer_lens).lm_cross_entropy_loss
    model = models.load("attn-only-2l")
    assert isinstance(model, HookedRootModule)
    clean = model.to_tokens("a b c d e f a b c")
    corrupt = clean.clone()
    corrupt[0, 1:4] = clean[0, 4:7]
    assert clean.shape == corrupt.shape
    _, cache = model.run_with_cache(clean)
    metric = lambda logits: logits[0, -1, 5]  # noqa: E731
    grid = patching.get_act_patch_resid_pre(model, corrupt, cache, metric)
    assert grid.shape == (model.cfg.n_layers, clean.shape[1])
    name = utils.get_act_name("resid_pre", 1)

    def patch(resid, hook, p=3):
        resid[:, p] = cache[name][:, p]
        return resid

    by_hand = metric(model.run_with_hooks(corrupt, fwd_hooks=[(name, patch)]))
    assert torch.allclose(grid[1, 3], by_hand, atol=1e-5)


def test_checkpoint_folders_carry_transformer_lens_checkpoint_labels():
    """TransformerLens 2.x's `cfg.checkpoint_value` (Main_Demo reads it): the step of a `checkpoints/step-N` folder."""
    root = models.io.checkpoint.resolve("attn-only-2l")
    for folder in sorted((root / "checkpoints").iterdir()):
        cfg = models.load(folder).cfg
        assert (cfg.checkpoint_label_type, cfg.checkpoint_value) == ("step", int(folder.name.split("-")[1]))
    final = models.load("attn-only-2l").cfg
    assert final.checkpoint_value is None and final.checkpoint_index is None
    assert "checkpoint_value" not in final.to_json()

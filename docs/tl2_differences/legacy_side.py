"""Run inside the TransformerLens 2.18 environment (.venv-tl2) by measure.py: builds the four cases, saves each state
dict and config, and TransformerLens 2.18's own numbers, into the folder given."""

import json
import sys

import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

OUT = sys.argv[1]
BASE = dict(n_layers=2, d_model=16, n_heads=4, d_head=4, n_ctx=16, d_vocab=23, d_mlp=32, act_fn="gelu", seed=0)
CASES = {
    "bidirectional-mask": dict(attention_dir="bidirectional"),
    "shortformer-decompose": dict(positional_embedding_type="shortformer"),
    "final-rms-after-ln": dict(final_rms=True),
    "float64-alibi": dict(positional_embedding_type="alibi", dtype=torch.float64, n_heads=3),
}
TOKENS = torch.tensor([[5, 3, 9, 12, 7, 1, 2, 8, 4, 6], [11, 2, 3, 4, 9, 13, 14, 0, 0, 0]])
MASK = torch.tensor([[1] * 10, [1] * 7 + [0] * 3])
results = {}
for name, over in CASES.items():
    torch.manual_seed(0)
    cfg = HookedTransformerConfig(**{**BASE, **over})
    model = HookedTransformer(cfg).eval()
    with torch.no_grad():  # every weight away from its initial value (biases and norm weights too)
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    torch.save(state, f"{OUT}/{name}.pth")
    json.dump({k: (str(v).replace("torch.", "") if isinstance(v, torch.dtype) else v) for k, v in
               {**BASE, **over}.items()}, open(f"{OUT}/{name}.json", "w"))
    with torch.no_grad():
        logits, cache = model.run_with_cache(TOKENS, attention_mask=MASK)
    r = {"logits": logits.tolist()}
    if name == "bidirectional-mask":  # attention mass the real queries of the padded row put on its padding
        r["pad_mass"] = [float(cache["pattern", l][1, :, :7, 7:].sum(-1).mean()) for l in range(cfg.n_layers)]
    if name == "shortformer-decompose":
        stack, labels = cache.decompose_resid(return_labels=True)
        resid = cache["resid_post", -1]
        r["labels"] = labels
        r["decompose_rel_err"] = float((stack.sum(0) - resid).norm() / resid.norm())
    if name == "final-rms-after-ln":
        stack = cache.decompose_resid()
        normed = cache.apply_ln_to_stack(stack, layer=None)
        r["apply_ln_rel_err"] = float((normed.sum(0) - cache["ln_final.hook_normalized"]).norm()
                                      / cache["ln_final.hook_normalized"].norm())
    if name == "float64-alibi":
        r["accumulated_bias_dtype"] = str(model.accumulated_bias(1).dtype)
    results[name] = r
json.dump(results, open(f"{OUT}/legacy.json", "w"))

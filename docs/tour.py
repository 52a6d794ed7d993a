"""The README's five-minute tour, as a script: `python docs/tour.py` prints every output the README shows."""

import torch

import analyses
import circuits
import models

torch.set_num_threads(1)


def show(title, value):
    print(f">>> {title}")
    print(value)
    print()


model = models.load("attn-only-2l")  # a zoo model: config.json + model.safetensors + tokenizer.json, offline
show("model.cfg.n_layers, model.cfg.n_heads, model.cfg.positional_embedding_type",
     (model.cfg.n_layers, model.cfg.n_heads, model.cfg.positional_embedding_type))

logits, cache = model.run_with_cache("def area(r):\n    return 3.14 * r * r\n")  # text in: it carries a tokenizer
show('logits.shape, cache["blocks.1.attn.hook_pattern"].shape',
     (tuple(logits.shape), tuple(cache["blocks.1.attn.hook_pattern"].shape)))
show("model.generate('import os\\nimport ', max_new_tokens=12, temperature=0)",
     repr(model.generate("import os\nimport ", max_new_tokens=12, temperature=0)))

ov = circuits.full_ov_circuit(model, 1, 0)  # W_E W_V W_O W_U, factored: nothing d_vocab² is formed
show("ov = circuits.full_ov_circuit(model, 1, 0); ov.shape, ov.A.shape", (tuple(ov.shape), tuple(ov.A.shape)))
show("circuits.copying_scores(model).round(decimals=2)  # Σλ/Σ|λ| of each head's OV circuit",
     circuits.copying_scores(model).round(decimals=2))
k = circuits.composition_scores(model, "k", subtract_baseline=True)  # [l1, h1, l2, h2]
show('circuits.composition_scores(model, "k", subtract_baseline=True).shape', tuple(k.shape))
show("analyses.induction_scores(model).round(decimals=2)", analyses.induction_scores(model).round(decimals=2))
show("print(analyses.detect_induction_heads(model).markdown(only_positive=True))",
     analyses.detect_induction_heads(model).markdown(only_positive=True))

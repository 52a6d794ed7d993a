"""The four places where TransformerLens 2.18 computes something other than what it documents and we compute what it
documents (issue 33), measured on the same weights: run with our environment's Python,

    python docs/tl2_differences/measure.py        # needs .venv-tl2 (bash tests/tl2/make_legacy_venv.sh)

It runs legacy_side.py inside .venv-tl2 (TransformerLens 2.18 builds each model, saves its state dict, and reports its
numbers), loads each state dict into our model the documented way, and prints both sides as a Markdown table
(docs/coming-from-transformerlens.md quotes it)."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main() -> None:
    import models
    from models.io.interop import config_from_transformer_lens

    legacy_python = ROOT / ".venv-tl2" / "bin" / "python"
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([str(legacy_python), str(Path(__file__).with_name("legacy_side.py")), out], check=True,
                       capture_output=True, timeout=600)
        legacy = json.loads(Path(out, "legacy.json").read_text())
        tokens = torch.tensor([[5, 3, 9, 12, 7, 1, 2, 8, 4, 6], [11, 2, 3, 4, 9, 13, 14, 0, 0, 0]])
        mask = torch.tensor([[1] * 10, [1] * 7 + [0] * 3])
        rows = []
        for name in legacy:
            cfg = json.loads(Path(out, f"{name}.json").read_text())
            if "dtype" in cfg:
                cfg["dtype"] = getattr(torch, cfg["dtype"])
            state = torch.load(Path(out, f"{name}.pth"), weights_only=True)
            model = models.from_transformer_lens_state_dict(state, config_from_transformer_lens(cfg)
                                                            if not isinstance(cfg, models.HookedTransformerConfig)
                                                            else cfg).eval()
            with torch.no_grad():
                logits, cache = model.run_with_cache(tokens, attention_mask=mask)
            theirs = legacy[name]
            if name == "bidirectional-mask":
                ours = [float(cache["pattern", l][1, :, :7, 7:].sum(-1).mean()) for l in range(model.cfg.n_layers)]
                rows.append((name, "attention mass of real queries on padded keys (layer 0, 1)",
                             " / ".join(f"{x:.3f}" for x in theirs["pad_mass"]), " / ".join(f"{x:.3f}" for x in ours)))
            elif name == "shortformer-decompose":
                stack, labels = cache.decompose_resid(return_labels=True)
                resid = cache["resid_post", -1]
                err = float((stack.sum(0) - resid).norm() / resid.norm())
                rows.append((name, "‖Σ decompose_resid − resid_post‖ / ‖resid_post‖ (components)",
                             f"{theirs['decompose_rel_err']:.3f} ({len(theirs['labels'])}, pos_embed counted)",
                             f"{err:.1e} ({len(labels)})"))
            elif name == "final-rms-after-ln":
                normed = cache.apply_ln_to_stack(cache.decompose_resid(), layer=None)
                ref = cache["ln_final.hook_normalized"]
                err = float((normed.sum(0) - ref).norm() / ref.norm())
                rows.append((name, "‖Σ apply_ln_to_stack(decompose_resid) − ln_final output‖ / ‖output‖",
                             f"{theirs['apply_ln_rel_err']:.3f}", f"{err:.1e}"))
            elif name == "float64-alibi":
                exact = model.to(torch.float64)(tokens, attention_mask=mask)  # ours: float64 throughout
                err_theirs = float((torch.tensor(theirs["logits"], dtype=torch.float64).detach() - exact).abs().max())
                err_ours = float((logits.double() - exact).abs().max())
                rows.append((name, "max abs(logits − exact float64 logits) (accumulated_bias dtype)",
                             f"{err_theirs:.1e} ({theirs['accumulated_bias_dtype']})",
                             f"{err_ours:.1e} ({model.accumulated_bias(1).dtype})"))
    print("| case | measure | TransformerLens 2.18 | ours |\n|---|---|---:|---:|")
    for r in rows:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main()

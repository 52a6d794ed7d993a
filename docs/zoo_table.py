"""Print the README's model-zoo table from the shipped models' cards: `python docs/zoo_table.py`.

Reads `models/zoo/*/config.json`, `summary.json` and `measured.json` (written by `circuits train` at the end of
training, the numbers quoted in each `card.md`); no model is run. The table is of the decoder-only models; the
encoder–decoders (config `model_type` "encoder_decoder") have their own rows in the README, from their cards.
"""

import json
from pathlib import Path

ZOO = Path(__file__).resolve().parents[1] / "models" / "zoo"


def _read(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def _max_last_layer(scores) -> float | None:
    return None if not scores else max(scores[-1])


def _heads(scores, layer: int, cut: float = 0.4) -> str:
    if not scores or len(scores) <= layer:
        return "—"
    hits = [f"L{layer}H{h}" for h, v in enumerate(scores[layer]) if v >= cut]
    return ", ".join(hits) or "none"


def n_params(path: Path, biases: bool = True) -> int | None:
    """Parameter count from a safetensors header (8-byte length, then JSON with every tensor's shape); with
    `biases=False` the zero bias buffers that bias-free models still save are left out."""
    if not path.is_file():
        return None
    with open(path, "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    total = 0
    for name, info in header.items():
        if name != "__metadata__" and (biases or not name.rsplit(".", 1)[-1].startswith("b")):
            n = 1
            for s in info["shape"]:
                n *= s
            total += n
    return total


def rows() -> list[str]:
    out = ["| model | architecture | params | tokens seen | val. loss | ICL score | best prev-token (L0) "
           "| best induction (last layer, \\|R\\|=50) | heads ≥ 0.4 |",
           "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for d in sorted(p for p in ZOO.iterdir() if (p / "config.json").is_file()):
        cfg, summ, meas = _read(d / "config.json"), _read(d / "summary.json"), _read(d / "measured.json")
        if cfg.get("model_type") == "encoder_decoder":
            continue
        arch = (f"{cfg['n_layers']}L × {cfg['n_heads']}H, d_model {cfg['d_model']}, "
                + ("attn-only" if cfg.get("attn_only") or cfg.get("d_mlp") is None else f"MLP {cfg['d_mlp']}")
                + f", {cfg['positional_embedding_type']}, norm {cfg['normalization_type']}")
        params = n_params(d / "model.safetensors", biases=cfg.get("use_bias", True))
        prev = meas.get("previous_token_scores")
        ind = meas.get("induction_scores_50")
        f = lambda x, d=3: "—" if x is None else f"{x:.{d}f}"
        heads = []
        if prev and cfg["n_layers"] >= 2:
            heads.append("prev: " + _heads(prev, 0))
        if ind and cfg["n_layers"] >= 2:
            heads.append("induction: " + _heads(ind, cfg["n_layers"] - 1))
        out.append(f"| `{d.name}` | {arch} | {'—' if params is None else f'{params:,}'} | "
                   f"{summ.get('tokens_seen', 0):,} | {f(meas.get('final_val_loss', summ.get('final_val_loss')))} | "
                   f"{f(meas.get('icl_score'), 2)} | {f(None if not prev else max(prev[0]), 2)} | "
                   f"{f(_max_last_layer(ind), 2)} | {'; '.join(heads) or '—'} |")
    return out


if __name__ == "__main__":
    print("\n".join(rows()))

"""Re-measure the zoo's language-model cards from the shipped weights, without training: after a score's
definition changes, `python docs/remeasure_cards.py [NAME ...]` (default: every zoo model with attention layers
and a `metrics.jsonl`, encoder-decoders aside; an encoder-decoder named gets its cross-attention diagonal
accuracy line, `remeasure_seq2seq`).

For each model, the training-time induction scores in `metrics.jsonl` are recomputed wherever weights exist
(the final model and the kept `checkpoints/step-*`), with `analyses.train_metrics.make_eval_fn`'s probe
(|R| = each recorded period, batch 16, seed 0, R from the training split's ids). The values recorded during
training by the definition before 2026-11-27 (ARENA's whole stripe, its two first-copy entries included) stay
in every record under `stripe_induction_scores_{period}` / `stripe_max_induction_{period}`; records without
weights keep only those. Then the card's "Measured" section, `measured.json`, `summary.json`'s `card_numbers`
and `training_curve.png` are rebuilt by `analyses.train_metrics.card_results` / `training_curve_png`, the
functions `circuits train` uses; the rest of the card (training settings, wall time, notes) is left as written.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _write(path: Path, data) -> None:
    """Write atomically: a temporary file beside `path`, then `os.replace`."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data.encode() if isinstance(data, str) else data)
    os.replace(tmp, path)


def _periods(records) -> list[int]:
    keys = {k for r in records for k in r if re.fullmatch(r"(stripe_)?induction_scores_\d+", k)}
    return sorted({int(k.rsplit("_", 1)[1]) for k in keys})


def remeasure(name: str) -> dict:
    import torch

    import models
    from analyses.scores import induction_scores
    from analyses.train_metrics import _rounded, card_results, loss_labels, training_curve_png
    from models.io.checkpoint import ZOO_DIR
    from models.training.loop import TrainConfig, build_data

    folder = ZOO_DIR / name
    cfg = TrainConfig.from_json((folder / "train_config.json").read_text())
    cfg.cache_dir = None
    model = models.load(folder)
    _, _, corpus = build_data(cfg, model.cfg, tokenizer=model.tokenizer)
    seen = torch.as_tensor(corpus.seen_ids(), dtype=torch.long)
    summary = json.loads((folder / "summary.json").read_text())
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]
    periods = _periods(records)
    weights = {int(p.name.split("-")[1]): p for p in (folder / "checkpoints").glob("step-*")} \
        if (folder / "checkpoints").is_dir() else {}
    weights[int(summary["steps"])] = folder
    changed = {}
    for r in records:
        if not any(f"induction_scores_{p}" in r or f"stripe_induction_scores_{p}" in r for p in periods):
            continue
        for p in periods:
            if f"induction_scores_{p}" in r and f"stripe_induction_scores_{p}" not in r:
                r[f"stripe_induction_scores_{p}"] = r.pop(f"induction_scores_{p}")
                r[f"stripe_max_induction_{p}"] = r.pop(f"max_induction_{p}")
        step = int(r["step"])
        if step not in weights:
            continue
        m = model if weights[step] == folder else models.load(weights[step])
        m.eval()
        m.tokenizer = m.tokenizer or model.tokenizer
        for p in periods:
            if f"stripe_induction_scores_{p}" in r:
                s = induction_scores(m, seq_len=p, batch=16, seed=0, tokens_from=seen)
                r[f"induction_scores_{p}"] = _rounded(s)
                r[f"max_induction_{p}"] = round(float(s[-1].max()), 4)
                changed[(step, p)] = (r[f"stripe_max_induction_{p}"], r[f"max_induction_{p}"])
    lines, numbers = card_results(model, records, summary, corpus)
    card = (folder / "card.md").read_text()
    head, rest = card.split("## Measured (final model)\n\n", 1)
    tail = rest[rest.index("\n\n") :] if "\n\n" in rest else "\n"
    card = head + "## Measured (final model)\n\n" + "\n".join(lines) + tail
    summary["card_numbers"] = numbers
    _write(folder / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in records))
    _write(folder / "card.md", card)
    _write(folder / "measured.json", json.dumps(numbers, indent=1))
    _write(folder / "summary.json", json.dumps(summary, indent=2))
    _write(folder / "training_curve.png", training_curve_png(records, name, loss_labels(cfg)))
    return changed


def remeasure_seq2seq(name: str) -> str:
    """An encoder–decoder card: the cross-attention OV circuits' top-1 / top-5 diagonal accuracy line
    (`analyses.seq2seq_card.cross_diagonal_line`) after the copying-score line, and its numbers."""
    import models
    from analyses.seq2seq_card import cross_diagonal_line
    from models.io.checkpoint import ZOO_DIR

    folder = ZOO_DIR / name
    model = models.load(folder)
    measured = json.loads((folder / "measured.json").read_text())
    summary = json.loads((folder / "summary.json").read_text())
    line = cross_diagonal_line(model, measured)
    lines = [ln for ln in (folder / "card.md").read_text().split("\n") if not ln.startswith("- top-1 / top-5 diag")]
    at = next(i for i, ln in enumerate(lines) if ln.startswith("- copying scores Σλ/Σ|λ| of the cross-attention"))
    lines.insert(at + 1, line)
    summary.setdefault("card_numbers", {}).update({k: v for k, v in measured.items() if "diagonal" in k})
    _write(folder / "card.md", "\n".join(lines))
    _write(folder / "measured.json", json.dumps(measured, indent=1))
    _write(folder / "summary.json", json.dumps(summary, indent=2))
    return line


def main(names: list[str]) -> int:
    from models.io.checkpoint import ZOO_DIR

    if not names:
        names = sorted(d.name for d in ZOO_DIR.iterdir() if (d / "metrics.jsonl").is_file()
                       and json.loads((d / "config.json").read_text()).get("n_layers", 0) > 0
                       and "d_vocab_src" not in json.loads((d / "config.json").read_text()))
    for name in names:
        if "d_vocab_src" in json.loads((ZOO_DIR / name / "config.json").read_text()):
            print(f"{name}: {remeasure_seq2seq(name)}")
            continue
        for (step, p), (old, new) in sorted(remeasure(name).items()):
            print(f"{name} step {step} |R|={p}: best last-layer induction {old} (whole stripe) -> {new}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

"""Re-measure the zoo's language-model cards from the shipped weights, without training: after a score's
definition changes, `python docs/remeasure_cards.py [NAME ...]` (default: every zoo model with attention layers
and a `metrics.jsonl`, encoder-decoders aside; an encoder-decoder named gets its cross-attention diagonal
accuracy line, `remeasure_seq2seq`). `python docs/remeasure_cards.py --corpus [NAME ...]` (default: every language
model, attn-only-0l included) re-measures every corpus-dependent number of the cards on the pinned corpus
(`remeasure_on_corpus`).

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


TRAINED_ON = ("the running standard library of the Python 3.11.7 that trained it (`stdlib` before the corpus was "
              "pinned: another build than the snapshot's, no checksum recorded)")


def remeasure_on_corpus(name: str) -> dict:
    """Re-measure every corpus-dependent number of a language-model card on the pinned corpus (`"stdlib"`, the
    snapshot `models.data.corpora.PINNED`), from the shipped weights: the validation loss (`evaluate_loss` on
    `val_sequences` validation windows, as training measured it), the unigram baseline, the checkpoint scores of the
    final model (`make_eval_fn`: ICL on `ICL_EXAMPLES` windows, previous-token scores, induction scores with R from
    the training split's ids), the 1L copying table and the 0L direct-path fit (`card_results`). The card's data line
    names the snapshot and its sha256 and says what text trained the model; the Measured section is rebuilt;
    `summary.json` gets the new numbers, `corpus` (name, sha256) and, once, `at_training` (the numbers as the
    training run measured them on its own library). `metrics.jsonl` and the training curve stay the training run's
    record. Returns {number: (old, new)} for the numbers that changed."""
    import torch

    import models
    from analyses.scores import ICL_EXAMPLES
    from analyses.train_metrics import card_results, data_line, make_eval_fn
    from models.data.corpora import unigram_baseline_loss
    from models.io.checkpoint import ZOO_DIR
    from models.training.loop import TrainConfig, build_data, evaluate_loss

    folder = ZOO_DIR / name
    cfg = TrainConfig.from_json((folder / "train_config.json").read_text())
    cfg.cache_dir = None
    model = models.load(folder)
    model.eval()
    batches, _, corpus = build_data(cfg, model.cfg, tokenizer=model.tokenizer)
    summary = json.loads((folder / "summary.json").read_text())
    old_numbers = json.loads((folder / "measured.json").read_text())
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]
    if "at_training" not in summary:
        summary["at_training"] = {"corpus": TRAINED_ON, **{k: summary[k] for k in (
            "final_val_loss", "unigram_val_loss", "train_tokens_in_corpus", "val_tokens_in_corpus") if k in summary},
            "card_numbers": summary.get("card_numbers")}
    with torch.no_grad():
        val_loss = evaluate_loss(model, torch.as_tensor(batches.val_batch(cfg.val_sequences)))
    summary.update(final_val_loss=val_loss, unigram_val_loss=unigram_baseline_loss(corpus),
                   train_tokens_in_corpus=int(corpus.train.size), val_tokens_in_corpus=int(corpus.val.size),
                   corpus=corpus.record())
    ev = make_eval_fn(model.tokenizer, batches.val_batch(ICL_EXAMPLES), corpus.seen_ids(), periods=(50, 100))(model)
    last = max(i for i, r in enumerate(records) if "icl_score" in r)
    now = [dict(r, **ev) if i == last else r for i, r in enumerate(records)]  # the final model's scores, re-measured
    lines, numbers = card_results(model, now, summary, corpus)
    card = (folder / "card.md").read_text()
    at = summary["at_training"]
    data = (data_line(cfg, corpus, summary) + f"\n- training text: {TRAINED_ON}: {at['train_tokens_in_corpus']:,} "
            f"training and {at['val_tokens_in_corpus']:,} validation tokens, validation loss then "
            f"{at['final_val_loss']:.4f}; every number under Measured is measured on the snapshot above "
            "(`python docs/remeasure_cards.py --corpus`)")
    card = re.sub(r"^- data: .*\n(- training text: .*\n)?", lambda _: data + "\n", card, count=1, flags=re.M)
    head, rest = card.split("## Measured (final model)\n\n", 1)
    tail = rest[rest.index("\n\n") :] if "\n\n" in rest else "\n"
    card = head + "## Measured (final model)\n\n" + "\n".join(lines) + tail
    summary["card_numbers"] = numbers
    _write(folder / "card.md", card)
    _write(folder / "measured.json", json.dumps(numbers, indent=1))
    _write(folder / "summary.json", json.dumps(summary, indent=2))
    return {k: (old_numbers.get(k), v) for k, v in numbers.items() if old_numbers.get(k) != v}


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

    on_corpus = "--corpus" in names
    names = [n for n in names if n != "--corpus"]
    if not names:
        names = sorted(d.name for d in ZOO_DIR.iterdir() if (d / "metrics.jsonl").is_file()
                       and (on_corpus or json.loads((d / "config.json").read_text()).get("n_layers", 0) > 0)
                       and "d_vocab_src" not in json.loads((d / "config.json").read_text()))
    for name in names:
        if on_corpus:
            for key, (old, new) in remeasure_on_corpus(name).items():
                print(f"{name} {key}: {json.dumps(old)} -> {json.dumps(new)}")
            continue
        if "d_vocab_src" in json.loads((ZOO_DIR / name / "config.json").read_text()):
            print(f"{name}: {remeasure_seq2seq(name)}")
            continue
        for (step, p), (old, new) in sorted(remeasure(name).items()):
            print(f"{name} step {step} |R|={p}: best last-layer induction {old} (whole stripe) -> {new}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

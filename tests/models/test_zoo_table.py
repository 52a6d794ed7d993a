"""docs/zoo_table.py prints the README's zoo table from the shipped cards: one row per decoder-only model, its
validation loss the card's, and the encoder–decoders (which have their own README rows) left out, not a KeyError."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_zoo_table_rows_are_the_cards():
    spec = importlib.util.spec_from_file_location("zoo_table", ROOT / "docs" / "zoo_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = mod.rows()[2:]
    zoo = ROOT / "models" / "zoo"
    decoders = sorted(d.name for d in zoo.iterdir() if (d / "config.json").is_file()
                      and json.loads((d / "config.json").read_text()).get("model_type") != "encoder_decoder")
    assert [r.split("`")[1] for r in rows] == decoders and len(decoders) >= 4
    for r, name in zip(rows, decoders, strict=True):
        meas = json.loads((zoo / name / "measured.json").read_text())
        assert r.split(" | ")[4] == f"{meas['final_val_loss']:.3f}"

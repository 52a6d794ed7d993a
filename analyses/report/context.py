"""What every report section reads: the model, its validation text and windows, the run folder, the figures written
so far and `cache`, the values sections share (each section declares the keys it reads and writes; `run.py` checks the
split over two processes against those declarations)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch


@dataclass
class Context:
    model: object
    name: str
    out_dir: Path
    text: torch.Tensor | None  # 1-D validation token stream, or None (no tokenizer / corpus)
    windows: torch.Tensor | None  # [n, n_ctx] validation windows starting with BOS
    vocab: torch.Tensor | None  # ids seen in the corpus (random probes are drawn from them)
    run_dir: Path | None
    seed: int = 0
    files: list[Path] = field(default_factory=list)
    cache: dict = field(default_factory=dict)
    train_text: object = None  # 1-D training split of the corpus (numpy memmap), or None
    train_config: dict = field(default_factory=dict)  # the run's train_config.json, when the model has one
    #: `cache` keys computed on first use from the model and the context alone (`detection`, the encoder–decoder
    #: sections' `probes`): any section, in either process, may compute them; no section declares them
    memos = frozenset({"detect", "encdec_probes"})

    @property
    def cfg(self):
        return self.model.cfg

    @property
    def attn_only(self) -> bool:
        return bool(getattr(self.cfg, "attn_only", False)) or getattr(self.cfg, "d_mlp", None) is None

    def figure(self, fig, name: str, caption: str) -> str:
        import matplotlib.pyplot as plt

        path = self.out_dir / f"{name}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        self.files.append(path)
        return f"![{caption}]({path.name})\n\n*{caption}*\n"

    def compute_memos(self, keys) -> None:
        """Compute the memos named in `keys` (of `memos`) that a method of this class computes."""
        if "detect" in keys:
            self.detection()

    def detection(self):
        if "detect" not in self.cache:
            from ..detect import detect_induction_heads, detect_previous_token_heads

            prev_tokens = self.windows[:8] if self.windows is not None else None
            self.cache["detect"] = (
                detect_induction_heads(self.model, seed=self.seed, tokens_from=self.vocab, prev_tokens=prev_tokens),
                detect_previous_token_heads(self.model, prev_tokens, seed=self.seed),
            )
        return self.cache["detect"]

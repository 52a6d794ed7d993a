"""`PatchResult`: the labelled tensor every patching tool returns (activation, attribution and path patching)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .metrics import normalized


@dataclass
class PatchResult:
    """The metric of each patched run, labelled.

    `per_prompt [*axes, batch]`: the metric of the run patched at that cell, per prompt (NaN: a cell that was not
    measured, e.g. a path from a head to an earlier one). `axes` names the cell axes (`layer`, `pos`, `head`,
    `component`, `sender`, `receiver`) and `labels` labels each axis' entries. `clean` and `corrupt` `[batch]`: the
    metric of the unpatched clean and corrupted runs. `direction`: "denoising" (the corrupted run with clean
    activations patched in) or "noising" (the clean run with corrupted activations patched in). `tokens`: the first
    clean prompt's token strings (for position labels), when the model has a tokenizer."""

    kind: str
    direction: str
    metric: str
    axes: tuple[str, ...]
    labels: tuple[tuple[str, ...], ...]
    per_prompt: torch.Tensor
    clean: torch.Tensor
    corrupt: torch.Tensor
    tokens: list[str] | None = None

    @property
    def values(self) -> torch.Tensor:
        """The patched metric averaged over prompts, `[*axes]`."""
        return self.per_prompt.mean(-1)

    @property
    def clean_value(self) -> float:
        return float(self.clean.mean())

    @property
    def corrupt_value(self) -> float:
        return float(self.corrupt.mean())

    def normalized(self) -> torch.Tensor:
        """`metrics.normalized` of `values`: 0 = the corrupted run's metric, 1 = the clean run's."""
        return normalized(self.values, self.clean_value, self.corrupt_value)

    def share(self) -> torch.Tensor:
        """The share of the clean–corrupted difference that the patched activation carries: the normalised metric
        when denoising (how much of the clean behaviour it restores), one minus it when noising (how much of it
        breaks when only this activation is corrupted)."""
        n = self.normalized()
        return n if self.direction == "denoising" else 1 - n

    def label(self, index: tuple[int, ...]) -> str:
        """A cell's name: `L1H2`, `L0 pos 5 'x'`, `k: L0H1 → L1H2`."""
        lab = {a: self.labels[d][i] for d, (a, i) in enumerate(zip(self.axes, index))}
        parts = []
        if "component" in lab:
            parts.append(f"{lab['component']}:")
        if "sender" in lab:
            parts.append(f"{lab['sender']} → {lab['receiver']}")
        if "layer" in lab:
            parts.append(f"L{lab['layer']}{lab['head']}" if "head" in lab else f"L{lab['layer']}")
        if "pos" in lab:
            parts.append(f"pos {lab['pos']}")
        return " ".join(parts)

    def top(self, k: int = 10, min_share: float = 0.0) -> list[tuple[str, float, float]]:
        """The `k` cells whose share is largest in magnitude (and at least `min_share`): `(label, patched metric,
        share)`."""
        share, vals = self.share(), self.values
        flat = share.reshape(-1).nan_to_num(0.0).abs()
        order = flat.argsort(descending=True)[:k]
        out = []
        for i in order.tolist():
            idx = tuple(int(j) for j in torch.unravel_index(torch.tensor(i), share.shape))
            if not torch.isnan(share[idx]) and abs(float(share[idx])) >= min_share:
                out.append((self.label(idx), float(vals[idx]), float(share[idx])))
        return out

    def to_dict(self) -> dict:
        return {"kind": self.kind, "direction": self.direction, "metric": self.metric, "axes": list(self.axes),
                "labels": [list(x) for x in self.labels], "clean": self.clean_value, "corrupt": self.corrupt_value,
                "values": self.values.tolist(), "share": self.share().tolist(), "tokens": self.tokens}

    def markdown(self, k: int = 10, min_share: float = 0.0) -> str:
        from ..util import markdown_table

        return markdown_table(["patched", f"{self.metric} (patched)", "share of the effect"],
                              [[lab, v, s] for lab, v, s in self.top(k, min_share)])

    def __str__(self) -> str:
        head = (f"PatchResult({self.kind}, {self.direction}, {self.metric}: clean {self.clean_value:.4f}, corrupted "
                f"{self.corrupt_value:.4f}; axes {', '.join(self.axes)})")
        return head + "\n" + self.markdown()

"""Training dynamics from a training run's folder: loss curve with the phase-change bump, in-context-learning
score and per-head induction scores over tokens seen, and the window where induction heads formed.

Olsson et al. (2022): induction heads form abruptly, together with a jump in the in-context-learning score
(< 0.15 nats before, ≈ 0.4 after) and a bump in the loss curve; one-layer models show none of it. Reads the
`metrics.jsonl` that `models.train.train` writes (records with `tokens`, `train_loss`, `val_loss` and, at
checkpoints, the `analyses.train_metrics` scores: `icl_score`, `induction_scores_{period}` `[layer][head]`,
`previous_token_scores`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from models.model import head_label

from .util import markdown_table

#: Induction heads have "formed" once the best layer ≥ 1 induction score crosses this (ARENA's threshold).
FORMED = 0.4


def _read_metrics(path: Path) -> list[dict]:
    out = []
    for line in path.read_text(errors="replace").splitlines():  # binary garbage: lines that are not JSON
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:  # a torn last line of a killed run
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


@dataclass
class TrainingDynamics:
    """Series over tokens seen (each a list of (tokens, value)), and what they say about the phase change.

    `formation_window`: (tokens, tokens) between the last checkpoint whose best layer ≥ 1 induction score is
    below 20 % of `FORMED` and the first at or above `FORMED` (None when it never forms). `bump`: tokens at which
    the validation loss falls fastest per log-token (the phase-change bump; None with < 3 points).
    `icl_before` / `icl_after`: ICL score at the window's start and at the end of training."""

    run_dir: str
    train_loss: list[tuple[int, float]]
    val_loss: list[tuple[int, float]]
    icl: list[tuple[int, float]]
    induction: list[tuple[int, torch.Tensor]]  # per-head [layer, head] induction scores
    induction_key: str | None
    formation_window: tuple[int, int] | None
    bump: int | None
    icl_before: float | None
    icl_after: float | None
    checkpoints: list[str] = field(default_factory=list)

    @property
    def best_induction(self) -> list[tuple[int, float]]:
        """Best layer ≥ 1 induction score at each checkpoint (all layers for 1-layer models)."""
        return [(t, float((s[1:] if s.shape[0] > 1 else s).max())) for t, s in self.induction]

    def markdown(self) -> str:
        fw = f"never (no head reached {FORMED:.1f})" if self.formation_window is None else \
            f"{self.formation_window[0]:,} – {self.formation_window[1]:,} tokens"
        rows = [["induction heads formed", fw],
                ["steepest loss drop (bump)", "—" if self.bump is None else f"{self.bump:,} tokens"],
                ["ICL score before", self.icl_before], ["ICL score at the end", self.icl_after],
                ["final validation loss", self.val_loss[-1][1] if self.val_loss else None]]
        if self.induction:
            t, s = self.induction[-1]
            top = sorted(((float(s[l, h]), l, h) for l in range(s.shape[0]) for h in range(s.shape[1])), reverse=True)
            rows.append(["strongest induction heads at the end",
                         ", ".join(f"{head_label(l, h)} {v:.2f}" for v, l, h in top[:3])])
        return markdown_table(["quantity", "value"], rows)

    def __str__(self) -> str:
        return f"TrainingDynamics({self.run_dir})\n{self.markdown()}"


def _series(records, key):
    return [(int(r["tokens"]), float(r[key])) for r in records if key in r and "tokens" in r and r[key] is not None]


def training_dynamics(run_dir) -> TrainingDynamics:
    """Read `run_dir/metrics.jsonl` (and list `run_dir/checkpoints/step-*`) into a `TrainingDynamics`."""
    run = Path(run_dir)
    path = run / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: training_dynamics needs a training run's folder")
    recs = sorted(_read_metrics(path), key=lambda r: (r.get("tokens", 0), r.get("step", 0)))
    keys = sorted({k for r in recs for k in r if k.startswith("induction_scores_")},
                  key=lambda k: abs(int(k.rsplit("_", 1)[1]) - 50) if k.rsplit("_", 1)[1].isdigit() else 99)
    key = keys[0] if keys else None
    induction = [(int(r["tokens"]), torch.tensor(r[key], dtype=torch.float32)) for r in recs if key and key in r]
    icl = _series(recs, "icl_score")
    val = _series(recs, "val_loss")
    window = _formation_window(induction)
    bump = _steepest_drop(val)
    icl_after = icl[-1][1] if icl else None
    icl_before = None
    if icl:
        start = window[0] if window else icl[-1][0]
        before = [v for t, v in icl if t <= start]
        icl_before = before[-1] if before else icl[0][1]
    ck = run / "checkpoints"
    cks = sorted(str(p) for p in ck.glob("step-*") if p.is_dir()) if ck.is_dir() else []
    return TrainingDynamics(str(run), _series(recs, "train_loss"), val, icl, induction, key, window, bump,
                            icl_before, icl_after, cks)


def _formation_window(induction) -> tuple[int, int] | None:
    return _window_from_best([(t, float((s[1:] if s.shape[0] > 1 else s).max())) for t, s in induction])


def _window_from_best(best: list[tuple[int, float]]) -> tuple[int, int] | None:
    formed = next((i for i, (_, v) in enumerate(best) if v >= FORMED), None)
    if formed is None:
        return None
    before = [i for i in range(formed) if best[i][1] < 0.2 * FORMED]
    start = best[before[-1]][0] if before else best[0][0]
    return start, best[formed][0]


def _steepest_drop(val: list[tuple[int, float]]) -> int | None:
    pts = [(t, v) for t, v in val if t > 0]
    if len(pts) < 3:
        return None
    x = torch.tensor([t for t, _ in pts], dtype=torch.float64).log()
    y = torch.tensor([v for _, v in pts], dtype=torch.float64)
    slope = (y[1:] - y[:-1]) / (x[1:] - x[:-1]).clamp_min(1e-12)
    i = int(slope[1:].argmin()) + 1 if slope.numel() > 1 else 0  # skip the first interval (initial fall)
    return int(round(float((x[i].exp() * x[i + 1].exp()).sqrt())))


def plot_training_dynamics(dyn: TrainingDynamics):
    """Three panels over tokens seen (log scale): train/validation loss with the formation window shaded and
    the bump marked; the ICL score; each head's induction score (layer ≥ 1 coloured) with the 0.4 line."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
    ax = axes[0]
    for name, s, kw in (("train", dyn.train_loss, dict(lw=0.8, alpha=0.6)), ("validation", dyn.val_loss, dict(lw=2))):
        pts = [(t, v) for t, v in s if t > 0]
        if pts:
            ax.plot(*zip(*pts), label=name, **kw)
    ax.set_ylabel("loss (nats)")
    ax.set_title("Loss")
    ax2 = axes[1]
    if dyn.icl:
        pts = [(t, v) for t, v in dyn.icl if t > 0]
        ax2.plot(*zip(*pts), marker="o", ms=3, color="tab:purple")
    ax2.axhline(0, color="0.8", lw=0.8)
    ax2.set_ylabel("loss(late) − loss(early) (nats)")
    ax2.set_title("In-context learning score (more negative = more ICL)")
    ax3 = axes[2]
    if dyn.induction:
        ts = [t for t, _ in dyn.induction]
        S = torch.stack([s for _, s in dyn.induction])  # [ckpt, layer, head]
        for l in range(S.shape[1]):
            for h in range(S.shape[2]):
                kw = dict(color="0.75", lw=0.8) if (l == 0 and S.shape[1] > 1) else dict(lw=1.5)
                label = head_label(l, h) if (l or S.shape[1] == 1) else None
                ax3.plot([max(t, 1) for t in ts], S[:, l, h].numpy(), label=label, **kw)
        ax3.axhline(FORMED, color="tab:red", ls="--", lw=1)
        ax3.legend(fontsize=6, ncol=2)
    ax3.set_ylabel(f"induction score ({dyn.induction_key or '—'})")
    ax3.set_title("Per-head induction scores (layer 0 grey)")
    for a in axes:
        a.set_xscale("log")
        a.set_xlabel("tokens seen")
        if dyn.formation_window:
            a.axvspan(*[max(t, 1) for t in dyn.formation_window], color="tab:orange", alpha=0.15)
        if dyn.bump:
            a.axvline(dyn.bump, color="tab:orange", ls=":", lw=1.5)
    axes[0].legend()
    fig.suptitle("Training dynamics (shaded: induction heads forming; dotted: steepest loss drop)")
    fig.tight_layout()
    return fig


@dataclass
class CheckpointScores:
    """Scores re-measured on each saved checkpoint (more windows than the training-time evaluation)."""

    steps: list[int]
    tokens: list[int | None]
    icl: list[float | None]  # in-context learning score on the given windows
    best_induction: list[float | None]  # best layer ≥ 1 induction score (ARENA, |R| = 50 or what fits)
    val_loss: list[float | None]

    def formation_window(self) -> tuple[int, int] | None:
        """(step, step) of induction-head formation by the rule of `TrainingDynamics.formation_window`."""
        return _window_from_best([(s, b) for s, b in zip(self.steps, self.best_induction) if b is not None])

    def markdown(self) -> str:
        rows = [[s, t, l, i, b] for s, t, l, i, b in zip(self.steps, self.tokens, self.val_loss, self.icl,
                                                          self.best_induction)]
        return markdown_table(["step", "tokens seen", "loss on the windows", "ICL score", "best induction score"],
                              rows)


@torch.no_grad()
def checkpoint_scores(run_dir, windows=None, tokens_from=None, early: int | None = None, late: int | None = None,
                      tokenizer=None, max_checkpoints: int | None = None) -> CheckpointScores:
    """Load every `run_dir/checkpoints/step-*` model and measure the ICL score on `windows [n, n_ctx]` (positions
    `early`, `late`: default Olsson's 50 and 500 of 512 scaled to the window) and the best layer ≥ 1 induction
    score (`analyses.scores`). `tokenizer` (default: the run's tokenizer.json) gives the probes' BOS/specials.
    `max_checkpoints`: measure at most this many, evenly spread over the list (first and last always kept)."""
    import models

    from .scores import icl_positions, in_context_learning_differences, induction_scores, position_losses

    run = Path(run_dir)
    recs = _read_metrics(run / "metrics.jsonl") if (run / "metrics.jsonl").is_file() else []
    tok_at = {int(r["step"]): int(r["tokens"]) for r in recs if "step" in r and "tokens" in r}
    if tokenizer is None and (run / "tokenizer.json").is_file():
        from models.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(run / "tokenizer.json")
    folders = sorted((p for p in (run / "checkpoints").glob("step-*") if (p / "config.json").is_file()),
                     key=lambda p: int(p.name.split("-")[1])) if (run / "checkpoints").is_dir() else []
    if max_checkpoints is not None and len(folders) > max_checkpoints >= 2:
        keep = torch.linspace(0, len(folders) - 1, max_checkpoints).round().long().unique().tolist()
        folders = [folders[i] for i in keep]
    out = CheckpointScores([], [], [], [], [])
    for f in folders:
        step = int(f.name.split("-")[1])
        m = models.load(f)
        m.eval()
        m.tokenizer = m.tokenizer or tokenizer
        icl = loss = best = None
        if windows is not None:
            w = torch.as_tensor(windows, dtype=torch.long).to(m.W_E.device)
            e, lt = icl_positions(w.shape[1])
            per = position_losses(m, w)  # one forward gives both numbers
            icl = float(in_context_learning_differences(m, w, early or e, late or lt, losses=per).mean())
            loss = float(per.mean())
        if m.cfg.n_layers:
            s = induction_scores(m, seq_len=min(50, (m.cfg.n_ctx - 1) // 2), tokens_from=tokens_from)
            best = float((s[1:] if s.shape[0] > 1 else s).max())
        out.steps.append(step)
        out.tokens.append(tok_at.get(step))
        out.icl.append(icl)
        out.best_induction.append(best)
        out.val_loss.append(loss)
    return out

"""Training dynamics from a training run's folder: loss curve with the phase-change bump, in-context-learning
score and per-head induction scores over tokens seen, and the window where induction heads formed.

Olsson et al. (2022): induction heads form abruptly, together with a jump in the in-context-learning score
(< 0.15 nats before, ≈ 0.4 after) and a bump in the loss curve; one-layer models show none of it. Reads the
`metrics.jsonl` that `models.training.loop.train` writes (records with `tokens`, `train_loss`, `val_loss` and, at
checkpoints, the `analyses.train_metrics` scores: `icl_score`, `induction_scores_{period}` `[layer][head]`,
`previous_token_scores`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from models.arch.model import head_label

from .util import markdown_table

#: Induction heads have "formed" once the best layer ≥ 1 induction score crosses this (ARENA's threshold).
FORMED = 0.4


def _read_metrics(path: Path) -> list[dict]:
    """The records of a run's metrics.jsonl, through its reader (`models.io.readers.read_metrics`)."""
    from models.io.readers import read_metrics

    return read_metrics(path)


@dataclass
class TrainingDynamics:
    """Series over tokens seen (each a list of (tokens, value)), and what they say about the phase change.

    `formation_window`: (tokens, tokens) between the last checkpoint whose best layer ≥ 1 induction score is
    below 20 % of `FORMED` and the first at or above `FORMED` (None when it never forms). `bump`: the checkpoint
    (tokens) after which the validation loss falls fastest relative to before (`loss_bump`), None when the loss
    never speeds up that much; `bump_slopes`: the loss slopes (nats per e-fold of tokens) over the doubling
    before and after it. `icl_before` / `icl_after`: ICL score at the window's start (a checkpoint before the
    onset) and at the end of training; `icl_se`: the standard errors recorded with them (None when the run
    did not record them)."""

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
    bump_slopes: tuple[float, float] | None = None
    icl_se: list[tuple[int, float]] = field(default_factory=list)
    loss_labels: tuple[str, str] = ("train", "validation")  # from the run's train_config.json (`loss_labels`)

    @property
    def best_induction(self) -> list[tuple[int, float]]:
        """Best layer ≥ 1 induction score at each checkpoint (all layers for 1-layer models)."""
        return [(t, float((s[1:] if s.shape[0] > 1 else s).max())) for t, s in self.induction]

    def markdown(self) -> str:
        fw = f"never (no head reached {FORMED:.1f})" if self.formation_window is None else \
            f"{self.formation_window[0]:,} – {self.formation_window[1]:,} tokens"
        rows = [["induction heads formed", fw],
                ["loss bump (the loss falls ≥ 2× faster after than before)", "none" if self.bump is None else
                 f"{self.bump:,} tokens ({self.bump_slopes[0]:+.2f} → {self.bump_slopes[1]:+.2f} nats per e-fold "
                 "of tokens)"],
                [f"ICL score before the onset ({self._icl_at(True)})", self._icl_value(self.icl_before, True)],
                [f"ICL score at the end ({self._icl_at(False)})", self._icl_value(self.icl_after, False)],
                ["final validation loss", self.val_loss[-1][1] if self.val_loss else None]]
        if self.induction:
            t, s = self.induction[-1]
            top = sorted(((float(s[l, h]), l, h) for l in range(s.shape[0]) for h in range(s.shape[1])), reverse=True)
            rows.append(["strongest induction heads at the end",
                         ", ".join(f"{head_label(l, h)} {v:.2f}" for v, l, h in top[:3])])
        return markdown_table(["quantity", "value"], rows)

    def _icl_tokens(self, before: bool) -> int | None:
        if not self.icl:
            return None
        if not before:
            return self.icl[-1][0]
        start = self.formation_window[0] if self.formation_window else self.icl[-1][0]
        at = [t for t, _ in self.icl if t <= start]
        return at[-1] if at else self.icl[0][0]

    def _icl_at(self, before: bool) -> str:
        t = self._icl_tokens(before)
        return "—" if t is None else f"{t:,} tokens"

    def _icl_value(self, v: float | None, before: bool) -> str | None:
        se = dict(self.icl_se).get(self._icl_tokens(before))
        return None if v is None else (f"{v:+.3f} ± {se:.3f}" if se is not None else f"{v:+.3f} (s.e. not recorded)")

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
    bump, slopes = loss_bump(val)
    icl_after = icl[-1][1] if icl else None
    icl_before = None
    if icl:
        start = window[0] if window else icl[-1][0]
        before = [v for t, v in icl if t <= start]
        icl_before = before[-1] if before else icl[0][1]
    ck = run / "checkpoints"
    cks = sorted(str(p) for p in ck.glob("step-*") if p.is_dir()) if ck.is_dir() else []
    return TrainingDynamics(str(run), _series(recs, "train_loss"), val, icl, induction, key, window, bump,
                            icl_before, icl_after, cks, slopes, _series(recs, "icl_score_se"), _run_loss_labels(run))


def _run_loss_labels(run: Path) -> tuple[str, str]:
    """`train_metrics.loss_labels` of the run's own train_config.json (plain labels when it has none)."""
    from .train_metrics import loss_labels

    path = run / "train_config.json"
    if not path.is_file():
        return loss_labels(None)
    from models.io.readers import read_train_config
    from models.training.loop import TrainConfig

    try:
        return loss_labels(TrainConfig.from_dict(read_train_config(path)))
    except (ValueError, TypeError):  # a config this version cannot read: say nothing it does not know
        return loss_labels(None)


def _formation_window(induction) -> tuple[int, int] | None:
    return _window_from_best([(t, float((s[1:] if s.shape[0] > 1 else s).max())) for t, s in induction])


def _window_from_best(best: list[tuple[int, float]]) -> tuple[int, int] | None:
    formed = next((i for i, (_, v) in enumerate(best) if v >= FORMED), None)
    if formed is None:
        return None
    before = [i for i in range(formed) if best[i][1] < 0.2 * FORMED]
    start = best[before[-1]][0] if before else best[0][0]
    return start, best[formed][0]


#: A loss bump: over the doubling of tokens after a checkpoint the validation loss falls at least BUMP_RATIO times
#: as fast (per e-fold of tokens) as over the doubling before it, and faster by at least BUMP_MIN nats per e-fold.
BUMP_RATIO, BUMP_MIN = 2.0, 0.1


def loss_bump(val: list[tuple[int, float]]) -> tuple[int | None, tuple[float, float] | None]:
    """`(tokens, (slope before, slope after))` of the phase-change bump in a validation-loss curve, or
    `(None, None)` when it has none.

    Olsson et al. (2022) see the induction-head phase change as a bump in the loss curve: the loss, which had
    been levelling off, falls faster again. A loss curve without one flattens steadily on a log-token axis. So
    for each checkpoint t whose window [t/2, t] starts after the loss first came 5 % below its first recorded
    value (training starts on a plateau near ln d_vocab; falling off it is not a bump), fit the loss against
    ln(tokens) by least squares over [t/2, t] and over [t, 2t] (at least 3 points each): the slopes s_before and
    s_after, in nats per e-fold of tokens. A bump needs s_after ≤ BUMP_RATIO ·
    s_before and s_after ≤ s_before − BUMP_MIN (speeding up by a clear margin, not by noise); it is placed at
    the checkpoint where s_before − s_after is largest. Measured on the zoo: attn-only-2l −0.15 → −0.86 at 7.2M
    tokens (its induction heads form between 6.1M and 7.7M); attn-only-1l at most −0.29 → −0.39, attn-only-0l
    and gelu-2l never faster: no bump."""
    first = min(val, key=lambda p: p[0])[1] if val else None
    pts = sorted((t, v) for t, v in val if t > 0)
    if len(pts) < 6:
        return None, None
    x = torch.tensor([t for t, _ in pts], dtype=torch.float64).log()
    y = torch.tensor([v for _, v in pts], dtype=torch.float64)
    off = torch.nonzero(y <= 0.95 * first)  # off the initial plateau
    if off.numel() == 0:
        return None, None
    t_off = float(x[int(off[0])])

    def slope(m):
        xs, ys = x[m], y[m]
        xc = xs - xs.mean()
        return float((xc * (ys - ys.mean())).sum() / (xc * xc).sum().clamp_min(1e-30))

    best = None
    ln2 = math.log(2)
    for i in range(len(pts)):
        before = (x >= x[i] - ln2 - 1e-9) & (x <= x[i])
        after = (x >= x[i]) & (x <= x[i] + ln2 + 1e-9)
        if float(x[i]) - ln2 < t_off - 1e-9 or int(before.sum()) < 3 or int(after.sum()) < 3:
            continue
        sb, sa = slope(before), slope(after)
        if sa <= BUMP_RATIO * sb and sa <= sb - BUMP_MIN and (best is None or sb - sa > best[1][0] - best[1][1]):
            best = (pts[i][0], (sb, sa))
    return (best[0], best[1]) if best else (None, None)


def plot_training_dynamics(dyn: TrainingDynamics, checkpoints: CheckpointScores | None = None):
    """Three panels over tokens seen, one shared log-scale x-axis: train/validation loss; the ICL score (the
    training-time evaluation, with ± one standard error where the run recorded it, and `checkpoints`'
    re-measurements with theirs); each head's induction score (layer 0 dashed, later layers solid) with the
    `FORMED` line. Shaded: the formation window; dotted: the loss bump (when there is one)."""
    import matplotlib.pyplot as plt

    from .plots import fixed_layout, log_axis_labels, tick_label_inches

    fig, axes = plt.subplots(1, 3, figsize=(12, 4.4), sharex=True)  # 1080 px at 90 dpi
    ax = axes[0]
    for name, s, kw in ((dyn.loss_labels[0], dyn.train_loss, dict(lw=0.8, alpha=0.6)),
                        (dyn.loss_labels[1], dyn.val_loss, dict(lw=2, marker=".", ms=4))):
        pts = [(t, v) for t, v in s if t > 0]
        if pts:
            ax.plot(*zip(*pts), label=name, **kw)
    ax.set_ylabel("loss (nats per token)")
    ax.set_title("Loss", fontsize=10)
    ax2 = axes[1]
    pts = [(t, v) for t, v in dyn.icl if t > 0]
    if pts:
        se = dict(dyn.icl_se)
        err = [se.get(t) for t, _ in pts]
        ax2.errorbar(*zip(*pts), yerr=None if None in err else err, marker="o", ms=3, lw=1, capsize=2,
                     color="tab:purple", label="training-time evaluation" + (" (s.e. not recorded)" if None in err
                                                                              else " ± 1 s.e."))
    if checkpoints is not None and any(v is not None for v in checkpoints.icl):
        cp = [(t, v, e) for t, v, e in zip(checkpoints.tokens, checkpoints.icl, checkpoints.icl_se)
              if t and v is not None]
        if cp:
            t, v, e = zip(*cp)
            ax2.errorbar(t, v, yerr=[x or 0.0 for x in e], ls="", marker="s", ms=4, capsize=3, color="tab:green",
                         label=f"saved checkpoints re-measured ({checkpoints.n_windows} windows) ± 1 s.e.")
    ax2.axhline(0, color="0.8", lw=0.8)
    ax2.set_ylabel("ICL score: loss(late) − loss(early) (nats)")
    ax2.set_title("In-context learning score (more negative = more ICL)", fontsize=10)
    if ax2.get_legend_handles_labels()[0]:
        ax2.legend(fontsize=7, loc="lower left")
    ax3 = axes[2]
    if dyn.induction:
        ts = [t for t, _ in dyn.induction]
        keep = [i for i, t in enumerate(ts) if t > 0]
        S = torch.stack([s for _, s in dyn.induction])[keep]  # [ckpt, layer, head]
        ts = [ts[i] for i in keep]
        deep = S.shape[1] > 1
        for l in range(S.shape[1]):
            for h in range(S.shape[2]):
                kw = dict(ls="--", lw=1.0, alpha=0.8) if (l == 0 and deep) else dict(lw=1.8)
                ax3.plot(ts, S[:, l, h].numpy(), label=head_label(l, h), marker=".", ms=4, **kw)
        ax3.axhline(FORMED, color="tab:red", ls="--", lw=1)
        ax3.legend(fontsize=7, ncol=2 if S.shape[1] * S.shape[2] > 4 else 1, loc="upper left",
                   title="layer 0 dashed" if deep else None, title_fontsize=7)
    period = (dyn.induction_key or "").rsplit("_", 1)[-1]
    ax3.set_ylabel(f"induction score ([BOS] + R + R, |R| = {period})" if period.isdigit() else "induction score")
    n_points = len({t for t, _ in dyn.induction if t > 0})
    ax3.set_title(f"Induction score per head, {n_points} checkpoint{'s' if n_points != 1 else ''}", fontsize=10)
    xs = [t for s in (dyn.train_loss, dyn.val_loss, dyn.icl) for t, _ in s if t > 0]
    for a in axes:
        a.set_xscale("log")
        log_axis_labels(a.xaxis)
        a.set_xlabel("tokens seen (log scale)")
        if xs:
            a.set_xlim(min(xs) / 1.2, max(xs) * 1.2)
        if dyn.formation_window:
            a.axvspan(*[max(t, 1) for t in dyn.formation_window], color="tab:orange", alpha=0.15)
        if dyn.bump:
            a.axvline(dyn.bump, color="tab:orange", ls=":", lw=1.5)
    axes[0].legend(fontsize=8)
    bump = "dotted: the loss bump" if dyn.bump else "no loss bump"
    window = "shaded: induction heads forming" if dyn.formation_window else "no induction heads formed"
    window += f"; red dashed line: {FORMED}"
    fig.suptitle(f"Training dynamics ({window}; {bump})", fontsize=11, y=1 - 0.08 / 4.4, va="top")
    ticks = [tick_label_inches(a.yaxis) for a in axes]  # y tick labels and the 10 pt axis label left of each panel
    fixed_layout(fig, left=0.4 + ticks[0], right=0.15, bottom=0.55, top=0.65, wspace=0.5 + max(ticks[1:]))
    return fig


@dataclass
class CheckpointScores:
    """Scores re-measured on each saved checkpoint (more windows than the training-time evaluation)."""

    steps: list[int]
    tokens: list[int | None]
    icl: list[float | None]  # in-context learning score on the given windows
    best_induction: list[float | None]  # best layer ≥ 1 induction score (ARENA, |R| = 50 or what fits)
    val_loss: list[float | None]
    icl_se: list[float | None] = field(default_factory=list)  # standard error of each ICL score over the windows
    n_windows: int = 0

    def before_onset(self) -> int | None:
        """Index of the checkpoint the ICL score is taken 'before' the phase change at: the start of
        `formation_window()` (the last one whose best induction score is below 20 % of `FORMED`), else the first."""
        fw = self.formation_window()
        if not self.steps:
            return None
        return self.steps.index(fw[0]) if fw is not None else 0

    def formation_window(self) -> tuple[int, int] | None:
        """(step, step) of induction-head formation by the rule of `TrainingDynamics.formation_window`."""
        return _window_from_best([(s, b) for s, b in zip(self.steps, self.best_induction) if b is not None])

    def markdown(self) -> str:
        se = self.icl_se or [None] * len(self.steps)
        rows = [[s, f"{t:,}" if t is not None else None, l, None if i is None else
                 (f"{i:+.3f} ± {e:.3f}" if e is not None else f"{i:+.3f}"), b]
                for s, t, l, i, e, b in zip(self.steps, self.tokens, self.val_loss, self.icl, se, self.best_induction)]
        return markdown_table(["step", "tokens seen", "loss on the windows", "ICL score ± s.e.",
                               "best induction score"], rows)


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
        from models.data.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(run / "tokenizer.json", contained=True)
    folders = sorted((p for p in (run / "checkpoints").glob("step-*") if (p / "config.json").is_file()),
                     key=lambda p: int(p.name.split("-")[1])) if (run / "checkpoints").is_dir() else []
    if max_checkpoints is not None and len(folders) > max_checkpoints >= 2:
        keep = torch.linspace(0, len(folders) - 1, max_checkpoints).round().long().unique().tolist()
        folders = [folders[i] for i in keep]
    out = CheckpointScores([], [], [], [], [], [], 0 if windows is None else len(windows))
    for f in folders:
        step = int(f.name.split("-")[1])
        m = models.load(f)
        m.eval()
        m.tokenizer = m.tokenizer or tokenizer
        icl = se = loss = best = None
        if windows is not None:
            w = torch.as_tensor(windows, dtype=torch.long).to(m.W_E.device)
            e, lt = icl_positions(w.shape[1])
            per = position_losses(m, w)  # one forward gives both numbers
            diff = in_context_learning_differences(m, w, early or e, late or lt, losses=per)
            icl = float(diff.mean())
            se = float(diff.std() / diff.numel() ** 0.5) if diff.numel() > 1 else None
            loss = float(per.mean())
        if m.cfg.n_layers:
            s = induction_scores(m, seq_len=min(50, (m.cfg.n_ctx - 1) // 2), tokens_from=tokens_from)
            best = float((s[1:] if s.shape[0] > 1 else s).max())
        out.steps.append(step)
        out.tokens.append(tok_at.get(step))
        out.icl.append(icl)
        out.icl_se.append(se)
        out.best_induction.append(best)
        out.val_loss.append(loss)
    return out

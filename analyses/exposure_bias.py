"""Exposure bias of an encoder–decoder, measured per target position against two targets, and the statistics over
training seeds.

A model trained with teacher forcing only ever reads true target prefixes; decoding, it reads its own, so one mistake
can lead to more (exposure bias; scheduled sampling, Bengio et al. 2015, "Scheduled Sampling for Sequence Prediction
with Recurrent Neural Networks", trains on a mixture of both, `models.training.tasks.sampling_probability`). Each way
of decoding is a `Decoded` (what the decoder read at each target position, and what it predicted there):

- `teacher_forced`: the argmax prediction of target symbol j given the true symbols 0 .. j − 1;
- `free_running`: greedy decoding, the decoder reading its own earlier predictions;
- `injected`: the same after one wrong symbol (`wrong_tokens`) replaces true symbol k in the decoder's input, the
  later inputs true (`free=False`) or the model's own continuation (`free=True`), beside the same positions without
  the injection (the base).

`errors` scores a `Decoded` against one of two targets. The **true target** (`task=None`) is the task's answer for
the source; where a task's next symbol is computed from the previous one (`seq2seq:cumsum`), a prediction that is
right for the prefix the model read is "wrong" against it after any earlier mistake, so what it measures after one
is the compounding the task imposes, not the model's exposure bias. The **prefix-consistent target** (`task` given;
`models.data.seq2seq.Task.consistent_targets`) is the symbol the task's rule gives for the prefix the model actually
read: an error against it is a mistake the model made at that step, so a higher error on its own prefixes than on
true ones is exposure bias proper.

"Position j" is the j-th symbol of the target (0-based; BOS and EOS left out); a row counts at j when its target has a
symbol j. A model is any callable `model(src, tgt, src_mask, tgt_mask)` returning next-token logits
`[batch, tgt_pos, vocab]`, as `HookedEncoderDecoder`'s forward, so hand-built oracles test the measures.
`mean_interval` (Student's t over seeds), `prediction_interval` (where one more seed's value should fall),
`welch_difference` and `detectable_difference` (the smallest difference a two-sided Welch test finds with the given
power) summarise runs; `train_to_accuracy` stops a run where its teacher-forced accuracy first reaches a threshold.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from models.data.seq2seq import ANY_SYMBOL, EOS
from models.training.loop import train

from . import stats
from .stats import t_quantile

FIRST_SYMBOL = EOS + 1  # ids below are PAD, BOS, EOS (models.data.seq2seq)


def symbols_of(tgt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`(gold [batch, n], valid [batch, n])`: target symbols at positions j = 0 .. n − 1 (n = target width − 2) and
    where a row has one (not EOS or padding)."""
    gold = tgt[:, 1:-1]
    return gold, gold >= FIRST_SYMBOL


@torch.no_grad()
def _next_tokens(model, src, prefix, src_mask) -> torch.Tensor:
    """`[batch, pos]`: the argmax token after each prefix position (the decoder reads `prefix` whole, causally)."""
    return model(src, prefix, src_mask, None).argmax(-1)


@torch.no_grad()
def greedy_from(model, src, src_mask, prefix: torch.Tensor, width: int) -> torch.Tensor:
    """Greedy decoding continued from `prefix [batch, p]` (BOS first) to `width` tokens, re-reading the whole prefix
    each step (as `generate(use_cache=False)`); EOS does not stop it (every position is compared)."""
    out = prefix
    while out.shape[1] < width:
        out = torch.cat([out, _next_tokens(model, src, out, src_mask)[:, -1:]], 1)
    return out


@dataclasses.dataclass
class Decoded:
    """One way of decoding a batch: `read [batch, n]`, the token the decoder read last before predicting target
    symbol j (BOS at j = 0, then the symbol fed at position j), and `pred [batch, n]`, its argmax prediction of j."""

    read: torch.Tensor
    pred: torch.Tensor


@torch.no_grad()
def teacher_forced(model, src, tgt, src_mask, tgt_mask) -> Decoded:
    """Every symbol predicted from the true prefix (teacher forcing)."""
    n = tgt.shape[1] - 2
    return Decoded(tgt[:, :n], model(src, tgt, src_mask, tgt_mask).argmax(-1)[:, :n])


@torch.no_grad()
def free_running(model, src, tgt, src_mask, tgt_mask=None) -> Decoded:
    """Greedy decoding from BOS, the decoder reading its own predictions (`greedy_from`)."""
    n = tgt.shape[1] - 2
    out = greedy_from(model, src, src_mask, tgt[:, :1], n + 1)
    return Decoded(out[:, :n], out[:, 1:])


def errors(decoded: Decoded, src, tgt, task=None) -> torch.Tensor:
    """`[batch, n]` bool: the prediction of symbol j is wrong against the true target (`task=None`) or against the
    prefix-consistent target of `task` (`Task.consistent_targets` for what `decoded` read; where the rule admits any
    symbol, every symbol is right). Not masked: combine with `symbols_of(tgt)[1]`."""
    gold, _ = symbols_of(tgt)
    if task is None:
        return decoded.pred != gold
    want = task.consistent_targets(src, decoded.read, gold)
    return ~((decoded.pred == want) | ((want == ANY_SYMBOL) & (decoded.pred >= FIRST_SYMBOL)))


def gold_prefix_errors(model, src, tgt, src_mask, tgt_mask, task=None) -> tuple[torch.Tensor, torch.Tensor]:
    """`(errors, valid)`, bool `[batch, n]`: the prediction of symbol j from the true prefix is wrong (teacher
    forcing), against the true target or, with `task`, the prefix-consistent one (the same, but for symbols the rule
    leaves free)."""
    valid = symbols_of(tgt)[1]
    return errors(teacher_forced(model, src, tgt, src_mask, tgt_mask), src, tgt, task) & valid, valid


def free_running_errors(model, src, tgt, src_mask, tgt_mask=None, task=None) -> tuple[torch.Tensor, torch.Tensor]:
    """`(errors, valid)`, bool `[batch, n]`: symbol j of greedy decoding from BOS is wrong against the true target or,
    with `task`, against the prefix-consistent target of what it read."""
    valid = symbols_of(tgt)[1]
    return errors(free_running(model, src, tgt, src_mask), src, tgt, task) & valid, valid


def wrong_tokens(gold: torch.Tensor, n_symbols: int, generator: torch.Generator) -> torch.Tensor:
    """A symbol other than `gold`, uniform over the other n_symbols − 1: FIRST + (gold − FIRST + r) mod n_symbols,
    r uniform in 1 .. n_symbols − 1."""
    r = torch.randint(1, n_symbols, gold.shape, generator=generator)
    return FIRST_SYMBOL + (gold - FIRST_SYMBOL + r.to(gold.device)) % n_symbols


@torch.no_grad()
def injected(model, src, tgt, src_mask, tgt_mask, k: int, n_symbols: int, generator: torch.Generator,
             free: bool = False) -> tuple[Decoded, Decoded, torch.Tensor]:
    """`(with the injection, without it, valid)`: symbol k of the decoder's input replaced by a wrong one
    (`wrong_tokens`) or left true; the inputs after k are the true symbols (`free=False`, teacher forcing) or the
    model's own greedy continuation (`free=True`, from the prefix through position k). `valid [batch, n]`: positions
    j > k of rows that have a symbol k + 1."""
    gold, valid = symbols_of(tgt)
    n = gold.shape[1]
    valid = valid & (torch.arange(n, device=tgt.device) > k) & valid[:, k + 1 : k + 2]
    wrong = tgt.clone()
    wrong[:, 1 + k] = wrong_tokens(gold[:, k], n_symbols, generator)
    if free:
        runs = [greedy_from(model, src, src_mask, t[:, : 2 + k], n + 1) for t in (wrong, tgt)]
        return Decoded(runs[0][:, :n], runs[0][:, 1:]), Decoded(runs[1][:, :n], runs[1][:, 1:]), valid
    runs = [Decoded(t[:, :n], model(src, t, src_mask, tgt_mask).argmax(-1)[:, :n]) for t in (wrong, tgt)]
    return runs[0], runs[1], valid


def injected_errors(model, src, tgt, src_mask, tgt_mask, k: int, n_symbols: int, generator: torch.Generator,
                    free: bool = False, task=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`(errors, base, valid)`, bool `[batch, n]`, at positions j > k of rows that have a symbol k + 1 (`injected`):
    errors after the wrong symbol and without it, against the true target or, with `task`, the prefix-consistent
    one."""
    wrong, base, valid = injected(model, src, tgt, src_mask, tgt_mask, k, n_symbols, generator, free)
    return errors(wrong, src, tgt, task) & valid, errors(base, src, tgt, task) & valid, valid


def rate(errors: torch.Tensor, valid: torch.Tensor, dim: int | None = 0) -> torch.Tensor:
    """Errors over the rows counted: per position (`dim=0`, NaN where none) or over everything (`dim=None`)."""
    if dim is None:
        return errors.sum() / valid.sum()
    return errors.sum(dim) / valid.sum(dim)


def compounded(rates) -> torch.Tensor:
    """The free-running error each position would have if every error from true prefixes were independent and carried
    forward to every later symbol: 1 − Π_{i ≤ j} (1 − e_i), for per-position error rates e."""
    r = torch.as_tensor(rates, dtype=torch.float64)
    return 1 - torch.cumprod(1 - r, 0)


def _mean_var(values) -> tuple[float, float, int]:
    v = torch.as_tensor(values, dtype=torch.float64)
    return float(v.mean()), float(v.var(unbiased=True)) if v.numel() > 1 else math.nan, v.numel()


def mean_interval(values, confidence: float = 0.95) -> tuple[float, float, float]:
    """`(mean, low, high)` of `analyses.stats.t_interval` (NaN bounds below 2 values), the form results.json keeps."""
    a = stats.t_interval(values, confidence)
    return a["mean"], math.nan if a["low"] is None else a["low"], math.nan if a["high"] is None else a["high"]


def prediction_interval(values, confidence: float = 0.95) -> tuple[float, float, float]:
    """`(mean, low, high)`: where one more independent draw falls with probability `confidence`, mean ± t_{(1+c)/2,
    n−1} · s · √(1 + 1/n) (the normal-theory prediction interval; e.g. Hahn & Meeker 1991, "Statistical Intervals",
    §4.5). Wider than the mean's interval by √(n + 1): a new seed's value outside the mean's interval is expected."""
    m, v, n = _mean_var(values)
    if n < 2:
        return m, math.nan, math.nan
    half = t_quantile((1 + confidence) / 2, n - 1) * math.sqrt(v * (1 + 1 / n))
    return m, m - half, m + half


def outside_mean_interval_chance(n: int, confidence: float = 0.95) -> float:
    """The probability that one more independent normal draw falls outside the `confidence` t-interval of the mean of
    n draws: P(|T_{n−1}| > t_{(1+c)/2, n−1} / √(n + 1)), since (x_new − mean) / (s √(1 + 1/n)) is Student's t with
    n − 1 degrees of freedom (Hahn & Meeker 1991, §4.5). About 0.32 for n = 5."""
    return stats.t_tail(t_quantile((1 + confidence) / 2, n - 1) / math.sqrt(n + 1), n - 1)


def _welch(a, b) -> tuple[float, float, float]:
    """`(mean(a) − mean(b), its standard error, Welch–Satterthwaite degrees of freedom)` (Welch 1947)."""
    ma, va, na = _mean_var(a)
    mb, vb, nb = _mean_var(b)
    se2 = va / na + vb / nb
    df = se2**2 / ((va / na) ** 2 / (na - 1) + (vb / nb) ** 2 / (nb - 1)) if se2 > 0 else float(na + nb - 2)
    return ma - mb, math.sqrt(se2), df


def welch_difference(a, b, confidence: float = 0.95) -> tuple[float, float, float]:
    """`(difference, low, high)`: mean(a) − mean(b) with Welch's t confidence interval (Welch 1947)."""
    d, se, df = _welch(a, b)
    half = t_quantile((1 + confidence) / 2, df) * se
    return d, d - half, d + half


def detectable_difference(a, b, alpha: float = 0.05, power: float = 0.8) -> float:
    """The smallest true difference of means a two-sided Welch test at level `alpha` detects with probability
    `power`, given the observed between-seed variances and the numbers of seeds:
    (t_{1−α/2, ν} + t_{power, ν}) · √(s_a²/n_a + s_b²/n_b) (Cohen 1988, "Statistical Power Analysis for the
    Behavioral Sciences", §2.3, with t in place of normal quantiles; ν Welch's degrees of freedom)."""
    _, se, df = _welch(a, b)
    return (t_quantile(1 - alpha / 2, df) + t_quantile(power, df)) * se


def teacher_forced_accuracy(model, src, tgt, src_mask, tgt_mask, task=None) -> float:
    """Per-symbol accuracy under teacher forcing (1 − `gold_prefix_errors`' rate over every position), against the
    true target or, with `task`, the prefix-consistent one (the same from true prefixes, but for free symbols)."""
    was = model.training
    model.eval()
    wrong, valid = gold_prefix_errors(model, src, tgt, src_mask, tgt_mask, task)
    model.train(was)
    return 1.0 - float(rate(wrong, valid, None))


def train_to_accuracy(model_cfg, train_cfg, stop_split, threshold: float, task=None):
    """Train (`models.training.loop.train`, no output folder) and stop after the first step at which the
    teacher-forced per-symbol accuracy (`teacher_forced_accuracy`, with `task`) on `stop_split = (src, tgt, src_mask,
    tgt_mask)` reaches `threshold`, or at `train_cfg.steps`. The accuracy is measured after every step (a checkpoint
    every step, no files). Returns `(model in eval mode, steps trained, accuracies after steps 1, 2, ...)`; the last
    accuracy's excess over `threshold` is the rule's overshoot."""
    history, kept = [], {}

    class Reached(Exception):  # noqa: N818  (ends the run: train() has no early stop of its own)
        pass

    def check(model):
        history.append(teacher_forced_accuracy(model, *stop_split, task=task))
        kept["model"] = model
        if history[-1] >= threshold:
            raise Reached
        return {"teacher_forced_accuracy": history[-1]}

    cfg = dataclasses.replace(train_cfg, checkpoint_every=1, log_checkpoints=0, out_dir=None, progress=False)
    try:
        model, _ = train(model_cfg, cfg, eval_fn=check)
    except Reached:
        model = kept["model"]
    return model.eval(), len(history), history

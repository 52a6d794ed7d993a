"""Patching metrics: functions of the logits `[batch, pos, d_vocab]` that return one number per prompt `[batch]`.

An `Answers` names, for each prompt, the positions read and the answer token at each (and optionally a wrong
token): one position per prompt (the last, for a question answered by the next token), or several (every
position of the second copy of a repeated sequence, each with its own next token). Each metric averages over
the positions of a prompt. `normalized` maps a metric onto 0 = corrupted run, 1 = clean run.

Sources: the logit difference and its normalisation are those of Wang et al. 2022, "Interpretability in the Wild:
a Circuit for Indirect Object Identification in GPT-2 small" (IOI); Heimersheim & Nanda 2024, "How to use and
interpret activation patching", discuss the choice among logit difference, probability and loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .inputs import PatchingError, single_token


@dataclass(frozen=True)
class Answers:
    """Where each prompt is read and what it should say: `positions`, `correct` and optional `wrong`, each
    `[batch, n]` int64 (negative positions count from the end)."""

    positions: torch.Tensor
    correct: torch.Tensor
    wrong: torch.Tensor | None = None

    def check(self, n_pos: int, batch: int) -> None:
        """Refuse positions outside −n_pos..n_pos−1 and answers for another number of prompts."""
        if self.positions.shape[0] != batch:
            raise PatchingError(f"answers are given for {self.positions.shape[0]} prompts, but there are {batch}")
        if int(self.positions.min()) < -n_pos or int(self.positions.max()) >= n_pos:
            raise PatchingError(f"answer positions must lie in {-n_pos}..{n_pos - 1} for prompts of {n_pos} tokens")

    def gather(self, logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """`logits[b, positions[b, j], ids[b, j]]` → `[batch, n]`."""
        P = logits.shape[1]
        pos = (self.positions % P).to(logits.device)
        rows = logits.gather(1, pos[..., None].expand(-1, -1, logits.shape[-1]))  # [batch, n, d_vocab]
        return rows.gather(-1, ids.to(logits.device)[..., None])[..., 0]

    def log_probs(self, logits: torch.Tensor) -> torch.Tensor:
        """log softmax at the answer positions `[batch, n, d_vocab]` (float32 or wider)."""
        P = logits.shape[1]
        pos = (self.positions % P).to(logits.device)
        rows = logits.gather(1, pos[..., None].expand(-1, -1, logits.shape[-1]))
        return rows.to(torch.promote_types(rows.dtype, torch.float32)).log_softmax(-1)


def answers(model, batch: int, correct, wrong=None, positions=-1) -> Answers:
    """`Answers` for `batch` prompts. `correct` / `wrong`: one token (an id or a one-token string) for every prompt,
    ids `[batch]` (one per prompt) or `[batch, n]` (one per prompt and position). `positions`: an int, `[n]` (the
    same positions in every prompt) or `[batch, n]`."""

    def ids(x, name):
        if isinstance(x, (str, int)):
            return torch.tensor([[single_token(model, x, name)]])
        t = torch.as_tensor(x)
        if t.dtype.is_floating_point or t.dtype == torch.bool or t.ndim > 2:
            raise PatchingError(f"{name} must be token ids [batch] or [batch, n], got {t.dtype} {tuple(t.shape)}")
        t = t.long().reshape(-1, 1) if t.ndim < 2 else t.long()
        if t.numel() and (int(t.min()) < 0 or int(t.max()) >= model.cfg.d_vocab):
            raise PatchingError(f"{name} holds ids outside 0..{model.cfg.d_vocab - 1}")
        return t

    pos = torch.as_tensor(positions).long()
    if pos.ndim > 2 or pos.dtype != torch.long:
        raise PatchingError(f"positions must be an int, [n] or [batch, n], got shape {tuple(pos.shape)}")
    pos = pos.reshape(1, -1) if pos.ndim < 2 else pos
    c = ids(correct, "answer")
    w = None if wrong is None else ids(wrong, "wrong answer")
    try:
        shape = torch.broadcast_shapes((batch, 1), pos.shape, c.shape, *(() if w is None else (w.shape,)))
    except RuntimeError:
        raise PatchingError(f"answers do not fit {batch} prompts: positions {tuple(pos.shape)}, answer "
                            f"{tuple(c.shape)}" + ("" if w is None else f", wrong {tuple(w.shape)}")) from None
    if shape[0] != batch:
        raise PatchingError(f"answers are given for {shape[0]} prompts, but there are {batch}")
    if w is not None and bool((c.expand(shape) == w.expand(shape)).any()):
        raise PatchingError("the wrong answer equals the answer (the same token id): their logit difference is zero "
                            "by construction; give a different wrong answer")
    return Answers(pos.expand(shape).clone(), c.expand(shape).clone(), None if w is None else w.expand(shape).clone())


def next_token_answers(tokens: torch.Tensor, positions) -> Answers:
    """Answers that ask each position for the token that follows it: `correct[b, j] = tokens[b, positions[j] + 1]`
    (e.g. every position of the second copy of a repeated sequence, for the induction circuit)."""
    pos = torch.as_tensor(positions).long().reshape(-1)
    P = tokens.shape[1]
    if pos.numel() == 0 or int(pos.min()) < 0 or int(pos.max()) >= P - 1:
        raise PatchingError(f"next-token positions must lie in 0..{P - 2} (each needs a following token)")
    pos = pos[None].expand(tokens.shape[0], -1).cpu()
    return Answers(pos.clone(), tokens.cpu().gather(1, pos + 1))


def logit_difference(logits: torch.Tensor, ans: Answers) -> torch.Tensor:
    """Mean over a prompt's answer positions of logit[correct] − logit[wrong] (Wang et al. 2022, IOI: the logit
    difference between the indirect object and the subject). `[batch]`."""
    if ans.wrong is None:
        raise PatchingError("the logit difference needs a wrong answer too (Answers.wrong)")
    return (ans.gather(logits, ans.correct) - ans.gather(logits, ans.wrong)).mean(-1)


def answer_loss(logits: torch.Tensor, ans: Answers) -> torch.Tensor:
    """Mean over a prompt's answer positions of −log softmax(logits)[correct], in nats (Heimersheim & Nanda 2024:
    loss, unlike probability, does not saturate). `[batch]`; lower is better."""
    return -ans.log_probs(logits).gather(-1, ans.correct.to(logits.device)[..., None])[..., 0].mean(-1)


def answer_probability(logits: torch.Tensor, ans: Answers) -> torch.Tensor:
    """Mean over a prompt's answer positions of softmax(logits)[correct] (Heimersheim & Nanda 2024: probability
    saturates near 0 and 1, so it understates effects there). `[batch]`."""
    return ans.log_probs(logits).gather(-1, ans.correct.to(logits.device)[..., None])[..., 0].exp().mean(-1)


METRICS = {"logit_diff": logit_difference, "loss": answer_loss, "prob": answer_probability}


def normalized(value, clean, corrupt):
    """(value − corrupt) / (clean − corrupt): 0 at the corrupted run's metric, 1 at the clean run's (Wang et al.
    2022's normalised logit difference; Heimersheim & Nanda 2024 recommend reporting patching effects this way).
    Works for metrics where lower is better (loss) as well: the sign of the denominator follows."""
    return (value - corrupt) / (clean - corrupt)


@dataclass(frozen=True)
class Metric:
    """A named metric bound to its answers: `metric(logits) → [batch]`."""

    name: str
    answers: Answers

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        return METRICS[self.name](logits, self.answers)


def metric(name: str, answers: Answers) -> Metric:
    """`Metric` `name` ∈ {logit_diff, loss, prob} on `answers` (the logit difference needs `answers.wrong`)."""
    if name not in METRICS:
        raise PatchingError(f"unknown metric {name!r}; allowed: {', '.join(METRICS)}")
    if name == "logit_diff" and answers.wrong is None:
        raise PatchingError("metric 'logit_diff' needs a wrong answer; give one, or use 'loss' or 'prob'")
    return Metric(name, answers)


def metric_name(fn) -> str:
    return getattr(fn, "name", None) or getattr(fn, "__name__", None) or type(fn).__name__


def evaluate(fn, logits: torch.Tensor, batch: int) -> torch.Tensor:
    """`fn(logits)` checked to be `[batch]` (a scalar is refused: per-prompt values are what the tools report); its
    autograd graph is kept when there is one."""
    out = fn(logits)
    out = out if isinstance(out, torch.Tensor) else torch.as_tensor(out)
    if out.shape != (batch,):
        raise PatchingError(f"the metric must return one value per prompt, shape ({batch},); got "
                            f"{tuple(out.shape)}")
    return out


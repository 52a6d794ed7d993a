"""Write `analyses/REPRODUCTION.md`: each published number from `reference.md` that the model zoo can speak to,
beside ours, measured.

    python -m analyses.reproduction [--out analyses/REPRODUCTION.md] [--zoo models/zoo]

Models: `attn-only-0l`, `attn-only-1l`, `attn-only-2l` (and their training runs' `metrics.jsonl`). A model that is
missing is reported as such. Deterministic (seeded probes, fixed validation windows).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from circuits.diagonal import diagonal_rank_stats
from circuits.eigen import copying_score
from circuits.factored import full_qk_circuit
from circuits.interface import attn_scale
from models.arch.model import head_label
from models.arch.tl_compat import FactoredMatrix
from models.files.atomic import atomic_write_text

from .sequences import token_pool

DEFAULT_OUT = Path(__file__).resolve().parent / "REPRODUCTION.md"


@dataclass
class Row:
    claim: str
    paper: str
    ours: str
    note: str


def _load(zoo: Path, name: str):
    import models

    folder = zoo / name
    if not (folder / "config.json").is_file():
        return None, None
    m = models.load(folder)
    m.eval()
    return m, folder


def _text(model, folder, n_windows: int = 64):
    from .report import validation_text
    from .sequences import bos_token_id
    from .util import windows

    text, vocab = validation_text(model, folder, 400_000)
    if text is None:
        return None, None, None
    return text, vocab, windows(text, model.cfg.n_ctx, n_windows, 0, bos=bos_token_id(model))


def _mean_se(diff: torch.Tensor) -> tuple[float, float]:
    return float(diff.mean()), float(diff.std() / diff.numel() ** 0.5)


def _icl_with_ablation(model, w, heads, early, late):
    """(mean, s.e.) of the ICL score clean and with `heads` zeroed together (patterns frozen), from one pair of
    passes."""
    from .one_layer import ablated_position_losses
    from .scores import in_context_learning_differences

    clean, ablated = ablated_position_losses(model, w, heads)
    return tuple(_mean_se(in_context_learning_differences(model, w, early, late, losses=x)) for x in (clean, ablated))


@torch.no_grad()
def _combined_diag(model, heads, tokens_from=None):
    """Top-1 / top-5 diagonal accuracy of the summed full OV circuits of `heads` (ARENA's "1.4 and 1.10 together")
    over the non-special ids (of `tokens_from`, when given)."""
    S = token_pool(model, tokens_from)
    A = torch.cat([model.W_E[S] @ model.W_V[l, h] for l, h in heads], -1)  # [|S|, n·d_head]
    B = torch.cat([model.W_O[l, h] @ model.W_U[:, S] for l, h in heads], 0)
    st = diagonal_rank_stats(FactoredMatrix(A, B), k=(1, 5))
    return float(st[1]), float(st[5])


@torch.no_grad()
def _positional_subdiag(model, layer, head, n=64):
    """ARENA's check on the previous-token head: softmax of the position-position QK term (causal), mean
    attention on the sub-diagonal."""
    parts = full_qk_circuit(model, layer, head, positional=True)
    pp = (parts.pos_pos.A[:n] @ parts.pos_pos.B[:, :n]) / attn_scale(model, layer)
    pp = pp.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
    return float(pp.diagonal(-1).mean())


def zero_layer_rows(zoo: Path) -> list[Row]:
    from .zero_layer import direct_path_fit

    m, folder = _load(zoo, "attn-only-0l")
    if m is None:
        return [Row("0L: loss approaches the bigram entropy", "—", "model not in the zoo", "")]
    from .report import training_corpus

    corpus = training_corpus(m, folder)
    _, _, w = _text(m, folder)
    fit = direct_path_fit(m, corpus.train)
    loss = float(m(w, return_type="loss"))
    return [Row("0L: the direct path W_E W_U approximates the bigram table (frequency-weighted KL small, loss → "
                "bigram entropy)", "no number; the rank-d_model limit keeps it above the entropy",
                f"on the whole training split ({fit.n_tokens:,} bigrams): direct-path loss {fit.direct_path_loss:.3f} "
                f"vs bigram entropy {fit.bigram_entropy:.3f} nats, weighted KL {fit.weighted_kl:.3f}, argmax "
                f"agreement {fit.argmax_agreement:.1%} of tokens; validation loss {loss:.3f} on {w.shape[0]} windows",
                "One definition everywhere (card, README, report): the table is the training split's own bigram "
                "counts, the text the model was fitted to; its entropy is in-sample, so biased low. The gap is what "
                f"d_model = {m.cfg.d_model} cannot represent of a {m.cfg.d_vocab}-token bigram table.")]


def one_layer_rows(zoo: Path) -> list[Row]:
    from .one_layer import copying_heads_table, positional_vs_content

    m, folder = _load(zoo, "attn-only-1l")
    if m is None:
        return [Row("1L: copying heads", "10 of 12", "model not in the zoo", "")]
    _, vocab, w = _text(m, folder)
    t = copying_heads_table(m, vocab=vocab, behavioural=False)
    pc = positional_vs_content(m, vocab=vocab)
    H = m.cfg.n_heads
    pos = [head_label(0, h) for h in range(H) if pc.labels[0][h] != "content"]
    r2 = pc.positional_r2
    noncopy = [f"{head_label(0, h)} (content independence {float(pc.content_independence[0, h]):.2f}, positional "
               f"R² {float(r2[0, h]) if r2 is not None else float('nan'):.2f}, previous-token "
               f"{float(pc.previous[0, h]):.2f}, first-token {float(pc.first[0, h]):.2f})"
               for h in range(H) if (0, h) not in t.heads + t.ov_positive]
    scores = ", ".join(f"{float(v):+.2f}" for v in t.copying_score[0])
    top1 = ", ".join(f"{float(v):.1%}" for v in t.top1[0])
    rows = [Row("1L: most heads copy (OV eigenvalue copying score Σλ/Σ|λ| ≥ 0.5); the others are positional",
                "10 of 12 heads copy; the other 2 are positional",
                f"{len(t.heads) + len(t.ov_positive)} of {H} heads pass the eigenvalue score (scores {scores}); "
                f"top-1 diagonal accuracy over the {t.n_ids} ids seen in training {top1}, so {len(t.heads)} of {H} "
                f"copy by both measures (Σλ/Σ|λ| ≥ {t.threshold} and top-1 ≥ {t.diagonal}); positional heads: "
                f"{', '.join(pos) or 'none'}",
                "The eigenvalue score says attending to a token raises its own logit on balance; top-1 says for how "
                "many tokens it is the most raised" + (": no head reaches half, so the paper's 'copying' holds for "
                "our heads only in the eigenvalue sense" if not t.heads else "")
                + f". Heads below the eigenvalue score: {', '.join(noncopy) or 'none'}. Our 1L model "
                f"has {H} heads of d_head "
                f"{m.cfg.d_head} on a {m.cfg.d_vocab}-token code vocabulary, not 12 × 64 on 50k web tokens.")]
    rows.append(Row("1L: copying score of random matrices", "≈ 0 ± 0.03 (d_model 768)",
                    _random_copying(m), "Random heads of our shapes (d_head "
                    f"{m.cfg.d_head}) spread wider than the paper's, so 0.5 is a conservative cut."))
    return rows


def _random_copying(m) -> str:
    g = torch.Generator().manual_seed(0)
    d, dh, V = m.cfg.d_model, m.cfg.d_head, m.cfg.d_vocab
    vals = []
    for _ in range(64):
        A = torch.randn(V, dh, generator=g, dtype=torch.float64)
        B = torch.randn(dh, V, generator=g, dtype=torch.float64)
        vals.append(float(copying_score(FactoredMatrix(A, B))))
    t = torch.tensor(vals)
    return f"{float(t.mean()):+.3f} ± {float(t.std()):.3f} (64 random rank-{dh} circuits, d_vocab {V}; d_model {d})"


def two_layer_rows(zoo: Path) -> list[Row]:
    from .scores import icl_positions, icl_windows
    from .two_layer import composition_study, find_induction_circuit, term_importance_by_order

    m, folder = _load(zoo, "attn-only-2l")
    if m is None:
        return [Row("2L rows", "—", "model not in the zoo", "")]
    text, vocab, w = _text(m, folder)
    wi = icl_windows(m, text)
    rows = []
    circ = find_induction_circuit(m, w[:8], vocab)
    ind, prev = circ.induction, circ.previous
    ih = ind.heads
    from .sequences import token_pool

    n_all = token_pool(m).numel()
    scores = ", ".join(f"{head_label(*h)} {ind.row(*h).induction_arena:.2f}" for h in ih) or "none"
    seen = ", ".join(f"{head_label(*h)} {ind.row(*h).induction:.2f}" for h in ih) or "none"
    rows.append(Row("2L: induction heads exist; induction score (|R| = 50) of the heads",
                    "ARENA's 1.4 ≈ 0.68; its induction heads > 0.6; threshold 0.4",
                    f"{len(ih)} induction head(s); ARENA's score (its whole stripe, two first-copy queries "
                    f"included; R uniform over all {n_all} non-special ids, batch 10): {scores}; the induction score "
                    f"(second copy only, R from the {vocab.numel()} ids seen in training): {seen}; "
                    f"previous-token heads: {', '.join(head_label(*h) for h in prev.heads) or 'none'}",
                    f"{n_all - vocab.numel()} of our BPE's ids never occur in the training split, so "
                    "their embeddings stayed near initialisation; the verdicts use the seen-ids probe. Repeats inside "
                    f"R are avoided in both (our vocabulary is {m.cfg.d_vocab}, not 50k)."))
    comp = composition_study(m)
    if ih:
        partners = {ind.row(*h).partner for h in ih}
        kex = comp.excess("k")
        shares = []
        for l, h in ih:
            col = kex[0, :, l, h].clamp_min(0)
            best = ind.row(l, h).partner
            shares.append(float(col[best[1]] / col.sum().clamp_min(1e-12)))
        q, v = float(comp.excess("q")[:, :, 1].max()), float(comp.excess("v")[:, :, 1].max())
        k = float(max(kex[0, p[1], l, h] for (l, h) in ih for p in [ind.row(l, h).partner]))
        rows.append(Row("2L: induction heads K-compose with the previous-token head (and not much else)",
                        "only K-composition matters, with one layer-0 head",
                        f"partners {', '.join(head_label(*p) for p in partners)}; K-comp − baseline of the pair(s) "
                        f"up to {k:.3f}; the partner holds {min(shares):.0%}–{max(shares):.0%} of each induction "
                        f"head's positive K-composition excess; max Q {q:+.3f}, max V {v:+.3f} over baseline",
                        f"Composition scores are weight norms; with d_head {m.cfg.d_head} the random baseline is "
                        f"{comp.baselines['k']:.3f}, so excesses are small numbers in absolute terms."))
        qk = [circ.positivity.get(h, (float('nan'),) * 2) for h in ih]
        rows.append(Row("2L: induction heads sit in the (QK positivity, OV positivity) corner",
                        "both near +1 for induction heads",
                        ", ".join(f"{head_label(*h)} ({a:+.2f}, {b:+.2f})" for h, (a, b) in zip(ih, qk)),
                        "QK positivity: Σλ/Σ|λ| of W_E W_QK (W_OV^prev)ᵀ W_Eᵀ; OV: of W_E W_OV W_U."))
        n_seen = token_pool(m, vocab).numel()
        acc = {k: ([_combined_diag(m, [h], pool) for h in ih], _combined_diag(m, ih, pool))
               for k, pool in (("all", None), ("seen", vocab))}

        def diag(k, n):
            one, both = acc[k]
            return ("; ".join(f"{head_label(*h)} {a:.1%} / {b:.1%}" for h, (a, b) in zip(ih, one))
                    + f"; together {both[0]:.1%} / {both[1]:.1%} (= {round(both[0] * n)}/{n})")

        rows.append(Row("2L: full OV top-1 / top-5 diagonal accuracy of the induction heads",
                        "1.4 alone 30.8 % / 47.7 %; 1.4 + 1.10 together 95.6 % / 98 %",
                        f"over the {n_seen} ids seen in training: {diag('seen', n_seen)}; over all {n_all} "
                        f"non-special ids, never-trained ones counted: {diag('all', n_all)}",
                        f"The {n_all - n_seen} ids that never occur in the training split kept near-initial embeddings "
                        "and count as misses in the second figure."))
    if prev.heads:
        l, h = prev.heads[0]
        rows.append(Row("2L: the previous-token head's QK is positional",
                        "0.7: mean sub-diagonal attention of the position-only pattern 0.998",
                        f"{head_label(l, h)}: {_positional_subdiag(m, l, h):.3f} (previous-token score "
                        f"{prev.row(l, h).previous:.2f} on text)", ""))
    from .one_layer import copying_verdict

    verdicts = {hh: copying_verdict(ind.row(1, hh).ov_copying, ind.row(1, hh).ov_top1) for hh in range(m.cfg.n_heads)}
    copy1 = [hh for hh, v in verdicts.items() if v == "copying"]
    pos1 = [hh for hh, v in verdicts.items() if v]
    rows.append(Row("2L: layer-1 heads that copy", "7 of 12 copy; about 6 are induction heads",
                    f"{len(pos1)} of {m.cfg.n_heads} pass the eigenvalue score (OV copying ≥ 0.5), {len(copy1)} of "
                    f"them also top-1 diagonal accuracy ≥ 0.5 (" + ", ".join(
                        f"{head_label(1, hh)} {ind.row(1, hh).ov_copying:.2f} / {ind.row(1, hh).ov_top1:.1%}"
                        for hh in pos1) + f"); {len([x for x in ih if x[0] == 1])} are induction heads",
                    "Top-1 over the ids seen in training (`circuits heads` shows both for every head)."))
    imp = term_importance_by_order(m, w[:8])
    rows.append(Row("2L term importance (patterns frozen): individual-head terms vs all virtual heads",
                    "≈ 5.2 nats vs ≈ 0.3 nats; layer-1 heads ≫ layer-0 heads",
                    f"{imp.individual:.3f} vs {imp.virtual:+.3f} nats; removing layer 0's head terms costs "
                    f"{imp.by_layer[0]:.3f}, layer 1's {imp.by_layer[1]:.3f}",
                    "Absolute sizes depend on the model and text (our direct path alone scores "
                    f"{imp.losses[0]:.2f} nats on 8 validation windows); the ordering is the claim."))
    early, late = icl_positions(m.cfg.n_ctx)
    if (folder / "metrics.jsonl").is_file():
        rows += _phase_change_rows(folder, wi, vocab, early, late)
    clean, ablated = _icl_with_ablation(m, wi.to(m.W_E.device), ih, early, late)
    rows.append(Row("2L: pattern-preserving ablation of the induction heads removes in-context learning",
                    "almost all ICL in small attention-only models comes from induction heads",
                    f"ICL score {_pm(clean)} clean → {_pm(ablated)} with {', '.join(head_label(*h) for h in ih)} "
                    f"ablated ({wi.shape[0]} validation windows, ± one standard error)", ""))
    return rows


def _phase_change_rows(folder: Path, w, vocab, early: int, late: int) -> list[Row]:
    from .dynamics import checkpoint_scores, training_dynamics

    d = training_dynamics(folder)
    fw = "none" if d.formation_window is None else f"{d.formation_window[0]:,}–{d.formation_window[1]:,} tokens"
    cs = checkpoint_scores(folder, w, vocab, early, late)
    ours = (f"training-time evaluation (s.e. not recorded): {_f(d.icl_before)} before / "
            f"{_f(d.icl_after)} at the end; formed at {fw}")
    if cs.steps:
        i0 = cs.before_onset()
        pm = lambda i: _pm((cs.icl[i], cs.icl_se[i]))
        ours = (f"{pm(i0)} at step {cs.steps[i0]}, before the onset (best induction {cs.best_induction[i0]:.2f}) → "
                f"{pm(-1)} at step {cs.steps[-1]} (best induction {cs.best_induction[-1]:.2f}); per checkpoint: "
                + ", ".join(f"{s}: {pm(i)}" for i, s in enumerate(cs.steps)) + f"; {ours}")
    return [Row(f"2L: ICL score (loss at token {late} − token {early}) before / after induction heads form",
                "> −0.15 before, ≈ −0.4 after (tokens 500 − 50 of 512)", ours,
                f"Re-measured on the saved checkpoints with {w.shape[0]} validation windows (± one standard error); "
                "'before' is the last checkpoint whose best induction score is below 0.08, before the formation "
                f"window. Not directly comparable with the paper's numbers: our context is {w.shape[1]} tokens "
                "(positions scaled from 50 and 500 of 512), a 512-id BPE covers ~2 bytes per token, half the training "
                "sequences carried synthetic repeats, and Python source repeats identifiers: a control run without "
                "induction heads reached −0.49 (the model card).")]


def _f(x) -> str:
    return "—" if x is None else f"{x:+.3f}"


def _pm(mean_se) -> str:
    m, se = mean_se
    return "—" if m is None else (f"{m:+.3f} ± {se:.3f}" if se is not None else f"{m:+.3f}")


def one_layer_dynamics_rows(zoo: Path) -> list[Row]:
    from .dynamics import BUMP_RATIO, training_dynamics
    from .scores import icl_positions, icl_windows, in_context_learning_differences, induction_scores

    m, folder = _load(zoo, "attn-only-1l")
    if m is None:
        return []
    text, vocab, _ = _text(m, folder)
    w = icl_windows(m, text)
    early, late = icl_positions(w.shape[1])
    icl, se = _mean_se(in_context_learning_differences(m, w, early, late))
    ind = float(induction_scores(m, tokens_from=vocab).max())
    extra = ""
    if (folder / "metrics.jsonl").is_file():
        d = training_dynamics(folder)
        bump = (f"no loss bump (the loss never falls {BUMP_RATIO:g}× faster over a doubling of tokens than over the "
                "one before)" if d.bump is None else f"a loss bump at {d.bump:,} tokens")
        extra = f"; training-time ICL {_f(d.icl_before)} → {_f(d.icl_after)}; {bump}"
    return [Row("1L: no induction heads, so no induction phase change",
                "no bump in the loss curve of 1-layer models",
                f"best induction score {ind:.2f}; ICL score {icl:+.3f} ± {se:.3f} on {w.shape[0]} windows{extra}",
                "A 1-layer model cannot K-compose, so no head can prefix-match. " + _one_layer_icl_note(icl, se))]


def _one_layer_icl_note(icl: float, se: float) -> str:
    if abs(icl) < 2 * se:
        return (f"Its ICL score is within two standard errors of zero ({icl:+.3f} ± {se:.3f}): no measurable "
                "in-context learning, the papers' 'before the phase change' state.")
    if icl < 0:
        return ("Its ICL score is clearly negative: Python source repeats identifiers, and 1-layer copying "
                "heads (skip-trigrams '[a] … [b] → [a]') raise tokens seen earlier in the context without induction.")
    return ("Its ICL score is positive: later tokens are predicted worse than early ones (measured, not explained "
            "here); without prefix matching the longer context does not help it.")


def write(out: Path = DEFAULT_OUT, zoo: Path | None = None) -> str:
    from models.io.checkpoint import ZOO_DIR

    zoo = Path(zoo) if zoo is not None else ZOO_DIR
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    with torch.no_grad():  # measurement only
        rows = zero_layer_rows(zoo) + one_layer_rows(zoo) + one_layer_dynamics_rows(zoo) + two_layer_rows(zoo)
    lines = ["# Reproduction: published numbers vs our model zoo", "",
             "Generated by `python -m analyses.reproduction` from the models in `models/zoo/` (see each model's "
             "card for its training). Paper columns: Elhage et al. 2021 (Framework), Olsson et al. 2022 (Induction "
             "heads), ARENA 1.2, as collected in `reference.md`. Our models are far smaller than the papers' (d_model "
             "128; 0L/1L: 2048-token BPE, 256-token contexts; 2L: 512-token BPE, 128-token contexts, 4 heads of 32; "
             "Python's standard library; 12–25 million tokens on a 2-core CPU), so the claims to check are the "
             "qualitative ones; absolute numbers differ and each row says why. ICL scores average 1024 validation "
             "windows (standard error 0.08–0.12 nats).", "",
             "| claim | paper | ours (measured) | note |", "|---|---|---|---|"]
    esc = lambda s: s.replace("|", "\\|")
    lines += [f"| {esc(r.claim)} | {esc(r.paper)} | {esc(r.ours)} | {esc(r.note)} |" for r in rows]
    lines += ["", f"*Computed in {time.perf_counter() - t0:.0f} s on CPU.*", ""]
    text = "\n".join(lines)
    atomic_write_text(out, text)
    return text


def _main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m analyses.reproduction", description=__doc__.split("\n")[0])
    p.add_argument("--out", default=str(DEFAULT_OUT))
    p.add_argument("--zoo", default=None, help="folder holding the zoo models (default: models/zoo)")
    a = p.parse_args(argv)
    print(write(Path(a.out), a.zoo))
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())

"""`build_report(model_or_name_or_path, out_dir)`: a markdown report with PNG figures, sections chosen to fit
the model (depth, attention-only or not, a training run beside it). `circuits report MODEL --out DIR` calls it.
"""

from __future__ import annotations

import errno
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..patching.report_section import induction_paths
from . import sections as S
from .encdec_sections import ENCDEC_SECTIONS

#: (key, title, predicate(ctx) → bool, function) in report order.
SECTIONS = [
    ("overview", "Overview", lambda c: True, S.overview),
    ("direct_path", "Zero layers: the direct path as a bigram model", lambda c: True, S.direct_path),
    ("attention", "Attention patterns and head scores", lambda c: c.cfg.n_layers >= 1, S.attention),
    ("detection", "Previous-token and induction heads", lambda c: c.cfg.n_layers >= 1, S.detection),
    ("copying", "Copying heads: OV circuit eigenvalues", lambda c: c.cfg.n_layers >= 1, S.copying),
    ("skip_trigrams", "One layer: skip-trigrams", lambda c: c.cfg.n_layers >= 1, S.skip_trigram_section),
    ("positional", "Positional vs content heads", lambda c: c.cfg.n_layers >= 1, S.positional),
    ("ablation", "Pattern-preserving head ablation", lambda c: c.cfg.n_layers >= 1, S.ablation),
    ("composition", "Two layers: composition and the induction circuit", lambda c: c.cfg.n_layers >= 2,
     S.composition),
    ("path_patching", "Path patching of the induction circuit", lambda c: c.cfg.n_layers >= 2, induction_paths),
    ("term_importance", "Path expansion: term importance by order",
     lambda c: c.cfg.n_layers >= 1 and c.attn_only, S.term_importance),
    ("icl", "In-context learning", lambda c: True, S.in_context),
    ("dynamics", "Training dynamics", lambda c: c.run_dir is not None, S.dynamics),
    ("mlp_note", "A note on MLPs", lambda c: not c.attn_only, S.mlp_note),
]
#: Sections that may run in a second process beside the others (`build_report(parallel=True)`): they read
#: `ctx.cache` only from each other, and together take about half of the attn-only-2l report's CPU time.
SECOND_PROCESS = {"direct_path", "skip_trigrams", "ablation", "icl", "dynamics"}


@dataclass
class Report:
    """What `build_report` wrote: `path` (report.md), `files` (report.md and every figure), the sections run,
    sections that failed (key → error message) and the seconds each section took."""

    path: Path
    files: list[Path]
    sections: list[str]
    failed: dict[str, str] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    def __str__(self) -> str:
        figs = sum(1 for f in self.files if f.suffix == ".png")
        fail = f"; failed: {', '.join(self.failed)}" if self.failed else ""
        return f"Report({self.path}: {len(self.sections)} sections, {figs} figures{fail})"


_DISK_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO)


def _load(model_or_name_or_path):
    """(model, display name, model folder or None)."""
    if isinstance(model_or_name_or_path, (str, Path)):
        import models
        from models.io.checkpoint import ZOO_DIR, resolve

        folder = resolve(model_or_name_or_path)
        shipped = Path(folder).resolve().parent == Path(ZOO_DIR).resolve()
        return models.load(folder), Path(folder).name if shipped else str(model_or_name_or_path), folder
    m = model_or_name_or_path
    if not hasattr(m, "cfg") or not (hasattr(m, "W_E") or hasattr(m, "W_E_src")):
        raise TypeError(f"build_report needs a model, a zoo name or a folder path, got {type(m).__name__}")
    return m, getattr(m.cfg, "model_name", None) or type(m).__name__, None


def read_train_config(folder: Path | None) -> dict:
    if folder is not None and (Path(folder) / "train_config.json").is_file():
        from models.errors import CheckpointError
        from models.files.safe_read import JSON_LIMIT, read_text

        return json.loads(read_text(Path(folder) / "train_config.json", JSON_LIMIT, CheckpointError))
    return {}


def training_corpus(model, folder: Path | None):
    """The token corpus the model was trained on (`train_config.json`'s data, resolved inside the folder by
    `models.data.corpora.recorded_data`, else the standard library), or None when the model has no tokenizer,
    trained on synthetic data, or the corpus fails. A `data` naming anything outside the folder raises
    `CorpusError`."""
    tok = getattr(model, "tokenizer", None)
    if tok is None or not hasattr(tok, "vocab_size"):
        return None
    from models.data.corpora import recorded_data

    data = read_train_config(folder).get("data") if folder is not None else None
    data = recorded_data(folder, data) if folder is not None else "stdlib"  # CorpusError: a name outside the folder
    if isinstance(data, str) and data.startswith(("synthetic", "seq2seq")):
        return None
    try:
        from models.data.corpora import build_token_corpus

        return build_token_corpus(data, tok)
    except Exception:  # no corpus here (offline, missing folder): the report goes on without text
        return None


def validation_text(model, folder: Path | None, max_tokens: int, corpus=None):
    """(1-D validation tokens, seen ids) of the corpus the model was trained on (`training_corpus`), or
    (None, None)."""
    corpus = corpus if corpus is not None else training_corpus(model, folder)
    if corpus is None:
        return None, None
    val = torch.from_numpy(corpus.val[:max_tokens].astype("int64"))
    return val, torch.from_numpy(corpus.seen_ids())


def build_report(model_or_name_or_path, out_dir, tokens=None, sections: list[str] | None = None,
                 n_windows: int = 64, max_text_tokens: int = 400_000, seed: int = 0, progress: bool = True,
                 run_dir=None, num_threads: int | None = 1, html: bool = False, parallel: bool = True) -> Report:
    """Analyse a model and write `out_dir/report.md` plus PNG figures; returns a `Report` listing the files.

    `model_or_name_or_path`: a model object, a zoo name ("attn-only-2l") or a saved-model folder. `tokens`: a
    1-D validation token stream (default: the validation split of the corpus in the folder's
    `train_config.json`, else the standard library, tokenized with the model's tokenizer). `sections`: keys of
    `SECTIONS` to run (default: every one that fits the model). `run_dir`: a training run's folder holding
    `metrics.jsonl` (default: the model's folder, when it has one). `n_windows` validation windows of n_ctx
    tokens feed the loss and the ICL score (a difference of two single-position losses: it needs many).
    A section that fails is reported in the markdown and in `Report.failed`; the others still run. `html`: also
    write `report.html`, one self-contained page (figures embedded, attention patterns interactive; see
    `analyses.report.html`). `parallel`: run the sections in `SECOND_PROCESS` in a forked child process beside the
    others where that is safe (see `analyses.report.run`); the report is the same either way.
    `num_threads`: torch intra-op threads while the
    report runs: 1 (default) avoids OpenMP barrier waits with these small tensors on a busy shared CPU (see
    benchmarks/README.md); None keeps torch's setting.

    `out_dir` is a report folder (`models.io.run_folder`): new, empty or an earlier report (a folder of other files,
    or of another kind, raises `FolderError`; a file raises `NotADirectoryError`), locked while the report runs. The
    report is written into a hidden staging folder beside it and published in one atomic swap (the folder's other
    files kept), so an error, a full disk (`DiskFullError`) or a crash leaves the previous report as it was."""
    from models.io.run_folder import staged

    with staged(out_dir, "report", legacy_report) as stage:  # checked and locked before any analysis runs
        n_before = torch.get_num_threads()
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        try:
            return _build(model_or_name_or_path, out_dir, stage, tokens, sections, n_windows, max_text_tokens, seed,
                          progress, run_dir, html, parallel)
        finally:
            torch.set_num_threads(n_before)


def legacy_report(folder: Path):
    """A report folder written before folders carried marks: it holds report.md."""
    from models.io.run_folder import Mark

    return Mark("report") if (folder / "report.md").is_file() else None


def _build(model_or_name_or_path, out_dir, stage, tokens, sections, n_windows, max_text_tokens, seed, progress,
           run_dir, html=False, parallel=True) -> Report:
    import matplotlib

    matplotlib.use("Agg")
    from ..util import as_1d_tokens, windows

    model, name, folder = _load(model_or_name_or_path)
    if hasattr(model, "eval"):
        model.eval()
    out = Path(out_dir)
    corpus = None
    if tokens is not None:
        text, vocab = as_1d_tokens(tokens), None
    else:
        corpus = training_corpus(model, folder)
        text, vocab = validation_text(model, folder, max_text_tokens, corpus)
    if vocab is None and text is not None:
        vocab = torch.unique(text)
    win = None
    if text is not None:
        from ..sequences import bos_token_id

        n = min(model.cfg.n_ctx, max(2, text.numel() - 1))
        win = windows(text, n, n_windows, seed, bos=bos_token_id(model))
    rd = Path(run_dir) if run_dir is not None else folder
    if rd is not None and not (rd / "metrics.jsonl").is_file():
        rd = None
    return _write(model, name, out, stage, text, win, vocab, rd, seed, corpus, folder, sections, progress, html,
                  parallel)


def _write(model, name, out, stage, text, win, vocab, rd, seed, corpus, folder, sections, progress, html,
           parallel) -> Report:
    """Run the sections into the staging folder `stage` (`build_report` publishes it into `out`)."""
    ctx = S.Context(model, name, stage, text, win, vocab, rd, seed,
                    train_text=None if corpus is None else corpus.train, train_config=read_train_config(folder))
    encdec = hasattr(model, "cross_W_Q")
    table = ENCDEC_SECTIONS if encdec else SECTIONS  # the section set is picked by model type
    chosen = [s for s in table if (sections is None or s[0] in sections) and s[2](ctx)]
    heads = "`E`/`D`/`C{layer}H{head}` (encoder, decoder, cross-attention)" if encdec else "`L{layer}H{head}`"
    md = [f"# Circuit report: {name}", "",
          f"Generated by `analyses.report.build_report`. Each section says what its numbers measure; head names "
          f"are {heads}; losses are in nats per token.", ""]
    report = Report(out / "report.md", [], [s[0] for s in chosen])
    from .run import Progress, run_sections

    outcomes = run_sections(ctx, [(s[0], s[3]) for s in chosen], SECOND_PROCESS, _DISK_ERRORS, parallel,
                            Progress(len(chosen), f"report {name}", progress))
    for key, title, _, _ in chosen:
        o = outcomes[key]
        md += [f"## {title}", "", o.text, ""]
        if o.failure is not None:
            report.failed[key] = o.failure
        report.seconds[key] = o.seconds
    ctx.files = [f for key, *_ in chosen for f in outcomes[key].files]  # report order, whichever process
    (stage / "report.md").write_text("\n".join(md))
    staged = list(dict.fromkeys(ctx.files))
    if html:
        from .html import write_html

        staged.append(write_html(ctx, "\n".join(md), stage / "report.html"))
    report.files = [report.path] + [out / f.name for f in staged]
    return report

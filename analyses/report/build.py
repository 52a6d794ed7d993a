"""`build_report(model, out_dir)`: a markdown report with PNG figures of a loaded model, sections chosen to fit it
(its kind, depth, attention-only or not, a training run beside it). `circuits report MODEL --out DIR` calls it.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from models.arch.kind import ENCODER_DECODER, model_kind

from ..patching.report_section import induction_paths
from . import discovery_section as D
from . import sections as S
from .context import Context
from .encdec_sections import ENCDEC_SECTIONS
from .run import Section, check_split, shared_memos

#: The sections of decoder-only and encoder-only models, in report order (`Section`: key, title, fits(ctx), run(ctx),
#: the `ctx.cache` keys it reads and writes); encoder–decoders get `ENCDEC_SECTIONS`.
SECTIONS = [
    Section("overview", "Overview", lambda c: True, S.overview, writes=frozenset({"val_loss"})),
    Section("direct_path", "Zero layers: the direct path as a bigram model", lambda c: True, S.direct_path,
            writes=frozenset({"bigrams"})),
    Section("attention", "Attention patterns and head scores", lambda c: c.cfg.n_layers >= 1, S.attention,
            memos=frozenset({"detect"})),
    Section("detection", "Previous-token and induction heads", lambda c: c.cfg.n_layers >= 1, S.detection,
            memos=frozenset({"detect"})),
    Section("copying", "Copying heads: OV circuit eigenvalues", lambda c: c.cfg.n_layers >= 1, S.copying,
            writes=frozenset({"copying"})),
    Section("skip_trigrams", "One layer: skip-trigrams", lambda c: c.cfg.n_layers >= 1, S.skip_trigram_section,
            reads=frozenset({"bigrams"})),
    Section("positional", "Positional vs content heads", lambda c: c.cfg.n_layers >= 1, S.positional),
    Section("ablation", "Pattern-preserving head ablation", lambda c: c.cfg.n_layers >= 1, S.ablation,
            memos=frozenset({"detect"})),
    Section("composition", "Two layers: composition and the induction circuit", lambda c: c.cfg.n_layers >= 2,
            S.composition, memos=frozenset({"detect"})),
    Section("path_patching", "Path patching of the induction circuit", lambda c: c.cfg.n_layers >= 2,
            induction_paths, memos=frozenset({"detect"})),
    Section("discovery", "Circuit discovery: the edges that carry the behaviour", D.fits_decoder, D.discovery,
            memos=frozenset({"detect"})),
    Section("term_importance", "Path expansion: term importance by order",
            lambda c: c.cfg.n_layers >= 1 and c.attn_only, S.term_importance_section),
    Section("icl", "In-context learning", lambda c: True, S.in_context, writes=frozenset({"icl"})),
    Section("dynamics", "Training dynamics", lambda c: c.run_dir is not None, S.dynamics),
    Section("mlp_note", "A note on MLPs", lambda c: not c.attn_only, S.mlp_note),
]
#: Sections that may run in a second process beside the others (`build_report(parallel=True)`), together about half
#: of the attn-only-2l report's CPU time; `run.check_split` holds them to their `ctx.cache` declarations.
SECOND_PROCESS = {"direct_path", "skip_trigrams", "ablation", "icl", "dynamics"}


def section_table(model) -> list[Section]:
    """The sections of `model`'s kind (`models.model_kind`): `ENCDEC_SECTIONS` for an encoder–decoder, else
    `SECTIONS`."""
    return [Section(*s) for s in (ENCDEC_SECTIONS if model_kind(model) == ENCODER_DECODER else SECTIONS)]


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


def folder_train_config(folder: Path | None) -> dict:
    """The folder's train_config.json through its reader (`models.io.readers.read_train_config`), {} without one."""
    if folder is not None and os.path.lexists(Path(folder) / "train_config.json"):
        from models.io.readers import read_train_config as read

        return read(Path(folder) / "train_config.json")
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

    data = folder_train_config(folder).get("data") if folder is not None else None
    data = recorded_data(folder, data) if folder is not None else "stdlib"  # CorpusError: a name outside the folder
    if isinstance(data, str) and data.startswith(("synthetic", "seq2seq")):
        return None
    try:
        from models.data.corpora import build_token_corpus

        return build_token_corpus(data, tok)
    except Exception:  # no corpus here (offline, missing folder): the report goes on without text
        return None


def corpus_warning(corpus, folder: Path | None) -> str:
    """"" when `corpus` is the one the model's card names (its folder's `summary.json` `corpus`, by sha256) or there
    is no card; else one sentence saying the numbers are measured on another corpus, or that the card names none."""
    if corpus is None or folder is None or not (Path(folder) / "summary.json").is_file():
        return ""
    from models.io.readers import read_summary

    card = read_summary(Path(folder) / "summary.json").get("corpus") or {}
    if not card.get("sha256"):
        return "The model's card names no corpus checksum: its numbers may be measured on other text."
    if card["sha256"] != corpus.sha256:
        return (f"Not the corpus the model's card names ({card.get('name')}, sha256 {card['sha256']}): numbers can "
                "differ from the card's.")
    return ""


def corpus_note(corpus, folder: Path | None) -> str:
    """One line naming the corpus numbers are measured on (name, sha256), with `corpus_warning`'s sentence."""
    if corpus is None:
        return ""
    warning = corpus_warning(corpus, folder)
    return f"Text: the validation split of corpus {corpus.name} (sha256 {corpus.sha256})." + (
        f" {warning}" if warning else "")


def validation_text(model, folder: Path | None, max_tokens: int, corpus=None):
    """(1-D validation tokens, seen ids) of the corpus the model was trained on (`training_corpus`), or
    (None, None)."""
    corpus = corpus if corpus is not None else training_corpus(model, folder)
    if corpus is None:
        return None, None
    val = torch.from_numpy(corpus.val[:max_tokens].astype("int64"))
    return val, torch.from_numpy(corpus.seen_ids())


def build_report(model, out_dir, folder=None, name: str | None = None, tokens=None, sections: list[str] | None = None,
                 n_windows: int = 64, max_text_tokens: int = 400_000, seed: int = 0, progress: bool = True,
                 num_threads: int | None = 1, html: bool = False, parallel: bool = True) -> Report:
    """Analyse a loaded model and write `out_dir/report.md` plus PNG figures; returns a `Report` listing the files.

    `model`: a model object (`models.load(...)`: its tokenizer, device and weights are the ones reported).
    `folder`: the folder it was trained in or saved to, or None: its `train_config.json` names the corpus and the
    seq2seq task, its `metrics.jsonl` gives the training dynamics. `name`: the name the report shows (default: the
    folder's name, else the config's `model_name`, else the class name). `tokens`: a 1-D validation token stream
    (default: the validation split of the corpus in the folder's `train_config.json`, else the standard library,
    tokenized with the model's tokenizer). `sections`: keys of the section table to run (default: every one that
    fits the model). `n_windows` validation windows of n_ctx tokens feed the loss and the ICL score (a difference
    of two single-position losses: it needs many). A section that fails is reported in the markdown and in
    `Report.failed`; the others still run. `html`: also write `report.html`, one self-contained page (figures
    embedded, attention patterns interactive; see `analyses.report.html`). `parallel`: run the sections in
    `SECOND_PROCESS` in a forked child process beside the others where that is safe (see `analyses.report.run`);
    the report is the same either way. `num_threads`: torch intra-op threads while the report runs: 1 (default)
    avoids OpenMP barrier waits with these small tensors on a busy shared CPU (see benchmarks/README.md); None
    keeps torch's setting.

    `out_dir` is a report folder (`models.io.run_folder`): new, empty or an earlier report (a folder of other files,
    or of another kind, raises `FolderError`; a file raises `NotADirectoryError`), locked while the report runs. The
    report is written into a hidden staging folder beside it and published in one atomic swap (the folder's other
    files kept), so an error, a full disk (`DiskFullError`) or a crash leaves the previous report as it was."""
    if isinstance(model, (str, Path)) or not hasattr(model, "cfg"):
        raise TypeError(f"build_report takes a loaded model (models.load(NAME_OR_FOLDER), with folder=the folder), "
                        f"got {type(model).__name__}")
    model_kind(model)  # ConfigError for an object that is not a model
    from models.io.run_folder import staged

    with staged(out_dir, "report", legacy_report) as stage:  # checked and locked before any analysis runs
        n_before = torch.get_num_threads()
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        try:
            return _build(model, Path(out_dir), stage, None if folder is None else Path(folder), name, tokens,
                          sections, n_windows, max_text_tokens, seed, progress, html, parallel)
        finally:
            torch.set_num_threads(n_before)


def legacy_report(folder: Path):
    """A report folder written before folders carried marks: it holds report.md."""
    from models.io.run_folder import Mark

    return Mark("report") if (folder / "report.md").is_file() else None


@dataclass
class _Inputs:
    """What the sections of one report are run on, gathered before anything is written."""

    model: object
    name: str
    out: Path  # the report folder (published into at the end)
    text: torch.Tensor | None  # 1-D validation tokens
    windows: torch.Tensor | None  # [n, n_ctx] validation windows, BOS first
    vocab: torch.Tensor | None  # the ids random probes are drawn from
    run_dir: Path | None  # the folder with metrics.jsonl, when there is one
    seed: int
    train_text: object  # the corpus' training split, or None
    train_config: dict
    sections: list[str] | None  # keys asked for (None: all that fit)
    progress: bool
    html: bool
    parallel: bool
    corpus_note: str = ""  # the header's line naming the text (`corpus_note`)


def _build(model, out: Path, stage: Path, folder, name, tokens, sections, n_windows, max_text_tokens, seed, progress,
           html, parallel) -> Report:
    import matplotlib

    matplotlib.use("Agg")
    from ..util import as_1d_tokens, windows

    if hasattr(model, "eval"):
        model.eval()
    name = name or (folder.name if folder is not None else None) or getattr(model.cfg, "model_name", None) \
        or type(model).__name__
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
    rd = folder if folder is not None and (folder / "metrics.jsonl").is_file() else None
    note = "Text: the validation tokens the caller gave." if tokens is not None else corpus_note(corpus, folder)
    inputs = _Inputs(model, name, out, text, win, vocab, rd, seed, None if corpus is None else corpus.train,
                     folder_train_config(folder), sections, progress, html, parallel, note)
    return _write(inputs, stage)


def _write(i: _Inputs, stage: Path) -> Report:
    """Run the sections into the staging folder `stage` (`build_report` publishes it into `i.out`)."""
    ctx = Context(i.model, i.name, stage, i.text, i.windows, i.vocab, i.run_dir, i.seed, train_text=i.train_text,
                    train_config=i.train_config)
    table = section_table(i.model)  # the section set is picked by the model's kind
    check_split(table, SECOND_PROCESS)
    chosen = [s for s in table if (i.sections is None or s.key in i.sections) and s.fits(ctx)]
    encdec = model_kind(i.model) == ENCODER_DECODER
    heads = "`E`/`D`/`C{layer}H{head}` (encoder, decoder, cross-attention)" if encdec else "`L{layer}H{head}`"
    md = [f"# Circuit report: {i.name}", "",
          f"Generated by `analyses.report.build_report`. Each section says what its numbers measure; head names "
          f"are {heads}; losses are in nats per token.", "",
          *([i.corpus_note, ""] if i.corpus_note else [])]
    out, name, html, parallel, progress = i.out, i.name, i.html, i.parallel, i.progress
    report = Report(out / "report.md", [], [s[0] for s in chosen])
    from .run import Progress, run_sections

    memos = shared_memos(chosen, SECOND_PROCESS)
    outcomes = run_sections(ctx, [(s.key, s.run) for s in chosen], SECOND_PROCESS, _DISK_ERRORS, parallel,
                            Progress(len(chosen), f"report {name}", progress), lambda: ctx.compute_memos(memos))
    for key, title, *_ in chosen:
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

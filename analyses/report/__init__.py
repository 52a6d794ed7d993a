"""The circuits report of one model: `build_report` (build.py) runs the sections (sections.py for decoder-only
models, encdec_sections.py for encoder–decoders; each reads the `Context` of context.py) in one process or two
(run.py) and writes report.md, its figures and optionally one HTML page (html.py) into a staged folder."""

from .build import (  # noqa: F401
    ENCDEC_SECTIONS,
    SECOND_PROCESS,
    SECTIONS,
    Report,
    Section,
    build_report,
    corpus_note,
    corpus_warning,
    folder_train_config,
    section_table,
    training_corpus,
    validation_text,
)

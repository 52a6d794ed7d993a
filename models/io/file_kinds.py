"""The registry of file kinds: each kind of file the toolkit reads, with its reader (`models.io.readers`), a
function that writes a valid example (`models.io.examples`) and the command lines that read it.
`tests/reliability/test_corruption.py` corrupts every kind registered here in every way that applies and runs every
command listed: a new file kind, or a new command that reads one, joins that test by a line here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..data.corpora import read_corpus_meta
from ..data.tokenizer import load_tokenizer
from ..files.safe_read import JSON_LIMIT, TOKENIZER_LIMIT
from . import examples as ex
from .checkpoint import load
from .readers import (
    CONFIG_FILE,
    DISCOVERY_TASK_FILE,
    METRICS_FILE,
    METRICS_LIMIT,
    SAE_CFG_FILE,
    SAE_CFG_LIMIT,
    SAE_TRAINING_FILE,
    SAE_WEIGHTS_FILE,
    STATE_FILE,
    SUMMARY_FILE,
    SWEEP_FILE,
    TOKENIZER_FILE,
    TRAIN_CONFIG_FILE,
    WEIGHTS_FILE,
    WEIGHTS_LIMIT,
    read_config,
    read_discovery_task,
    read_metrics,
    read_pth,
    read_sae_cfg,
    read_sae_folder,
    read_sae_training,
    read_summary,
    read_sweep,
    read_train_config,
    read_trainer_state,
)


@dataclass(frozen=True)
class FileKind:
    """A kind of file the toolkit reads.

    `name`: its file name; `read(path)`: its reader; `example(folder) -> path`: writes into `folder` a valid
    example of what holds the file (a model folder, a sweep, an SAE beside a model) and returns the file's path;
    `format`: "json", "jsonl", "safetensors" or "pth" (which corruptions apply); `commands`: the command lines
    (`circuits ...` argv) that read it, with `{root}` for `folder` and `{out}` for a new path they may write;
    `finite`: whether non-finite values in it are refused (weights that must be finite); `limit`: its size bound
    in bytes; `contained`: whether it is a file of a folder (a symbolic link leading out of it is refused) rather than
    one a user names on the command line."""

    name: str
    read: Callable
    example: Callable[[Path], Path]
    format: str
    commands: tuple[tuple[str, ...], ...] = field(default=())
    finite: bool = False
    limit: int = JSON_LIMIT
    contained: bool = True


#: every command that loads a model folder (and so reads its config, weights, tokenizer, train_config and summary)
MODEL_COMMANDS = (
    ("info", "{root}/model"),
    ("heads", "{root}/model"),
    ("eigen", "{root}/model"),
    ("compose", "{root}/model"),
    ("paths", "{root}/model"),
    ("trigrams", "{root}/model", "--head", "0.0"),
    ("attention", "{root}/model", "--text", "hello", "--figure", "{out}.png"),
    ("generate", "{root}/model", "--prompt", "hello", "--max-new-tokens", "2"),
    ("report", "{root}/model", "--out", "{out}", "--sections", "overview"),
    ("patch", "{root}/model", "--clean", "the fox", "--corrupt", "the dog", "--answer", " world"),
    ("lens", "{root}/model", "--text", "hello"),
    ("discover", "{root}/model", "--task", "induction", "--seq-len", "3", "--n-prompts", "2", "--out", "{out}"),
    ("sae", "train", "{root}/model", "--hook", "blocks.0.hook_resid_post", "--out", "{out}"),
    ("sae", "report", "{root}/model", "{root}/sae", "--out", "{out}"),
)
SWEEP_COMMANDS = (
    ("sweep", "{root}/sweep"),
    ("sweep", "{root}/sweep", "--out", "{out}"),
    ("report", "{root}/sweep", "--out", "{out}"),
)
SAE_COMMANDS = (("sae", "report", "{root}/model", "{root}/sae", "--out", "{out}"),
                ("sae", "report", "{root}/model", "{root}/sae", "--out", "{out}", "--html", "--features", "0,3"))
DISCOVERY_COMMANDS = (("discover", "{root}/model", "--task", "{root}/task.json", "--method", "acdc", "--out", "{out}"),)
LEGACY_COMMANDS = (
    ("info", "{root}/old.pth", "--config", "{root}/cfg.json"),
    ("heads", "{root}/old.pth", "--config", "{root}/cfg.json"),
)


def _kinds() -> dict[str, FileKind]:
    model, sae, sweep = ex.model_example, ex.sae_example, ex.sweep_example
    return {
        "config.json": FileKind(CONFIG_FILE, read_config, lambda d: model(d) / CONFIG_FILE, "json", MODEL_COMMANDS),
        "model.safetensors": FileKind(WEIGHTS_FILE, lambda p: load(Path(p).parent), lambda d: model(d) / WEIGHTS_FILE,
                                      "safetensors", MODEL_COMMANDS, limit=WEIGHTS_LIMIT),
        "tokenizer.json": FileKind(TOKENIZER_FILE, lambda p: load_tokenizer(p, contained=True),
                                   lambda d: model(d) / TOKENIZER_FILE, "json", MODEL_COMMANDS, limit=TOKENIZER_LIMIT),
        "train_config.json": FileKind(TRAIN_CONFIG_FILE, read_train_config, lambda d: model(d) / TRAIN_CONFIG_FILE,
                                      "json", MODEL_COMMANDS),
        "summary.json": FileKind(SUMMARY_FILE, read_summary, lambda d: model(d) / SUMMARY_FILE, "json",
                                 MODEL_COMMANDS),
        "trainer_state.json": FileKind(STATE_FILE, read_trainer_state, ex.trainer_state_example, "json"),
        "metrics.jsonl (run)": FileKind(METRICS_FILE, read_metrics, lambda d: model(d) / METRICS_FILE, "jsonl",
                                        MODEL_COMMANDS, limit=METRICS_LIMIT),
        "metrics.jsonl": FileKind(METRICS_FILE, read_metrics, lambda d: sweep(d) / "seed-0" / METRICS_FILE, "jsonl",
                                  SWEEP_COMMANDS, limit=METRICS_LIMIT),
        "sweep.json": FileKind(SWEEP_FILE, read_sweep, lambda d: sweep(d) / SWEEP_FILE, "json", SWEEP_COMMANDS),
        "cfg.json (SAE)": FileKind(SAE_CFG_FILE, read_sae_cfg, lambda d: sae(d) / SAE_CFG_FILE, "json", SAE_COMMANDS,
                                   limit=SAE_CFG_LIMIT),
        "sae_weights.safetensors": FileKind(SAE_WEIGHTS_FILE, lambda p: read_sae_folder(Path(p).parent),
                                            lambda d: sae(d) / SAE_WEIGHTS_FILE, "safetensors", SAE_COMMANDS,
                                            finite=True, limit=WEIGHTS_LIMIT),
        "training.json (SAE)": FileKind(SAE_TRAINING_FILE, read_sae_training, lambda d: sae(d) / SAE_TRAINING_FILE,
                                        "json", SAE_COMMANDS),
        "task.json (discovery)": FileKind(DISCOVERY_TASK_FILE, read_discovery_task, ex.discovery_task_example, "json",
                                          DISCOVERY_COMMANDS, contained=False),
        "meta.json (corpus cache)": FileKind("meta.json", read_corpus_meta, ex.corpus_cache_example, "json"),
        "legacy .pth": FileKind("old.pth", read_pth, ex.legacy_example, "pth", LEGACY_COMMANDS, limit=WEIGHTS_LIMIT,
                                contained=False),
    }


FILE_KINDS: dict[str, FileKind] = _kinds()

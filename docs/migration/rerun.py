"""Re-run real TransformerLens 2.x code on this toolkit's zoo: ARENA 1.2's solutions and four TransformerLens 2.18
demos, cell by cell, and count the cells that ran unchanged, needed an edit, or failed (issue 33).

Each source is read at a pinned commit from a local git clone (`--tl-git`, `--arena-git`: a `.git` folder or a bare
mirror; nothing is fetched), split into cells (notebook code cells; ARENA's `solutions.py` at its `# %%` markers),
adapted mechanically the way README's "Coming from TransformerLens 2.x" tells a user to adapt code:

1. the import rename `transformer_lens` -> `models` (every occurrence of the package name);
2. model loading: `HookedTransformer.from_pretrained("NAME", ...)` -> `models.load("ZOO", ...)` (`ZOO_FOR`), plus
   the few hand-written loading cells in `LOAD` (ARENA builds its model from a config and a downloaded TL 2.x state
   dict: here the config has the zoo model's sizes and the state dict is the zoo model saved by transformer-lens
   2.18.0 itself, masks and all);

then the per-cell edits of `EDITS` (each with its reason and whose it is: "ours" = a gap of this toolkit, "inherent"
= the source needs a hub model, a dataset, GPT-2's behaviour, a display package that is not on PyPI, ...), and runs
every cell in order in ONE fresh Jupyter kernel per source (nbclient; one torch thread; Hugging Face offline flags;
a per-cell timeout that interrupts the kernel and goes on). A cell counts as "unchanged" when it ran after the
mechanical adaptation only, "edited" when it ran with an `EDITS` entry, "failed" when it raised (`FAILS` says why).

    python docs/migration/rerun.py --tl-git PATH --arena-git PATH [--only NAME ...] [--out docs/migration]

writes `results.json` and `results.md` into `--out`. Needs the dev environment plus `nbclient`, `ipykernel`,
`plotly` and `gdown` (what the sources import) and the legacy environment `.venv-tl2` (tests/tl2/make_legacy_venv.sh)
for ARENA's TL 2.x state dict.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
ZOO = ROOT / "models" / "zoo"

TL_REPO, TL_COMMIT = "TransformerLensOrg/TransformerLens", "589acd47c7a4e100754f16a840f73229d56e8196"  # v2.18.0
ARENA_REPO, ARENA_COMMIT = "callummcdougall/ARENA_2.0", "e805ad8772b81fa44252ab3b7590ac614aa29376"
ARENA_DIR = "chapter1_transformers/exercises"

#: name -> (git option, commit, path, git blob id of that file at that commit, kind)
SOURCES = {
    "ARENA 1.2 solutions": ("arena", ARENA_COMMIT, f"{ARENA_DIR}/part2_intro_to_mech_interp/solutions.py",
                            None, "percent"),
    "Main_Demo": ("tl", TL_COMMIT, "demos/Main_Demo.ipynb", None, "ipynb"),
    "Exploratory_Analysis_Demo": ("tl", TL_COMMIT, "demos/Exploratory_Analysis_Demo.ipynb", None, "ipynb"),
    "Activation_Patching_in_TL_Demo": ("tl", TL_COMMIT, "demos/Activation_Patching_in_TL_Demo.ipynb", None, "ipynb"),
    "Head_Detector_Demo": ("tl", TL_COMMIT, "demos/Head_Detector_Demo.ipynb", None, "ipynb"),
}
#: ARENA's own helper modules that solutions.py imports (put beside it, import rename applied like the cells)
ARENA_HELPERS = ("plotly_utils.py", "part2_intro_to_mech_interp/solutions.py",
                 "part1_transformer_from_scratch/__init__.py",
                 "part1_transformer_from_scratch/solutions.py", "part1_transformer_from_scratch/tests.py",
                 "part2_intro_to_mech_interp/__init__.py", "part2_intro_to_mech_interp/tests.py")

#: edits to those helper modules (reported with the source's results): helper -> [(old, new, why, whose)]
HELPER_EDITS = {
    "part1_transformer_from_scratch/solutions.py": [
        ("from transformers.models.gpt2.tokenization_gpt2_fast import GPT2TokenizerFast",
         "from transformers import GPT2TokenizerFast",
         "transformers 5 removed the module path tokenization_gpt2_fast (the class is still top-level)", "inherent"),
    ],
}

#: hub model -> the zoo model that stands in for it (GPT-2-like models: gelu-2l, the zoo's one model with MLPs and LN)
ZOO_FOR = {"gpt2-small": "gelu-2l", "gpt2": "gelu-2l", "distilgpt2": "gelu-2l", "gpt2-xl": "gelu-2l",
           "solu-2l": "gelu-2l", "attn-only-2l": "attn-only-2l", "attn-only-1l": "attn-only-1l"}

# Harness code run in the kernel before the first cell (not counted): one thread, and the helpers the loading
# adaptation uses: `_zoo_tl2_state_dict(name)` (path of the zoo model saved as a TL 2.18 state dict) and
# `_zoo_hf_tokenizer(name)` (the zoo model's tokenizer.json as a Hugging Face tokenizer, as TL 2.x would have it),
# `_zoo_checkpoint(name, index)` (the index-th of the zoo model's checkpoint folders, the last one past the end).
PRELUDE = """
import os, sys, torch
torch.set_num_threads(1)
import models
_ZOO = {zoo!r}
_TL2_SD = {tl2!r}
def _zoo_tl2_state_dict(name):
    return _TL2_SD[name]
def _zoo_hf_tokenizer(name):
    from transformers import PreTrainedTokenizerFast
    return PreTrainedTokenizerFast(tokenizer_file=os.path.join(_ZOO, name, "tokenizer.json"), bos_token="<|bos|>",
                                   eos_token="<|endoftext|>", pad_token="<|pad|>")
def _zoo_checkpoint(name, index):
    steps = sorted(os.listdir(os.path.join(_ZOO, name, "checkpoints")))
    return os.path.join(_ZOO, name, "checkpoints", steps[min(index, len(steps) - 1)])
{extra}
print(sys.executable, torch.get_num_threads())
"""

# --- the documented loading adaptation beyond the from_pretrained rewrite (counted as unchanged) ----------------
#: source -> {code cell index: [(old, new), ...]}
LOAD = {
    "ARENA 1.2 solutions": {
        # the config of the downloaded attn_only_2L_half.pth -> the zoo's attn-only-2l's sizes; the tokenizer comes
        # from the zoo folder (set_tokenizer below) instead of the hub name
        10: [("d_model=768", "d_model=128"), ("d_head=64", "d_head=32"), ("n_heads=12", "n_heads=4"),
             ("n_ctx=2048", "n_ctx=128"), ("d_vocab=50278", "d_vocab=512"),
             ('tokenizer_name="EleutherAI/gpt-neox-20b", ', "")],
        # the download -> the zoo model's weights as a TL 2.18 state dict (.pth, with attn.mask / attn.IGNORE)
        11: [("(section_dir / \"attn_only_2L_half.pth\").resolve()", "Path(_zoo_tl2_state_dict(\"attn-only-2l\"))")],
        12: [("model.load_state_dict(pretrained_weights)",
              "model.load_state_dict(pretrained_weights)\n\tmodel.set_tokenizer(_zoo_hf_tokenizer(\"attn-only-2l\"))")],
    },
    "Main_Demo": {
        # a hub model's training checkpoints -> the zoo's attn-only-2l checkpoint folders (gelu-2l keeps none)
        59: [("HookedTransformer.from_pretrained(model_name, checkpoint_index=index, device=device)",
              'models.load(_zoo_checkpoint("attn-only-2l", index), device=device)')],
    },
}

# --- per-cell edits (counted as edited) -------------------------------------------------------------------------
#: source -> {code cell index: {"subs": [(old, new), ...], "why": text, "whose": "ours" | "inherent"}, or a list of
#: those, tried cumulatively in order (a cell's inherent edits first, a workaround of one of our gaps last)}
_HEADS = "the zoo model has 4 heads a layer where ARENA's has 12: its previous-token head 0.7 is the zoo's 0.1, " \
         "its induction head 1.4 the zoo's 1.1 (tests.py's references are recomputed from the same indices)"
_CV = "circuitsvis 1.43 (installed) has no attention_head_names argument"
_BYTES = "gelu-2l's byte-level tokenizer makes a name or word several tokens: the edit takes its first letter"
_VOCAB = "random token ids drawn from GPT-2's range (up to 20000) are outside the zoo's vocabulary (259 / 512 ids)"
_LAYERS = "the layer or head index is GPT-2 small's (12 layers x 12 heads); the zoo model has 2 x 4"
_CTX = "the prompt is longer than the zoo model's 128-token context in bytes: the edit shortens it"
_PLOTLY = "neel_plotly is installed from git, not PyPI: the edit defines no-op line / imshow / scatter"
_PYSVELTE = "PySvelte is installed from git, not PyPI: the edit draws the patterns with circuitsvis"
EDITS: dict[str, dict[int, dict]] = {
    "ARENA 1.2 solutions": {
        9: {"subs": [('\t\tattention_head_names=[f"L0H{i}" for i in range(12)],\n', "")], "why": _CV,
            "whose": "inherent"},
        12: {"subs": [("model.load_state_dict(pretrained_weights)\n",
                       "model.load_state_dict({k: v for k, v in pretrained_weights.items() "
                       "if not k.endswith(('.mask', '.IGNORE'))})\n"),
                      ('model.set_tokenizer(_zoo_hf_tokenizer("attn-only-2l"))',
                       'model.tokenizer = models.load("attn-only-2l").tokenizer')],
             "why": "load_state_dict refuses the attn.mask / attn.IGNORE buffers of a TL 2.x state dict, and "
                    "set_tokenizer refuses a Hugging Face tokenizer", "whose": "ours"},
        19: {"subs": [("for induction_head_layer in [5, 6, 7]:", "for induction_head_layer in [1]:"),
                      ("\t\tgpt2_small.run_with_hooks(\n\t\t\trep_tokens, ",
                       "\t\tgpt2_small.run_with_hooks(\n\t\t\trep_tokens_10, ")],
             "why": "GPT-2 small's induction heads are in layers 5-7 (gelu-2l has 2 layers); the loop feeds GPT-2 the "
                    "attention-only model's tokens, ids past gelu-2l's vocabulary (the cell's own rep_tokens_10 "
                    "instead)", "whose": "inherent"},
        29: {"subs": [("head_index = 4", "head_index = 1")], "why": _HEADS, "whose": "inherent"},
        32: {"subs": [("head_index = 7", "head_index = 1")], "why": _HEADS, "whose": "inherent"},
        34: {"subs": [("ind_head_index = 4", "ind_head_index = 1")], "why": _HEADS, "whose": "inherent"},
        36: {"subs": [("decomposed_scores[0, 9]", "decomposed_scores[0, 3]")], "why": _HEADS + " (component 9 = L0H7 "
             "-> component 3 = L0H1)", "whose": "inherent"},
        37: {"subs": [("prev_token_head_index = 7", "prev_token_head_index = 1"),
                      ("ind_head_index = 4", "ind_head_index = 1"),
                      ("tests.test_find_K_comp_full_circuit(find_K_comp_full_circuit, model)", "pass")],
             "why": _HEADS + "; tests.test_find_K_comp_full_circuit hard-codes heads 7 and 4, so it is not called",
             "whose": "inherent"},
        43: {"subs": [("ablation_induction_score(None, 4)", "ablation_induction_score(None, 1)"),
                      ("ablation_induction_score(i, 4)", "ablation_induction_score(i, 1)")], "why": _HEADS,
             "whose": "inherent"},
    },
    "Main_Demo": {
        14: {"subs": [("head_index_to_ablate = 8", "head_index_to_ablate = 3")], "why": _LAYERS, "whose": "inherent"},
        15: {"subs": [("model.to_single_token(correct_answer)", "model.to_single_token(correct_answer.strip()[0])"),
                      ("model.to_single_token(incorrect_answer)",
                       "model.to_single_token(incorrect_answer.strip()[0])")], "why": _BYTES, "whose": "inherent"},
        18: [{"subs": [("torch.randint(1000, 10000, size)", "torch.randint(3, model.cfg.d_vocab, size)")],
              "why": _VOCAB, "whose": "inherent"},
             {"subs": [("model.loss_fn(repeated_logits, repeated_tokens, per_token=True)",
                        "models.lm_cross_entropy(repeated_logits, repeated_tokens, per_token=True)")],
              "why": "HookedTransformer has no loss_fn", "whose": "ours"}],
        20: {"subs": [("induction_head_layer = 5", "induction_head_layer = 1"),
                      ("induction_head_index = 5", "induction_head_index = 1"),
                      ("torch.randint(1000, 10000, size)", "torch.randint(3, model.cfg.d_vocab, size)")],
             "why": _LAYERS + "; " + _VOCAB, "whose": "inherent"},
        28: {"subs": [("model.to_single_token(' John')", "model.to_single_token('J')"),
                      ("model.to_single_token(' Mary')", "model.to_single_token('M')")], "why": _BYTES,
             "whose": "inherent"},
        32: {"subs": [('model.to_single_token(" The")', 'model.to_single_token("T")')], "why": _BYTES,
             "whose": "inherent"},
        33: {"subs": [("model.to_string(256)", "model.to_string([256])")],
             "why": "to_string does not take an int token id", "whose": "ours"},
        34: {"subs": [('get_token_position(" cat",', 'get_token_position("c",')], "why": _BYTES,
             "whose": "inherent"},
        35: {"subs": [('    " cat", ', '    "c", ')], "why": _BYTES, "whose": "inherent"},
        38: {"subs": [('model.to_single_token(" Mary")', 'model.to_single_token("M")'),
                      ('model.to_single_token(" Claire")', 'model.to_single_token("C")')], "why": _BYTES,
             "whose": "inherent"},
        51: {"subs": [("for layer in range(12) for head in range(12)",
                       "for layer in range(model.cfg.n_layers) for head in range(model.cfg.n_heads)")],
             "why": _LAYERS, "whose": "inherent"},
        59: {"subs": [("model_for_this_checkpoint.cfg.checkpoint_value",
                       'int(os.path.basename(_zoo_checkpoint("attn-only-2l", index)).split("-")[1])')],
             "why": "a zoo checkpoint's config has no checkpoint_value (TL 2.x sets checkpoint_index / _value / "
                    "_label_type on a checkpoint load): the edit reads the step from the folder name",
             "whose": "ours"},
        52: {"subs": [("model.to_string(256)", "model.to_string([256])")],
             "why": "to_string does not take an int token id", "whose": "ours"},
    },
    "Exploratory_Analysis_Demo": {
        6: {"subs": [("model.to_single_token(answers[-1][0])", "model.to_single_token(answers[-1][0].strip()[0])"),
                     ("model.to_single_token(answers[-1][1])", "model.to_single_token(answers[-1][1].strip()[0])")],
            "why": _BYTES, "whose": "inherent"},
        32: {"subs": [("top_k = 10", "top_k = 8"), ("first_mid_layer = 7", "first_mid_layer = 1"),
                      ("first_late_layer = 9", "first_late_layer = 1.5")],
             "why": _LAYERS + " (top 8 of 8 heads, split early / middle / late at heads 4 and 6)", "whose": "inherent"},
        33: {"subs": [("induction_head_labels = [81, 65]", "induction_head_labels = [5, 6]")], "why": _LAYERS +
             " (GPT-2's induction heads L6H9, L5H5 -> gelu-2l's L1H1, L1H2; cell 34 reads them)", "whose": "inherent",
             "always": True},
        35: {"subs": [("seq_len = 100", "seq_len = 50"), ("100, 20000, size=", "3, model.cfg.d_vocab, size=")],
             "why": _VOCAB + "; 2 x 100 tokens exceed the 128-token context", "whose": "inherent"},
    },
    "Activation_Patching_in_TL_Demo": {
        5: {"subs": [("from neel_plotly import line, imshow, scatter",
                      "line = imshow = scatter = lambda *args, **kwargs: None")], "why": _PLOTLY,
            "whose": "inherent"},
        8: {"subs": [("model.to_single_token(answers[i][j])", "model.to_single_token(answers[i][j].strip()[0])")],
            "why": _BYTES, "whose": "inherent"},
        18: {"subs": [("torch.randint(100, 10000, (batch, seq_len))",
                       "torch.randint(3, attn_only.cfg.d_vocab, (batch, seq_len))")],
             "why": _VOCAB + " (cell 19 runs them)", "whose": "inherent", "always": True},
    },
    "Head_Detector_Demo": {
        1: {"subs": [("not DEBUG_MODE", "not DEVELOPMENT_MODE")],
            "why": "the demo's own bug: DEBUG_MODE is never defined (cell 0 defines DEVELOPMENT_MODE)",
            "whose": "inherent"},
        2: {"subs": [("import pysvelte\n", "import circuitsvis as cv\n"),
                     ("from neel_plotly import line, imshow, scatter",
                      "line = imshow = scatter = lambda *args, **kwargs: None")], "why": _PLOTLY,
            "whose": "inherent"},
        16: {"subs": [("    while not tokens[current_token].startswith(' '):",
                       "    while current_token > 1 and not tokens[current_token].startswith(' '):")],
             "why": "the demo's current-word pattern walks back to a token starting with a space; with byte tokens "
                    "the first word's walk wraps round to the prompt's end (GPT-2 tokens assumed): the edit stops it "
                    "at the first token", "whose": "inherent"},
        4: {"subs": [("pysvelte.AttentionMulti(tokens=model.to_str_tokens(prompt), attention=attention_pattern)",
                      "cv.attention.attention_patterns(tokens=model.to_str_tokens(prompt), "
                      "attention=einops.rearrange(attention_pattern, 'seq1 seq2 heads -> heads seq1 seq2'))")],
            "why": _PYSVELTE + " (the cells that call it fail otherwise)", "whose": "inherent", "always": True},
        9: {"subs": [("automatically, reducing the cost of discovery.", "automatically.")], "why": _CTX,
            "whose": "inherent"},
        12: {"subs": [("plot_attn_pattern_from_cache(cache, 4)", "plot_attn_pattern_from_cache(cache, 1)")],
             "why": _LAYERS, "whose": "inherent"},
        11: {"subs": [("plot_attn_pattern_from_cache(cache, 2)", "plot_attn_pattern_from_cache(cache, 1)")],
             "why": _LAYERS, "whose": "inherent"},
        14: {"subs": [("plot_attn_pattern_from_cache(cache, 5)", "plot_attn_pattern_from_cache(cache, 1)")],
             "why": _LAYERS, "whose": "inherent"},
        20: {"subs": [("plot_attn_pattern_from_cache(cache, 5)", "plot_attn_pattern_from_cache(cache, 1)")],
             "why": _LAYERS, "whose": "inherent"},
        29: {"subs": [("automatically, reducing the cost of discovery.", "automatically.")],
             "why": _CTX + " (cells 30-31 run it)", "whose": "inherent", "always": True},
    },
}

#: source -> {code cell index: {"why": text, "whose": "ours" | "inherent"}}: cells that fail even after edits
FAILS: dict[str, dict[int, dict]] = {
    "ARENA 1.2 solutions": {
        21: {"why": "plotly_utils.convert_tokens_to_string calls model.tokenizer.decode(0-d tensor)", "whose": "ours"},
        22: {"why": "plotly_utils.convert_tokens_to_string calls model.tokenizer.decode(0-d tensor)", "whose": "ours"},
    },
    "Main_Demo": {
        57: {"why": "get_checkpoint_labels lists hub models' checkpoint schedules (no zoo counterpart)",
             "whose": "inherent"},
        59: {"why": "past the checkpoint_value edit (ours), evals.induction_loss (TL 4.x's, as `models` has no "
                    "evals) draws ids 100-20000 over 2 x 384 positions, beyond the zoo's 512 ids and 128-token "
                    "context", "whose": "ours + inherent"},
        60: {"why": "plots cell 59's induction losses against tokens seen: cell 59 failed after recording one "
                    "checkpoint's step and no loss", "whose": "inherent"},
    },
    "Head_Detector_Demo": {
    },
}

# The import workaround a user needs today where `models` lacks a name a TL 2.x notebook imports (tried, like an
# EDITS entry, only on a cell that raised): the name from transformer-lens 4.x, which `models` builds on. Every use
# of it is one of OUR gaps (issue 33: "changing the package name is enough").
_TL4_HOME = {"utils": ("transformer_lens", "utilities as utils"), "HookedRootModule": ("transformer_lens", None),
             "FactoredMatrix": ("transformer_lens", None), "ActivationCache": ("transformer_lens", None),
             "HookPoint": ("transformer_lens.hook_points", None)}
_FROM = re.compile(r"^([ \t]*)from models(\.hook_points)? import (\([^)]*\)|[^\n]*)", re.M)


def _has_module(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:
        return False


def _our_names() -> set[str]:
    import models

    return {n for n in ("utils", "HookedRootModule", "HookPoint", "FactoredMatrix", "ActivationCache", "patching",
                        "evals", "head_detector") if hasattr(models, n) or _has_module(f"models.{n}")} | \
        set(models.__all__)


def tl4_imports(src: str) -> str:
    """`from models import a, b` / `from models.hook_points import ...` split into what `models` has and what comes
    from transformer-lens 4.x; `models.utils` -> `transformer_lens.utilities`; `models.patching` / `evals` /
    `head_detector` / `hook_points` -> transformer-lens 4.x's modules of those names."""
    ours = _our_names()

    def split(m):
        indent, sub, body = m.group(1), m.group(2), m.group(3)
        if sub and _has_module("models.hook_points"):
            return m.group(0)
        names = [n.strip() for n in body.strip("() \n").replace("\n", " ").split(",") if n.strip()]
        names = [n for n in names if not n.startswith("#")]
        keep, lines = [], {}
        for n in names:
            base = n.split(" as ")[0].strip()
            if not sub and base in ours:
                keep.append(n)
            else:
                home, alias = _TL4_HOME.get(base, ("transformer_lens.hook_points" if sub else "transformer_lens", None))
                lines.setdefault(home, []).append(alias or n)
        out = ([f"from models import {', '.join(keep)}"] if keep else []) + \
              [f"from {home} import {', '.join(ns)}" for home, ns in lines.items()]
        return indent + ("\n" + indent).join(out)

    src = _FROM.sub(split, src)
    if not _has_module("models.utils"):
        src = re.sub(r"\bimport models\.utils as utils\b", "import transformer_lens.utilities as utils", src)
        src = re.sub(r"\bmodels\.utils\b", "transformer_lens.utilities", src)
    for sub in ("patching", "evals", "head_detector", "hook_points"):
        if not _has_module(f"models.{sub}"):
            src = re.sub(rf"\bmodels\.{sub}\b", f"transformer_lens.{sub}", src)
    return src


TL4_IMPORTS = {"why": "the import needs transformer-lens 4.x's module: `models` does not re-export it", "whose": "ours"}


def git_show(git_dir: str, commit: str, path: str) -> str:
    return subprocess.run(["git", f"--git-dir={git_dir}", "show", f"{commit}:{path}"], check=True,
                          capture_output=True, text=True).stdout


def blob_id(git_dir: str, commit: str, path: str) -> str:
    return subprocess.run(["git", f"--git-dir={git_dir}", "rev-parse", f"{commit}:{path}"], check=True,
                          capture_output=True, text=True).stdout.strip()


def split_cells(text: str, kind: str) -> list[str]:
    """Code cells: a notebook's code cells, or a percent-format script's chunks between `# %%` lines (chunks with
    no code, only comments and blank lines, are dropped)."""
    if kind == "ipynb":
        return ["".join(c["source"]) for c in json.loads(text)["cells"] if c["cell_type"] == "code"]
    chunks, cur = [], []
    for line in text.splitlines(keepends=True):
        if line.startswith("# %%"):
            chunks.append("".join(cur))
            cur = []
        else:
            cur.append(line)
    chunks.append("".join(cur))
    return [c for c in chunks if any(ln.strip() and not ln.strip().startswith("#") for ln in c.splitlines())]


def rename_imports(src: str) -> str:
    return re.sub(r"\btransformer_lens\b", "models", src)


_FROM_PRETRAINED = re.compile(
    r"(?:\bmodels\.)?HookedTransformer\.from_pretrained(?:_no_processing)?\(\s*(['\"])([\w./-]+)\1")


def adapt_loading(src: str) -> str:
    return _FROM_PRETRAINED.sub(lambda m: f'models.load("{ZOO_FOR[m.group(2)]}"' if m.group(2) in ZOO_FOR
                                else m.group(0), src)


def apply_subs(src: str, subs, what: str) -> str:
    for old, new in subs:
        if old not in src:
            raise SystemExit(f"{what}: {old!r} is not in the cell (the source changed? re-check the tables)")
        src = src.replace(old, new)
    return src


def adapt_cells(name: str, originals: list[str]) -> list[dict]:
    """Each cell after the import rename and the loading adaptation (`source`), the edits applied before the run
    (`upfront`), and the fallbacks tried in order on failure (`steps`: (source, reason))."""
    cells = []
    for i, original in enumerate(originals):
        src = adapt_loading(rename_imports(original))
        adapted = src != original
        if i in LOAD.get(name, {}):
            src = apply_subs(src, LOAD[name][i], f"{name} cell {i} (loading)")
            adapted = True
        # the fallbacks, cumulative, tried in order on failure: the transformer-lens 4.x imports (a no-op where
        # `models` has the names), then each EDITS entry of the cell
        edits = EDITS.get(name, {}).get(i, [])
        edits = [edits] if isinstance(edits, dict) else edits
        upfront = [e for e in edits if e.get("always")]  # a value a LATER cell fails on: applied before the run
        for edit in upfront:
            src = apply_subs(src, edit["subs"], f"{name} cell {i}")
        steps, cur = [], src
        if tl4_imports(cur) != cur:
            cur = tl4_imports(cur)
            steps.append((cur, TL4_IMPORTS))
        for edit in edits:
            if not edit.get("always"):
                cur = apply_subs(cur, edit["subs"], f"{name} cell {i}")
                steps.append((cur, edit))
        cells.append({"index": i, "source": src, "adapted": adapted, "steps": steps, "upfront": upfront})
    return cells


def prepare(name: str, args) -> tuple[list[dict], Path]:
    """The cells of one source after adaptation and edits, and the folder to run them in."""
    option, commit, path, _, kind = SOURCES[name]
    git_dir = getattr(args, f"{option}_git")
    text = git_show(git_dir, commit, path)
    work = Path(tempfile.mkdtemp(prefix="rerun-"))
    helpers_edited = []  # helper modules that needed the transformer-lens 4.x imports (one of OUR gaps)
    if option == "arena":  # ARENA's helpers beside solutions.py, as in the course's folder
        for helper in ARENA_HELPERS:
            try:
                body = git_show(git_dir, commit, f"{ARENA_DIR}/{helper}")
            except subprocess.CalledProcessError:
                body = ""
            dest = work / "exercises" / helper
            dest.parent.mkdir(parents=True, exist_ok=True)
            adapted = rename_imports(body)
            for old, new, why, whose in HELPER_EDITS.get(helper, ()):
                adapted = apply_subs(adapted, [(old, new)], helper)
                helpers_edited.append(f"{helper}: {why} ({whose})")
            if tl4_imports(adapted) != adapted:
                helpers_edited.append(f"{helper}: {TL4_IMPORTS['why']} (ours)")
            dest.write_text(tl4_imports(adapted))
    return adapt_cells(name, split_cells(text, kind)), work, helpers_edited


def tl2_state_dicts(out: Path) -> dict[str, str]:
    """The zoo's attention-only models saved by transformer-lens 2.18.0 (`.venv-tl2`) as TL 2.x `.pth` state dicts:
    our safetensors loaded into TL 2.18's HookedTransformer of the same config (missing: only its mask buffers)."""
    py = ROOT / ".venv-tl2" / "bin" / "python"
    script = r"""
import json, sys, torch
from safetensors.torch import load_file
from transformer_lens import HookedTransformer, HookedTransformerConfig
zoo, name, out = sys.argv[1:4]
c = json.load(open(f"{zoo}/{name}/config.json"))
keep = ("n_layers", "d_model", "n_ctx", "d_head", "n_heads", "d_vocab", "d_mlp", "act_fn", "attn_only",
        "normalization_type", "positional_embedding_type", "attention_dir", "use_attn_result", "eps")
cfg = HookedTransformerConfig(**{k: c[k] for k in keep}, seed=398)
model = HookedTransformer(cfg)
res = model.load_state_dict(load_file(f"{zoo}/{name}/model.safetensors"), strict=False)
assert not res.unexpected_keys and all(k.endswith((".mask", ".IGNORE")) for k in res.missing_keys), res
torch.save(model.state_dict(), out)
"""
    paths = {}
    for name in ("attn-only-2l",):
        dest = out / f"{name}-tl2.pth"
        subprocess.run([str(py), "-c", script, str(ZOO), name, str(dest)], check=True)
        paths[name] = str(dest)
    return paths


def _local_paths(text: str) -> str:
    """This machine's paths in an error message as <repo>, <site-packages>, <work>."""
    text = re.sub(r"/\S*?/site-packages/", "<site-packages>/", text)
    text = re.sub(r"/\S*?/rerun-[^/\s]+/", "<work>/", text)
    return text.replace(str(ROOT), "<repo>")


def _printed(nb, k: int) -> str:
    """What cell k printed (its stdout), shortened: a trace of what the code computed on the zoo model."""
    text = "".join(o.text for o in nb.cells[k].outputs if o.output_type == "stream" and o.name == "stdout")
    return _local_paths(text[:600] + (" ..." if len(text) > 600 else ""))


def _execute(client, nb, k: int, source: str) -> str | None:
    """Run notebook cell k with `source`; its first error as "Name: first line of the message", or None."""
    cell = nb.cells[k]
    cell.source, cell.outputs = source, []
    client.execute_cell(cell, k)
    for out in cell.outputs:
        if out.output_type == "error":
            msg = str(out.evalue).strip().splitlines()
            frames = [re.sub(r"\x1b\[[0-9;]*m", "", f) for f in out.traceback]
            where = [ln.strip() for f in frames[-4:-1] for ln in f.splitlines()
                     if ln.strip().startswith(("File", "Cell", "---->", "->"))]
            text = (f"{out.ename}: {msg[0][:300]}" if msg else out.ename) + \
                (f" [at: {' | '.join(where)[:400]}]" if where else "")
            return _local_paths(text)
    return None


def run_cells(name: str, cells: list[dict], prelude: str, work: Path, cell_timeout: int) -> list[dict]:
    """Run `prelude` then the cells in order in one fresh kernel (working folder `work`); one row per cell."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(prelude)] + [nbformat.v4.new_code_cell(c["source"]) for c in cells]
    client = NotebookClient(nb, timeout=cell_timeout, kernel_name="python3", allow_errors=True,
                            interrupt_on_timeout=True, resources={"metadata": {"path": str(work)}})
    rows = []
    with client.setup_kernel():
        client.execute_cell(nb.cells[0], 0)
        pre_err = [o for o in nb.cells[0].outputs if o.output_type == "error"]
        if pre_err:
            raise SystemExit(f"{name}: the harness prelude failed: {pre_err[0].ename}: {pre_err[0].evalue}")
        for k, c in enumerate(cells, start=1):
            t0 = time.monotonic()
            error = _execute(client, nb, k, c["source"])
            row = {"index": c["index"], "adapted": c["adapted"],
                   "first_line": next((ln for ln in c["source"].splitlines() if ln.strip()), "")[:100]}
            row["status"] = "unchanged"
            if c["upfront"]:
                row.update(status="edited", why="; ".join(r["why"] for r in c["upfront"]),
                           whose=" + ".join(dict.fromkeys(r["whose"] for r in c["upfront"])))
            if error and c["steps"]:  # the edits, on failure only, one more at a time until the cell runs
                row["error_unedited"] = error
                used = list(c["upfront"])
                for source, reason in c["steps"]:
                    used.append(reason)
                    error = _execute(client, nb, k, source)
                    if not error:
                        break
                row.update(status="edited", why="; ".join(r["why"] for r in used),
                           whose=" + ".join(dict.fromkeys(r["whose"] for r in used)))
            if error:
                known = FAILS.get(name, {}).get(c["index"], {})
                if row["status"] == "edited":
                    row["edits_tried"] = row["why"]
                row.update(status="failed", error=error, why=known.get("why"), whose=known.get("whose"))
            row["seconds"] = round(time.monotonic() - t0, 2)
            row["printed"] = _printed(nb, k)
            rows.append(row)
            print(f"  {name} [{c['index']}] {row['status']} {row['seconds']}s {row.get('error', '')}", flush=True)
    return rows


def run_source(name: str, args, tl2: dict[str, str]) -> dict:
    cells, work, helpers_edited = prepare(name, args)
    extra = ""
    if SOURCES[name][0] == "arena":  # solutions.py finds its helpers through __file__, as when run as a file
        extra = f"__file__ = {str(work / 'exercises' / 'part2_intro_to_mech_interp' / 'solutions.py')!r}"
        (work / "exercises" / "part2_intro_to_mech_interp").mkdir(parents=True, exist_ok=True)
    prelude = PRELUDE.format(zoo=str(ZOO), tl2=tl2, extra=extra)
    rows = run_cells(name, cells, prelude, work, args.cell_timeout)
    option, commit, path, _, _ = SOURCES[name]
    git_dir = getattr(args, f"{option}_git")
    counts = {s: sum(r["status"] == s for r in rows) for s in ("unchanged", "edited", "failed")}
    return {"source": name, "repo": ARENA_REPO if option == "arena" else TL_REPO, "commit": commit, "path": path,
            "blob": blob_id(git_dir, commit, path), "cells": len(rows), "helpers_edited": helpers_edited,
            "load_adapted": sum(r["adapted"] for r in rows), **counts, "rows": rows}


def environment() -> dict:
    """What the run ran on: this checkout's commit, the versions that matter, the CPU, the date."""
    import platform
    from importlib.metadata import version

    def run(*cmd):
        return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT).stdout.strip()

    cpu = next((ln.split(":", 1)[1].strip() for ln in run("lscpu").splitlines() if ln.startswith("Model name")), "")
    dirty = bool(run("git", "status", "--porcelain", "--", ".", ":!docs/migration/results.*"))
    return {"commit": run("git", "rev-parse", "HEAD"), "dirty": dirty,
            "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "python": platform.python_version(),
            "cpu": cpu, **{p: version(p) for p in ("torch", "transformer-lens", "transformers", "circuitsvis",
                                                    "plotly", "nbclient", "ipykernel")}}


def markdown(results: list[dict], env: dict) -> str:
    lines = [f"Generated by `docs/migration/rerun.py` on {env['date_utc']} UTC at {env['commit'][:10]}"
             f"{' (uncommitted changes)' if env['dirty'] else ''}: torch {env['torch']}, transformer-lens "
             f"{env['transformer-lens']}, transformers {env['transformers']}, {env['cpu']}.", "",
             "| source | commit | cells | ran unchanged | edited | failed | of which loading-adapted |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    tot = {k: 0 for k in ("cells", "unchanged", "edited", "failed", "load_adapted")}
    for r in results:
        lines.append(f"| {r['source']} (`{r['path']}`) | {r['repo']}@{r['commit'][:10]} | {r['cells']} | "
                     f"{r['unchanged']} | {r['edited']} | {r['failed']} | {r['load_adapted']} |")
        for k in tot:
            tot[k] += r[k]
    lines.append(f"| **total** | | {tot['cells']} | {tot['unchanged']} | {tot['edited']} | {tot['failed']} | "
                 f"{tot['load_adapted']} |")
    lines += ["", "## Edited and failed cells", "", "| source | cell | status | whose | why | error (failed) |",
              "| --- | ---: | --- | --- | --- | --- |"]
    for r in results:
        for row in r["rows"]:
            if row["status"] != "unchanged":
                err = row.get("error", "").replace("|", "\\|").replace("\n", " ")
                why = (row["why"] or "UNEXPLAINED").replace("|", "\\|")
                lines.append(f"| {r['source']} | {row['index']} | {row['status']} | {row['whose'] or '?'} | {why} | "
                             f"{'`' + err + '`' if err else ''} |")
    helpers = [f"- {r['source']}: {h}" for r in results for h in r["helpers_edited"]]
    if helpers:
        lines += ["", "## Helper modules edited (not cells)", "", *helpers]
    return "\n".join(lines) + "\n"


def kernel_environment() -> None:
    """What the kernels inherit: offline Hugging Face libraries, one thread, this checkout importable."""
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = "1"
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tl-git", required=True, help="git dir of a TransformerLens clone holding commit " + TL_COMMIT)
    ap.add_argument("--arena-git", required=True, help="git dir of an ARENA_2.0 clone holding " + ARENA_COMMIT)
    ap.add_argument("--only", nargs="*", choices=list(SOURCES), help="run only these sources")
    ap.add_argument("--out", default=str(HERE), help="folder for results.json and results.md")
    ap.add_argument("--cell-timeout", type=int, default=300, help="seconds per cell before the kernel is interrupted")
    args = ap.parse_args(argv)
    kernel_environment()
    env = environment()
    with tempfile.TemporaryDirectory() as tmp:
        tl2 = tl2_state_dicts(Path(tmp))
        results = [run_source(name, args, tl2) for name in (args.only or SOURCES)]
    out = Path(args.out)
    record = {"environment": env, "sources": results}
    (out / "results.json").write_text(json.dumps(record, indent=1) + "\n")
    (out / "results.md").write_text(markdown(results, record["environment"]))
    print(markdown(results, record["environment"]).split("\n\n")[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())

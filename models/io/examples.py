"""Valid examples of every registered file kind (`models.io.readers.FILE_KINDS`), written into a folder: what the
corruption test starts from. Tiny (a 2-layer model of 16 dimensions), deterministic, and in the layout the
toolkit's own commands write."""

from __future__ import annotations

import json
from pathlib import Path

TEXT = "hello world, the quick brown fox jumps over the lazy dog; hello there, world. " * 4


def _model(d_vocab: int):
    from ..arch.config import HookedTransformerConfig
    from ..arch.model import HookedTransformer

    cfg = HookedTransformerConfig(n_layers=2, d_model=16, n_ctx=16, d_vocab=d_vocab, n_heads=2, d_mlp=None,
                                  normalization_type=None, positional_embedding_type="shortformer", seed=0,
                                  model_name="example")
    return HookedTransformer(cfg)


def model_example(root) -> Path:
    """`root/model`: a model folder (config.json, model.safetensors, a BPE tokenizer.json, train_config.json,
    summary.json, metrics.jsonl) and `root/sae`, an SAE on its `blocks.0.hook_resid_post`; returns `root/model`."""
    from ..data.tokenizer import BPETokenizer
    from .checkpoint import save

    root = Path(root)
    folder = root / "model"
    if (folder / "config.json").is_file():
        return folder
    tok = BPETokenizer.train([TEXT] * 8, vocab_size=280)
    model = _model(tok.vocab_size)
    model.tokenizer = tok
    train_config = {"steps": 10, "batch_size": 2, "seed": 0, "data": "stdlib", "tokenizer": "bpe-280",
                    "seq_len": None, "lr": 0.001}
    metrics = [{"step": s, "tokens": s * 32, "lr": 0.001, "train_loss": 5.6 - s / 100, "val_loss": 5.5 - s / 100}
               for s in (0, 5, 10)]
    save(model, folder, extra_files={"train_config.json": json.dumps(train_config),
                                     "summary.json": json.dumps({"steps": 10, "final_val_loss": 5.5,
                                                                 "corpus": {"name": "c", "sha256": "0" * 64}}),
                                     "metrics.jsonl": "".join(json.dumps(r) + "\n" for r in metrics)})
    sae_example(root)
    return folder


def sae_example(root) -> Path:
    """`root/sae`: an SAE folder as SAELens 6 writes it (cfg.json, sae_weights.safetensors) with `training.json`,
    on `blocks.0.hook_resid_post` (d_in 16, d_sae 32) of `root/model`; returns `root/sae`. Written without SAELens."""
    import torch
    from safetensors.torch import save_file

    folder = Path(root) / "sae"
    if (folder / "cfg.json").is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    d_in, d_sae = 16, 32
    g = torch.Generator().manual_seed(0)
    tensors = {"W_enc": torch.randn(d_in, d_sae, generator=g) * 0.1, "W_dec": torch.randn(d_sae, d_in, generator=g)
               * 0.1, "b_enc": torch.zeros(d_sae), "b_dec": torch.zeros(d_in)}
    save_file(tensors, str(folder / "sae_weights.safetensors"))
    cfg = {"d_in": d_in, "d_sae": d_sae, "dtype": "float32", "device": "cpu", "apply_b_dec_to_input": True,
           "normalize_activations": "none", "reshape_activations": "none",
           "metadata": {"sae_lens_version": "6.54.12", "sae_lens_training_version": "6.54.12",
                        "hook_name": "blocks.0.hook_resid_post"}, "architecture": "standard"}
    (folder / "cfg.json").write_text(json.dumps(cfg))
    (folder / "training.json").write_text(json.dumps({"model": "example", "hook_name": "blocks.0.hook_resid_post",
                                                      "steps": 10, "expansion": 2, "l1": 2.0, "batch_size": 64,
                                                      "lr": 0.003, "seed": 0, "d_in": d_in, "d_sae": d_sae}))
    if not (Path(root) / "model" / "config.json").is_file():
        model_example(root)
    return folder


def sweep_example(root) -> Path:
    """`root/sweep`: a finished seed sweep of two members (seed-0, seed-1: model folders with metrics.jsonl holding
    head scores) and its sweep.json; returns `root/sweep`."""
    from .checkpoint import save
    from .run_folder import claim

    out = Path(root) / "sweep"
    if (out / "sweep.json").is_file():
        return out
    members = []
    for seed in (0, 1):
        model = _model(30)
        folder = out / f"seed-{seed}"
        recs = []
        for step in range(0, 101, 20):
            ind = [[0.05, 0.05], [0.05, 0.6 if step >= 60 else 0.05]]
            recs.append({"step": step, "tokens": step * 64, "val_loss": 4.0 - step / 100,
                         "train_loss": 4.1 - step / 100,
                         "induction_scores_50": ind, "previous_token_scores": [[0.9, 0.1], [0.1, 0.1]],
                         "icl_score": -0.2})
        save(model, folder, extra_files={"metrics.jsonl": "".join(json.dumps(r) + "\n" for r in recs)})
        claim(folder, "sweep-member", "..")
        members.append({"seed": seed, "folder": folder.name, "status": "finished"})
    record = {"format": "toy-circuits seed sweep", "status": "finished", "steps": 100, "seeds": [0, 1],
              "train_config": {"batch_size": 4, "seq_len": 16}, "model_config": {"n_ctx": 16, "n_heads": 2,
                                                                                 "model_name": "example"},
              "notes": {}, "members": members}
    (out / "sweep.json").write_text(json.dumps(record))
    claim(out, "sweep")  # marked as the sweep command marks its folders (models.io.run_folder)
    return out


def trainer_state_example(root) -> Path:
    """`root/run/checkpoints/step-000000/trainer_state.json` as a checkpoint holds it; returns its path."""
    path = Path(root) / "run" / "checkpoints" / "step-000000" / "trainer_state.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {"step": 0, "tokens_seen": 0, "wall_time": 0.0, "param_groups": [{"lr": 0.001, "betas": [0.9, 0.99]}],
             "rng": {"python": [3, [0] * 624 + [624], None], "numpy": ["MT19937", [0] * 624, 624, 0, 0.0]}}
    path.write_text(json.dumps(state, indent=1))
    return path


def legacy_example(root) -> Path:
    """`root/old.pth` (a TransformerLens-layout state dict saved by `torch.save`) and `root/cfg.json`, its config;
    returns `root/old.pth`."""
    import torch

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    model = _model(30)
    torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, root / "old.pth")
    (root / "cfg.json").write_text(model.cfg.to_json())
    return root / "old.pth"


def corpus_cache_example(root) -> Path:
    """`root/cache/meta.json` as a tokenized corpus cache holds it (beside its train.bin / val.bin); returns its
    path."""
    folder = Path(root) / "cache"
    folder.mkdir(parents=True, exist_ok=True)
    meta = {"name": "example", "dtype": "uint16", "n_train": 100, "n_val": 0, "val_fraction": 0.1,
            "n_train_files": 1, "n_val_files": 0}
    (folder / "meta.json").write_text(json.dumps(meta, indent=2))
    return folder / "meta.json"


def discovery_task_example(root) -> Path:
    """`root/task.json`, a circuit-discovery task of two prompt pairs in token ids for the example model (its
    vocabulary holds ids 0 … 279), and `root/model`; returns the task's path."""
    model_example(root)
    path = Path(root) / "task.json"
    task = {"name": "example", "clean": [[5, 6, 7, 5], [8, 9, 10, 8]], "corrupt": [[11, 12, 7, 5], [13, 14, 10, 8]],
            "answer": [6, 9], "wrong": [12, 14], "metric": "logit_diff"}
    path.write_text(json.dumps(task, indent=1))
    return path

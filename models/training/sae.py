"""Training a sparse autoencoder on a hook point of one of our models, with SAELens' own trainer (optional:
`pip install sae-lens`): `ActivationSource`, SAELens' `DataProvider` (an iterator of `[batch, d_in]` activations) from
our model and a token stream of our corpora (`models.data.corpora`) or any text our tokenizer encodes: windows of
`[BOS] + n_ctx - 1` tokens (as the models were trained, `models.data.batches`), the BOS position left out, shuffled
in a buffer; `hook_z` concatenated over heads (`n_heads * d_head` inputs), as Kissane et al. 2024 ("Interpreting
Attention Layer Outputs with Sparse Autoencoders") did. `train_sae`: SAELens' `StandardTrainingSAE` trained by its
`SAETrainer` on an `ActivationSource`. Writing and reading the folder: `models.io.sae` (`save_sae`, `load_sae`).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import SAEError
from ..io.sae import activations, check_model, hook_width, sae_lens


def text_windows(tokens: torch.Tensor, n_ctx: int, n: int, generator: torch.Generator, bos: int | None) -> torch.Tensor:
    """`[n, n_ctx]`: windows of a 1-D token stream at random offsets, `[BOS] + n_ctx - 1` tokens when `bos` is given."""
    body = n_ctx - (bos is not None)
    if tokens.numel() < body + 1:
        raise SAEError(f"the text holds {tokens.numel()} tokens; an SAE needs at least {body + 1} (one window)")
    starts = torch.randint(0, tokens.numel() - body, (n,), generator=generator)
    out = torch.stack([tokens[s: s + body] for s in starts.tolist()])
    if bos is not None:
        out = torch.cat([torch.full((n, 1), bos, dtype=out.dtype), out], 1)
    return out


class ActivationSource:
    """SAELens' `DataProvider`: an endless iterator of `[batch_size, d_in]` float32 activations at `hook_name`, from
    windows of the 1-D token stream `tokens` (a corpus split, or a text tokenized with the model's tokenizer).
    `buffer_windows` windows are run at a time and their activations shuffled together (tokens of one window are
    correlated); deterministic given `seed`."""

    def __init__(self, model, hook_name: str, tokens: torch.Tensor, batch_size: int = 4096, seed: int = 0,
                 bos: int | None = None, buffer_windows: int = 128, windows_per_pass: int = 32):
        self.model, self.hook_name = model, hook_name
        self.tokens = torch.as_tensor(tokens, dtype=torch.long).reshape(-1)
        self.d_in = hook_width(model, hook_name)
        self.batch_size, self.bos = int(batch_size), bos
        self.buffer_windows, self.windows_per_pass = int(buffer_windows), int(windows_per_pass)
        self.generator = torch.Generator().manual_seed(int(seed))
        self._buffer = torch.empty(0, self.d_in)
        self.windows_read = 0

    def __iter__(self):
        return self

    def _refill(self) -> None:
        parts = [self._buffer]
        for _ in range(max(self.buffer_windows // self.windows_per_pass, 1)):
            w = text_windows(self.tokens, self.model.cfg.n_ctx, self.windows_per_pass, self.generator, self.bos)
            parts.append(activations(self.model, self.hook_name, w.to(self.model.W_E.device),
                                     skip=int(self.bos is not None)).float().cpu())
            self.windows_read += w.shape[0]
        buf = torch.cat(parts)
        self._buffer = buf[torch.randperm(buf.shape[0], generator=self.generator)]

    def __next__(self) -> torch.Tensor:
        while self._buffer.shape[0] < self.batch_size * 2:
            self._refill()
        out, self._buffer = self._buffer[: self.batch_size], self._buffer[self.batch_size:]
        return out


# --- training -------------------------------------------------------------------------------------------------
@dataclass
class Trained:
    """A trained SAE (SAELens' inference `SAE`), its training settings and the seconds training took."""

    sae: object
    settings: dict
    seconds: float


def train_sae(model, hook_name: str, tokens: torch.Tensor, steps: int = 1000, expansion: int = 8, l1: float = 2.0,
              batch_size: int = 4096, lr: float = 3e-3, seed: int = 0, bos: int | None = None,
              progress: bool = True) -> Trained:
    """Train SAELens' standard SAE (ReLU encoder, L1 penalty scaled by decoder norms; Bricken et al. 2023, "Towards
    Monosemanticity") on `hook_name` of `model` for `steps` batches of `batch_size` token activations from
    `tokens`: `d_sae = expansion * d_in`, `l1` SAELens' `l1_coefficient` on activations normalised to mean squared
    norm `d_in` (its `expected_average_only_in`, folded into the weights at the end). Returns the inference SAE."""
    sl = sae_lens()
    check_model(model, "train_sae")
    from sae_lens import SAE, SAETrainer, StandardTrainingSAE, StandardTrainingSAEConfig
    from sae_lens.config import LoggingConfig, SAETrainerConfig

    for name, value in (("steps", steps), ("expansion", expansion), ("batch_size", batch_size)):
        if int(value) < 1:
            raise SAEError(f"{name} must be a positive integer, got {value}")
    if not (l1 >= 0 and lr > 0):
        raise SAEError(f"l1 must be >= 0 and lr > 0, got l1={l1}, lr={lr}")
    source = ActivationSource(model, hook_name, tokens, batch_size=batch_size, seed=seed, bos=bos)
    d_in = source.d_in
    torch.manual_seed(seed)
    metadata = {"hook_name": hook_name, "model_name": model.cfg.model_name, "context_size": model.cfg.n_ctx,
                "prepend_bos": bos is not None}
    cfg = StandardTrainingSAEConfig(d_in=d_in, d_sae=int(expansion) * d_in, l1_coefficient=float(l1),
                                    l1_warm_up_steps=max(int(steps) // 20, 1), device=str(model.W_E.device),
                                    normalize_activations="expected_average_only_in",
                                    reshape_activations="hook_z" if hook_name.endswith("hook_z") else "none")
    for k, v in metadata.items():
        setattr(cfg.metadata, k, v)
    sae = StandardTrainingSAE(cfg)
    trainer_cfg = SAETrainerConfig(total_training_samples=int(steps) * int(batch_size),
                                   train_batch_size_samples=int(batch_size), lr=float(lr), lr_end=float(lr) / 10,
                                   lr_warm_up_steps=0,
                                   lr_decay_steps=max(int(steps) // 5, 1), lr_scheduler_name="constant",
                                   device=str(model.W_E.device), n_batches_for_norm_estimate=NORM_BATCHES,
                                   dead_feature_window=max(int(steps) // 2, 1),
                                   feature_sampling_window=max(int(steps), 1),
                                   logger=LoggingConfig(log_to_wandb=False))
    t0 = time.perf_counter()
    bar = _batch_bar(int(steps) + NORM_BATCHES, progress)
    try:
        with _quiet_progress(False):  # SAELens' bars off: ours counts the batches
            trained = SAETrainer(trainer_cfg, sae, _Counted(source, bar)).fit()
    finally:
        bar.close()
    seconds = time.perf_counter() - t0
    with tempfile_dir() as tmp:  # SAELens' own inference conversion: save as inference, load as SAE
        trained.save_inference_model(tmp)
        inference = SAE.load_from_disk(tmp, device=str(model.W_E.device))
    settings = {"model": model.cfg.model_name, "hook_name": hook_name, "steps": int(steps),
                "expansion": int(expansion), "l1": float(l1), "batch_size": int(batch_size), "lr": float(lr),
                "seed": int(seed), "d_in": d_in, "d_sae": int(expansion) * d_in, "tokens_seen": int(steps) *
                int(batch_size), "windows_read": source.windows_read, "sae_lens": sl.__version__,
                "seconds": round(seconds, 3)}
    return Trained(inference, settings, seconds)


@contextlib.contextmanager
def tempfile_dir():
    import tempfile

    with tempfile.TemporaryDirectory(prefix="toy-circuits-sae-") as d:
        yield Path(d)


#: Batches SAELens draws to estimate the activations' mean norm before training (`n_batches_for_norm_estimate`).
NORM_BATCHES = 8


def _batch_bar(total: int, show: bool):
    """The progress bar of `train_sae` on stderr: one tick per batch of activations (hidden when `show` is False,
    and for runs shorter than half a second)."""
    import sys

    from tqdm.auto import tqdm

    return tqdm(total=total, desc="sae train", unit="batch", file=sys.stderr, delay=0.5, leave=False,
                disable=not show)


class _Counted:
    """The activation source, ticking `bar` for each batch SAELens draws from it. SAELens' own bar moves once every
    100 steps (a short run shows 0 % throughout), and beside its nested norm-estimate bar it writes cursor-up
    escapes (`ESC[A`) into a log; so its bars stay off and this one counts."""

    def __init__(self, source: ActivationSource, bar):
        self.source, self.bar = source, bar

    def __iter__(self):
        return self

    def __next__(self) -> torch.Tensor:
        out = next(self.source)
        self.bar.update()
        return out


@contextlib.contextmanager
def _quiet_progress(show: bool):
    """SAELens' trainer and activation scaler draw tqdm bars of their own; hide them when `show` is False."""
    import functools

    import sae_lens.training.activation_scaler as scaler_module
    import sae_lens.training.sae_trainer as trainer_module

    modules = (trainer_module, scaler_module)
    saved = [m.tqdm for m in modules]
    if not show:
        for m, bar in zip(modules, saved):
            m.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        for m, bar in zip(modules, saved):
            m.tqdm = bar

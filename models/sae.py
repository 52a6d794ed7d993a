"""Sparse autoencoders on this toolkit's models, through SAELens (optional: `pip install sae-lens`).

Nothing here re-implements SAELens; it connects our models to it:

- `with_saes(model)`: the model, its class extended by SAELens' own `HookedSAETransformer` methods (`add_sae`,
  `reset_saes`, `saes`, `run_with_saes`, `run_with_cache_with_saes`, `run_with_hooks_with_saes`, `acts_to_saes`). An
  attached SAE takes the hook point's place as SAELens' wrapper, so its hook points are cached under SAELens' names
  (`blocks.1.hook_mlp_out.hook_sae_acts_post`, ...). While an SAE is attached the model runs its fully hooked path
  (`models.arch.watch.forced`), the path a hand-written hook splice takes.
- `ActivationSource`: SAELens' `DataProvider` (an iterator of `[batch, d_in]` activations) from our model and a token
  stream of our corpora (`models.data.corpora`) or any text our tokenizer encodes: windows of `[BOS] + n_ctx - 1`
  tokens (as the models were trained, `models.data.batches`), the BOS position left out, shuffled in a buffer;
  `hook_z` concatenated over heads (`n_heads * d_head` inputs), as Kissane et al. 2024 ("Interpreting Attention
  Layer Outputs with Sparse Autoencoders") did.
- `train_sae`: SAELens' `StandardTrainingSAE` trained by its `SAETrainer` on an `ActivationSource`;
  `save_sae` writes the folder SAELens' `SAE.load_from_disk` reads, atomically; `load_sae` reads it back.
- `fvu`, `sae_losses`, `feature_stats`: how well an SAE reconstructs and how much of the model's loss survives it.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .arch.watch import forced
from .errors import MissingDependencyError, SAEError

#: SAELens' version this module is tested with (pyproject's `sae` extra).
SAE_LENS_VERSION = "6.54.12"
#: SAELens' `HookedSAETransformer` methods given to our models (`forward` is wrapped below: it calls `super()`).
SAE_METHODS = ("acts_to_saes", "add_sae", "_reset_sae", "reset_saes", "_compute_exclusion_mask", "_token_masks",
               "saes", "run_with_saes", "run_with_cache_with_saes", "run_with_hooks_with_saes")
#: Written beside SAELens' cfg.json and sae_weights.safetensors: how the SAE was trained.
TRAINING_FILE = "training.json"


def sae_lens():
    """The `sae_lens` package, or `MissingDependencyError` naming the install."""
    from .deferred_import import complete_all

    # SAELens imports TransformerLens' model classes, whose modules import the package's other parts: its package
    # `__init__`s must have run (the command line defers them, `models.deferred_import`); a no-op otherwise.
    complete_all()
    try:
        import sae_lens
    except ImportError as e:
        from .arch.tl_compat import TL_VERSION, version_tuple

        why = "it is not installed" if (e.name or "").split(".")[0] == "sae_lens" else \
            f"SAELens 6.x needs transformer-lens<4, this environment has {TL_VERSION}" \
            if version_tuple(TL_VERSION) >= (4, 0) else f"importing it failed: {e}"
        raise MissingDependencyError(f"sparse autoencoders need SAELens: pip install sae-lens=={SAE_LENS_VERSION} "
                                     f"(or pip install 'toy-circuits[sae]'; {why})") from None
    return sae_lens


_CLASSES: dict[type, type] = {}


def _with_saes_class(cls: type) -> type:
    if cls in _CLASSES:
        return _CLASSES[cls]
    from sae_lens.analysis.hooked_sae_transformer import HookedSAETransformer

    class WithSAEs(cls):
        __doc__ = f"{cls.__name__} with SAELens' HookedSAETransformer methods (models.sae.with_saes)."

        def forward(self, input, *args, **kwargs):
            # HookedSAETransformer.forward, plus the hooked path while an SAE is attached
            with self._token_masks(input, kwargs), (forced(self) if self._acts_to_saes else contextlib.nullcontext()):
                return super().forward(input, *args, **kwargs)

    for name in SAE_METHODS:
        setattr(WithSAEs, name, HookedSAETransformer.__dict__[name])
    WithSAEs.__name__ = WithSAEs.__qualname__ = f"{cls.__name__}WithSAEs"
    _CLASSES[cls] = WithSAEs
    return WithSAEs


def check_model(model, what: str) -> None:
    """`SAEError` unless `model` is a `HookedTransformer` (a decoder-only model): the models SAEs here read."""
    from .arch.model import HookedTransformer

    if not isinstance(model, HookedTransformer):
        raise SAEError(f"{what} takes a HookedTransformer (a decoder-only model), got {type(model).__name__}")


def with_saes(model):
    """`model` itself, its class extended by SAELens' `HookedSAETransformer` methods (see the module docstring);
    idempotent. Decoder-only models (`HookedTransformer`)."""
    sae_lens()
    check_model(model, "with_saes")
    if not hasattr(model, "_acts_to_saes"):
        model._acts_to_saes = {}
        model._transcoder_output_hooks = {}
    if type(model) not in _CLASSES.values():
        model.__class__ = _with_saes_class(type(model))
    return model


# --- activations ----------------------------------------------------------------------------------------------
def hook_width(model, hook_name: str) -> int:
    """`d_in` of an SAE on `hook_name`: the last axis of its activation, or `n_heads * d_head` for `hook_z`
    (concatenated over heads). `SAEError` for a name that is not a firing hook point or whose activation is not
    `[batch, pos, d]` (or `[batch, pos, head, d_head]` for `hook_z`)."""
    names = model.firing_hook_names()
    if hook_name not in names:
        near = [n for n in names if n.endswith(hook_name.rsplit(".", 1)[-1])][:6] or names[:6]
        raise SAEError(f"{hook_name!r} is not a hook point of this model that fires; e.g. {', '.join(near)}")
    probe = torch.zeros(1, 2, dtype=torch.long, device=model.W_E.device)
    with torch.no_grad():
        _, cache = model.run_with_cache(probe, names_filter=lambda n: n == hook_name)
    shape = tuple(cache[hook_name].shape)
    if hook_name.endswith("hook_z") and len(shape) == 4:
        return shape[2] * shape[3]
    if len(shape) != 3 or shape[1] != 2:
        raise SAEError(f"{hook_name!r} holds activations of shape {list(shape)}; an SAE reads [batch, pos, d] "
                       "(or hook_z, concatenated over heads): use e.g. hook_resid_post, hook_mlp_out, hook_z")
    return shape[2]


def activations(model, hook_name: str, tokens: torch.Tensor, skip: int = 1) -> torch.Tensor:
    """`[n, d_in]`: the activations at `hook_name` of every window of `tokens` `[batch, pos]`, positions from `skip`
    on (1: the BOS position left out), `hook_z` concatenated over heads."""
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n == hook_name)
    act = cache[hook_name][:, skip:]
    return act.reshape(-1, act.shape[2] * act.shape[3]) if act.dim() == 4 else act.reshape(-1, act.shape[-1])


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
                                   device=str(model.W_E.device), n_batches_for_norm_estimate=8,
                                   dead_feature_window=max(int(steps) // 2, 1),
                                   feature_sampling_window=max(int(steps), 1),
                                   logger=LoggingConfig(log_to_wandb=False))
    t0 = time.perf_counter()
    with _quiet_progress(progress):
        trained = SAETrainer(trainer_cfg, sae, source).fit()
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


def save_sae(trained: Trained, folder) -> Path:
    """Write `folder` (SAELens' cfg.json and sae_weights.safetensors, and `training.json`) atomically; an existing
    folder that is not empty is refused (`SAEError`): nothing of the user's is replaced."""
    folder = Path(folder)
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise SAEError(f"{folder} exists and is not an empty folder; give a new folder (nothing is overwritten)")
    from .io.run_folder import write_folder

    def write(tmp: Path) -> None:
        trained.sae.save_model(tmp)
        (tmp / TRAINING_FILE).write_text(json.dumps(trained.settings, indent=2) + "\n")

    return write_folder(folder, "sae", write)


def load_sae(folder, model=None):
    """SAELens' `SAE.load_from_disk(folder)`; with `model`, `SAEError` unless its hook point fires in `model` with
    the SAE's width."""
    sae_lens()
    from sae_lens import SAE

    folder = Path(folder)
    if not (folder / "cfg.json").is_file():
        raise SAEError(f"{folder} holds no SAE (no cfg.json); give a folder `circuits sae train` wrote")
    try:
        sae = SAE.load_from_disk(folder, device="cpu" if model is None else str(model.W_E.device))
    except (KeyError, ValueError, TypeError, OSError, json.JSONDecodeError) as e:
        raise SAEError(f"{folder}: SAELens cannot load this SAE ({type(e).__name__}: {e})") from None
    if model is not None:
        hook = sae.cfg.metadata.hook_name
        if hook is None:
            raise SAEError(f"{folder}/cfg.json names no hook_name")
        width = hook_width(model, hook)
        if width != sae.cfg.d_in:
            raise SAEError(f"the SAE in {folder} reads {sae.cfg.d_in} inputs at {hook}, where this model has {width}")
    return sae


# --- measures -------------------------------------------------------------------------------------------------
def fvu(x: torch.Tensor, x_hat: torch.Tensor) -> float:
    """Fraction of variance unexplained, `Σ‖x − x̂‖² / Σ‖x − mean(x)‖²` over tokens `[n, d]` (1 − explained variance;
    Gao et al. 2024, "Scaling and evaluating sparse autoencoders", use its normalised MSE), in float64."""
    x, x_hat = x.double(), x_hat.double()
    return float(((x - x_hat) ** 2).sum() / ((x - x.mean(0)) ** 2).sum())


@dataclass
class FeatureStats:
    """Over the tokens `[n, d_in]` measured: `fvu`; `l0`, the mean number of features active (> 0) per token;
    `frequency [d_sae]`, the fraction of tokens on which each fires; `dead`, the features that never fire; `acts`
    `[n, d_sae]` the feature activations."""

    fvu: float
    l0: float
    frequency: torch.Tensor
    dead: int
    acts: torch.Tensor


def feature_stats(sae, x: torch.Tensor) -> FeatureStats:
    """`FeatureStats` of `sae` on activations `x` `[n, d_in]` (what `activations` returns; for a `hook_z` SAE the heads
    are already concatenated, so SAELens' own reshaping is off meanwhile)."""
    z = getattr(sae, "hook_z_reshaping_mode", False)
    if z:
        sae.turn_off_forward_pass_hook_z_reshaping()
    try:
        with torch.no_grad():
            acts = sae.encode(x.to(sae.W_dec.dtype))
            x_hat = sae.decode(acts)
    finally:
        if z:
            sae.turn_on_forward_pass_hook_z_reshaping()
    active = acts > 0
    freq = active.double().mean(0)
    return FeatureStats(fvu(x, x_hat), float(active.sum(1).double().mean()), freq, int((freq == 0).sum()), acts)


def sae_losses(model, sae, tokens: torch.Tensor, bos: int | None = None) -> dict[str, float]:
    """Mean next-token loss of `model` on `tokens` `[batch, pos]`: `clean`; `spliced`, the SAE's reconstruction in
    place of its hook point's activation (SAELens' `run_with_saes`, the error term left out); `zero_ablated`, zeros
    in its place; at every position but the BOS ones (`bos`), where SAELens' `exclude_special_tokens` keeps the
    model's own value. `recovered` = (zero_ablated − spliced) / (zero_ablated − clean), the fraction of the loss
    the SAE recovers (Bricken et al. 2023, "Towards Monosemanticity", §"Loss"; SAELens' `ce_loss_score`)."""
    hook = sae.cfg.metadata.hook_name
    keep = tokens == bos if bos is not None else torch.zeros_like(tokens, dtype=torch.bool)

    def zero(act, hook):
        m = keep.to(act.device).reshape(*keep.shape, *([1] * (act.dim() - 2)))
        return torch.where(m, act, torch.zeros_like(act))

    m = with_saes(model)
    with torch.no_grad():
        clean = float(m(tokens, return_type="loss"))
        spliced = float(m.run_with_saes(tokens, saes=[sae], use_error_term=False, return_type="loss",
                                        exclude_special_tokens=[bos] if bos is not None else False))
        ablated = float(m.run_with_hooks(tokens, return_type="loss", fwd_hooks=[(hook, zero)]))
    gap = ablated - clean
    return {"clean": clean, "spliced": spliced, "zero_ablated": ablated,
            "recovered": (ablated - spliced) / gap if gap != 0 else float("nan")}

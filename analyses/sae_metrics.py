"""How well a sparse autoencoder reconstructs a hook point of a model and how much of the model's loss survives it
spliced in: `fvu`, `feature_stats` (FVU, L0, feature frequencies, dead features), `sae_losses` (clean, spliced and
zero-ablated next-token loss, and the fraction recovered). The SAE is SAELens' (`models.sae`); `analyses.sae_report`
turns these into a report.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from models.io.sae import with_saes


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


@dataclass
class Histogram:
    """Counts of a feature's non-zero activations in `len(counts)` equal bins from 0 to its largest activation:
    `edges [bins + 1]`, `counts [bins]` (the last bin closed, as `numpy.histogram`); `zeros`, the tokens where it is
    0 (not drawn: a feature is off on most tokens)."""

    edges: list[float]
    counts: list[int]
    zeros: int


def activation_histogram(acts: torch.Tensor, bins: int = 24) -> Histogram:
    """`Histogram` of the positive values of one feature's activations `acts [n]` over `bins` equal bins from 0 to
    their maximum (the activation density plot of SAE dashboards, Bricken et al. 2023, "Towards Monosemanticity",
    feature browser), in float64; a feature that never fires gets no bins."""
    a = acts.detach().double().reshape(-1).cpu()
    pos = a[a > 0]
    if pos.numel() == 0:
        return Histogram([], [], int(a.numel()))
    counts, edges = torch.histogram(pos, bins=int(bins), range=(0.0, float(pos.max())))
    return Histogram(edges.tolist(), [int(c) for c in counts.tolist()], int(a.numel() - pos.numel()))

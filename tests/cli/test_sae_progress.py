"""`circuits sae train`'s progress bar (issue 41.3): one bar of ours that counts every batch of activations to the
end, instead of SAELens' own, which moves once per 100 steps (0 % throughout a short run) and writes cursor-up
escapes (ESC[A) beside its nested norm-estimate bar. Ecosystem tier: needs SAELens."""

from __future__ import annotations

import pytest
import torch

import models

pytestmark = pytest.mark.ecosystem


def test_the_bar_counts_every_batch_and_sae_lens_draws_none(monkeypatch, capsys):
    pytest.importorskip("sae_lens", reason="needs SAELens (pip install -e '.[sae]'); CI's ecosystem job has it")
    from models.training import sae as training

    bars = []

    class Bar:  # records what a tqdm bar would show
        def __init__(self, total, show):
            self.total, self.n, self.closed = total, 0, False
            bars.append(self)

        def update(self, k=1):
            self.n += k

        def close(self):
            self.closed = True

    monkeypatch.setattr(training, "_batch_bar", Bar)
    model = models.load("gelu-2l").eval()
    stream = torch.randint(3, 250, (20_000,), generator=torch.Generator().manual_seed(0))
    training.train_sae(model, "blocks.0.hook_resid_post", stream, steps=5, expansion=2, batch_size=128,
                       bos=model.tokenizer.bos_token_id, progress=True)
    (bar,) = bars
    assert bar.closed and bar.n == bar.total == 5 + training.NORM_BATCHES  # to the end, not stuck at 0
    err = capsys.readouterr().err
    assert "\x1b[A" not in err and "Training SAE" not in err and "Estimating norm" not in err, err

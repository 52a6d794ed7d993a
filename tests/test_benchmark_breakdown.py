"""`benchmarks/train_breakdown.py`: its parts add up to the step, its FLOP counts are the model's, and it leaves the
classes it times as it found them."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import train_breakdown  # noqa: E402

from models.accel import fused_loss, gemm, train_attention  # noqa: E402


@pytest.fixture
def no_floor(monkeypatch):
    """The 2048³ GEMM floor takes seconds; the parts do not depend on it."""
    fake = {"wall": {"plain": 100.0}, "cpu": {"plain": 100.0}}
    monkeypatch.setattr(train_breakdown, "gemm_floor", lambda: fake)


def test_parts_add_up_and_classes_are_restored(no_floor):
    timed = (gemm._OneDNNAffine, train_attention._BmmAttention, train_attention._FusedAttention,
             fused_loss._FusedCrossEntropy)
    before = [dict(cls.__dict__) for cls in timed]
    out = train_breakdown.run(steps=2, batch=2)
    assert [dict(cls.__dict__) for cls in timed] == before
    ms = out["ms"]
    for phase, parts in (("forward", ["linears forward", "attention forward", "loss forward"]),
                         ("backward", ["linears backward", "attention backward", "loss backward"])):
        assert all(0 <= ms[p] for p in parts) and ms[f"{phase}, other"] >= 0  # the timed parts fit in their phase
    if gemm.kernel() == "onednn":  # the wrapped classes ran and were timed (they read 0 with torch's kernels)
        assert ms["linears forward"] > 0 and ms["linears backward"] > 0
    assert ms["loss forward"] > 0
    assert (ms["loss backward"] > 0) == (fused_loss.why_not() == "")  # the kernel's backward, where it runs
    # FLOPs of the attn-only-2l preset at batch 2: 2 layers of q, k, v, o (128 → 128) and the unembedding (128 → 512)
    tokens = 2 * 128
    assert out["flops"]["linears forward"] == 2 * tokens * (2 * 4 * 128 * 128 + 128 * 512)
    squares = 2 * 2 * 2 * 4 * 128 * 128 * 32 * 2  # layers, products, FLOPs per multiply-add, heads, T², d_head, batch
    formed, backward = {"fused": (129 / 256, 2.5), "batched": (3 / 4, 2), "torch": (3 / 4, 2)}[out["attention"]]
    assert out["flops"]["attention forward"] == squares * formed
    assert out["flops"]["attention backward"] == squares * formed * backward
    assert "| **step** |" in train_breakdown.table(out)

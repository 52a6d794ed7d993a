"""The CUDA paths against the CPU and float64: forward, every cached activation, gradients, a training run, the KV
cache, the fused AdamW, the circuits and TransformerLens parity on the GPU. Skipped where torch sees no CUDA GPU
(CI's machines); run on a lent GPU machine (benchmarks/README.md, "GPU")."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import in_dtype

from models import HookedTransformer, HookedTransformerConfig

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here")
DEVICE = "cuda"

ARCHS = {
    "attn-only shortformer": dict(n_layers=2, d_model=64, n_heads=4, d_mlp=None, attn_only=True,
                                  normalization_type=None, positional_embedding_type="shortformer"),
    "LN gelu standard": dict(n_layers=2, d_model=64, n_heads=4, d_mlp=256, normalization_type="LN"),
    "RMS rotary gqa": dict(n_layers=2, d_model=64, n_heads=4, n_key_value_heads=2, d_mlp=128, act_fn="silu",
                           gated_mlp=True, normalization_type="RMS", positional_embedding_type="rotary"),
}


@pytest.fixture(autouse=True)
def _ieee_float32():
    """float32 products in IEEE float32 on the GPU (no TF32), as torch's default, whatever a caller set."""
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


def _model(arch: str) -> HookedTransformer:
    return HookedTransformer(HookedTransformerConfig(n_ctx=32, d_vocab=97, seed=0, **ARCHS[arch])).eval()


def _tokens(batch: int = 3, pos: int = 32, vocab: int = 97) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, pos), generator=torch.Generator().manual_seed(1))


def _close(got: torch.Tensor, want: torch.Tensor, rel: float, scale: float | None = None) -> None:
    """`got` within `rel` of `want` relative to `scale` (default: `want`'s largest finite magnitude); infinities
    (masked attention scores) where `want` has them."""
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    assert got.shape == want.shape
    inf = want.isinf()
    assert torch.equal(got[inf], want[inf])
    got, want = got[~inf], want[~inf]
    err = float((got - want).abs().max())
    scale = float(want.abs().max()) if scale is None else scale
    assert err <= rel * scale, (err, scale)


@pytest.mark.parametrize("arch", ARCHS)
def test_forward_and_cache_on_cuda_match_float64(arch):
    model = _model(arch)
    ref = in_dtype(model, "float64").eval()
    gpu = model.to(DEVICE)
    tokens = _tokens()
    with torch.no_grad():
        logits, cache = gpu.run_with_cache(tokens.to(DEVICE))
        ref_logits, ref_cache = ref.run_with_cache(tokens)
    assert logits.device.type == "cuda" and logits.dtype == torch.float32
    _close(logits, ref_logits, 1e-5)
    assert set(cache.keys()) == set(ref_cache.keys())
    for name in ref_cache.keys():
        assert cache[name].device.type == "cuda", name
        _close(cache[name], ref_cache[name], 1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_gradients_on_cuda_match_float64(arch):
    model = _model(arch).train()
    ref = in_dtype(model, "float64").train()
    gpu = model.to(DEVICE)
    tokens = _tokens()
    gpu(tokens.to(DEVICE), return_type="loss").backward()
    ref(tokens, return_type="loss").backward()
    grads = dict(ref.named_parameters())
    scale = max(float(p.grad.abs().max()) for p in grads.values())  # some gradients are 0 but for rounding (b_K)
    for name, p in gpu.named_parameters():
        _close(p.grad, grads[name].grad, 1e-4, scale)


def test_bfloat16_forward_on_cuda_near_float64():
    model = _model("LN gelu standard")
    ref = in_dtype(model, "float64").eval()
    gpu = model.to(DEVICE, torch.bfloat16)
    tokens = _tokens()
    with torch.no_grad():
        got = gpu(tokens.to(DEVICE))
        want = ref(tokens)
    assert got.dtype == torch.bfloat16
    _close(got, want, 0.05)  # bfloat16 keeps 8 bits of mantissa; the error of a 2-layer model stays within 5 %


def test_kv_cache_generation_on_cuda_matches_cache_free():
    gpu = _model("RMS rotary gqa").to(DEVICE)
    prompt = _tokens(2, 5).to(DEVICE)
    with torch.no_grad():
        cached = gpu.generate(prompt, max_new_tokens=20, temperature=0.0, use_past_kv_cache=True, verbose=False)
        plain = gpu.generate(prompt, max_new_tokens=20, temperature=0.0, use_past_kv_cache=False, verbose=False)
    assert cached.device.type == "cuda"
    assert torch.equal(cached, plain)


def test_fused_adamw_on_cuda_matches_foreach():
    from models.training.loop import adamw

    torch.manual_seed(0)
    shapes = [(64, 32), (32,), (4, 8, 16)]
    start = [torch.randn(s, device=DEVICE) for s in shapes]
    runs = {}
    for kind in ("fused", "foreach"):
        params = [torch.nn.Parameter(t.clone()) for t in start]
        opt = adamw(params, lr=1e-2, weight_decay=0.1) if kind == "fused" else \
            torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1, foreach=True)
        if kind == "fused":
            assert opt.defaults["fused"] is True
        gen = torch.Generator(device=DEVICE).manual_seed(1)
        for _ in range(5):
            for p in params:
                p.grad = torch.randn(p.shape, device=DEVICE, generator=gen)
            opt.step()
        runs[kind] = params
    for a, b in zip(runs["fused"], runs["foreach"]):
        _close(a, b, 1e-6)


def test_circuits_on_cuda_match_cpu():
    from circuits.composition import composition_scores
    from circuits.eigen import copying_scores

    model = _model("attn-only shortformer")
    cpu_scores = copying_scores(model), composition_scores(model, "k")
    gpu = model.to(DEVICE)
    gpu_scores = copying_scores(gpu), composition_scores(gpu, "k")
    for got, want in zip(gpu_scores, cpu_scores):
        _close(got, want, 1e-5)


def test_transformer_lens_parity_on_cuda():
    pytest.importorskip("transformer_lens")
    from models import to_transformer_lens

    model = _model("LN gelu standard")
    gpu = model.to(DEVICE)
    bridge = to_transformer_lens(gpu)
    tokens = _tokens().to(DEVICE)
    with torch.no_grad():
        _close(gpu(tokens), bridge(tokens), 1e-5)


def test_training_run_on_cuda(tmp_path):
    """`circuits train --device cuda`: runs under bfloat16 autocast, the loss falls on text, the
    checkpoint loads on the CPU and gives the GPU's logits."""
    from analyses import cli
    from models import load

    config = {"model": {"n_layers": 1, "d_model": 32, "n_heads": 2, "n_ctx": 32, "d_vocab": 259, "attn_only": True,
                        "normalization_type": None},
              "train": {"data": "stdlib", "tokenizer": "bytes", "steps": 60, "batch_size": 16, "lr": 1e-2,
                        "warmup_steps": 5, "checkpoint_every": 30, "log_checkpoints": 0, "eval_every": 30,
                        "val_sequences": 8}}
    out = tmp_path / "run"
    argv = ["train", "--config", json.dumps(config), "--device", "cuda", "--no-scores", "--out", str(out)]
    assert cli.main(argv) == 0
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [m["val_loss"] for m in metrics if "val_loss" in m]  # steps 0, 30 and 60
    assert len(losses) >= 2 and losses[-1] < losses[0] - 0.5, losses
    model = load(out)
    assert model.W_E.device.type == "cpu"
    tokens = _tokens(2, 32, 259)
    with torch.no_grad():
        _close(model.to(DEVICE)(tokens.to(DEVICE)), model.cpu()(tokens), 1e-5)


def test_stacked_sweep_on_cuda_matches_cpu():
    """The seed sweep's stacked step on one GPU: float32 logits and per-member losses equal the CPU's to float32
    rounding, and a `circuits train --seeds 0-1 --device cuda` sweep trains both members with falling loss."""
    from analyses import cli
    from models.training.stacked import StackedDecoder

    cfg = HookedTransformerConfig(n_ctx=32, d_vocab=97, seed=0, **ARCHS["attn-only shortformer"])
    members = [HookedTransformer(cfg.replace(seed=k)) for k in range(3)]
    stack = StackedDecoder(members)
    tokens = torch.stack([_tokens(2) for _ in range(3)])
    with torch.no_grad():
        _close(stack.to(DEVICE)(tokens.to(DEVICE)), stack.cpu()(tokens), 1e-5)
        _close(stack.to(DEVICE).losses(tokens.to(DEVICE)), stack.cpu().losses(tokens), 1e-5)
    config = {"model": {"n_layers": 1, "d_model": 32, "n_heads": 2, "n_ctx": 32, "d_vocab": 259, "attn_only": True,
                        "normalization_type": None},
              "train": {"data": "stdlib", "tokenizer": "bytes", "steps": 60, "batch_size": 16, "lr": 1e-2,
                        "warmup_steps": 5, "checkpoint_every": 30, "log_checkpoints": 0, "eval_every": 30,
                        "val_sequences": 8}}
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "sweep"
        argv = ["train", "--config", json.dumps(config), "--device", "cuda", "--seeds", "0-1", "--no-scores",
                "--out", str(out)]
        assert cli.main(argv) == 0
        for k in (0, 1):
            metrics = [json.loads(x) for x in (out / f"seed-{k}" / "metrics.jsonl").read_text().splitlines()]
            losses = [m["val_loss"] for m in metrics if "val_loss" in m]
            assert len(losses) >= 2 and losses[-1] < losses[0] - 0.5, losses

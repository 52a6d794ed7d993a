"""`circuits.checks.check_finite` clears a tensor by its sum and tests every entry only when the sum is not finite:
every NaN/±inf is still caught and named, and finite tensors whose sum overflows still pass."""

import pytest
import torch

from circuits.checks import NonFiniteError, check_finite


@pytest.mark.parametrize("bad", [[float("nan")], [float("inf")], [float("-inf")], [float("inf"), float("-inf")]])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64, torch.complex64])
def test_every_non_finite_entry_is_named(bad, dtype):
    t = torch.randn(300, 70, generator=torch.Generator().manual_seed(0)).to(dtype)
    for i, v in enumerate(bad):
        t[17 * i + 3, 5 * i + 1] = v
    with pytest.raises(NonFiniteError, match="W_bad holds non-finite values"):
        check_finite({"W_ok": torch.ones(3), "W_bad": t}, "test")


@pytest.mark.parametrize("dtype,big", [(torch.float16, 6e4), (torch.float32, 3e38), (torch.float64, 1.7e308)])
def test_finite_tensors_whose_sum_overflows_pass(dtype, big):
    t = torch.full((64,), big, dtype=dtype)
    assert not torch.isfinite(t.sum())
    check_finite({"W": t, "W_neg": -t}, "test")

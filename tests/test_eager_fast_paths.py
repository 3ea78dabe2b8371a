"""The eager fast paths of matmul and mse_loss (two C-contiguous float operands)
refuse what the checked paths refuse, and kernels.typed is call_typed in two steps."""
import numpy as np
import pytest

import numbagrad as ng
from numbagrad import kernels


def test_boolean_operands_take_the_checked_path_and_its_error():
    x = ng.tensor(np.array([[1.0, -1.0], [2.0, 0.5]]))
    mask = x > 0.0                      # a C-contiguous boolean tensor
    with pytest.raises(TypeError, match="boolean tensor"):
        ng.matmul(mask, mask)
    with pytest.raises(TypeError, match="boolean tensor"):
        ng.mse_loss(mask, mask)


def test_typed_matches_call_typed(monkeypatch):
    monkeypatch.setattr(kernels, "CHECK_TYPED", False)
    monkeypatch.setattr(kernels, "_typed", {})
    monkeypatch.setattr(kernels, "_typed_signature", {})
    cpu = kernels.get("cpu")
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((4, 2))
    outs = [np.empty((3, 2)) for _ in range(3)]
    kernels.call_typed(cpu, "gemm", 0, "test-two-steps", a, b, outs[0], 0, 0, 1.0, 0.0)
    fn = kernels.typed(cpu, "gemm", 0, "test-two-steps")
    assert fn is kernels._typed[(cpu, "gemm", "test-two-steps")]   # the specialisation
    fn(a, b, outs[1], 0, 0, 1.0, 0.0)
    kernels.typed(cpu, "gemm", cpu.MT_MIN, "test-two-steps")(a, b, outs[2], 0, 0, 1.0, 0.0)
    assert np.array_equal(outs[0], outs[1]) and np.array_equal(outs[0], outs[2])
    np.testing.assert_allclose(outs[0], a @ b, rtol=1e-12)

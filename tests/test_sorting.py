"""sort, argsort and topk against PyTorch on both devices: values, indices,
stability at ties, nan's place, and the gradient through the values."""
from __future__ import annotations

import numpy as np
import pytest

import numbagrad as ng

torch = pytest.importorskip("torch")


def host(dev, a):
    return ng.kernels.get(dev.name).to_host(a) if dev.name != "cpu" else np.asarray(a)


X = np.array([[3.0, 1.0, np.nan, 1.0, -2.0, 5.0],
              [0.0, -0.0, 2.0, 2.0, np.inf, -np.inf],
              [1.0, 1.0, 1.0, 0.5, np.nan, np.nan]])


@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("dim", [1, 0, -1])
def test_sort_matches_torch_stable(dev, dim, descending):
    p = dev.param(X)
    with ng.grad_tape():
        values, indices = ng.sort(p, dim, descending)
        loss = ng.sum(ng.where(ng.isfinite(values), values, 0.0) *
                      dev.tensor(np.arange(values.size, dtype=float).reshape(values.shape)))
    grads = ng.backward(loss)
    t = torch.tensor(X, requires_grad=True)
    tv, ti = torch.sort(t, stable=True, dim=dim, descending=descending)
    tl = (torch.where(torch.isfinite(tv), tv, 0.0) * torch.arange(tv.numel(), dtype=tv.dtype)
          .reshape(tv.shape)).sum()
    tl.backward()
    np.testing.assert_array_equal(host(dev, values._data), tv.detach().numpy())
    np.testing.assert_array_equal(host(dev, indices), ti.numpy())
    np.testing.assert_array_equal(host(dev, grads[p.id]), t.grad.numpy())
    np.testing.assert_array_equal(host(dev, ng.argsort(p, dim, descending)), ti.numpy())


@pytest.mark.parametrize("largest", [True, False])
def test_topk_matches_torch(dev, largest):
    x = np.random.default_rng(0).normal(size=(4, 7, 3))
    p = dev.param(x)
    with ng.grad_tape():
        values, indices = ng.topk(p, 3, 1, largest)
        loss = ng.sum(values * values)
    grads = ng.backward(loss)
    t = torch.tensor(x, requires_grad=True)
    tv, ti = torch.topk(t, 3, 1, largest)
    (tv * tv).sum().backward()
    np.testing.assert_array_equal(host(dev, values._data), tv.detach().numpy())
    np.testing.assert_array_equal(host(dev, indices), ti.numpy())
    np.testing.assert_allclose(host(dev, grads[p.id]), t.grad.numpy(), rtol=1e-15)


def test_long_rows_and_errors():
    x = np.random.default_rng(1).integers(0, 50, size=(3, 1000)).astype(np.float64)  # ties
    values, indices = ng.sort(ng.tensor(x), descending=True)
    tv, ti = torch.sort(torch.tensor(x), stable=True, descending=True)
    np.testing.assert_array_equal(indices, ti.numpy())
    assert ng.topk(ng.tensor(x), 0).values.shape == (3, 0)
    with pytest.raises(ValueError, match="topk: k=1001 is out of range for dim 1 of size 1000"):
        ng.topk(ng.tensor(x), 1001)
    with pytest.raises(TypeError, match="sort: descending must be a bool"):
        ng.sort(ng.tensor(x), 0, "yes")
    t = ng.tensor(x)
    assert t.sort().values.shape == (3, 1000) and t.argsort(0).shape == (3, 1000)

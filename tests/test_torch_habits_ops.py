"""PyTorch habits (issue 35): max/min with a dim return (values, indices),
amax/amin keep the values-only reduction, dim=/keepdim= alias axis=/keepdims=,
and an out-of-range axis is NumPy's AxisError in every op."""
import numpy as np
import pytest
import torch

import numbagrad as ng
from conftest import Dev, cuda_dev, inputs, matches_torch


def tied(shape, seed=0):
    """Small integers as floats: many ties along every axis."""
    return np.random.default_rng(seed).integers(0, 3, size=shape).astype(np.float64)


def devices():
    return [Dev("cpu"), pytest.param("cuda", id="cuda")]


def dev_of(d):
    return cuda_dev() if d == "cuda" else d


@pytest.mark.parametrize("name", ["max", "min"])
@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("dev", devices())
def test_max_min_with_dim_match_torch(name, dim, keepdim, dev):
    dev = dev_of(dev)
    a = tied((3, 4))
    got = getattr(ng, name)(dev.tensor(a), dim, keepdim)
    want = getattr(torch, name)(torch.tensor(a), dim, keepdim)
    assert type(got).__name__ == name and got._fields == ("values", "indices")
    np.testing.assert_array_equal(got.values.numpy(), want.values.numpy())
    np.testing.assert_array_equal(dev.host(got.indices), want.indices.numpy())
    np.testing.assert_array_equal(dev.host(got[1]), want[1].numpy())
    # the gradient goes to the index picked, ties not split (unlike amax)
    matches_torch(lambda t: getattr(t, name)(dim=dim, keepdim=keepdim).values,
                  lambda t: getattr(t, name)(dim=dim, keepdim=keepdim).values, [a], dev=dev,
                  name=name)


def test_max_with_dim_nan_and_0d_match_torch():
    a = np.array([[1.0, np.nan, 2.0, np.nan], [3.0, 3.0, 0.0, 1.0]])
    got, want = ng.max(ng.tensor(a), 1), torch.max(torch.tensor(a), 1)
    np.testing.assert_array_equal(got.values.numpy(), want.values.numpy())
    np.testing.assert_array_equal(got.indices, want.indices.numpy())
    s = np.array(2.5)
    matches_torch(lambda t: ng.min(t, 0).values, lambda t: torch.min(t, 0).values, [s])
    assert int(ng.min(ng.tensor(s), -1).indices) == int(torch.min(torch.tensor(s), -1).indices)


def test_dqn_target_takes_each_rows_maximum():
    q = inputs([(5, 3)], seed=3)[0]
    np.testing.assert_allclose(ng.tensor(q).max(1)[0].numpy(), torch.tensor(q).max(1)[0].numpy())


def test_max_without_dim_stays_a_tensor_and_with_a_tensor_is_maximum():
    a, b = inputs([(3, 4), (4,)], seed=1)
    out = ng.max(ng.tensor(a))
    assert isinstance(out, ng.Tensor) and out.shape == ()
    np.testing.assert_allclose(ng.min(ng.tensor(a)).numpy(), torch.min(torch.tensor(a)).numpy())
    matches_torch(lambda x, y: ng.max(x, y), lambda x, y: torch.max(x, y), [a, b])
    matches_torch(lambda x, y: x.min(y), lambda x, y: x.min(y), [a, b])


@pytest.mark.parametrize("name", ["amax", "amin"])
def test_amax_amin_split_ties_as_torch(name):
    a = tied((3, 4), seed=2)
    matches_torch(lambda t: getattr(t, name)(1), lambda t: getattr(torch, name)(t, 1), [a])
    matches_torch(lambda t: getattr(ng, name)(t, dim=(0, 1), keepdim=True),
                  lambda t: getattr(torch, name)(t, (0, 1), True), [a])


def test_max_refuses_what_torch_max_refuses():
    x = ng.tensor(np.ones((2, 3)))
    with pytest.raises(TypeError, match=r"max: axis must be an int .* amax"):
        ng.max(x, (0, 1))
    with pytest.raises(TypeError, match="min: keepdims=True needs an axis"):
        ng.min(x, keepdims=True)


# (name, call with axis/keepdims given positionally or as NumPy keywords, torch)
REDUCERS = ["sum", "mean", "logsumexp", "var", "std", "amax", "amin", "argmax", "argmin"]
AXIS_ONLY = ["softmax", "log_softmax", "cumsum"]


@pytest.mark.parametrize("name", REDUCERS)
@pytest.mark.parametrize("keepdim", [False, True])
def test_dim_keepdim_alias_axis_keepdims(name, keepdim):
    a = inputs([(2, 3, 4)], seed=4)[0]
    x = ng.tensor(a)
    want = getattr(ng, name)(x, axis=1, keepdims=keepdim)
    for got in (getattr(ng, name)(x, dim=1, keepdim=keepdim), getattr(x, name)(dim=1,
                                                                               keepdim=keepdim),
                getattr(x, name)(1, keepdim=keepdim)):
        np.testing.assert_array_equal(Dev.host(got), Dev.host(want))
    if name in ("argmax", "argmin", "logsumexp", "amax", "amin", "sum", "mean"):
        ref = getattr(torch, name)(torch.tensor(a), dim=1, keepdim=keepdim)
        np.testing.assert_allclose(Dev.host(want), ref.numpy())
    with pytest.raises(TypeError, match=f"^{name}: got both axis=1 and dim=1"):
        getattr(ng, name)(x, 1, dim=1)
    with pytest.raises(TypeError, match=f"^{name}: got both keepdims=True and keepdim"):
        getattr(ng, name)(x, 1, keepdims=True, keepdim=keepdim)


@pytest.mark.parametrize("name", AXIS_ONLY + ["squeeze", "unsqueeze"])
def test_dim_aliases_axis(name):
    a = inputs([(2, 1, 4)], seed=5)[0]
    x = ng.tensor(a)
    got, want = getattr(x, name)(dim=1), getattr(ng, name)(x, axis=1)
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    np.testing.assert_allclose(got.numpy(), getattr(torch, name)(torch.tensor(a), dim=1).numpy())
    with pytest.raises(TypeError, match=f"^{name}: got both axis=0 and dim=1"):
        getattr(ng, name)(x, 0, dim=1) if name != "softmax" else ng.softmax(x, 0, dim=1)


@pytest.mark.parametrize("name", ["concatenate", "cat", "stack"])
def test_joins_take_dim(name):
    a, b = inputs([(2, 3), (2, 3)], seed=6)
    got = getattr(ng, name)([ng.tensor(a), ng.tensor(b)], dim=1)
    ref = getattr(torch, "cat" if name == "concatenate" else name)(
        [torch.tensor(a), torch.tensor(b)], dim=1)
    np.testing.assert_array_equal(got.numpy(), ref.numpy())
    with pytest.raises(TypeError, match=f"^{name}: got both"):
        getattr(ng, name)([ng.tensor(a)], axis=1, dim=1)
    parts = ng.split(ng.tensor(a), 3, dim=1)
    np.testing.assert_array_equal(parts[2].numpy(), a[:, 2:])


OUT_OF_RANGE = {
    "sum": lambda x: ng.sum(x, 3), "mean": lambda x: x.mean(dim=-4),
    "softmax": lambda x: ng.softmax(x, 3), "log_softmax": lambda x: ng.log_softmax(x, -4),
    "logsumexp": lambda x: ng.logsumexp(x, (0, 3)), "var": lambda x: ng.var(x, 3),
    "std": lambda x: ng.std(x, 3), "cumsum": lambda x: ng.cumsum(x, 3),
    "amax": lambda x: ng.amax(x, 3), "amin": lambda x: ng.amin(x, 3),
    "max": lambda x: ng.max(x, 3), "min": lambda x: ng.min(x, dim=3),
    "argmax": lambda x: ng.argmax(x, 3), "argmin": lambda x: ng.argmin(x, 3),
    "concatenate": lambda x: ng.concatenate([x, x], 3), "stack": lambda x: ng.stack([x], 4),
    "split": lambda x: ng.split(x, 1, 3), "squeeze": lambda x: ng.squeeze(x, 3),
    "unsqueeze": lambda x: ng.unsqueeze(x, 4),
    "flatten": lambda x: ng.flatten(x, 3), "transpose": lambda x: ng.transpose(x, 0, 3),
}


@pytest.mark.parametrize("name", sorted(OUT_OF_RANGE))
def test_out_of_range_axis_is_axis_error(name):
    x = ng.tensor(np.ones((2, 1, 3)))
    with pytest.raises(np.exceptions.AxisError, match=f"^{name}: "):
        OUT_OF_RANGE[name](x)


def test_gather_takes_dim_as_torch():
    a = np.arange(12.0).reshape(3, 4)
    index = np.array([[0, 3], [1, 1], [2, 0]])
    ref = torch.gather(torch.tensor(a), dim=1, index=torch.tensor(index)).numpy()
    np.testing.assert_array_equal(ng.tensor(a).gather(dim=1, index=index).numpy(), ref)
    np.testing.assert_array_equal(ng.gather(ng.tensor(a), 1, index).numpy(), ref)
    with pytest.raises(TypeError, match="both axis=1 and dim=1"):
        ng.gather(ng.tensor(a), 1, index, dim=1)
    with pytest.raises(TypeError, match="axis .* and index are needed"):
        ng.gather(ng.tensor(a), index=index)


@pytest.mark.parametrize("name", ["maximum", "minimum"])
@pytest.mark.parametrize("dev", devices())
def test_a_python_number_takes_the_tensors_dtype(name, dev):
    """PyTorch: a Python scalar never changes a tensor's dtype (ng.maximum(x32, 0)
    raised "dtypes differ", and on CUDA refused the number as host data)."""
    dev = dev_of(dev)
    a = np.array([[-1.0, 0.0, 2.5], [0.5, -3.0, 0.0]], np.float32)
    fn = getattr(ng, name)
    for got in (fn(dev.tensor(a), 0), fn(0.0, dev.tensor(a)), fn(dev.tensor(a), np.float64(0))):
        assert got.dtype == np.float32 and got.device == dev.name
        np.testing.assert_array_equal(dev.host(got), getattr(torch, name)(
            torch.tensor(a), torch.tensor(0.0)).numpy())
    # the gradient at ties (x == 0) is split as torch's
    matches_torch(lambda t: fn(t, 0), lambda t: getattr(torch, name)(t, torch.tensor(0.0)),
                  [a.astype(np.float64)], dev=dev)

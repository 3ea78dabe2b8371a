"""Issue 17's axis reductions: max/min (torch.amax/amin gradients),
argmax/argmin, logsumexp, var/std and cumsum against PyTorch on both
devices, any rank and axes, ties, +-inf, size-0, bad input, CUDA launch
bounds and the reduce_axis kernels' PTX."""
import warnings

import numpy as np
import pytest
import torch

import numbagrad as ng
from conftest import cuda_dev, cuda_launches, inputs, matches_torch

# (name, ng function, torch function, (shape, axis, keepdims) cases)
CASES = [
    ("max", lambda x, a, k: ng.amax(x, a, k),
     lambda t, a, k: torch.amax(t, () if a is None else a, k)),
    ("min", lambda x, a, k: x.amin(a, keepdims=k),
     lambda t, a, k: torch.amin(t, () if a is None else a, k)),
    ("logsumexp", lambda x, a, k: ng.logsumexp(x, a, k),
     lambda t, a, k: torch.logsumexp(t, tuple(range(t.ndim)) if a is None else a, k)),
    ("var", lambda x, a, k: ng.var(x, a, keepdims=k), lambda t, a, k: torch.var(t, a, keepdim=k)),
    ("std", lambda x, a, k: x.std(a, correction=0, keepdims=k),
     lambda t, a, k: torch.std(t, a, correction=0, keepdim=k)),
]
AXES = [((), None, False), ((4,), 0, False), ((4,), -1, True), ((2, 3), None, True),
        ((2, 3), 1, False), ((2, 3, 2), (0, 2), False), ((2, 3, 2), (-1, 1), True),
        ((1, 2, 2, 3), (1, 2), False), ((2, 1, 2, 2), (0, 3), True)]


@pytest.mark.parametrize("name, f, g", CASES, ids=[c[0] for c in CASES])
def test_reductions_match_torch(dev, name, f, g):
    for shape, axis, keep in AXES:
        if name in ("var", "std") and shape == ():
            continue     # one element, correction 1: nan (tested below)
        matches_torch(lambda x: f(x, axis, keep), lambda t: g(t, axis, keep),
                      inputs([shape], seed=len(shape)), dev, name=f"{name}{shape}{axis}")


def test_cumsum_matches_torch(dev):
    for shape, axis in [((), 0), ((4,), 0), ((2, 3), -1), ((2, 3, 2), 1), ((1, 2, 2, 3), 0)]:
        matches_torch(lambda x: ng.cumsum(x, axis), lambda t: torch.cumsum(t, axis),
                      inputs([shape]), dev, name=f"cumsum{shape}{axis}")
    matches_torch(lambda x: x.cumsum(), lambda t: torch.cumsum(t.reshape(-1), 0),
                  inputs([(2, 3)]), dev, name="cumsum over the flattened tensor")


def test_ties_share_the_gradient_evenly(dev):
    x = np.array([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0], [-1.0, -5.0, -5.0, 4.0]])
    for f, g in [(lambda t: ng.amax(t, 1), lambda t: torch.amax(t, 1)),
                 (lambda t: ng.amin(t, 1), lambda t: torch.amin(t, 1)),
                 (ng.max, torch.max), (ng.min, torch.min)]:
        matches_torch(f, g, [x], dev, name="ties")
    p = dev.param(x)
    with ng.grad_tape():
        loss = ng.amax(p, 1).sum()
    np.testing.assert_array_equal(dev.host(ng.backward(loss)[p.id]),
                                  [[0, 0.5, 0.5, 0], [0.25] * 4, [0, 0, 0, 1]])


@pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")
def test_infinities(dev):
    x = np.array([[np.inf, 1.0, -2.0], [-np.inf, -np.inf, -np.inf], [-np.inf, 0.5, 3.0]])
    for f, g in [(lambda t: ng.amax(t, 1), lambda t: torch.amax(t, 1)),
                 (lambda t: ng.amin(t, 0), lambda t: torch.amin(t, 0)),
                 (lambda t: ng.logsumexp(t, 1), lambda t: torch.logsumexp(t, 1)),
                 (lambda t: ng.cumsum(t, 1), lambda t: torch.cumsum(t, 1))]:
        p, t = dev.param(x), torch.tensor(x, requires_grad=True)
        with ng.grad_tape():
            out = f(p)
            loss = out.sum()
        want = g(t)
        np.testing.assert_array_equal(out.numpy(), want.detach().numpy())
        want.sum().backward()
        got, ref = dev.host(ng.backward(loss)[p.id]), t.grad.numpy()
        np.testing.assert_array_equal(got[np.isfinite(ref)], ref[np.isfinite(ref)])


def test_nan_propagates_and_argmax_finds_it(dev):
    x = np.array([[1.0, np.nan, 3.0], [0.0, 2.0, -1.0]])
    np.testing.assert_array_equal(ng.amax(dev.tensor(x), 1).numpy(), [np.nan, 2.0])
    np.testing.assert_array_equal(dev.host(ng.argmax(dev.tensor(x), 1)), np.argmax(x, 1))
    np.testing.assert_array_equal(dev.host(ng.argmin(dev.tensor(x), 1)), np.argmin(x, 1))


def test_size_zero():
    x = ng.param(np.zeros((2, 0, 3)))
    with pytest.raises(ValueError, match=r"max: cannot reduce over a size-0 axis .*\(2, 0, 3\)"):
        ng.amax(x, 1)
    with pytest.raises(ValueError, match="argmin: cannot reduce over a size-0 axis"):
        ng.argmin(x)
    assert ng.amax(x, 0).shape == (0, 3)
    np.testing.assert_array_equal(ng.logsumexp(x, 1).numpy(), np.full((2, 3), -np.inf))
    np.testing.assert_array_equal(ng.logsumexp(x).numpy(), -np.inf)
    assert ng.cumsum(x, 1).shape == (2, 0, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert np.isnan(ng.var(x, 1).numpy()).all()
        assert np.isnan(ng.std(ng.tensor(np.ones(3)), correction=3).numpy())
    with pytest.warns(RuntimeWarning, match=r"var: degrees of freedom <= 0"):
        ng.var(ng.tensor(np.ones((2, 1))), 1)


def test_argmax_and_argmin_are_numpy_indices(dev):
    x = np.array([[[1.0, 5.0], [5.0, 0.0]], [[2.0, 2.0], [-3.0, 7.0]]])
    t = dev.tensor(x)
    for axis in (None, 0, 1, -1):
        for keep in (False, True):
            for ng_f, np_f in [(ng.argmax, np.argmax), (ng.argmin, np.argmin)]:
                got = ng_f(t, axis, keep)
                want = np_f(x, axis, keepdims=keep)
                assert dev.host(got).dtype == np.int64
                np.testing.assert_array_equal(dev.host(got), want)
                assert isinstance(got, np.ndarray) == (dev.name == "cpu")
    assert t.argmax().shape == () and dev.host(t.argmax()) == 7
    np.testing.assert_array_equal(dev.host(ng.argmax(dev.tensor(np.array(3.0)))), 0)


def test_float32_within_1e5(dev):
    x = inputs([(3, 4)])[0].astype(np.float32)
    for f, g in [(lambda t: ng.amax(t, 1), lambda t: torch.amax(t, 1)),
                 (lambda t: ng.logsumexp(t, 0), lambda t: torch.logsumexp(t, 0)),
                 (lambda t: ng.var(t, 1), lambda t: torch.var(t, 1)),
                 (lambda t: ng.std(t), torch.std),
                 (lambda t: ng.cumsum(t, 1), lambda t: torch.cumsum(t, 1))]:
        p, t = dev.param(x), torch.tensor(x, requires_grad=True)
        with ng.grad_tape():
            out = f(p)
            loss = out.sum()
        assert out.dtype == np.float32
        want = g(t)
        np.testing.assert_allclose(out.numpy(), want.detach().numpy(), rtol=1e-5, atol=1e-6)
        want.sum().backward()
        np.testing.assert_allclose(dev.host(ng.backward(loss)[p.id]), t.grad.numpy(),
                                   rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("f", [lambda t: ng.amax(t, (0, 2)), lambda t: ng.amin(t, 1),
                               lambda t: ng.logsumexp(t, (0, 2), True), lambda t: ng.var(t, 1),
                               lambda t: ng.std(t, (0, 1)), lambda t: ng.cumsum(t, -1)],
                         ids=["max", "min", "logsumexp", "var", "std", "cumsum"])
def test_gradcheck(dev, f):
    p = dev.param(inputs([(2, 3, 2)], seed=8)[0])
    w = dev.tensor(inputs([f(p).shape], seed=9)[0])
    ng.gradcheck(lambda: (f(p) * w).sum(), [p], directions=None if dev.name == "cpu" else 2)


def test_bad_input_is_refused_before_anything_runs():
    x = ng.param(np.ones((2, 3)))
    with pytest.raises(ValueError, match=r"max: axis 2 is out of range for a tensor of shape"):
        ng.amax(x, 2)
    with pytest.raises(ValueError, match=r"logsumexp: axis \(1, -1\) names axis 1 twice"):
        ng.logsumexp(x, (1, -1))
    with pytest.raises(TypeError, match="argmax: axis must be None or an int"):
        ng.argmax(x, (0, 1))
    with pytest.raises(np.exceptions.AxisError, match="cumsum: axis 5 is out of range"):
        ng.cumsum(x, 5)
    with pytest.raises(TypeError, match="var: correction must be a real number"):
        ng.var(x, correction="1")
    with pytest.raises(TypeError, match="std: keepdims must be a bool"):
        ng.std(x, 0, 1, keepdims=2)
    assert ng.min(x > 0).dtype == np.bool_ and bool(ng.min(x > 0))   # a bool one, as PyTorch
    np.testing.assert_array_equal(x.numpy(), np.ones((2, 3)))
    assert x.grad is None


def test_cuda_launch_bounds():
    """One launch forward and one backward; a tuple of axes that are not
    adjacent adds one copy each way (the reduced axes moved last)."""
    dev = cuda_dev()
    x = dev.param(inputs([(2, 3, 2)])[0])
    for f in [lambda t: ng.amax(t, 1), lambda t: ng.logsumexp(t, (1, 2)), ng.var,
              lambda t: ng.std(t, -1), lambda t: ng.cumsum(t, 1)]:
        assert cuda_launches(f, x) == (1, 1)
    assert cuda_launches(lambda t: ng.amin(t, (0, 2)), x) == (2, 2)
    before = ng.cuda.launch_count()
    ng.argmax(x, 1)
    assert ng.cuda.launch_count() - before == 1

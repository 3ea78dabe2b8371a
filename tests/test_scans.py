"""prod, cumprod, cummax/cummin, logcumsumexp and norm (issue 30) against
PyTorch in float64 (values and gradients, zeros, ties, -inf, nan, size-0
dims), finite differences, both devices (CUDA: tiny shapes), ng.compile,
and their errors."""
import math

import numpy as np
import pytest
import torch

import numbagrad as ng
from conftest import Dev, compiled_matches_eager, matches_torch


def _with_zeros(shape, zeros, seed=0):
    a = np.random.default_rng(seed).normal(size=shape)
    for z in zeros:
        a[z] = 0.0
    return a


# (id, input, ng function, torch function)
CASES = [
    ("prod_dim", _with_zeros((3, 4), []), lambda x: ng.prod(x, 1), lambda x: torch.prod(x, 1)),
    ("prod_one_zero", _with_zeros((3, 4), [(1, 2)]), lambda x: x.prod(1, keepdim=True),
     lambda x: x.prod(1, keepdim=True)),
    ("prod_two_zeros", _with_zeros((3, 4), [(1, 2), (1, 0), (2, 3)]), lambda x: ng.prod(x, 1),
     lambda x: torch.prod(x, 1)),
    ("prod_all", _with_zeros((2, 3), [(0, 1)]), lambda x: ng.prod(x), lambda x: torch.prod(x)),
    ("prod_dim0_3d", _with_zeros((3, 2, 2), [(0, 1, 1)]), lambda x: ng.prod(x, dim=0),
     lambda x: torch.prod(x, 0)),
    ("cumprod", _with_zeros((3, 5), [(0, 1), (2, 1), (2, 3)]), lambda x: ng.cumprod(x, 1),
     lambda x: torch.cumprod(x, 1)),
    ("cumprod_dim0", _with_zeros((4, 2, 3), [(1, 0, 0)]), lambda x: ng.cumprod(x, dim=0),
     lambda x: torch.cumprod(x, 0)),
    ("cummax_ties", np.array([[1.0, 3.0, 3.0, 2.0, 3.0, 0.5], [2.0, 2.0, 1.0, 2.0, 5.0, 5.0]]),
     lambda x: ng.cummax(x, 1).values, lambda x: torch.cummax(x, 1).values),
    ("cummin_ties", np.array([[3.0, 1.0, 1.0, 2.0, 1.0], [0.0, 0.0, -1.0, -1.0, 4.0]]).T,
     lambda x: x.cummin(0).values, lambda x: x.cummin(0).values),
    ("logcumsumexp", np.random.default_rng(2).normal(size=(3, 4)) * 30,
     lambda x: ng.logcumsumexp(x, 1), lambda x: torch.logcumsumexp(x, 1)),
    ("logcumsumexp_-inf", np.array([[1.0, -np.inf, 2.0, -1.0], [-3.0, 0.5, -np.inf, 700.0]]),
     lambda x: ng.logcumsumexp(x, -1), lambda x: torch.logcumsumexp(x, -1)),
    ("norm_fro", _with_zeros((3, 4), [(0, 0)]), lambda x: ng.norm(x), lambda x: torch.norm(x)),
    ("norm_2_dim", _with_zeros((3, 4), [(0, 0)]), lambda x: ng.norm(x, 2, 1, True),
     lambda x: torch.norm(x, 2, 1, True)),
    ("norm_1", _with_zeros((3, 4), [(0, 0)]), lambda x: ng.norm(x, 1, 0),
     lambda x: torch.norm(x, 1, 0)),
    ("norm_3_tuple", _with_zeros((2, 3, 2), [(0, 0, 1)]), lambda x: ng.norm(x, 3, (0, 2)),
     lambda x: torch.linalg.vector_norm(x, 3, (0, 2))),
    ("norm_0.5", _with_zeros((3, 4), [(0, 0)]), lambda x: ng.norm(x, 0.5, 1),
     lambda x: torch.norm(x, 0.5, 1)),
    ("norm_inf_ties", np.array([[0.0, 2.0, -2.0, 1.0], [1.0, -3.0, 0.5, 0.0]]),
     lambda x: ng.norm(x, math.inf, 1), lambda x: torch.norm(x, math.inf, 1)),
    ("norm_-inf", np.array([[0.5, 2.0, -0.5, 1.0], [1.0, -3.0, 0.0, 2.0]]),
     lambda x: ng.norm(x, -math.inf, 1), lambda x: torch.linalg.vector_norm(x, -math.inf, 1)),
    ("norm_0", _with_zeros((3, 4), [(0, 0), (2, 1)]), lambda x: ng.norm(x, 0, 1),
     lambda x: torch.norm(x, 0, 1) + 0 * x.sum(1)),
    ("norm_of_zeros", np.zeros((2, 3)), lambda x: ng.norm(x, 2, 1), lambda x: torch.norm(x, 2, 1)),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_against_torch_cpu(case):
    name, a, f, g = case
    matches_torch(f, g, [a], name=name)


@pytest.mark.parametrize("name", ["prod_one_zero", "cumprod", "cummax_ties",
                                  "logcumsumexp_-inf", "norm_2_dim", "norm_inf_ties"])
def test_against_torch_cuda(name):
    dev = Dev("cuda")
    if not ng.cuda_available():
        pytest.skip("CUDA unusable here")
    _, a, f, g = next(c for c in CASES if c[0] == name)
    matches_torch(f, g, [a], dev, name=name)


@pytest.mark.parametrize("f", [lambda x: ng.prod(x, 0), lambda x: ng.cumprod(x, 1),
                               lambda x: ng.logcumsumexp(x, 0), lambda x: ng.cummax(x, 1)[0],
                               lambda x: ng.norm(x, 3, 1)],
                         ids=["prod", "cumprod", "logcumsumexp", "cummax", "norm"])
def test_finite_differences(dev, f):
    a = np.random.default_rng(5).normal(size=(2, 3))
    w = np.random.default_rng(6).normal(size=(2, 3))
    x = dev.param(a)

    def loss():
        y = f(x)
        return ng.sum(y * dev.tensor(w.reshape(-1)[:y.size].reshape(y.shape)))
    ng.testing.gradcheck(loss, [x])


def test_indices_like_torch(dev):
    """(The third row: a later nan takes the index, a tie, as PyTorch's.)"""
    a = np.array([[1.0, 3.0, 3.0, np.nan, 5.0, 0.0], [2.0, 2.0, 1.0, 2.0, 0.0, 0.0],
                  [1.0, np.nan, -np.inf, np.nan, -0.0, np.nan]])
    for name in ("cummax", "cummin"):
        got = getattr(ng, name)(dev.tensor(a), 1)
        want = getattr(torch, name)(torch.tensor(a), 1)
        np.testing.assert_array_equal(got.values.numpy(), want.values.numpy())
        idx = Dev.host(got.indices)
        assert idx.dtype == np.int64 and type(got.indices) is type(ng.argmax(dev.tensor(a), 1))
        np.testing.assert_array_equal(idx, want.indices.numpy())
        assert got._fields == ("values", "indices")


def test_float32_and_nan(dev):
    a = np.array([[1.5, np.nan, 2.0], [0.5, -1.0, 4.0]], np.float32)
    x = dev.tensor(a)
    t = torch.tensor(a)
    for f, g in [(lambda v: ng.cumprod(v, 1), lambda v: torch.cumprod(v, 1)),
                 (lambda v: ng.logcumsumexp(v, 1), lambda v: torch.logcumsumexp(v, 1)),
                 (lambda v: ng.prod(v, 1), lambda v: torch.prod(v, 1)),
                 (lambda v: ng.norm(v, 2, 1), lambda v: torch.norm(v, 2, 1))]:
        y = f(x)
        assert y.dtype == np.float32
        np.testing.assert_allclose(y.numpy(), g(t).numpy(), rtol=1e-6)


def test_logcumsumexp_gradient_at_all_inf():
    for a in ([-np.inf, -np.inf, 1.0], [np.inf, 1.0, 2.0]):
        x = ng.param(np.array(a))
        with ng.grad_tape():
            y = ng.logcumsumexp(x, 0)
            loss = ng.sum(y * ng.tensor(np.array([1.0, -2.0, 3.0])))
        grads = ng.backward(loss)
        t = torch.tensor(a, requires_grad=True)
        torch.logcumsumexp(t, 0).backward(torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64))
        np.testing.assert_array_equal(y.numpy(), torch.logcumsumexp(t.detach(), 0).numpy())
        np.testing.assert_allclose(grads[x.id], t.grad.numpy(), rtol=1e-12)


def test_size0():
    x = ng.param(np.zeros((2, 0)))
    np.testing.assert_array_equal(ng.prod(x, 1).numpy(), np.ones(2))
    assert ng.cumprod(x, 1).shape == (2, 0) and ng.logcumsumexp(x, 0).shape == (2, 0)
    assert ng.cummax(x, 1).values.shape == (2, 0)
    assert float(ng.norm(x).numpy()) == 0.0
    with ng.grad_tape():
        loss = ng.sum(ng.prod(x, 1))
    assert ng.backward(loss)[x.id].shape == (2, 0)


def test_compile(tmp_path):
    def make():
        w = ng.param(_with_zeros((3, 4), [(1, 1)]))

        def loss_fn(x):
            return ng.sum(ng.prod(w * x, 1)) + ng.sum(ng.cummax(w, 0).values) + \
                ng.sum(ng.logcumsumexp(w, 1)) + ng.norm(w * x)
        return [w], loss_fn, ng.optim.SGD([w], lr=0.1)
    compiled_matches_eager(make, [(ng.tensor(np.full((3, 4), 0.5)),)] * 4, tmp_path)


def test_errors():
    x = ng.tensor(np.ones((2, 3)))
    for f in (lambda: ng.prod(x, 2), lambda: ng.cumprod(x, -3), lambda: ng.cummax(x, 2),
              lambda: ng.logcumsumexp(x, 5), lambda: ng.norm(x, 2, 4)):
        with pytest.raises(np.exceptions.AxisError):
            f()
    with pytest.raises(ValueError, match="'nuc' is not supported"):
        ng.norm(x, "nuc")
    with pytest.raises(TypeError, match="axis must be None or an int"):
        ng.prod(x, (0, 1))

"""Issue 30's binary math (ops/arith.py) at its edges, against PyTorch."""
from __future__ import annotations

import numpy as np
import pytest

import numbagrad as ng
from numbagrad.kernels import codes

torch = pytest.importorskip("torch")

VALUES = np.array([-np.inf, -7.5, -2.0, -1.0, -0.5, -0.0, 0.0, 0.5, 1.0, 3.0, 7.5, np.inf,
                   np.nan])
A, B = (g.ravel() for g in np.meshgrid(VALUES, VALUES, indexing="ij"))   # every pair

EDGE = {
    "atan2": (ng.atan2, torch.atan2),
    "copysign": (ng.copysign, torch.copysign),
    "fmod": (ng.fmod, torch.fmod),
    "remainder": (ng.remainder, torch.remainder),
    "floor_divide": (ng.floor_divide, lambda a, b: torch.div(a, b, rounding_mode="floor")),
    "div trunc": (lambda a, b: ng.div(a, b, rounding_mode="trunc"),
                  lambda a, b: torch.div(a, b, rounding_mode="trunc")),
    "logaddexp": (ng.logaddexp, torch.logaddexp),
    "pow": (ng.pow, torch.pow),
}


@pytest.mark.parametrize("name", sorted(EDGE))
def test_values_at_the_edges_match_torch(name):
    f, g = EDGE[name]
    with np.errstate(all="ignore"):
        got = f(ng.tensor(A), ng.tensor(B)).numpy()
    want = g(torch.tensor(A), torch.tensor(B)).numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=name)
    ok = ~np.isnan(want)
    np.testing.assert_allclose(got[ok], want[ok], rtol=1e-15, atol=0, err_msg=name)
    zero = want == 0     # the sign of zero too (floor_divide(-0.5, inf) is -0.0)
    np.testing.assert_array_equal(np.signbit(got[zero]), np.signbit(want[zero]), err_msg=name)


# gradients where PyTorch's are defined by a formula (not at its own nan
# corners, where autograd's formulas meet inf * 0)
FINITE = np.array([-7.5, -2.0, -1.0, -0.5, 0.5, 1.0, 3.0, 7.5])
FA, FB = (g.ravel() for g in np.meshgrid(FINITE, FINITE, indexing="ij"))


@pytest.mark.parametrize("name", sorted(EDGE))
def test_gradients_on_finite_pairs_match_torch(name):
    f, g = EDGE[name]
    pa, pb = ng.param(FA), ng.param(FB)
    with ng.grad_tape():
        loss = ng.sum(f(pa, pb))
    grads = ng.backward(loss)
    ta, tb = torch.tensor(FA, requires_grad=True), torch.tensor(FB, requires_grad=True)
    g(ta, tb).sum().backward()
    for got, want, which in ((grads[pa.id], ta.grad, "a"), (grads[pb.id], tb.grad, "b")):
        want = want.numpy()
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=f"{name} d{which}")
        ok = ~np.isnan(want)
        np.testing.assert_allclose(got[ok], want[ok], rtol=1e-14, err_msg=f"{name} d{which}")


def test_pow_with_a_tensor_exponent_broadcasts_and_differentiates(dev):
    rng = np.random.default_rng(0)
    base, exponent = rng.uniform(0.5, 2.0, size=(3, 4)), rng.normal(size=(4,))
    pa, pb = dev.param(base), dev.param(exponent)
    with ng.grad_tape():
        y = pa ** pb
        loss = ng.sum(y * y)
    grads = ng.backward(loss)
    ta, tb = torch.tensor(base, requires_grad=True), torch.tensor(exponent, requires_grad=True)
    ((ta ** tb) ** 2).sum().backward()
    host = ng.kernels.get(dev.name).to_host
    np.testing.assert_allclose(host(grads[pa.id]), ta.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(host(grads[pb.id]), tb.grad.numpy(), rtol=1e-12)


def test_operators_and_scalars():
    x = ng.tensor(np.array([-7.5, -1.0, 2.5, 4.0]))
    t = torch.tensor(x.numpy())
    for got, want in ((x % 3, t % 3), (x // 2, t // 2), (-5.0 % x, -5.0 % t),
                      (7 // x, 7 // t), (x ** x.abs(), t ** t.abs()),
                      (np.fmod(x, 2.0), torch.fmod(t, 2.0)),
                      (np.arctan2(x, 1.5), torch.atan2(t, torch.tensor(1.5, dtype=t.dtype)))):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-15)
    assert (ng.tensor(np.ones(2, np.float32)) % 2).dtype == np.float32


def test_the_boolean_tests_match_torch(dev):
    a = np.array([0.0, -0.0, 1.0, np.inf, -np.inf, np.nan, 1e-9, 1.0, np.inf, np.nan, 5.0])
    b = np.array([0.0, 0.0, 1.0 + 1e-6, np.inf, np.inf, np.nan, 0.0, 1.1, 1.0, 1.0, np.inf])
    ta, tb = torch.tensor(a), torch.tensor(b)
    host = ng.kernels.get(dev.name).to_host
    for name in ("isnan", "isinf", "isfinite"):
        got = getattr(ng, name)(dev.tensor(a))
        assert got.dtype == np.bool_
        np.testing.assert_array_equal(host(got._data), getattr(torch, name)(ta).numpy(), name)
    for kw in ({}, {"equal_nan": True}, {"rtol": 0.2, "atol": 0.0}, {"rtol": 0, "atol": 1e-8}):
        got = host(ng.isclose(dev.tensor(a), dev.tensor(b), **kw)._data)
        np.testing.assert_array_equal(got, torch.isclose(ta, tb, **kw).numpy(), str(kw))
    np.testing.assert_array_equal(np.isclose(ng.tensor(a), ng.tensor(b)).numpy(),
                                  torch.isclose(ta, tb).numpy())
    with pytest.raises(ValueError, match="isclose: rtol and atol"):
        ng.isclose(ng.tensor(a), ng.tensor(b), rtol=-1)


def test_lerp_with_a_tensor_weight_and_div_modes_checked():
    rng = np.random.default_rng(1)
    s, e, w = rng.normal(size=(3, 4)), rng.normal(size=(3, 4)), rng.uniform(size=(4,))
    got = ng.lerp(ng.tensor(s), ng.tensor(e), ng.tensor(w)).numpy()
    want = torch.lerp(torch.tensor(s), torch.tensor(e), torch.tensor(w)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-15)
    with pytest.raises(ValueError, match="div: rounding_mode"):
        ng.div(ng.tensor(s), 2.0, rounding_mode="round")


def test_shared_binary_loop_on_every_cpu_path():
    """The binary codes without a loop of their own run on the broadcast 2-D
    path, the N-d strided one and the threaded twin, and an unknown code is
    refused on each."""
    from numbagrad.kernels.cpu import elementwise
    rng = np.random.default_rng(2)
    a, b = rng.normal(size=(64, 300)), rng.normal(size=(1, 300)) + 3
    serial, threaded = np.empty((64, 300)), np.empty((64, 300))
    elementwise.binary(codes.LOGADDEXP, a, b, serial)
    elementwise.binary_mt(codes.LOGADDEXP, a, b, threaded)
    np.testing.assert_array_equal(serial, threaded)
    np.testing.assert_allclose(serial, np.logaddexp(a, b), rtol=1e-15)
    x = ng.tensor(rng.normal(size=(4, 3, 5))).permute(2, 0, 1)      # strided: N-d kernel
    y = ng.tensor(rng.normal(size=(4, 1)) + 3)
    np.testing.assert_array_equal(ng.fmod(x, y).numpy(), np.fmod(x.numpy(), y.numpy()))
    da, db = np.empty((64, 300)), np.empty((1, 300))
    for fn in (elementwise.binary_backward, elementwise.binary_backward_mt):
        fn(codes.ATAN2, a, b, np.ones((64, 300)), da, 0.0, True, db, 0.0, True)
        np.testing.assert_allclose(da, b / (a * a + b * b), rtol=1e-14)
        np.testing.assert_allclose(db, (-a / (a * a + b * b)).sum(0, keepdims=True), rtol=1e-12)
    with pytest.raises(ValueError, match="unknown op code"):
        elementwise.binary(codes.N_BINARY, a, b, serial)
    with pytest.raises(ValueError, match="unknown op code"):
        elementwise.binary_backward(codes.N_BINARY + 2, a, b, serial, da, 0.0, True, db, 0.0,
                                    True)


def test_any_and_all_match_torch(dev):
    x = np.array([[0.0, 1.0, np.nan], [0.0, 0.0, 0.0], [2.0, -1.0, 3.0]])
    t = torch.tensor(x)
    host = ng.kernels.get(dev.name).to_host
    for kwargs, tk in (({}, {}), ({"axis": 1}, {"dim": 1}), ({"axis": 0, "keepdims": True},
                                                              {"dim": 0, "keepdim": True})):
        for name in ("any", "all"):
            got = getattr(ng, name)(dev.tensor(x), **kwargs)
            want = getattr(torch, name)(t, **tk).numpy()
            assert got.dtype == np.bool_ and got.shape == want.shape
            np.testing.assert_array_equal(host(got._data), want, err_msg=f"{name} {kwargs}")
    mask = dev.tensor(x) > 0
    assert not mask.all().item() and mask.any().item()
    empty = dev.tensor(np.zeros((0, 3)))
    assert ng.all(empty).item() and not ng.any(empty).item()
    np.testing.assert_array_equal(host(ng.any(empty, 0)._data), [False] * 3)

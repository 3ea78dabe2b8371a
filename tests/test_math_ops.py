"""Issue 30's math functions and activations at their edges, against PyTorch.

The op table's rows (tests/test_ops.py) check each op on random inputs of its
domain, with finite differences, on both devices; here every op meets the
points where formulas break: +-inf, nan, +-0, its poles and domain ends, the
activations' kinks (where PyTorch picks a side for the gradient), ties of
rounding, and values past exp's range, in float64 and float32.
"""
from __future__ import annotations

import numpy as np
import pytest

import numbagrad as ng
from numbagrad.kernels import codes

torch = pytest.importorskip("torch")
F = torch.nn.functional

SPECIAL = np.array([-np.inf, -1000.0, -20.5, -3.0, -2.5, -1.0, -0.5, -0.0, 0.0, 0.5, 1.0, 2.5,
                    3.0, 6.0, 20.5, 1000.0, np.inf, np.nan])
# name -> (numbagrad function, PyTorch function)
EDGE_OPS = {
    **{name: (getattr(ng, name), getattr(torch, name)) for name in (
        "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh",
        "erfc", "exp2", "log2", "log10", "log1p", "expm1", "rsqrt", "reciprocal", "sign",
        "floor", "ceil", "trunc", "round")},
    "round(decimals=1)": (lambda x: ng.round(x, decimals=1), lambda x: torch.round(x, decimals=1)),
    "round(decimals=-1)": (lambda x: ng.round(x, decimals=-1),
                           lambda x: torch.round(x, decimals=-1)),
    "elu": (ng.elu, F.elu),
    "elu(alpha=0.5)": (lambda x: ng.elu(x, 0.5), lambda x: F.elu(x, 0.5)),
    "selu": (ng.selu, F.selu),
    "celu(alpha=2)": (lambda x: ng.celu(x, 2.0), lambda x: F.celu(x, 2.0)),
    "hardtanh": (ng.hardtanh, F.hardtanh),
    "hardtanh(-3, 2.5)": (lambda x: ng.hardtanh(x, -3.0, 2.5), lambda x: F.hardtanh(x, -3.0, 2.5)),
    "relu6": (ng.relu6, F.relu6),
    "hardsigmoid": (ng.hardsigmoid, F.hardsigmoid),
    "hardswish": (ng.hardswish, F.hardswish),
    "mish": (ng.mish, F.mish),
    "softsign": (ng.softsign, F.softsign),
    "logsigmoid": (ng.logsigmoid, F.logsigmoid),
    "quick_gelu": (ng.quick_gelu, lambda x: x * torch.sigmoid(1.702 * x)),
}


def _close(got, want, rtol, name, atol=1e-300):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=f"{name}: nan")
    finite = np.isfinite(want)
    np.testing.assert_array_equal(got[~finite & ~np.isnan(want)],
                                  want[~finite & ~np.isnan(want)], err_msg=f"{name}: inf")
    np.testing.assert_allclose(got[finite], want[finite], rtol=rtol, atol=atol,
                               err_msg=name)


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("name", sorted(EDGE_OPS))
def test_edges_match_torch(name, dtype):
    f, g = EDGE_OPS[name]
    x = SPECIAL.astype(dtype)
    p = ng.param(x.copy())
    with ng.grad_tape():
        y = f(p)
        loss = ng.sum(y)
    grads = ng.backward(loss)
    # float32 against float64's answer rounded to float32: PyTorch's own
    # float32 loses digits where numbagrad's float32 formulas do not
    # (softsign's gradient at 1000 cancels in float32)
    t = torch.tensor(x.astype(np.float64), requires_grad=True)
    want = g(t)
    want.sum().backward()
    with np.errstate(over="ignore"):     # (1000.0 ** 3 and the like, as float32)
        value, grad = want.detach().numpy().astype(dtype), t.grad.numpy().astype(dtype)
    # hardsigmoid's PyTorch gradient is float32's 1/6 (tests/test_ops.py's row
    # checks the exact one inside; here the kinks)
    rtol = 2e-6 if dtype == np.float32 or name == "hardsigmoid" else 1e-13
    assert y.dtype == dtype
    # (float32's atol: expm1's gradient y + 1 is 0 where y rounds to -1)
    atol = 1e-8 if dtype == np.float32 else 1e-300
    _close(y.numpy(), value, rtol, f"{name} value", atol)
    _close(grads[p.id], grad, rtol, f"{name} gradient", atol)
    # the sign of a zero result, too (ceil(-0.5) is -0.0)
    zero = value == 0
    np.testing.assert_array_equal(np.signbit(y.numpy()[zero]), np.signbit(value[zero]),
                                  err_msg=f"{name}: sign of zero")


def test_rounding_ties_and_large_values_follow_torch():
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 2.0 ** 52 + 1, -(2.0 ** 53), 1e300,
                  4503599627370495.5, 0.49999999999999994])
    for name in ("round", "floor", "ceil", "trunc"):
        got = getattr(ng, name)(ng.tensor(x)).numpy()
        want = getattr(torch, name)(torch.tensor(x)).numpy()
        np.testing.assert_array_equal(got, want, err_msg=name)


def test_shared_loop_paths_broadcast_strided_and_threaded(monkeypatch):
    """The codes without a loop of their own run through the shared loop on
    every CPU path: a broadcast 2-D operand, an N-d strided view, and the
    threaded twin, each equal to the contiguous result."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(6, 5, 4))
    view = ng.tensor(x).permute(2, 0, 1)            # strided: the N-d kernel
    dense = ng.tensor(np.ascontiguousarray(x.transpose(2, 0, 1)))
    for name in ("sin", "mish", "round", "hardswish"):
        np.testing.assert_array_equal(getattr(ng, name)(view).numpy(),
                                      getattr(ng, name)(dense).numpy(), err_msg=name)
    row = ng.tensor(x[0, :1])                        # (1, 4) broadcast by the kernel
    out = np.empty((3, 4))
    ng.kernels.get("cpu").unary(codes.SIN, row.numpy(), out, 0.0, 1.0, 0.0)
    np.testing.assert_array_equal(out, np.broadcast_to(np.sin(x[0, :1]), (3, 4)))
    from numbagrad.kernels.cpu import elementwise
    big = rng.normal(size=(64, 300))
    serial, threaded = np.empty_like(big), np.empty_like(big)
    elementwise.unary(codes.LOG1P, np.abs(big), serial, 0.0, 1.0, 0.0)
    elementwise.unary_mt(codes.LOG1P, np.abs(big), threaded, 0.0, 1.0, 0.0)
    np.testing.assert_array_equal(serial, threaded)


def test_every_shared_code_is_refused_past_the_records():
    from numbagrad.kernels.cpu import elementwise
    x, out = np.ones((2, 2)), np.empty((2, 2))
    with pytest.raises(ValueError, match="unknown op code"):
        elementwise.unary(codes.N_UNARY, x, out, 0.0, 1.0, 0.0)
    with pytest.raises(ValueError, match="unknown op code"):
        elementwise.unary_backward(codes.N_UNARY + 3, x, x, x, out, 0.0, 0.0)


def test_activation_arguments_are_checked_before_anything_runs():
    x = ng.tensor(np.ones(3))
    with pytest.raises(ValueError, match="hardtanh: min_val"):
        ng.hardtanh(x, 1.0, -1.0)
    with pytest.raises(ValueError, match="celu: alpha"):
        ng.celu(x, 0.0)
    with pytest.raises(TypeError, match="elu: alpha"):
        ng.elu(x, "1")
    with pytest.raises(TypeError, match="round: decimals"):
        ng.round(x, 0.5)


def test_numpy_ufuncs_and_methods_run_the_ops():
    x = ng.tensor(np.array([0.25, 0.5]))
    np.testing.assert_array_equal(np.arcsin(x).numpy(), ng.asin(x).numpy())
    np.testing.assert_array_equal(np.rint(x).numpy(), ng.round(x).numpy())
    np.testing.assert_array_equal(x.log1p().numpy(), np.log1p(x.numpy()))


@pytest.mark.parametrize("name", ["ELU", "SELU", "CELU", "Hardtanh", "ReLU6", "Hardsigmoid",
                                  "Hardswish", "Mish", "Softsign", "LogSigmoid"])
def test_activation_modules_match_torch(name):
    x = np.linspace(-4, 7, 23)
    got = getattr(ng.nn, name)()(ng.tensor(x)).numpy()
    want = getattr(torch.nn, name)()(torch.tensor(x)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-14)

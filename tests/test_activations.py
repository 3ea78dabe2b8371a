"""Issue 17's activations (gelu, silu, softplus, abs, clamp/clip, maximum,
minimum) and linear's gelu/silu epilogue: values and every gradient against
PyTorch on both devices, any rank, ties, +-inf and nan, bad input."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import numbagrad as ng
from conftest import cuda_dev, cuda_launches, inputs, matches_torch, weighted_sum

UNARY = [
    ("gelu", ng.gelu, F.gelu),
    ("gelu_tanh", lambda x: ng.gelu(x, approximate="tanh"),
     lambda x: F.gelu(x, approximate="tanh")),
    ("silu", ng.silu, F.silu),
    ("softplus", ng.softplus, F.softplus),
    ("softplus_beta", lambda x: ng.softplus(x, beta=2.0, threshold=1.5),
     lambda x: F.softplus(x, beta=2.0, threshold=1.5)),
    ("softplus_beta_only", lambda x: ng.softplus(x, beta=0.5),
     lambda x: F.softplus(x, beta=0.5)),
    ("abs", ng.abs, torch.abs),
    ("clamp", lambda x: ng.clamp(x, -0.5, 0.7), lambda x: torch.clamp(x, -0.5, 0.7)),
    ("clamp_min", lambda x: ng.clamp(x, min=0.1), lambda x: torch.clamp(x, min=0.1)),
    ("clip_max", lambda x: x.clip(max=0.2), lambda x: torch.clip(x, max=0.2)),
    ("clamp_empty_range", lambda x: ng.clamp(x, 0.5, -0.5), lambda x: torch.clamp(x, 0.5, -0.5)),
]
BINARY = [("maximum", ng.maximum, torch.maximum), ("minimum", ng.minimum, torch.minimum)]
F32 = UNARY[:7] + BINARY    # abs and before, and the binary ops
RANKS = [(), (3,), (2, 3), (2, 1, 3), (1, 2, 2, 2)]


@pytest.mark.parametrize("name, f, g", UNARY, ids=[c[0] for c in UNARY])
def test_unary_matches_torch_at_every_rank(dev, name, f, g):
    for shape in RANKS:
        matches_torch(f, g, inputs([shape], seed=len(shape)), dev, name=f"{name}{shape}")


@pytest.mark.parametrize("name, f, g", BINARY, ids=[c[0] for c in BINARY])
def test_binary_broadcasts_like_torch(dev, name, f, g):
    for sa, sb in [((), ()), ((3,), ()), ((2, 3), (3,)), ((2, 1, 3), (2, 1)),
                   ((2, 1, 2, 2), (1, 2, 1, 2))]:
        matches_torch(f, g, inputs([sa, sb], seed=len(sa)), dev, name=f"{name}{sa}{sb}")


@pytest.mark.parametrize("name, f, g", BINARY, ids=[c[0] for c in BINARY])
def test_binary_ties_share_the_gradient_and_nan_wins(dev, name, f, g):
    a = np.array([1.0, 2.0, -1.0, np.nan, 3.0, np.inf])
    b = np.array([1.0, 0.5, 4.0, 2.0, np.nan, np.inf])
    matches_torch(f, g, [a, b], dev, name=name)
    x = dev.param(np.array([0.5, -2.0]))
    with ng.grad_tape():
        loss = f(x, x).sum()
    np.testing.assert_array_equal(dev.host(ng.backward(loss)[x.id]), [1.0, 1.0])


# (the CUDA simulator's NumPy scalars warn about the nan and inf they compute)
@pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")
@pytest.mark.parametrize("name, f, g", UNARY, ids=[c[0] for c in UNARY])
def test_unary_at_nonfinite_inputs(dev, name, f, g):
    x = np.array([np.inf, -np.inf, np.nan, 0.0, 30.0, -800.0])
    p, t = dev.param(x), torch.tensor(x, requires_grad=True)
    weights = np.linspace(0.5, 2.0, x.size)
    with ng.grad_tape():
        out = f(p)
        loss = weighted_sum(out, dev.tensor(weights))
    want = g(t)
    np.testing.assert_allclose(out.numpy(), want.detach().numpy(), rtol=1e-12, atol=0)
    (want * torch.tensor(weights)).sum().backward()
    got = dev.host(ng.backward(loss)[p.id])
    np.testing.assert_allclose(got, t.grad.numpy(), rtol=1e-12, atol=0, err_msg=name)


def test_abs_gradient_at_zero_is_zero(dev):
    x = dev.param(np.array([0.0, -0.0, 2.0, -3.0]))
    with ng.grad_tape():
        loss = ng.abs(x).sum()
    np.testing.assert_array_equal(dev.host(ng.backward(loss)[x.id]), [0.0, 0.0, 1.0, -1.0])


@pytest.mark.parametrize("name, f, g", F32, ids=[c[0] for c in F32])
def test_float32_within_1e5(dev, name, f, g):
    arrays = [a.astype(np.float32) for a in
              inputs([(2, 3)] * (2 if name in ("maximum", "minimum") else 1), seed=5)]
    ps = [dev.param(a) for a in arrays]
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    weights = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    with ng.grad_tape():
        out = f(*ps)
        loss = weighted_sum(out, dev.tensor(weights))
    assert out.dtype == np.float32
    want = g(*ts)
    np.testing.assert_allclose(out.numpy(), want.detach().numpy(), rtol=1e-5, atol=1e-6)
    (want * torch.tensor(weights)).sum().backward()
    grads = ng.backward(loss)
    for p, t in zip(ps, ts):
        np.testing.assert_allclose(dev.host(grads[p.id]), t.grad.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name, f, g", UNARY + BINARY, ids=[c[0] for c in UNARY + BINARY])
def test_gradcheck(dev, name, f, g):
    arrays = inputs([(2, 3)] * (2 if name in ("maximum", "minimum") else 1), seed=9)
    ps = [dev.param(a + np.sign(a) * 0.1) for a in arrays]   # clear of the kinks
    ng.gradcheck(lambda: (f(*ps) * f(*ps)).sum(), ps, directions=None if dev.name == "cpu"
                 else 2)


@pytest.mark.parametrize("activation, g", [("gelu", F.gelu), ("silu", F.silu)])
def test_linear_applies_gelu_and_silu_like_torch(dev, activation, g):
    matches_torch(lambda x, w, b: ng.linear(x, w, b, activation=activation),
                  lambda x, w, b: g(F.linear(x, w, b)), inputs([(2, 3, 4), (5, 4), (5,)]), dev,
                  name=activation)
    matches_torch(lambda x, w: ng.linear(x, w, activation=activation),
                  lambda x, w: g(F.linear(x, w)), inputs([(3, 4), (2, 4)]), dev, name=activation)


def test_bad_input_is_refused_before_anything_runs():
    x = ng.param(np.ones((2, 3)))
    with pytest.raises(ValueError, match="approximate must be 'none' or 'tanh'"):
        ng.gelu(x, approximate="erf")
    with pytest.raises(ValueError, match="at least one of min and max"):
        ng.clamp(x)
    with pytest.raises(TypeError, match="clamp: min must be a real number"):
        ng.clamp(x, min=np.ones(3))
    with pytest.raises(TypeError, match="softplus: beta must be a real number"):
        ng.softplus(x, beta="2")
    with pytest.raises(ValueError, match=r"maximum: shapes \(2, 3\) and \(2,\) cannot be"):
        ng.maximum(x, ng.tensor(np.ones(2)))
    assert ng.minimum(x, ng.tensor(np.ones(3, np.float32))).dtype == x.dtype   # promoted
    with pytest.raises(TypeError, match="boolean tensor"):
        ng.silu(x > 0)
    np.testing.assert_array_equal(x.numpy(), np.ones((2, 3)))


def test_cuda_launch_bounds():
    """One launch forward and one per gradient written; softplus with beta != 1
    and threshold != 20 chains three unary ops, a comparison and a where
    (whose backward writes both branches' gradients: two launches)."""
    dev = cuda_dev()
    x = dev.param(inputs([(2, 3)])[0])
    y = dev.param(inputs([(2, 3)], seed=1)[0])
    for f, bound in [(ng.gelu, 1), (ng.silu, 1), (ng.abs, 1), (ng.softplus, 1),
                     (lambda t: ng.clamp(t, min=0.0), 1), (lambda t: ng.maximum(t, y), 1),
                     (lambda t: ng.softplus(t, beta=2.0), 1),
                     (lambda t: ng.clamp(t, -1.0, 1.0), 1),
                     (lambda t: ng.softplus(t, beta=2.0, threshold=3.0), 5)]:
        forward, backward = cuda_launches(f, x)
        assert forward == bound and backward == (1 if bound == 1 else 2)
    b, w = dev.param(np.zeros(3)), dev.param(np.ones((3, 3)))
    forward, _ = cuda_launches(lambda t: ng.linear(t, w, b, activation="gelu"), x)
    assert forward == 2      # the GEMM with the bias folded in, then gelu


def test_float32_gelu_fast_path_accuracy_on_the_cpu():
    """The CPU computes float32's exact GELU with vectorisable erfc and exp
    in float32 lanes (kernels/cpu/vmath.py): within 5e-7 relative of the
    float64 formula everywhere (the left tail too, where 1 + erf would
    cancel), the gradient within 2.5e-7 absolute, the same bits from the
    threaded twin and from a strided input, and PyTorch's values at +-inf
    and nan."""
    from numbagrad.kernels import cpu as kcpu
    from numbagrad.kernels import codes
    x64 = np.concatenate([np.linspace(-18.0, 18.0, 200_001), [16.0, -16.0, 1e-30, -1e-30, 0.0]])
    x = x64.astype(np.float32)
    exact = x.astype(np.float64)
    p = ng.param(x)
    with ng.grad_tape():
        out = ng.gelu(p)
        loss = out.sum()
    grad = ng.backward(loss)[p.id]
    phi = np.array([0.5 * math.erfc(-v / math.sqrt(2)) for v in exact])
    want = exact * phi
    want_grad = phi + exact * np.exp(-0.5 * exact * exact) / math.sqrt(2 * math.pi)
    got = out.numpy().astype(np.float64)
    big = np.abs(want) > 1e-37                  # float32's normal range
    np.testing.assert_allclose(got[big], want[big], rtol=5e-7, atol=0)
    assert np.all(np.abs(got[~big]) <= 1e-37)
    np.testing.assert_allclose(grad.astype(np.float64), want_grad, rtol=0, atol=2.5e-7)
    # the threaded twin and the strided kernel run the same expression
    rows = x[:200_000].reshape(400, 500)
    f32 = np.float32
    serial, threaded = np.empty_like(rows), np.empty_like(rows)
    kcpu.unary(codes.GELU, rows, serial, f32(0), f32(1), f32(0))
    kcpu.unary_mt(codes.GELU, rows, threaded, f32(0), f32(1), f32(0))
    np.testing.assert_array_equal(serial, threaded)
    np.testing.assert_array_equal(serial.ravel(), out.numpy()[:200_000])
    strided = ng.gelu(ng.tensor(rows.T.copy()).T)     # a transposed view: the N-d kernel
    np.testing.assert_array_equal(strided.numpy(), serial)
    special = ng.param(np.array([np.inf, -np.inf, np.nan, 20.0, -20.0], np.float32))
    t = torch.tensor(special.numpy().astype(np.float64), requires_grad=True)
    with ng.grad_tape():
        y = ng.gelu(special)
        loss = y.sum()
    g = ng.backward(loss)[special.id]
    F.gelu(t).sum().backward()
    np.testing.assert_array_equal(y.numpy(), F.gelu(t).detach().numpy().astype(np.float32))
    np.testing.assert_array_equal(g, t.grad.numpy().astype(np.float32))


def test_the_fast_forms_fuse_their_multiply_adds_with_one_rounding():
    """vmath's polynomials run on ``_fma``: a * b + c rounded once, on every
    CPU (a vector FMA where there is one), so their bits do not depend on
    whether a compiler contracts; exp_neg stays within 1e-8 relative."""
    from numba import njit

    from numbagrad.kernels.cpu import vmath

    @njit
    def fma(a, b, c):
        return vmath._fma(a, b, c)

    @njit
    def exp_neg(x):
        return vmath.exp_neg(x)
    a, b = 1.0 + 2.0 ** -30, 1.0 - 2.0 ** -30
    assert a * b - 1.0 == 0.0                       # two roundings lose it
    assert fma(a, b, -1.0) == -2.0 ** -60           # one keeps it
    assert fma(3.0, 5.0, 7.0) == 22.0
    z = np.linspace(-700.0, 1.0, 100_001)
    got = np.array([exp_neg(v) for v in z])
    np.testing.assert_allclose(got, np.exp(z), rtol=1e-8, atol=0)

"""max_pool2d, avg_pool2d and adaptive_avg_pool2d and their layers against
PyTorch on both devices: values and gradients, padding, overlapping
windows, ties, bad input and CUDA launches."""
import numpy as np
import pytest

import numbagrad as ng
from conftest import cuda_dev, cuda_launches, inputs, matches_torch

torch = pytest.importorskip("torch")
F = torch.nn.functional

# (op, x shape, arguments, keyword arguments)
CASES = [
    ("max_pool2d", (2, 3, 6, 5), (2,), {}),
    ("max_pool2d", (2, 2, 5, 6), (3,), dict(stride=2, padding=1)),            # overlapping
    ("max_pool2d", (1, 2, 6, 6), ((3, 2),), dict(stride=(1, 2), padding=(1, 1),
                                                dilation=(2, 1))),
    ("max_pool2d", (3, 5, 4), (2,), dict(stride=1)),                            # unbatched
    ("avg_pool2d", (2, 3, 6, 5), (2,), {}),
    ("avg_pool2d", (2, 2, 5, 6), (3,), dict(stride=2, padding=1)),
    ("avg_pool2d", (1, 2, 5, 6), ((3, 2),), dict(stride=(2, 1), padding=(1, 1),
                                                count_include_pad=False)),
    ("avg_pool2d", (3, 5, 4), (2,), dict(stride=1)),
    ("adaptive_avg_pool2d", (2, 3, 7, 5), ((3, 2),), {}),
    ("adaptive_avg_pool2d", (2, 3, 4, 6), (4,), {}),                             # upsampling
    ("adaptive_avg_pool2d", (2, 5, 6), ((None, 4),), {}),
    ("adaptive_avg_pool2d", (1, 2, 5, 5), (1,), {}),
]


@pytest.mark.parametrize("name, xs, args, kw", CASES, ids=[f"{c[0]}-{i}"
                                                           for i, c in enumerate(CASES)])
def test_pool_matches_torch(name, xs, args, kw):
    matches_torch(lambda x: getattr(ng, name)(x, *args, **kw),
                  lambda x: getattr(F, name)(x, *args, **kw), inputs([xs], seed=3), name=name)


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("name, args, kw", [("max_pool2d", (2,), dict(stride=1, padding=1)),
                                            ("avg_pool2d", (3,), dict(stride=2, padding=1)),
                                            ("adaptive_avg_pool2d", ((2, 3),), {})])
def test_pool_on_both_devices(dev, dtype, name, args, kw):
    x = inputs([(1, 2, 3, 4)], seed=6)[0].astype(dtype)
    p, t = dev.param(x), torch.tensor(x, requires_grad=True)
    weights = np.random.default_rng(0).normal(size=getattr(F, name)(t, *args, **kw).shape)
    with ng.grad_tape():
        out = getattr(ng, name)(p, *args, **kw)
        loss = (out * dev.tensor(weights.astype(dtype))).sum()
    grads = ng.backward(loss)
    want = getattr(F, name)(t, *args, **kw)
    (want * torch.tensor(weights.astype(dtype))).sum().backward()
    tol = dict(rtol=1e-9, atol=1e-12) if dtype == np.float64 else dict(rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out.numpy(), want.detach().numpy(), **tol)
    np.testing.assert_allclose(dev.host(grads[p.id]), t.grad.numpy(), **tol)


@pytest.mark.parametrize("name, args", [("max_pool2d", (2, 1, 1)), ("avg_pool2d", (3, 2, 1)),
                                        ("adaptive_avg_pool2d", ((2, 2),))])
def test_pool_gradcheck(dev, name, args):
    x = dev.param(inputs([(1, 2, 3, 3)], seed=7)[0])
    weights = dev.tensor(np.random.default_rng(1).normal(
        size=getattr(ng, name)(x, *args).shape))
    ng.gradcheck(lambda: (getattr(ng, name)(x, *args) * weights).sum(), [x],
                 directions=None if dev.name == "cpu" else 2)


def test_max_pool_ties_padding_and_nan_follow_torch(dev):
    # ties: the gradient goes to the first max of each window in row-major
    # order (PyTorch's CPU kernel); padding is -inf, so all-negative windows
    # at the border never return 0; a nan is the max
    x = np.array([[[[1.0, 1.0, 0.0], [1.0, -2.0, -3.0], [-5.0, -4.0, np.nan]]]])
    p, t = dev.param(x), torch.tensor(x, requires_grad=True)
    with ng.grad_tape():
        out = ng.max_pool2d(p, 2, stride=1, padding=1)
        loss = out.sum()
    grads = ng.backward(loss)
    want = F.max_pool2d(t, 2, stride=1, padding=1)
    want.sum().backward()
    np.testing.assert_array_equal(out.numpy(), want.detach().numpy())
    np.testing.assert_array_equal(dev.host(grads[p.id]), t.grad.numpy())
    assert dev.host(grads[p.id])[0, 0, 0, 0] == 4     # each window of the tied 1s: the first


# ------------------------------------------------------------ bad input
BAD = [
    (lambda x: ng.max_pool2d(x, 2, ceil_mode=True), NotImplementedError, "ceil_mode"),
    (lambda x: ng.avg_pool2d(x, 2, ceil_mode=True), NotImplementedError, "ceil_mode"),
    (lambda x: ng.max_pool2d(x, 2, return_indices=True), NotImplementedError, "return_indices"),
    (lambda x: ng.avg_pool2d(x, 2, divisor_override=2), NotImplementedError, "divisor_override"),
    (lambda x: ng.max_pool2d(x, 0), ValueError, "kernel_size must be >= 1"),
    (lambda x: ng.max_pool2d(x, (2, 2, 2)), TypeError, "tuple of 2 ints"),
    (lambda x: ng.max_pool2d(x, 2, padding=2), ValueError, "at most half of kernel_size"),
    (lambda x: ng.avg_pool2d(x, 5), ValueError, "too small"),
    (lambda x: ng.max_pool2d(x, 2, stride=0), ValueError, "stride must be >= 1"),
    (lambda x: ng.max_pool2d(x[0, 0], 2), ValueError, "must be 3-D .unbatched. or 4-D"),
    (lambda x: ng.adaptive_avg_pool2d(x, 0), ValueError, "output_size must be >= 1"),
    (lambda x: ng.adaptive_avg_pool2d(x, (1, 2, 3)), TypeError, "int or a pair"),
]


@pytest.mark.parametrize("case", range(len(BAD)))
def test_bad_input_raises_before_anything_changes(case):
    fn, kind, words = BAD[case]
    x = ng.param(np.ones((2, 3, 4, 4)))
    with ng.grad_tape():
        with pytest.raises(kind, match=words) as info:
            fn(x)
    assert "pool2d" in str(info.value)
    assert x.grad is None and np.all(x.numpy() == 1)


# ------------------------------------------------------------ layers
@pytest.mark.parametrize("kind, args, kw", [
    ("MaxPool2d", (3,), dict(stride=2, padding=1)),
    ("AvgPool2d", (2,), dict(stride=1, count_include_pad=False)),
    ("AdaptiveAvgPool2d", ((2, 3),), {}),
])
def test_pool_layers_match_torch(kind, args, kw):
    x = inputs([(2, 3, 5, 6)], seed=2)[0]
    mine, ref = getattr(ng.nn, kind)(*args, **kw), getattr(torch.nn, kind)(*args, **kw)
    assert mine.state_dict() == {}
    np.testing.assert_allclose(mine(ng.tensor(x)).numpy(), ref(torch.tensor(x)).numpy(),
                               rtol=1e-12)


# ------------------------------------------------------------ CUDA launches
def test_cuda_launch_bound():
    dev = cuda_dev()
    x = dev.param(inputs([(1, 2, 4, 4)])[0])
    for f in (lambda t: ng.max_pool2d(t, 2), lambda t: ng.avg_pool2d(t, 3, 1, 1),
              lambda t: ng.adaptive_avg_pool2d(t, 3)):
        assert cuda_launches(f, x) == (1, 1)    # one kernel forward, one for the gradient

"""The direct (im2col-free) convolution and the fused relu -> max_pool2d:
against PyTorch (values and gradients, both dtypes, both devices), the
direct path against the im2col one, the rule that picks it, finite
differences, non-finite inputs, ties, ``nn.Sequential``'s fusion, and a
compiled CNN bit for bit against eager."""

import numpy as np
import pytest

import numbagrad as ng
from conftest import (KernelNames, compiled_matches_eager, cuda_dev, cuda_launches, inputs,
                      matches_torch, sequential_like_torch, small_cnn)
from numbagrad import kernels
from numbagrad.ops import conv as conv_ops
from numbagrad.ops.pool import _relu_max_pool2d as relu_max_pool2d
from numbagrad.testing import gradcheck

torch = pytest.importorskip("torch")
F = torch.nn.functional
pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same':UserWarning")
MIN_OUTPUTS = conv_ops.DIRECT_MIN_OUTPUTS


@pytest.fixture(autouse=True)
def small_planes(monkeypatch):
    """The direct path for the tests' small planes too (the rule's own test
    puts the size back)."""
    monkeypatch.setattr(conv_ops, "DIRECT_MIN_OUTPUTS", 1)


def _kernel_names(fn):
    """The kernels ``fn()`` runs (forward on a tape, and its backward)."""
    seen = KernelNames()
    with kernels.observe(seen):
        fn()
    return seen.names


def _conv_step(x, w, b, **kw):
    def run():
        with ng.grad_tape():
            loss = ng.conv2d(x, w, b, **kw).sum()
        ng.backward(loss)
    return run


# (x shape, weight shape, keyword arguments, bias?): all on the direct path
DIRECT = [
    ((3, 1, 6, 6), (4, 1, 3, 3), dict(padding=1), True),          # a CNN's first layer
    ((2, 2, 5, 7), (3, 2, 2, 3), dict(padding=(1, 0), dilation=(1, 2)), False),
    ((2, 3, 5, 4), (2, 3, 3, 3), dict(padding="same"), True),      # 27 taps, the rule's most
    ((0, 2, 5, 5), (3, 2, 3, 3), dict(padding=1), True),           # an empty batch
    ((2, 5, 4), (3, 2, 3, 3), dict(padding=2), True),              # unbatched
]
CUDA_DIRECT = [DIRECT[0], DIRECT[1]]


@pytest.mark.parametrize("xs, ws, kw, bias", DIRECT)
def test_direct_matches_torch_float64(xs, ws, kw, bias):
    arrays = inputs([xs, ws] + ([(ws[0],)] if bias else []), seed=3)
    ps = [ng.param(a) for a in arrays]
    assert "conv2d_direct" in _kernel_names(_conv_step(ps[0], ps[1], ps[2] if bias else None,
                                                       **kw))
    matches_torch(lambda *a: ng.conv2d(a[0], a[1], a[2] if bias else None, **kw),
                  lambda *a: F.conv2d(a[0], a[1], a[2] if bias else None, **kw), arrays)


@pytest.mark.parametrize("xs, ws, kw, bias", [DIRECT[0], DIRECT[2]])
def test_direct_matches_torch_float32(xs, ws, kw, bias):
    arrays = [a.astype(np.float32) for a in inputs([xs, ws, (ws[0],)], seed=4)]
    ps = [ng.param(a) for a in arrays]
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    g = np.random.default_rng(5).normal(size=(xs[0], ws[0]) + xs[2:]).astype(np.float32)
    with ng.grad_tape():
        out = ng.conv2d(*ps, **kw)
        loss = (out * ng.tensor(g)).sum()
    grads = ng.backward(loss)
    want = F.conv2d(*ts, **kw)
    (want * torch.tensor(g)).sum().backward()
    np.testing.assert_allclose(out.numpy(), want.detach().numpy(), rtol=1e-5, atol=1e-5)
    for p, t in zip(ps, ts):
        np.testing.assert_allclose(grads[p.id], t.grad.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("xs, ws, kw, bias", CUDA_DIRECT)
def test_direct_matches_torch_on_cuda(xs, ws, kw, bias):
    dev = cuda_dev()
    arrays = inputs([xs, ws] + ([(ws[0],)] if bias else []), seed=6)
    matches_torch(lambda *a: ng.conv2d(a[0], a[1], a[2] if bias else None, **kw),
                  lambda *a: F.conv2d(a[0], a[1], a[2] if bias else None, **kw), arrays,
                  dev=dev)


@pytest.mark.parametrize("frozen", ["weight", "bias", "x"])
def test_direct_gradients_of_some_inputs(frozen):
    """A frozen weight (the bias's gradient then on its own) or bias or x."""
    arrays = inputs([(2, 2, 4, 5), (3, 2, 3, 3), (3,)], seed=11)
    names = ("x", "weight", "bias")
    ps = [ng.tensor(a) if n == frozen else ng.param(a) for n, a in zip(names, arrays)]
    ts = [torch.tensor(a, requires_grad=n != frozen) for n, a in zip(names, arrays)]
    with ng.grad_tape():
        loss = (ng.conv2d(*ps, padding=1) ** 2).sum()
    grads = ng.backward(loss)
    (F.conv2d(*ts, padding=1) ** 2).sum().backward()
    for n, p, t in zip(names, ps, ts):
        if n != frozen:
            np.testing.assert_allclose(grads[p.id], t.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_direct_cuda_launches():
    dev = cuda_dev()
    x, w, b = inputs([(2, 2, 3, 3), (2, 2, 2, 2), (2,)], seed=1)
    wp, bp = dev.param(w), dev.param(b)
    # forward 1; backward: dW, db, dx
    assert cuda_launches(lambda t: ng.conv2d(t, wp, bp, padding=1), dev.param(x)) == (1, 3)
    assert cuda_launches(lambda t: ng.conv2d(t, wp), dev.param(x)) == (1, 2)


@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-12), (np.float32, 2e-5)])
def test_direct_agrees_with_im2col(monkeypatch, dtype, tol):
    x, w, b = (a.astype(dtype) for a in inputs([(4, 3, 6, 5), (5, 3, 3, 3), (5,)], seed=7))
    results = []
    for taps in (conv_ops.DIRECT_MAX_TAPS, 0):
        monkeypatch.setattr(conv_ops, "DIRECT_MAX_TAPS", taps)   # (0: im2col)
        ps = [ng.param(a) for a in (x, w, b)]
        names = _kernel_names(_conv_step(*ps, padding=(2, 1)))
        assert ("conv2d_direct" in names) == (taps > 0) and ("im2col" in names) == (taps == 0)
        with ng.grad_tape():
            out = ng.conv2d(*ps, padding=(2, 1))
            loss = (out * out).sum()
        grads = ng.backward(loss)
        results.append([out.numpy()] + [grads[p.id] for p in ps])
    for direct, im2col in zip(*results):
        np.testing.assert_allclose(direct, im2col, rtol=tol, atol=tol * np.abs(im2col).max())


@pytest.mark.parametrize("xs, ws, kw, direct", [
    ((1, 3, 16, 16), (2, 3, 3, 3), dict(padding=1), True),            # 27 taps, 16x16
    ((1, 1, 17, 16), (2, 1, 3, 3), {}, False),                        # a 15x14 plane
    ((1, 4, 16, 16), (2, 4, 3, 3), dict(padding=1), False),           # 36 taps: im2col
    ((1, 2, 33, 33), (2, 2, 3, 3), dict(stride=2, padding=1), False),
    ((1, 2, 16, 16), (2, 1, 3, 3), dict(groups=2, padding=1), False),
])
def test_direct_rule(monkeypatch, xs, ws, kw, direct):
    monkeypatch.setattr(conv_ops, "DIRECT_MIN_OUTPUTS", MIN_OUTPUTS)
    x, w = (ng.param(a) for a in inputs([xs, ws]))
    names = _kernel_names(_conv_step(x, w, None, **kw))
    assert ("conv2d_direct" in names) == direct and ("im2col" in names) == (not direct)


def test_direct_gradients_match_finite_differences():
    x, w, b = (ng.param(a) for a in inputs([(2, 2, 4, 3), (3, 2, 2, 2), (3,)], seed=8))
    g = ng.tensor(np.random.default_rng(9).normal(size=(2, 3, 5, 2)))
    gradcheck(lambda: (ng.conv2d(x, w, b, padding=(1, 0)) * g).sum(), [x, w, b])


@pytest.mark.parametrize("where", ["x", "w"])
def test_direct_non_finite_like_torch(where):
    """An inf in x (in w): the weight (input) gradient is PyTorch's, with no
    nan from the padding's zeros, which the fast paths would multiply."""
    x, w, b = inputs([(2, 1, 4, 4), (2, 1, 3, 3), (2,)], seed=10)
    (x if where == "x" else w)[(0, 0, 1, 2) if where == "x" else (1, 0, 0, 1)] = np.inf
    ps = [ng.param(a) for a in (x, w, b)]
    ts = [torch.tensor(a, requires_grad=True) for a in (x, w, b)]
    with ng.grad_tape():
        loss = ng.conv2d(*ps, padding=1).sum()
    grads = ng.backward(loss)
    F.conv2d(*ts, padding=1).sum().backward()
    for p, t in zip(ps, ts):   # (inf where PyTorch's is, nan where it is: equal_nan)
        np.testing.assert_allclose(grads[p.id], t.grad.numpy(), rtol=1e-12)


# ------------------------------------------------------------ relu -> max_pool2d
def _tied(shape, seed):
    """Small integers: ties within windows, zeros, windows all <= 0."""
    return np.random.default_rng(seed).integers(-2, 3, size=shape).astype(np.float64)


POOLS = [
    ((2, 3, 6, 8), dict(kernel_size=2)),                                # tiling 2x2, stride 2
    ((2, 2, 7, 5), dict(kernel_size=2)),                                # odd: the unrolled path
    ((1, 2, 6, 6), dict(kernel_size=3, stride=2, padding=1, dilation=1)),
    ((1, 2, 6, 7), dict(kernel_size=2, stride=1, ceil_mode=True, dilation=2)),
    ((3, 5, 4), dict(kernel_size=2)),                                   # unbatched
]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape, kw", POOLS)
def test_relu_max_pool2d_matches_torchs_chain(shape, kw, dtype):
    x = _tied(shape, seed=len(shape) + shape[-1]).astype(dtype)
    x.reshape(-1)[5] = np.nan
    p, t = ng.param(x), torch.tensor(x, requires_grad=True)
    want = F.max_pool2d(F.relu(t), **kw)
    g = np.random.default_rng(0).normal(size=tuple(want.shape)).astype(dtype)
    with ng.grad_tape():
        out = relu_max_pool2d(p, **kw)
        loss = (out * ng.tensor(g)).sum()
    grads = ng.backward(loss)
    (want * torch.tensor(g)).sum().backward()
    np.testing.assert_array_equal(out.numpy(), want.detach().numpy())
    # the zeros exactly; an element of overlapping windows sums in float64 here
    np.testing.assert_allclose(grads[p.id], t.grad.numpy(),
                               rtol=1e-6 if dtype == np.float32 else 1e-15, atol=0)


def test_max_pool2d_tiling_path_ties_like_torch():
    """The vectorised 2x2 tiling picks the row-major first max, the last nan."""
    x = _tied((2, 3, 4, 6), seed=1)
    x[0, 0, 0, 1] = x[0, 0, 1, 0] = np.nan
    matches_torch(lambda a: ng.max_pool2d(a, 2), lambda a: F.max_pool2d(a, 2), [x])


def test_relu_max_pool2d_on_cuda():
    dev = cuda_dev()
    x = _tied((1, 2, 4, 4), seed=2)
    p, t = dev.param(x), torch.tensor(x, requires_grad=True)
    with ng.grad_tape():
        out = relu_max_pool2d(p, 2)
        loss = out.sum()
    grads = ng.backward(loss)
    want = F.max_pool2d(F.relu(t), 2)
    want.sum().backward()
    np.testing.assert_array_equal(out.numpy(), want.detach().numpy())
    np.testing.assert_array_equal(dev.host(grads[p.id]), t.grad.numpy())


def test_sequential_fuses_relu_and_pool_like_torch():
    x = np.random.default_rng(1).normal(size=(3, 1, 4, 4))
    names = sequential_like_torch(small_cnn, x, np.array([0, 2, 1]))
    # the second convolution with its relu and pool as one op (tests/test_conv_pool.py)
    assert names.count("relu_max_pool2d") == names.count("conv_relu_max_pool2d_nhwc") == 1
    assert "max_pool2d" not in names
    assert names.count("conv2d_direct") == 1 and "im2col" not in names   # (fused: inside)


def test_sequential_keeps_return_indices_pools_unfused():
    model = ng.nn.Sequential(ng.nn.ReLU(), ng.nn.MaxPool2d(2, return_indices=True))
    out, idx = model(ng.tensor(_tied((1, 1, 4, 4), seed=3)))
    assert out.shape == idx.shape == (1, 1, 2, 2)


def test_compiled_small_cnn_is_bit_identical_to_eager(tmp_path):
    def make():
        model = small_cnn(ng.nn, dtype=np.float32, rng=np.random.default_rng(0))
        params = model.parameters()

        def loss_fn(x, labels):
            return ng.cross_entropy(model(x), labels)
        return params, loss_fn, ng.optim.Adam(params, lr=0.01, accumulate_steps=2)
    rng = np.random.default_rng(2)
    batches = [(ng.tensor(rng.normal(size=(5, 1, 4, 4)).astype(np.float32)),
                rng.integers(0, 3, 5)) for _ in range(2)]
    step = compiled_matches_eager(make, [batches[i % 2] for i in range(4)], tmp_path)
    assert step.stats[-1]["mode"] == "njit"

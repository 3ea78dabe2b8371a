"""conv1d / conv2d and the Conv1d / Conv2d layers against PyTorch: values and
the input, weight and bias gradients over stride, padding, dilation and
groups, on both devices; bad input; accumulation; ng.compile; CUDA launches;
PTX for the new kernel sources."""

import numpy as np
import pytest

import numbagrad as ng
from conftest import (KernelNames, compiled_matches_eager, cuda_dev, cuda_launches, inputs,
                      matches_torch)

torch = pytest.importorskip("torch")
F = torch.nn.functional
# PyTorch pads a copy for some "same" cases and says so
pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same':UserWarning")


# (x shape, weight shape, keyword arguments), each run with and without a bias
CONV2D = [
    ((2, 3, 5, 6), (4, 3, 3, 3), {}),
    ((2, 3, 5, 6), (4, 3, 3, 2), dict(stride=2, padding=1)),
    ((1, 4, 6, 5), (6, 2, 2, 3), dict(stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2)),
    ((2, 2, 5, 5), (3, 2, 2, 2), dict(padding="same", dilation=2)),     # odd total padding
    ((2, 2, 5, 4), (3, 2, 3, 2), dict(padding="same")),
    ((2, 2, 5, 4), (3, 2, 3, 2), dict(padding="valid", stride=(1, 2))),
    ((4, 5, 6), (4, 2, 3, 3), dict(padding=1, groups=2)),                # unbatched
    ((3, 4, 4, 4), (4, 1, 3, 3), dict(groups=4, padding=1)),            # depthwise
    # 8 channels a group and more: the input gradient's channels-last columns
    ((2, 8, 5, 4), (3, 8, 3, 3), dict(padding=1)),
    ((1, 16, 6, 5), (4, 8, 3, 2), dict(stride=(2, 1), padding=(1, 2), dilation=(2, 1),
                                      groups=2)),
]
CONV1D = [
    ((2, 3, 7), (4, 3, 3), {}),
    ((2, 4, 9), (6, 2, 3), dict(stride=2, padding=2, dilation=2, groups=2)),
    ((2, 2, 6), (3, 2, 4), dict(padding="same")),
    ((3, 8), (2, 3, 2), dict(padding=(1,), stride=(3,))),                # unbatched
]


def _cases(table):
    return [(xs, ws, kw, bias) for xs, ws, kw in table for bias in (True, False)]


def _run(fn, tfn, xs, ws, kw, bias, dev=None, dtype=np.float64, rtol=1e-9, atol=1e-12):
    shapes = [xs, ws] + ([(ws[0],)] if bias else [])
    arrays = [a.astype(dtype) for a in inputs(shapes, seed=5)]
    if dtype == np.float64:
        matches_torch(lambda *a: fn(*a[:2], a[2] if bias else None, **kw),
                      lambda *a: tfn(*a[:2], a[2] if bias else None, **kw), arrays, dev=dev,
                      name=f"{fn.__name__}{xs}{ws}{kw}", rtol=rtol, atol=atol)
        return
    ps = [dev.param(a) for a in arrays]
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    want = tfn(*ts[:2], ts[2] if bias else None, **kw)
    with ng.grad_tape():
        out = fn(*ps[:2], ps[2] if bias else None, **kw)
        loss = out.sum()
    grads = ng.backward(loss)
    want.sum().backward()
    np.testing.assert_allclose(out.numpy(), want.detach().numpy(), rtol=rtol, atol=atol)
    for p, t in zip(ps, ts):
        np.testing.assert_allclose(dev.host(grads[p.id]), t.grad.numpy(), rtol=rtol, atol=atol)


@pytest.mark.parametrize("xs, ws, kw, bias", _cases(CONV2D))
def test_conv2d_matches_torch(xs, ws, kw, bias):
    _run(ng.conv2d, F.conv2d, xs, ws, kw, bias)


@pytest.mark.parametrize("xs, ws, kw, bias", _cases(CONV1D))
def test_conv1d_matches_torch(xs, ws, kw, bias):
    _run(ng.conv1d, F.conv1d, xs, ws, kw, bias)


# tiny shapes for the CUDA simulator
DEVICE_CASES = [(ng.conv2d, F.conv2d, (2, 2, 3, 4), (4, 1, 2, 2),
                 dict(stride=(1, 2), padding=1, groups=2)),
                (ng.conv1d, F.conv1d, (2, 2, 5), (2, 2, 2), dict(padding="same", dilation=2)),
                (ng.conv2d, F.conv2d, (1, 8, 3, 3), (2, 8, 2, 2), dict(padding=1))]   # col2im_cl


@pytest.mark.parametrize("case", range(len(DEVICE_CASES)))
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
def test_conv_on_both_devices(dev, case, dtype):
    fn, tfn, xs, ws, kw = DEVICE_CASES[case]
    tol = dict(rtol=1e-9, atol=1e-12) if dtype == np.float64 else dict(rtol=1e-5, atol=1e-5)
    _run(fn, tfn, xs, ws, kw, True, dev=dev, dtype=dtype, **tol)


def test_conv2d_gradcheck(dev):
    x, w, b = (dev.param(a) for a in inputs([(2, 2, 3, 3), (2, 1, 2, 2), (2,)], seed=3))
    weights = dev.tensor(np.random.default_rng(4).normal(size=(2, 2, 2, 2)))

    def loss():
        return (ng.conv2d(x, w, b, stride=2, padding=1, groups=2) * weights).sum()
    ng.gradcheck(loss, [x, w, b], directions=None if dev.name == "cpu" else 2)


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
def test_channels_last_columns_give_the_same_gradient_bits(dev, dtype, monkeypatch):
    """The input gradient's GEMM gives each column entry the same bits in
    either column order, and col2im_cl adds them as col2im does: the
    gradients from 8 channels a group equal the (C, KH, KW) columns' bits."""
    conv = ng.ops.conv
    cases = [((2, 8, 4, 4), (3, 8, 3, 3), dict(padding=1)),
             ((1, 16, 5, 4), (4, 8, 3, 2), dict(stride=2, padding=(2, 1), dilation=(1, 2),
                                               groups=2))]
    if dev.name == "cuda":
        cases = [((1, 8, 3, 3), (2, 8, 2, 2), dict(padding=1))]
    paths = ((conv.CL_MIN_CHANNELS, "col2im_cl"), (10 ** 9, "col2im"))
    for xs, ws, kw in cases:
        arrays = [a.astype(dtype) for a in inputs([xs, ws, (ws[0],)], seed=8)]
        weights = None
        grads = []
        for least, col2im in paths:
            monkeypatch.setattr(conv, "CL_MIN_CHANNELS", least)
            ps = [dev.param(a) for a in arrays]
            seen = KernelNames()
            with ng.kernels.observe(seen):
                with ng.grad_tape():
                    out = ng.conv2d(*ps, **kw)
                    if weights is None:
                        weights = np.random.default_rng(9).normal(size=out.shape).astype(dtype)
                    loss = (out * dev.tensor(weights)).sum()
                got = ng.backward(loss)
            assert [n.removesuffix("_mt") for n in seen.names].count(col2im) == 1
            grads.append([np.asarray(dev.host(got[p.id])) for p in ps])
        for a, b in zip(*grads):
            assert a.dtype == b.dtype and np.array_equal(a, b)


# ------------------------------------------------------------ bad input
BAD = [
    (lambda x, w: ng.conv2d(x, w[:, :2]), ValueError, "has 3 channels but weight"),
    (lambda x, w: ng.conv2d(x, w, groups=2), ValueError, "groups=2 must divide"),
    (lambda x, w: ng.conv2d(x, w, groups=0), ValueError, "groups must be a positive int"),
    (lambda x, w: ng.conv2d(x, w, stride=0), ValueError, "stride must be >= 1"),
    (lambda x, w: ng.conv2d(x, w, padding=-1), ValueError, "padding must be >= 0"),
    (lambda x, w: ng.conv2d(x, w, dilation=(1, 2, 3)), TypeError, "tuple of 2 ints"),
    (lambda x, w: ng.conv2d(x, w, padding="full"), ValueError, "'same', 'valid'"),
    (lambda x, w: ng.conv2d(x, w, stride=2, padding="same"), ValueError, "needs stride 1"),
    (lambda x, w: ng.conv2d(x, w[..., :0]), ValueError, "empty kernel"),
    (lambda x, w: ng.conv2d(x, w[0]), ValueError, "weight must be 4-D"),
    (lambda x, w: ng.conv2d(x[0, 0], w), ValueError, "must be 3-D .unbatched. or 4-D"),
    (lambda x, w: ng.conv2d(x[..., :2], w), ValueError, "too small"),
    (lambda x, w: ng.conv2d(x, w, dilation=3), ValueError, "too small"),
    (lambda x, w: ng.conv2d(x, w, ng.param(np.zeros(3))), ValueError, "bias"),
    (lambda x, w: ng.conv2d(x, w.astype(np.float32)), TypeError, "dtypes differ"),
    (lambda x, w: ng.conv1d(x, w), ValueError, "conv1d: input must be 2-D"),
    (lambda x, w: ng.conv2d(x[..., :0], w, padding=2), ValueError, "empty spatial dim"),
]


@pytest.mark.parametrize("case", range(len(BAD)))
def test_bad_input_raises_before_anything_changes(case):
    fn, kind, words = BAD[case]
    x = ng.param(np.ones((2, 3, 4, 4)))
    w = ng.param(np.ones((4, 3, 3, 3)))
    with ng.grad_tape():
        with pytest.raises(kind, match=words) as info:
            fn(x, w)
    assert ("conv2d" in str(info.value)) or ("conv1d" in str(info.value))
    assert x.grad is None and w.grad is None
    assert np.all(x.numpy() == 1) and np.all(w.numpy() == 1)


def test_operands_on_two_devices_raise():
    dev = cuda_dev()
    x, w = inputs([(1, 2, 3, 3), (2, 2, 2, 2)])
    with pytest.raises(ValueError, match="conv2d: operands are on different devices"):
        ng.conv2d(ng.param(x), dev.param(w))


def test_an_empty_batch_gives_zero_gradients_as_torch():
    x, w, b = inputs([(0, 2, 4, 4), (3, 2, 3, 3), (3,)])
    matches_torch(lambda x, w, b: ng.conv2d(x, w, b, padding=1),
                  lambda x, w, b: F.conv2d(x, w, b, padding=1), [x, w, b], name="empty batch")


# ------------------------------------------------------------ accumulation
def test_weight_gradient_accumulates_in_place(dev):
    x, w, b = inputs([(2, 2, 4, 4), (3, 2, 3, 3), (3,)], seed=8)
    xt, wp, bp = dev.tensor(x), dev.param(w), dev.param(b)
    for _ in range(2):
        with ng.grad_tape():
            loss = ng.conv2d(xt, wp, bp, padding=1).sum()
        loss.backward()
    wt, bt = torch.tensor(w, requires_grad=True), torch.tensor(b, requires_grad=True)
    F.conv2d(torch.tensor(x), wt, bt, padding=1).sum().backward()
    np.testing.assert_allclose(dev.host(wp.grad), 2 * wt.grad.numpy(), rtol=1e-9)
    np.testing.assert_allclose(dev.host(bp.grad), 2 * bt.grad.numpy(), rtol=1e-9)


# ------------------------------------------------------------ layers
@pytest.mark.parametrize("kind, args, kw, xs", [
    ("Conv2d", (3, 4, 3), dict(stride=2, padding=1), (2, 3, 5, 5)),
    ("Conv2d", (4, 6, (2, 3)), dict(groups=2, dilation=(2, 1), bias=False), (1, 4, 6, 5)),
    ("Conv2d", (2, 3, 3), dict(padding="same"), (2, 4, 4)),
    ("Conv1d", (3, 2, 3), dict(padding=1, stride=2), (2, 3, 7)),
])
def test_layers_load_torch_state_dicts(kind, args, kw, xs):
    torch.manual_seed(0)
    ref = getattr(torch.nn, kind)(*args, **kw).double()
    mine = getattr(ng.nn, kind)(*args, **kw, rng=np.random.default_rng(0))
    state = {k: v.detach().numpy() for k, v in ref.state_dict().items()}
    assert list(mine.state_dict()) == list(state)
    assert {k: v.shape for k, v in mine.state_dict().items()} == \
        {k: v.shape for k, v in state.items()}
    mine.load_state_dict(state)
    x = inputs([xs], seed=9)[0]
    np.testing.assert_allclose(mine(ng.tensor(x)).numpy(), ref(torch.tensor(x)).detach().numpy(),
                               rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_a_small_cnn_from_a_torch_state_dict_on_both_devices(dev, dtype):
    torch.manual_seed(1)
    ref = torch.nn.Sequential(torch.nn.Conv2d(2, 2, 2, padding=1), torch.nn.ReLU(),
                              torch.nn.MaxPool2d(2), torch.nn.AvgPool2d(1),
                              torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(0),
                              torch.nn.Conv1d(1, 1, 2))
    if dtype == np.float64:
        ref = ref.double()
    mine = ng.nn.Sequential(ng.nn.Conv2d(2, 2, 2, padding=1, dtype=dtype, device=dev.name),
                            ng.nn.ReLU(), ng.nn.MaxPool2d(2), ng.nn.AvgPool2d(1),
                            ng.nn.AdaptiveAvgPool2d(1), Reshape((1, 2)),
                            ng.nn.Conv1d(1, 1, 2, dtype=dtype, device=dev.name))
    mine.load_state_dict({k: v.detach().numpy() for k, v in ref.state_dict().items()})
    x = inputs([(2, 3, 3)], seed=4)[0].astype(dtype)     # unbatched (C, H, W)
    want = ref[6](ref[:6](torch.tensor(x)).reshape(1, 2)).detach().numpy()
    tol = 1e-9 if dtype == np.float64 else 1e-5
    np.testing.assert_allclose(mine(dev.tensor(x)).numpy(), want, rtol=tol, atol=tol)


class Reshape(ng.nn.Module):
    def __init__(self, shape):
        super().__init__()
        self.shape = shape

    def forward(self, x):
        return x.reshape(self.shape)


def test_layer_default_init_is_torchs():
    rng = np.random.default_rng(1)
    layer = ng.nn.Conv2d(4, 6, (3, 2), groups=2, dtype=np.float32, rng=rng)
    bound = 1 / np.sqrt(2 * 3 * 2)          # fan_in = in / groups * prod(kernel)
    w, b = layer.weight.numpy(), layer.bias.numpy()
    assert w.shape == (6, 2, 3, 2) and b.shape == (6,) and w.dtype == np.float32
    assert np.abs(w).max() <= bound and np.abs(b).max() <= bound
    assert np.abs(w).max() > 0.8 * bound
    again = np.random.default_rng(1)         # drawn from rng: weight first, then bias
    np.testing.assert_array_equal(w, again.uniform(-bound, bound, (6, 2, 3, 2)).astype(np.float32))
    np.testing.assert_array_equal(b, again.uniform(-bound, bound, 6).astype(np.float32))
    torch_layer = torch.nn.Conv2d(4, 6, (3, 2), groups=2)
    torch_bound = 1 / np.sqrt(torch_layer.weight[0].numel())
    assert np.isclose(bound, torch_bound)
    with pytest.raises(NotImplementedError, match="padding_mode"):
        ng.nn.Conv2d(2, 2, 3, padding_mode="reflect")
    with pytest.raises(ValueError, match="groups=3 must divide"):
        ng.nn.Conv2d(4, 6, 3, groups=3)


# ------------------------------------------------------------ ng.compile
def _cnn(seed=0):
    rng = np.random.default_rng(seed)
    f32 = dict(dtype=np.float32, rng=rng)
    conv = ng.nn.Conv2d(2, 3, 3, padding=1, **f32)
    pool = ng.nn.MaxPool2d(2)
    head = ng.nn.Linear(3 * 3 * 3, 4, **f32)

    def loss_fn(x, labels):
        h = pool(ng.relu(conv(x)))
        return ng.cross_entropy(head(h.reshape((h.shape[0], -1))), labels)
    return conv.parameters() + head.parameters(), loss_fn


def test_compiled_cnn_is_bit_identical_to_eager(tmp_path):
    def make():
        params, loss_fn = _cnn()
        return params, loss_fn, ng.optim.Adam(params, lr=0.01, accumulate_steps=2)
    rng = np.random.default_rng(2)
    batches = [(ng.tensor(rng.normal(size=(3, 2, 6, 6)).astype(np.float32)),
                rng.integers(0, 4, 3)) for _ in range(2)]
    step = compiled_matches_eager(make, [batches[i % 2] for i in range(6)], tmp_path)
    assert step.stats[-1]["mode"] == "njit"


# ------------------------------------------------------------ CUDA launches
def test_cuda_launch_bound(monkeypatch):
    dev = cuda_dev()
    # the im2col path's (tests/test_conv_direct.py: the direct one's)
    monkeypatch.setattr(ng.ops.conv, "DIRECT_MAX_TAPS", 0)
    x, w, b = inputs([(2, 2, 3, 3), (2, 2, 2, 2), (2,)], seed=1)
    wp, bp = dev.param(w), dev.param(b)
    # forward: im2col, the bias, the GEMM, the reorder to NCHW;
    # backward: the gradient's reorder, then 1 for db, 1 for dW, 2 for dx
    fwd, bwd = cuda_launches(lambda t: ng.conv2d(t, wp, bp, padding=1), dev.param(x))
    assert (fwd, bwd) == (4, 5)
    fwd, bwd = cuda_launches(lambda t: ng.conv2d(t, wp), dev.param(x[:1]))
    assert (fwd, bwd) == (3, 4)     # no bias: no bias launches


# ------------------------------------------------------------ PTX

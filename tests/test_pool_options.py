"""max_pool2d's ceil_mode and return_indices, max_unpool2d, avg_pool2d's
ceil_mode, count_include_pad and divisor_override, and their layers, against
PyTorch: values, indices and gradients, on both devices; bad input."""
import itertools

import numpy as np
import pytest

import numbagrad as ng
from conftest import inputs, matches_torch
from numbagrad.compile import compile as ng_compile
from numbagrad.ops._common import ArgumentLengthError

torch = pytest.importorskip("torch")
F = torch.nn.functional

X = (2, 2, 5, 7)
AVG = [dict(kernel_size=k, stride=s, padding=p, ceil_mode=c, count_include_pad=i,
            divisor_override=d)
       for k, s, p, c, i, d in itertools.product((3,), (2,), (0, 1), (False, True),
                                                 (False, True), (None, 4))]
AVG.append(dict(kernel_size=2, stride=1, ceil_mode=True, padding=1))
MAX = [dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
       dict(kernel_size=2, stride=2, ceil_mode=True),                    # the unrolled 2x2
       dict(kernel_size=(2, 3), stride=(3, 2), dilation=(2, 1), ceil_mode=True),
       dict(kernel_size=2, stride=1, ceil_mode=True)]


@pytest.mark.parametrize("kw", AVG, ids=[str(i) for i in range(len(AVG))])
def test_avg_pool2d_options_match_torch(kw):
    matches_torch(lambda x: ng.avg_pool2d(x, **kw), lambda x: F.avg_pool2d(x, **kw),
                  inputs([X], seed=1), name=str(kw))


@pytest.mark.parametrize("kw", MAX, ids=[str(i) for i in range(len(MAX))])
def test_max_pool2d_ceil_mode_and_indices_match_torch(kw):
    matches_torch(lambda x: ng.max_pool2d(x, **kw), lambda x: F.max_pool2d(x, **kw),
                  inputs([X], seed=2), name=str(kw))
    x = inputs([X], seed=2)[0]
    out, idx = ng.max_pool2d(ng.tensor(x), return_indices=True, **kw)
    want, tidx = F.max_pool2d(torch.tensor(x), return_indices=True, **kw)
    assert isinstance(idx, np.ndarray) and idx.dtype == np.int64
    np.testing.assert_array_equal(idx, tidx.numpy())
    np.testing.assert_array_equal(out.numpy(), want.numpy())


@pytest.mark.parametrize("kw, output_size", [
    (dict(kernel_size=2, stride=2), None),
    (dict(kernel_size=3, stride=2, padding=1), (5, 7)),
    (dict(kernel_size=2, stride=1), None),                      # overlapping: repeated indices
    (dict(kernel_size=2, stride=2), (1, 2, 5, 7)),              # output_size with N and C
])
def test_max_unpool2d_matches_torch(kw, output_size):
    x = torch.tensor(inputs([X], seed=3)[0])
    if output_size is None:
        x = x[..., :4, :6]     # the default output size: (H - 1) * stride - 2 * padding + kernel
    pooled, idx = F.max_pool2d(x, return_indices=True, **kw)
    unpool = dict(kw, output_size=output_size)
    matches_torch(lambda t: ng.max_unpool2d(t, idx.numpy(), **unpool),
                  lambda t: F.max_unpool2d(t, idx, **unpool), [pooled.numpy()], name=str(kw))


def test_max_unpool2d_unbatched_and_empty_batch():
    for shape in ((2, 5, 6), (0, 2, 4, 4)):
        x = torch.tensor(inputs([shape], seed=5)[0])
        pooled, idx = F.max_pool2d(x, 2, return_indices=True)
        matches_torch(lambda t: ng.max_unpool2d(t, idx.numpy(), 2),
                      lambda t: F.max_unpool2d(t, idx, 2), [pooled.numpy()], name=str(shape))


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
def test_on_both_devices(dev, dtype):
    x = inputs([(1, 2, 3, 5)], seed=6)[0].astype(dtype)
    p, t = dev.param(x), torch.tensor(x, requires_grad=True)
    kw = dict(kernel_size=2, stride=2, ceil_mode=True)
    tout, tidx = F.max_pool2d(t, return_indices=True, **kw)
    tup = F.max_unpool2d(tout, tidx, 2, output_size=x.shape[-2:])
    tavg = F.avg_pool2d(t, 2, 2, padding=1, ceil_mode=True, count_include_pad=False)
    weights = [np.random.default_rng(i).normal(size=tuple(a.shape)).astype(dtype)
               for i, a in enumerate((tup, tavg))]
    with ng.grad_tape():
        out, idx = ng.max_pool2d(p, return_indices=True, **kw)
        up = ng.max_unpool2d(out, idx, 2, output_size=x.shape[-2:])
        avg = ng.avg_pool2d(p, 2, 2, padding=1, ceil_mode=True, count_include_pad=False)
        loss = (up * dev.tensor(weights[0])).sum() + (avg * dev.tensor(weights[1])).sum()
    grads = ng.backward(loss)
    ((tup * torch.tensor(weights[0])).sum() + (tavg * torch.tensor(weights[1])).sum()).backward()
    tol = dict(rtol=1e-9, atol=1e-12) if dtype == np.float64 else dict(rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(dev.host(idx), tidx.numpy())
    np.testing.assert_allclose(up.numpy(), tup.detach().numpy(), **tol)
    np.testing.assert_allclose(avg.numpy(), tavg.detach().numpy(), **tol)
    np.testing.assert_allclose(dev.host(grads[p.id]), t.grad.numpy(), **tol)


def test_gradcheck():
    x = ng.param(inputs([(1, 2, 4, 5)], seed=3)[0])
    _, idx = ng.max_pool2d(x, 2, ceil_mode=True, return_indices=True)
    y = ng.param(inputs([(1, 2, 2, 3)], seed=4)[0])
    weights = ng.tensor(np.random.default_rng(4).normal(size=(1, 2, 4, 5)))
    w2 = ng.tensor(np.random.default_rng(5).normal(size=(1, 2, 3, 3)))

    def loss():
        return ((ng.max_unpool2d(y, idx, 2, output_size=(4, 5)) * weights).sum()
                + (ng.avg_pool2d(x, 2, 2, 1, ceil_mode=True, divisor_override=3) * w2).sum())
    ng.gradcheck(loss, [x, y])


def test_layers_take_the_new_arguments():
    x = inputs([X], seed=7)[0]
    pool = ng.nn.MaxPool2d(2, ceil_mode=True, return_indices=True)
    tpool = torch.nn.MaxPool2d(2, ceil_mode=True, return_indices=True)
    (out, idx), (tout, tidx) = pool(ng.tensor(x)), tpool(torch.tensor(x))
    unpool, tunpool = ng.nn.MaxUnpool2d(2), torch.nn.MaxUnpool2d(2)
    np.testing.assert_array_equal(unpool(out, idx, output_size=X).numpy(),
                                  tunpool(tout, tidx, output_size=X).numpy())
    avg = dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False,
               divisor_override=None)
    np.testing.assert_allclose(ng.nn.AvgPool2d(**avg)(ng.tensor(x)).numpy(),
                               torch.nn.AvgPool2d(**avg)(torch.tensor(x)).numpy(), rtol=1e-12)


def test_compiled_step_is_bit_identical_to_eager(tmp_path):
    def make():
        return ng.param(np.random.default_rng(0).normal(size=(2, 5, 7)).astype(np.float32))
    wa, wb = make(), make()

    def loss_fn(w, x):
        h, idx = ng.max_pool2d(x * w, 2, ceil_mode=True, return_indices=True)
        up = ng.max_unpool2d(h, idx, 2, output_size=(5, 7))
        return (up ** 2).sum() + ng.avg_pool2d(x * w, 3, 2, 1, ceil_mode=True,
                                               count_include_pad=False).sum()
    step = ng_compile(lambda x: loss_fn(wb, x), cache_dir=str(tmp_path))
    rng = np.random.default_rng(1)
    for i in range(3):
        x = ng.tensor(rng.normal(size=(2, 2, 5, 7)).astype(np.float32))
        with ng.grad_tape():
            la = loss_fn(wa, x)
        la.backward()
        lb = step(x)
        assert la.numpy().tobytes() == lb.numpy().tobytes(), i
        assert wa.grad.tobytes() == wb.grad.tobytes(), i
    assert step.stats[-1]["mode"] == "njit"


BAD = [
    (lambda x, i: ng.max_unpool2d(x, i + 100, 2), IndexError, "out of range"),
    (lambda x, i: ng.max_unpool2d(x, i.astype(np.float64), 2), ng.ops._common.IndexDtypeError,
     "integers"),
    (lambda x, i: ng.max_unpool2d(x, i[:1], 2), ValueError, "indices of shape"),
    (lambda x, i: ng.max_unpool2d(x, i, 2, output_size=(9, 9)), ValueError, "must lie between"),
    (lambda x, i: ng.max_unpool2d(x, i, 2, output_size=(4, 6, 1)), ArgumentLengthError,
     "output_size"),
    (lambda x, i: ng.max_unpool2d(x, i, (2, 2, 2)), ArgumentLengthError, "kernel_size"),
    (lambda x, i: ng.avg_pool2d(x, 2, divisor_override=0), ValueError, "divisor_override"),
    (lambda x, i: ng.max_pool2d(x, 2, stride=(1, 1, 1)), ArgumentLengthError, "stride"),
]


@pytest.mark.parametrize("case", range(len(BAD)))
def test_bad_input_raises_before_anything_changes(case):
    fn, kind, words = BAD[case]
    x = ng.param(np.arange(2 * 2 * 2 * 3, dtype=np.float64).reshape(2, 2, 2, 3))
    _, idx = ng.max_pool2d(ng.param(np.ones((2, 2, 4, 6))), 2, return_indices=True)
    with ng.grad_tape():
        with pytest.raises(kind, match=words):
            fn(x, idx)
    assert x.grad is None

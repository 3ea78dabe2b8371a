"""Every op with size-0 dimensions, on both devices, against PyTorch: values
and every input's gradient (a sum over nothing is 0, a mean over nothing nan).

Every array the library allocates is NaN-filled here, so a kernel that
leaves any of its destination unwritten fails the comparison.
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import numbagrad as ng
from conftest import assert_grads_like_torch, inputs, weighted_sum
from numbagrad import buffers, kernels

UNARY = [("relu", ng.relu, torch.relu), ("leaky_relu", ng.leaky_relu, F.leaky_relu),
         ("tanh", ng.tanh, torch.tanh), ("sigmoid", ng.sigmoid, torch.sigmoid),
         ("exp", ng.exp, torch.exp), ("neg", lambda x: -x, lambda x: -x),
         ("log", lambda x: ng.log(x * x + 0.5), lambda x: torch.log(x * x + 0.5)),
         ("sqrt", lambda x: ng.sqrt(x * x + 0.5), lambda x: torch.sqrt(x * x + 0.5)),
         ("pow2", lambda x: x ** 2, lambda x: x ** 2),
         ("x+s", lambda x: x + 1.5, lambda x: x + 1.5), ("s-x", lambda x: 1.5 - x,
                                                         lambda x: 1.5 - x),
         ("s/x", lambda x: 3.0 / (x * x + 1.0), lambda x: 3.0 / (x * x + 1.0))]
BINARY = [("add", ng.add, torch.add), ("mul", ng.mul, torch.mul), ("div", ng.div, torch.div)]
BROADCASTS = [((0, 3), (3,)), ((1, 3), (0, 3)), ((3, 0), (3, 1)), ((0,), (0,)), ((), (0, 3)),
              ((0, 1), (1, 4)), ((0, 3), (0, 3))]
EMPTY = [(0, 3), (3, 0), (0,)]
LABELS = np.zeros(0, np.int64)


def _reduction(name, mean, axis, keepdims):
    def ng_f(x):
        return (ng.mean if mean else ng.sum)(x, axis, keepdims)

    def torch_f(x):
        dims = tuple(range(x.dim())) if axis is None else axis
        return x.mean(dim=dims, keepdim=keepdims) if mean else x.sum(dim=dims, keepdim=keepdims)
    return name, ng_f, torch_f


CASES = []   # (id, shapes, ng function, torch function)
for name, f, g in UNARY:
    CASES += [(f"{name}{s}", [s], f, g) for s in EMPTY]
for name, f, g in BINARY:
    CASES += [(f"{name}{sa}{sb}", [sa, sb], f, g) for sa, sb in BROADCASTS]
for mean in (False, True):
    for axis in (None, 0, 1):
        for keepdims in (False, True):
            name, f, g = _reduction(f"{'mean' if mean else 'sum'}({axis}, {keepdims})", mean,
                                    axis, keepdims)
            CASES += [(f"{name}{s}", [s], f, g) for s in EMPTY if axis is None or axis < len(s)]
for axis in (0, 1):
    for log in (False, True):
        f = (lambda x, a=axis: ng.log_softmax(x, a)) if log else \
            (lambda x, a=axis: ng.softmax(x, a))
        g = (lambda x, a=axis: torch.log_softmax(x, a)) if log else \
            (lambda x, a=axis: torch.softmax(x, a))
        CASES += [(f"{'log_' * log}softmax({axis}){s}", [s], f, g) for s in EMPTY[:2]]
CASES += [
    ("T(0, 3)", [(0, 3)], lambda x: x.T * 1.0, lambda x: x.T * 1.0),
    ("reshape(0, 3)", [(0, 3)], lambda x: x.reshape(3, 0), lambda x: x.reshape(3, 0)),
    ("matmul(0, 3)(3, 4)", [(0, 3), (3, 4)], ng.matmul, torch.matmul),
    ("matmul(3, 0)(0, 4)", [(3, 0), (0, 4)], ng.matmul, torch.matmul),
    ("matmul(3, 4)(4, 0)", [(3, 4), (4, 0)], ng.matmul, torch.matmul),
    ("matmul(0,)(0, 3)", [(0,), (0, 3)], ng.matmul, torch.matmul),
    ("T@(0, 3)(0, 4)", [(0, 3), (0, 4)], lambda a, b: a.T @ b, lambda a, b: a.T @ b),
    ("linear(0, 3)", [(0, 3), (4, 3), (4,)], ng.linear, F.linear),
    ("linear(5, 0)", [(5, 0), (4, 0), (4,)], ng.linear, F.linear),
    ("linear_nobias(0, 3)", [(0, 3), (4, 3)], ng.linear, F.linear),
    ("linear_relu(0, 3)", [(0, 3), (4, 3), (4,)], lambda x, w, b: ng.linear(x, w, b, "relu"),
     lambda x, w, b: torch.relu(F.linear(x, w, b))),
    ("linear_tanh(5, 0)", [(5, 0), (4, 0), (4,)], lambda x, w, b: ng.linear(x, w, b, "tanh"),
     lambda x, w, b: torch.tanh(F.linear(x, w, b))),
]
for reduction in ("mean", "sum"):
    CASES += [
        (f"mse_{reduction}", [(0, 3), (0, 3)],
         lambda a, b, r=reduction: ng.mse_loss(a, b.data, reduction=r),
         lambda a, b, r=reduction: F.mse_loss(a, b.detach(), reduction=r)),
        (f"bce_{reduction}", [(0, 3), (0, 3)],
         lambda a, b, r=reduction: ng.binary_cross_entropy_with_logits(a, b.data, r),
         lambda a, b, r=reduction: F.binary_cross_entropy_with_logits(a, b.detach(),
                                                                      reduction=r)),
        (f"cross_entropy_{reduction}", [(0, 3)],
         lambda x, r=reduction: ng.cross_entropy(x, LABELS, r),
         lambda x, r=reduction: F.cross_entropy(x, torch.tensor(LABELS), reduction=r)),
    ]


@pytest.fixture
def poisoned(monkeypatch):
    """Every array the library allocates from now on starts NaN-filled."""
    for name in ("cpu", "cuda"):
        if name == "cuda" and not ng.cuda_available():
            continue
        kern = kernels.get(name)
        plain = kern.empty

        def empty(shape, dtype, kern=kern, plain=plain):
            array = plain(shape, dtype)
            if np.dtype(dtype).kind == "f":
                kern.fill(array, np.nan)
            return array
        monkeypatch.setattr(kern, "empty", empty)
    buffers.clear()
    yield
    buffers.clear()


@pytest.mark.parametrize("name, shapes, f, g", CASES, ids=[c[0] for c in CASES])
def test_size0_op_matches_torch(dev, poisoned, name, shapes, f, g):
    arrays = inputs(shapes)
    ps = [dev.param(a) for a in arrays]
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    want = g(*ts)
    weights = np.random.default_rng(1).normal(size=tuple(want.shape))
    with ng.grad_tape():
        out = f(*ps)
        loss = weighted_sum(out, dev.tensor(weights))
    assert out.shape == tuple(want.shape), name
    np.testing.assert_allclose(out.numpy(), want.detach().numpy(), rtol=1e-12, atol=1e-15)
    grads = ng.backward(loss)
    (want * torch.tensor(weights)).sum().backward()
    assert_grads_like_torch(name, ps, ts, grads, rtol=1e-12, atol=1e-15)


def test_an_empty_batch_leaves_the_bias_untouched(dev):
    # the probe: a linear layer over zero rows, one SGD step with lr=1
    W, b = dev.param(np.zeros((256, 2))), dev.param(np.zeros(256))
    opt = ng.optim.SGD([W, b], lr=1.0)
    with ng.grad_tape():
        loss = ng.sum(ng.linear(dev.tensor(np.zeros((0, 2))), W, b))
    loss.backward()
    assert not np.any(dev.host(b.grad)) and not np.any(dev.host(W.grad))
    assert opt.step()
    assert not np.any(b.numpy()) and not np.any(W.numpy())

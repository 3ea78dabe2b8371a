"""An op input that wraps the accumulator its own backward writes
(``ng.as_tensor(W.grad)``) is read as it was before the pass, as in PyTorch
(whose accumulation then leaves the referenced gradient alone)."""
import numpy as np
import pytest
import torch

import numbagrad as ng

W0 = np.random.default_rng(0).normal(size=(3, 3))


def wrapped(dev, grad, how):
    if how == "as_tensor":
        return ng.as_tensor(grad)
    if how == "view":
        return ng.as_tensor(grad.reshape(-1)).reshape(3, 3)
    if how == "T":     # a transposed view of the wrapper (an op's view, on both devices)
        return ng.as_tensor(grad).T.T
    return grad   # a raw array operand, wrapped by the op


def torch_grad(g0):
    w = torch.tensor(W0, requires_grad=True)
    g = torch.tensor(g0)
    ((w @ g).sum() + (w * g).sum() + (w * w).sum()).backward()
    return g0 + w.grad.numpy()


@pytest.mark.parametrize("owned", [False, True], ids=["free", "in-optimizer"])
@pytest.mark.parametrize("spelling", ["grad", "mapping"])
@pytest.mark.parametrize("how", ["as_tensor", "view", "T", "raw"])
def test_an_input_wrapping_the_accumulator_reads_its_old_values(dev, spelling, how, owned):
    W = dev.param(W0)
    if owned:   # W.grad is then a view of the optimizer's flat gradient buffer
        ng.optim.SGD([W, dev.param(np.zeros(2))], lr=0.1, accumulate_steps=8)
    with ng.grad_tape():
        loss = ng.sum(W * W)
    loss.backward()
    g0 = dev.host(W.grad).copy()
    with ng.grad_tape():
        G = wrapped(dev, W.grad, how)
        # two ops read G and each adds into W.grad: the matmul's GEMM would
        # write the array it reads, the second op would read the first's sum
        loss = ng.sum(W @ G) + ng.sum(W * G) + ng.sum(W * W)
    if spelling == "grad":
        loss.backward()
    else:
        grads = ng.backward(loss)
        np.testing.assert_allclose(dev.host(grads[W.id]), torch_grad(g0) - g0, rtol=1e-12)
    np.testing.assert_allclose(dev.host(W.grad), torch_grad(g0), rtol=1e-12)


def test_an_unrelated_wrapper_leaves_the_accumulator_in_place():
    # deferral is only for the aliased param: another param's accumulator
    # keeps being written in place (the same array object, the same values)
    A, B = ng.param(W0), ng.param(W0 * 2)
    with ng.grad_tape():
        loss = ng.sum(A * B)
    loss.backward()
    acc_b = B.grad
    with ng.grad_tape():
        loss = ng.sum(A * ng.as_tensor(A.grad)) + ng.sum(B * B)
    loss.backward()
    assert B.grad is acc_b
    np.testing.assert_allclose(B.grad, W0 + 4 * W0, rtol=1e-12)
    np.testing.assert_allclose(A.grad, 4 * W0, rtol=1e-12)

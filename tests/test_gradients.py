"""Gradients of matmul and mse_loss against finite differences and PyTorch."""
import importlib

import numpy as np
import pytest

import numbagrad as ng

DTYPES = [np.float32, np.float64]


def data(seed, *shape):
    return np.random.default_rng(seed).normal(size=shape)


def single_matmul(dev, dt):
    W, X = dev.param(data(1, 2, 3), dt), dev.tensor(data(2, 3, 4), dt)
    T = dev.tensor(data(3, 2, 4), dt)
    return (lambda: ng.mse_loss(ng.matmul(W, X), T)), [W]


def both_operands_non_square(dev, dt):
    A, B = dev.param(data(4, 3, 5), dt), dev.param(data(5, 5, 2), dt)
    T = dev.tensor(data(6, 3, 2), dt)
    return (lambda: ng.mse_loss(A @ B, T, reduction="sum")), [A, B]


def two_matmul_chain(dev, dt):
    W1, W2 = dev.param(data(7, 4, 3), dt), dev.param(data(8, 2, 4), dt)
    X, T = dev.tensor(data(9, 3, 5), dt), dev.tensor(data(10, 2, 5), dt)
    return (lambda: ng.mse_loss(W2 @ (W1 @ X), T)), [W1, W2]


def one_param_used_twice(dev, dt):
    W, x = dev.param(data(11, 3, 3) / 2, dt), dev.tensor(data(12, 3, 2), dt)
    T = dev.tensor(data(13, 3, 2), dt)
    return (lambda: ng.mse_loss(W @ (W @ x), T)), [W]


def intermediate_used_twice(dev, dt):
    W, X = dev.param(data(14, 2, 3) / 2, dt), dev.tensor(data(15, 3, 2), dt)
    T = dev.tensor(data(16, 2, 2), dt)

    def loss():
        H = W @ X
        return ng.mse_loss(H @ H, T)
    return loss, [W]


def vectors(dev, dt):
    v, M = dev.param(data(17, 3), dt), dev.param(data(18, 3, 4), dt)
    t = dev.tensor(data(20, 4), dt)
    return (lambda: ng.mse_loss(v @ M, t)), [v, M]


def matrix_vector(dev, dt):
    M, u = dev.param(data(21, 4, 3), dt), dev.param(data(22, 3), dt)
    t = dev.tensor(data(23, 4), dt)
    return (lambda: ng.mse_loss(M @ u, t)), [M, u]


def dot_product_as_loss(dev, dt):
    a, b = dev.param(data(24, 5), dt), dev.param(data(25, 5), dt)
    return (lambda: a @ b), [a, b]


def mse_of_a_param(dev, dt):
    P, T = dev.param(data(26, 3, 2), dt), dev.tensor(data(27, 3, 2), dt)
    return (lambda: ng.mse_loss(P, T)), [P]


CASES = [single_matmul, both_operands_non_square, two_matmul_chain, one_param_used_twice,
         intermediate_used_twice, vectors, matrix_vector, dot_product_as_loss, mse_of_a_param]


@pytest.mark.parametrize("dt", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__)
def test_backward_matches_finite_differences(dev, case, dt):
    loss_fn, params = case(dev, dt)
    # Simulated CUDA kernels are slow: check random directional derivatives.
    ng.gradcheck(loss_fn, params, directions=3 if dev.name == "cuda" else None)


def test_gradcheck_catches_a_wrong_gradient():
    # The checker itself must be able to fail: corrupt one gradient element.
    W, X = ng.param(data(30, 2, 3)), ng.tensor(data(31, 3, 4))
    T = ng.tensor(data(32, 2, 4))
    family = importlib.import_module("numbagrad.ops.matmul")   # the module, not ng.matmul
    real = family._matmul_backward

    def broken(ctx, node, gout):
        real(ctx, node, gout)
        dest, _ = ctx.dest(node.inputs[0])
        dest[0, 0] += 1e-3
    family._matmul_backward = broken
    try:
        for directions in (None, 3):
            with pytest.raises(AssertionError, match=r"params\[0\]"):
                ng.gradcheck(lambda: ng.mse_loss(W @ X, T), [W], directions=directions)
    finally:
        family._matmul_backward = real


@pytest.mark.parametrize("dt", DTYPES, ids=["f32", "f64"])
def test_chain_gradients_match_pytorch(dt):
    torch = pytest.importorskip("torch")
    w1, w2, x, t = data(40, 4, 3), data(41, 2, 4), data(42, 3, 6), data(43, 2, 6)
    W1, W2 = ng.param(w1, dtype=dt), ng.param(w2, dtype=dt)
    with ng.grad_tape():
        loss = ng.mse_loss(W2 @ (W1 @ ng.tensor(x, dtype=dt)), ng.tensor(t, dtype=dt))
    grads = ng.backward(loss)

    tdt = torch.float32 if dt == np.float32 else torch.float64
    T1 = torch.tensor(w1, dtype=tdt, requires_grad=True)
    T2 = torch.tensor(w2, dtype=tdt, requires_grad=True)
    tl = torch.nn.functional.mse_loss(T2 @ (T1 @ torch.tensor(x, dtype=tdt)),
                                      torch.tensor(t, dtype=tdt))
    tl.backward()
    tol = dict(rtol=1e-5, atol=1e-6) if dt == np.float32 else dict(rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(loss.item(), tl.item(), **tol)
    np.testing.assert_allclose(grads[W1.id], T1.grad.numpy(), **tol)
    np.testing.assert_allclose(grads[W2.id], T2.grad.numpy(), **tol)

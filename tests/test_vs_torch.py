"""Optimizer trajectories against PyTorch: accumulated windows vs full batches."""
import numpy as np
import pytest

import numbagrad as ng

torch = pytest.importorskip("torch")

D_IN, D_HID, D_OUT, MICRO, K, WINDOWS = 3, 4, 2, 2, 3, 3


def problem(seed):
    rng = np.random.default_rng(seed)
    w1, w2 = rng.normal(size=(D_HID, D_IN)), rng.normal(size=(D_OUT, D_HID))
    X = rng.normal(size=(WINDOWS, D_IN, MICRO * K))
    Y = rng.normal(size=(WINDOWS, D_OUT, MICRO * K))
    return w1, w2, X, Y


def make_ng_opt(kind, params, k):
    if kind == "sgd":
        return ng.optim.SGD(params, lr=0.05, momentum=0.9, accumulate_steps=k)
    return ng.optim.Adam(params, lr=0.01, betas=(0.8, 0.9), eps=1e-8, accumulate_steps=k)


def make_torch_opt(kind, params):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)
    return torch.optim.Adam(params, lr=0.01, betas=(0.8, 0.9), eps=1e-8, foreach=False)


def torch_full_batch(kind, w1, w2, X, Y):
    T1 = torch.tensor(w1, requires_grad=True)
    T2 = torch.tensor(w2, requires_grad=True)
    opt = make_torch_opt(kind, [T1, T2])
    out = []
    for x, y in zip(X, Y):
        opt.zero_grad()
        torch.nn.functional.mse_loss(T2 @ (T1 @ torch.tensor(x)), torch.tensor(y)).backward()
        opt.step()
        out.append((T1.detach().numpy().copy(), T2.detach().numpy().copy()))
    return out


@pytest.mark.parametrize("kind", ["sgd", "adam"])
@pytest.mark.parametrize("spelling", ["grad", "mapping"])
def test_accumulated_windows_follow_torch_full_batch(dev, kind, spelling):
    w1, w2, X, Y = problem(7 if kind == "sgd" else 8)
    expected = torch_full_batch(kind, w1, w2, X, Y)

    W1, W2 = dev.param(w1), dev.param(w2)
    opt = make_ng_opt(kind, [W1, W2], K)
    for window, (x, y) in enumerate(zip(X, Y)):
        for i in range(K):
            cols = slice(i * MICRO, (i + 1) * MICRO)
            with ng.grad_tape():
                loss = ng.mse_loss(W2 @ (W1 @ dev.tensor(x[:, cols])), dev.tensor(y[:, cols]))
            if spelling == "grad":
                loss.backward()
                applied = opt.step()
            else:
                applied = opt.step(ng.backward(loss))
            assert applied == (i == K - 1)
        np.testing.assert_allclose(W1.numpy(), expected[window][0], rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(W2.numpy(), expected[window][1], rtol=1e-10, atol=1e-12)
    assert opt.t == WINDOWS


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_float32_full_batch_steps_follow_torch(kind):
    w1, w2, X, Y = problem(9)
    expected = torch_full_batch(kind, w1.astype(np.float32), w2.astype(np.float32),
                                X.astype(np.float32), Y.astype(np.float32))
    W1, W2 = ng.param(w1, dtype=np.float32), ng.param(w2, dtype=np.float32)
    opt = make_ng_opt(kind, [W1, W2], 1)
    for window, (x, y) in enumerate(zip(X, Y)):
        with ng.grad_tape():
            loss = ng.mse_loss(W2 @ (W1 @ ng.tensor(x, dtype=np.float32)),
                               ng.tensor(y, dtype=np.float32))
        loss.backward()
        opt.step()
        np.testing.assert_allclose(W1.numpy(), expected[window][0], rtol=2e-5, atol=2e-6)
        np.testing.assert_allclose(W2.numpy(), expected[window][1], rtol=2e-5, atol=2e-6)


def test_adam_skips_an_unreached_param_like_torch():
    # A param that gets no gradient in a window keeps its weights, moments
    # and its own bias-correction count, as torch's per-param step does.
    rng = np.random.default_rng(10)
    a0, b0 = rng.normal(size=(2, 3)), rng.normal(size=(2, 3))
    x, y = rng.normal(size=(3, 1)), rng.normal(size=(2, 1))
    A, B = ng.param(a0), ng.param(b0)
    TA = torch.tensor(a0, requires_grad=True)
    TB = torch.tensor(b0, requires_grad=True)
    opt = ng.optim.Adam([A, B], lr=0.05)
    topt = torch.optim.Adam([TA, TB], lr=0.05, foreach=False)
    for which in "ABAAB":
        p, tp = (A, TA) if which == "A" else (B, TB)
        with ng.grad_tape():
            loss = ng.mse_loss(p @ ng.tensor(x), y)
        loss.backward()
        opt.step()
        topt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(tp @ torch.tensor(x), torch.tensor(y)).backward()
        topt.step()
        np.testing.assert_allclose(A.numpy(), TA.detach().numpy(), rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(B.numpy(), TB.detach().numpy(), rtol=1e-12, atol=1e-14)

"""Optimizer trajectories against PyTorch: accumulated windows vs full batches."""
import itertools

import numpy as np
import pytest
from conftest import Dev

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


# --------------------------------------------- schedules, clipping, decay, samples, flush
COS = ng.optim.schedules.cosine(0.05, total_updates=3, warmup=1, final=0.01)


def sgd_cosine(params):
    opt = torch.optim.SGD(params, lr=0.05, momentum=0.9)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda epoch: COS(epoch) / 0.05)


def adam_step(params):
    opt = torch.optim.Adam(params, lr=0.02, foreach=False)
    return opt, torch.optim.lr_scheduler.StepLR(opt, 2, gamma=0.5)


SAMPLES = {"sizes": (3, 5, 2), "average": "samples"}
CASES = {
    # name: numbagrad optimizer, torch optimizer and scheduler, options
    "sgd-cosine": {
        "ng": lambda p, k: ng.optim.SGD(p, lr=COS, momentum=0.9, accumulate_steps=k),
        "torch": sgd_cosine},
    "adam-step": {
        "ng": lambda p, k: ng.optim.Adam(p, lr=ng.optim.schedules.step(0.02, 2, gamma=0.5),
                                         accumulate_steps=k),
        "torch": adam_step},
    "sgd-clip": {
        "ng": lambda p, k: ng.optim.SGD(p, lr=0.05, momentum=0.9, accumulate_steps=k,
                                        max_grad_norm=0.5),
        "torch": lambda p: (torch.optim.SGD(p, lr=0.05, momentum=0.9), None), "clip": 0.5},
    "adam-clip": {
        "ng": lambda p, k: ng.optim.Adam(p, lr=0.01, accumulate_steps=k, max_grad_norm=0.5),
        "torch": lambda p: (torch.optim.Adam(p, lr=0.01, foreach=False), None), "clip": 0.5},
    "sgd-weight-decay": {
        "ng": lambda p, k: ng.optim.SGD(p, lr=0.05, momentum=0.9, accumulate_steps=k,
                                        weight_decay=0.1),
        "torch": lambda p: (torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=0.1),
                            None)},
    "sgd-weight-decay-no-momentum": {
        "ng": lambda p, k: ng.optim.SGD(p, lr=0.05, accumulate_steps=k, weight_decay=0.1),
        "torch": lambda p: (torch.optim.SGD(p, lr=0.05, weight_decay=0.1), None)},
    "adamw": {
        "ng": lambda p, k: ng.optim.AdamW(p, lr=0.01, betas=(0.8, 0.9), weight_decay=0.1,
                                          accumulate_steps=k),
        "torch": lambda p: (torch.optim.AdamW(p, lr=0.01, betas=(0.8, 0.9), weight_decay=0.1,
                                              foreach=False), None)},
    "adamw-samples-3-5-2": {
        "ng": lambda p, k: ng.optim.AdamW(p, lr=0.01, accumulate_steps=k, average="samples"),
        "torch": lambda p: (torch.optim.AdamW(p, lr=0.01, foreach=False), None), **SAMPLES},
    "sgd-samples-clip": {
        "ng": lambda p, k: ng.optim.SGD(p, lr=0.05, momentum=0.9, accumulate_steps=k,
                                        average="samples", max_grad_norm=0.5),
        "torch": lambda p: (torch.optim.SGD(p, lr=0.05, momentum=0.9), None), "clip": 0.5,
        **SAMPLES},
    "adam-flush-3-of-4": {
        "ng": lambda p, k: ng.optim.Adam(p, lr=0.01, accumulate_steps=k + 1),
        "torch": lambda p: (torch.optim.Adam(p, lr=0.01, foreach=False), None), "flush": True},
    "sgd-samples-flush": {
        "ng": lambda p, k: ng.optim.SGD(p, lr=0.05, momentum=0.9, accumulate_steps=k + 1,
                                        average="samples"),
        "torch": lambda p: (torch.optim.SGD(p, lr=0.05, momentum=0.9), None), "flush": True,
        **SAMPLES},
}


def run_torch_case(case, w1, w2, X, Y):
    T1 = torch.tensor(w1, requires_grad=True)
    T2 = torch.tensor(w2, requires_grad=True)
    opt, sched = case["torch"]([T1, T2])
    out = []
    for x, y in zip(X, Y):
        opt.zero_grad()
        pred = T2 @ (T1 @ torch.tensor(x))
        if case.get("average", True) == "samples":   # per-sample sums, over the samples
            loss = ((pred - torch.tensor(y)) ** 2).sum() / x.shape[1]
        else:
            loss = torch.nn.functional.mse_loss(pred, torch.tensor(y))
        loss.backward()
        norm = None
        if case.get("clip"):
            norm = float(torch.nn.utils.clip_grad_norm_([T1, T2], case["clip"]))
        opt.step()
        if sched is not None:
            sched.step()
        out.append((T1.detach().numpy().copy(), T2.detach().numpy().copy(), norm))
    return out


def run_ng_case(dev, case, w1, w2, X, Y):
    sizes = case.get("sizes", (MICRO,) * K)
    average = case.get("average", True)
    edges = np.cumsum([0, *sizes])
    W1, W2 = dev.param(w1), dev.param(w2)
    opt = case["ng"]([W1, W2], len(sizes))
    out = []
    for x, y in zip(X, Y):
        for i, (a, b) in enumerate(itertools.pairwise(edges)):
            with ng.grad_tape():
                loss = ng.mse_loss(W2 @ (W1 @ dev.tensor(x[:, a:b])), dev.tensor(y[:, a:b]),
                                   reduction="sum" if average == "samples" else "mean")
            loss.backward()
            applied = opt.step(samples=int(b - a) if average == "samples" else None)
            assert applied == (i == len(sizes) - 1 and not case.get("flush"))
        if case.get("flush"):
            assert opt.pending_steps == len(sizes) and opt.flush() is True
        out.append((W1.numpy(), W2.numpy(), opt.last_grad_norm))
    assert opt.t == len(X)
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_features_follow_torch(dev, name):
    case = CASES[name]
    w1, w2, X, Y = problem(11)
    if sum(case.get("sizes", ())) == 10:
        X = np.random.default_rng(12).normal(size=(WINDOWS, D_IN, 10))
        Y = np.random.default_rng(13).normal(size=(WINDOWS, D_OUT, 10))
    expected = run_torch_case(case, w1, w2, X, Y)
    got = run_ng_case(dev, case, w1, w2, X, Y)
    for window, ((g1, g2, g_norm), (t1, t2, t_norm)) in enumerate(zip(got, expected)):
        np.testing.assert_allclose(g1, t1, rtol=1e-10, atol=1e-12, err_msg=f"window {window}")
        np.testing.assert_allclose(g2, t2, rtol=1e-10, atol=1e-12, err_msg=f"window {window}")
        if t_norm is not None:
            assert g_norm == pytest.approx(t_norm, rel=1e-12)
    if case.get("clip"):   # the test clips some windows, and not others
        assert any(n > case["clip"] for *_, n in expected)


@pytest.mark.parametrize("name", ["adamw", "sgd-clip", "adam-clip", "sgd-weight-decay"])
def test_float32_features_follow_torch(name):
    case = CASES[name]
    w1, w2, X, Y = (a.astype(np.float32) for a in problem(14))
    expected = run_torch_case(case, w1, w2, X, Y)
    got = run_ng_case(Dev("cpu"), case, w1, w2, X, Y)
    for (g1, g2, g_norm), (t1, t2, t_norm) in zip(got, expected):
        assert g1.dtype == np.float32
        np.testing.assert_allclose(g1, t1, rtol=2e-5, atol=2e-6)
        np.testing.assert_allclose(g2, t2, rtol=2e-5, atol=2e-6)
        if t_norm is not None:
            assert g_norm == pytest.approx(t_norm, rel=1e-5)

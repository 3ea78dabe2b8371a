"""Property: k accumulated micro-batches land where one full batch lands."""
import numpy as np
import pytest
from conftest import Dev
from hypothesis import given, settings
from hypothesis import strategies as st

import numbagrad as ng

problems = st.fixed_dictionaries({
    "d_in": st.integers(1, 5), "d_out": st.integers(1, 5), "micro": st.integers(1, 3),
    "k": st.integers(1, 4), "windows": st.integers(1, 3), "seed": st.integers(0, 2**32 - 1),
    "kind": st.sampled_from(["sgd", "adam"]), "momentum": st.sampled_from([0.0, 0.5, 0.9]),
    "reduction": st.sampled_from(["mean", "sum"]),
})


def make_opt(prob, W, k):
    if prob["kind"] == "sgd":
        return ng.optim.SGD([W], lr=0.03, momentum=prob["momentum"], accumulate_steps=k,
                            average=prob["reduction"] == "mean")
    return ng.optim.Adam([W], lr=0.02, accumulate_steps=k, average=prob["reduction"] == "mean")


def train(dev, prob, W0, X, Y, k):
    """Train on every window, each split into k equal column micro-batches."""
    W = dev.param(W0)
    opt = make_opt(prob, W, k)
    cols = X.shape[2] // k
    for x, y in zip(X, Y):
        for i in range(k):
            part = slice(i * cols, (i + 1) * cols)
            with ng.grad_tape():
                loss = ng.mse_loss(W @ dev.tensor(x[:, part]), dev.tensor(y[:, part]),
                                   reduction=prob["reduction"])
            loss.backward()
            opt.step()
    assert opt.t == len(X)
    return W.numpy()


def check(dev, prob):
    rng = np.random.default_rng(prob["seed"])
    k, n = prob["k"], prob["micro"] * prob["k"]
    W0 = rng.normal(size=(prob["d_out"], prob["d_in"]))
    X = rng.normal(size=(prob["windows"], prob["d_in"], n))
    Y = rng.normal(size=(prob["windows"], prob["d_out"], n))
    # A mean loss averages the window (average=True); a sum loss sums it
    # (average=False): both match the full batch's gradient exactly.
    full = train(dev, prob, W0, X, Y, 1)
    accumulated = train(dev, prob, W0, X, Y, k)
    np.testing.assert_allclose(accumulated, full, rtol=1e-10, atol=1e-10)


@settings(max_examples=60, deadline=None)
@given(prob=problems)
def test_accumulated_equals_full_batch_cpu(prob):
    check(Dev("cpu"), prob)


@settings(max_examples=4, deadline=None)
@given(prob=problems)
def test_accumulated_equals_full_batch_cuda(prob):
    if not ng.cuda_available():
        pytest.skip("CUDA unusable here")
    check(Dev("cuda"), prob)

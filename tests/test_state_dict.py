"""state_dict / load_state_dict: a run resumed anywhere ends bit-identical."""
import copy
import pickle

import numpy as np
import pytest
from conftest import Dev

import numbagrad as ng

K, TOTAL = 3, 8   # micro-steps: two full windows and part of a third


def batches(seed=5):
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=(3, 2)), rng.normal(size=(2, 2))) for _ in range(TOTAL)]


def build(dev, kind, w1, w2):
    W1, W2 = dev.param(w1), dev.param(w2)
    if kind == "sgd":
        opt = ng.optim.SGD({"W1": W1, "W2": W2}, lr=0.05, momentum=0.9, accumulate_steps=K)
    else:
        opt = ng.optim.Adam({"W1": W1, "W2": W2}, lr=0.02, accumulate_steps=K)
    return W1, W2, opt


def micro_step(dev, W1, W2, opt, batch, spelling):
    x, y = batch
    with ng.grad_tape():
        loss = ng.mse_loss(W2 @ (W1 @ dev.tensor(x)), dev.tensor(y))
    if spelling == "grad":
        loss.backward()
        return opt.step()
    return opt.step(ng.backward(loss))


@pytest.mark.parametrize("kind", ["sgd", "adam"])
@pytest.mark.parametrize("spelling", ["grad", "mapping"])
def test_resuming_at_every_position_is_bit_identical(dev, kind, spelling):
    rng = np.random.default_rng(4)
    w1, w2 = rng.normal(size=(4, 3)), rng.normal(size=(2, 4))
    data = batches()

    W1, W2, opt = build(dev, kind, w1, w2)
    for b in data:
        micro_step(dev, W1, W2, opt, b, spelling)
    final = (W1.numpy(), W2.numpy(), opt.t)

    # every position on the CPU; on the (slow) simulator each window position once
    positions = range(1, TOTAL) if dev.name == "cpu" else (K - 1, K, K + 1)
    for stop in positions:
        W1, W2, opt = build(dev, kind, w1, w2)
        for b in data[:stop]:
            micro_step(dev, W1, W2, opt, b, spelling)
        saved = pickle.loads(pickle.dumps((opt.state_dict(), W1.numpy(), W2.numpy())))
        state, s1, s2 = saved
        assert state["pos"] == stop % K

        R1, R2, resumed = build(dev, kind, s1, s2)
        resumed.load_state_dict(state)
        for b in data[stop:]:
            micro_step(dev, R1, R2, resumed, b, spelling)
        np.testing.assert_array_equal(R1.numpy(), final[0], err_msg=f"resumed after {stop}")
        np.testing.assert_array_equal(R2.numpy(), final[1], err_msg=f"resumed after {stop}")
        assert resumed.t == final[2]


def test_state_dict_is_a_snapshot_not_a_view():
    cpu = Dev("cpu")
    W, W2, opt = build(cpu, "adam", np.ones((4, 3)), np.ones((2, 4)))
    micro_step(cpu, W, W2, opt, batches()[0], "grad")
    state = opt.state_dict()
    before = copy.deepcopy(state)
    for b in batches()[1:K]:
        micro_step(cpu, W, W2, opt, b, "grad")
    for g_now, g_then in zip(state["groups"], before["groups"]):
        np.testing.assert_array_equal(g_now["grad"], g_then["grad"])
        for name in g_now["slots"]:
            np.testing.assert_array_equal(g_now["slots"][name], g_then["slots"][name])


def test_load_state_dict_restores_hyper_parameters():
    W = ng.param(np.ones((2, 2)))
    a = ng.optim.Adam([W], lr=0.5, betas=(0.5, 0.6), eps=1e-3, accumulate_steps=2)
    b = ng.optim.Adam([ng.param(np.ones((2, 2)))], lr=0.1)
    b.load_state_dict(a.state_dict())
    assert (b.lr, b.betas, b.eps, b.accumulate_steps) == (0.5, (0.5, 0.6), 1e-3, 2)

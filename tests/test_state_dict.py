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


# ------------------------------------------------ the features, resumed anywhere
def build_featured(dev, kind, w1, w2):
    W1, W2 = dev.param(w1), dev.param(w2)
    params = {"W1": W1, "W2": W2}
    if kind == "sgd":
        opt = ng.optim.SGD(params, lr=ng.optim.schedules.cosine(0.05, 4, warmup=1, final=0.01),
                           momentum=0.9, weight_decay=0.01, accumulate_steps=K,
                           average="samples", max_grad_norm=0.5, nonfinite="skip")
    else:
        opt = ng.optim.AdamW(params, lr=ng.optim.schedules.step(0.02, every=1, gamma=0.7),
                             weight_decay=0.05, accumulate_steps=K, average="samples",
                             max_grad_norm=0.5, nonfinite="skip")
    return W1, W2, opt


# Micro-steps of 1-3 samples. The third carries a NaN and closes the first
# window, which is skipped; a flush closes the second after two micro-steps;
# the run ends one micro-step into its fourth window.
OPS = ["step", "step", "step-nan", "step", "step", "flush", "step", "step", "step", "step"]


def featured_batches():
    rng = np.random.default_rng(6)
    return [(rng.normal(size=(3, n)), rng.normal(size=(2, n))) for n in (1, 2, 3, 2, 1) * 2]


def run_ops(dev, W1, W2, opt, ops, data, spelling):
    for op, (x, y) in zip(ops, data):
        if op == "flush":
            assert opt.flush() is True
            continue
        if op == "step-nan":
            x = x.copy()
            x[0, 0] = np.nan
        with ng.grad_tape():
            loss = ng.mse_loss(W2 @ (W1 @ dev.tensor(x)), dev.tensor(y), reduction="sum")
        if spelling == "grad":
            loss.backward()
            grads = None
        else:
            grads = ng.backward(loss)
        if op == "step-nan":
            with pytest.warns(RuntimeWarning, match="non-finite"):
                assert opt.step(grads, samples=x.shape[1]) is False
        else:
            opt.step(grads, samples=x.shape[1])


@pytest.mark.parametrize("kind", ["sgd", "adamw"])
@pytest.mark.parametrize("spelling", ["grad", "mapping"])
def test_featured_runs_resume_bit_identically_at_every_position(dev, kind, spelling):
    rng = np.random.default_rng(8)
    w1, w2 = rng.normal(size=(4, 3)), rng.normal(size=(2, 4))
    data = featured_batches()[:len(OPS)]
    W1, W2, opt = build_featured(dev, kind, w1, w2)
    run_ops(dev, W1, W2, opt, OPS, data, spelling)
    final = (W1.numpy(), W2.numpy(), opt.t, opt.skipped, opt.last_grad_norm)
    assert (opt.t, opt.skipped, opt.pending_steps) == (2, 1, 1)

    positions = range(1, len(OPS)) if dev.name == "cpu" else (3, 5)
    for stop in positions:
        W1, W2, opt = build_featured(dev, kind, w1, w2)
        run_ops(dev, W1, W2, opt, OPS[:stop], data[:stop], spelling)
        state, s1, s2 = pickle.loads(pickle.dumps((opt.state_dict(), W1.numpy(), W2.numpy())))
        R1, R2, resumed = build_featured(dev, kind, s1, s2)
        resumed.load_state_dict(state)
        assert (resumed.pending_samples, resumed.pending_steps) == \
            (opt.pending_samples, opt.pending_steps)
        run_ops(dev, R1, R2, resumed, OPS[stop:], data[stop:], spelling)
        np.testing.assert_array_equal(R1.numpy(), final[0], err_msg=f"resumed after {stop}")
        np.testing.assert_array_equal(R2.numpy(), final[1], err_msg=f"resumed after {stop}")
        assert (resumed.t, resumed.skipped, resumed.last_grad_norm) == final[2:]


def test_schedules_are_saved_by_value_and_callables_by_name():
    W = ng.param(np.ones((2, 2)))
    sched = ng.optim.schedules.cosine(0.1, 10, warmup=2)
    state = ng.optim.SGD([W], lr=sched, max_grad_norm=1.0, nonfinite="ignore",
                         average="samples", weight_decay=0.2).state_dict()
    assert state["hyper"]["lr"] == {"schedule": "cosine", "peak": 0.1, "total_updates": 10,
                                    "warmup": 2, "final": 0.0}
    other = ng.optim.SGD([ng.param(np.ones((2, 2)))], lr=0.5)
    other.load_state_dict(state)
    assert other._lr == sched and other.lr == sched(0)
    assert (other.max_grad_norm, other.nonfinite, other.average, other.weight_decay) == \
        (1.0, "ignore", "samples", 0.2)

    def my_schedule(t):
        return 0.1 * 0.9 ** t

    with pytest.warns(RuntimeWarning, match=r"lr is the callable .*my_schedule, which a "
                                            r"state dict cannot hold"):
        state = ng.optim.Adam([ng.param(np.ones(2))], lr=my_schedule).state_dict()
    assert state["hyper"]["lr"]["schedule"] == "callable"
    plain = ng.optim.Adam([ng.param(np.ones(2))], lr=0.1)
    with pytest.raises(ValueError, match="lr was the callable .*my_schedule, which was not "
                                         "saved; build this optimizer with that callable"):
        plain.load_state_dict(state)
    assert plain.lr == 0.1

    def same(t):
        return 0.1 * 0.9 ** t

    again = ng.optim.Adam([ng.param(np.ones(2))], lr=same)
    again.load_state_dict(state)
    assert again._lr is same


def test_old_state_dicts_without_the_new_fields_still_load():
    W = ng.param(np.ones((2, 2)))
    opt = ng.optim.SGD([W], lr=0.1, momentum=0.9, accumulate_steps=2)
    state = opt.state_dict()
    for key in ("samples", "skipped", "last_grad_norm"):
        del state[key]
    for key in ("max_grad_norm", "nonfinite", "weight_decay"):
        del state["hyper"][key]
    other = ng.optim.SGD([ng.param(np.ones((2, 2)))], lr=0.5, momentum=0.5, accumulate_steps=3)
    other.load_state_dict(state)
    assert (other.lr, other.momentum, other.accumulate_steps, other.weight_decay) == \
        (0.1, 0.9, 2, 0.0)

"""ng.dropout and numbagrad's generator: PyTorch's formula, the seed, fresh masks
per micro-step and per compiled call, resuming mid-window, both devices."""

import numpy as np
import pytest
import torch

import numbagrad as ng
from numbagrad.compile import GraphChangedError
from conftest import cuda_dev, cuda_launches

TOL = {np.float32: dict(rtol=1e-5, atol=1e-6), np.float64: dict(rtol=1e-9, atol=1e-12)}


def host(a):
    return a.copy_to_host() if hasattr(a, "copy_to_host") else np.asarray(a)


def counter(device="cpu"):
    return ng.random.get_state()["counters"].get(device, 0)


@pytest.mark.parametrize("dt", [np.float32, np.float64], ids=["f32", "f64"])
def test_values_and_gradient_follow_torchs_formula(dev, dt):
    rng = np.random.default_rng(0)
    x0 = rng.uniform(0.5, 1.5, size=(3, 7)).astype(dt)      # no zeros: out == 0 is the mask
    g0 = rng.normal(size=(3, 7)).astype(dt)
    p = 0.3
    ng.manual_seed(1)
    x = dev.param(x0)
    with ng.grad_tape():
        out = ng.dropout(x, p)
        loss = (out * dev.tensor(g0)).sum()
    grads = ng.backward(loss)
    got = out.numpy()
    assert got.dtype == dt and got.shape == x0.shape
    keep = got != 0
    assert 0 < keep.sum() < keep.size
    tx = torch.tensor(x0, requires_grad=True)
    want = tx * torch.tensor(keep.astype(dt)) / (1 - p)      # PyTorch's dropout for this mask
    (want * torch.tensor(g0)).sum().backward()
    np.testing.assert_allclose(got, want.detach().numpy(), **TOL[dt])
    np.testing.assert_allclose(host(grads[x.id]), tx.grad.numpy(), **TOL[dt])


def test_gradcheck_for_a_fixed_mask():
    x = ng.param(np.random.default_rng(2).normal(size=(4, 5)))

    def loss():
        ng.random.set_state({"seed": 7, "counters": {}})   # the same mask every evaluation
        return (ng.dropout(x, 0.4) * x).sum()

    ng.gradcheck(loss, [x])


def test_same_seed_same_bits_and_each_call_draws_a_new_mask(dev):
    x = dev.tensor(np.ones((4, 9)))
    ng.manual_seed(123)
    first = [ng.dropout(x, 0.5).numpy() for _ in range(3)]
    ng.manual_seed(123)
    again = [ng.dropout(x, 0.5).numpy() for _ in range(3)]
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(first[0], first[1]) and not np.array_equal(first[1], first[2])
    ng.manual_seed(124)
    assert not np.array_equal(ng.dropout(x, 0.5).numpy(), first[0])
    assert counter(dev.name) == 1


def test_fraction_of_zeros_is_within_a_binomial_bound(dev):
    n = 3000 if dev.name == "cpu" else 400
    x = dev.tensor(np.ones(n, np.float32))
    ng.manual_seed(5)
    for p in (0.1, 0.5, 0.8):
        out = ng.dropout(x, p).numpy()
        zeros = np.mean(out == 0)
        assert abs(zeros - p) < 4.5 * np.sqrt(p * (1 - p) / n), (p, zeros)
        np.testing.assert_allclose(out[out != 0], np.float32(1 / (1 - p)), rtol=1e-6)


def test_p0_and_eval_are_the_identity_and_p1_gives_zeros(dev):
    x = dev.param(np.arange(1.0, 7.0).reshape(2, 3))
    before = counter(dev.name)
    assert ng.dropout(x, 0.0) is x
    assert ng.dropout(x, 0.7, training=False) is x
    layer = ng.nn.Dropout(0.7)
    assert layer.eval()(x) is x and layer.training is False
    assert counter(dev.name) == before              # nothing drawn
    with ng.grad_tape():
        out = ng.dropout(x, 1.0)
        loss = (out * dev.tensor(np.ones((2, 3)))).sum()
    grads = ng.backward(loss)
    np.testing.assert_array_equal(out.numpy(), np.zeros((2, 3)))
    np.testing.assert_array_equal(host(grads[x.id]), np.zeros((2, 3)))
    assert ng.dropout(dev.tensor(np.zeros((0, 3))), 0.5).shape == (0, 3)


def test_bad_arguments_raise_before_anything_is_drawn():
    x = ng.tensor(np.ones((2, 2)))
    before = ng.random.get_state()
    for p in (-0.1, 1.5, float("nan"), "0.5", None):
        with pytest.raises(ValueError, match=r"dropout: p must be a probability in \[0, 1\]"):
            ng.dropout(x, p)
    with pytest.raises(TypeError, match="generator must be a NumPy Generator"):
        ng.dropout(x, 0.5, generator=np.random.RandomState(0))
    with pytest.raises(TypeError, match="training must be a bool"):
        ng.dropout(x, 0.5, training="yes")
    with pytest.raises(TypeError, match="boolean tensor"):
        ng.dropout(x > 0, 0.5)
    with pytest.raises(ValueError, match="Dropout: p must be"):
        ng.nn.Dropout(2)
    assert ng.random.get_state() == before


def test_random_state_is_checked_and_round_trips():
    ng.manual_seed(3)
    ng.dropout(ng.tensor(np.ones(5)), 0.5)
    state = ng.random.get_state()
    assert state["seed"] == 3 and state["counters"]["cpu"] == 1
    assert ng.random.initial_seed() == 3
    for bad, match in [({"seed": -1, "counters": {}}, r"\[0, 2\*\*64\)"),
                       ({"seed": 1.5, "counters": {}}, "must be an integer"),
                       ({"seed": 1, "counters": {"tpu": 0}}, "unknown device 'tpu'"),
                       ({"seed": 1}, "as get_state"), ([1, 2], "as get_state")]:
        with pytest.raises((ValueError, TypeError), match=match):
            ng.random.set_state(bad)
    assert ng.random.get_state() == state
    ng.manual_seed(-1)                                  # torch's rule: counts from 2**64
    assert ng.random.initial_seed() == 2 ** 64 - 1
    ng.random.set_state(state)
    assert ng.random.get_state() == state


def test_a_numpy_generator_is_the_callers_and_leaves_ngs_alone():
    x = ng.tensor(np.ones((3, 8)))
    before = ng.random.get_state()
    a = ng.dropout(x, 0.5, generator=np.random.default_rng(9)).numpy()
    b = ng.dropout(x, 0.5, generator=np.random.default_rng(9)).numpy()
    np.testing.assert_array_equal(a, b)
    gen = np.random.default_rng(9)
    layer = ng.nn.Dropout(0.5, generator=gen)
    np.testing.assert_array_equal(layer(x).numpy(), a)
    assert not np.array_equal(layer(x).numpy(), a)     # the generator advanced
    assert ng.random.get_state() == before


def test_a_compiled_step_refuses_a_numpy_generators_host_draw(tmp_path):
    W, gen = ng.param(np.ones((2, 3))), np.random.default_rng(0)
    step = ng.compile(lambda x: ng.dropout(W @ x, 0.5, generator=gen).sum(),
                      cache_dir=str(tmp_path))
    x = ng.tensor(np.ones((3, 4)))
    step(x)
    with pytest.raises(GraphChangedError, match="created inside fn"):
        step(x)


# ------------------------------------------------------------ training loops
def _model(seed=0):
    rng = np.random.default_rng(seed)
    model = ng.nn.Sequential(ng.nn.Linear(6, 8, rng=rng), ng.nn.ReLU(), ng.nn.Dropout(0.5),
                             ng.nn.Linear(8, 1, rng=rng))
    return model, ng.optim.Adam(model.parameters(), lr=0.01, accumulate_steps=3)


def _batches(n=7):
    rng = np.random.default_rng(1)
    return [(ng.tensor(rng.normal(size=(4, 6))), ng.tensor(rng.normal(size=(4, 1))))
            for _ in range(n)]


def _eager(model, opt, batches):
    losses = []
    for x, y in batches:
        with ng.grad_tape():
            loss = ng.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_micro_steps_of_a_window_draw_fresh_masks():
    model, opt = _model()
    x, y = _batches(1)[0]
    ng.manual_seed(0)
    grads = []
    for _ in range(2):                    # two micro-steps of one window, the same batch
        with ng.grad_tape():
            loss = ng.mse_loss(model(x), y)
        grads.append(ng.backward(loss)[model[0].weight.id].copy())
        opt.step()
    assert not np.array_equal(grads[0], grads[1])


def test_compiled_steps_draw_fresh_masks_bit_identical_to_eager(tmp_path):
    batches = _batches()
    model, opt = _model()
    ng.manual_seed(11)
    want = _eager(model, opt, batches)
    twin, topt = _model()
    ng.manual_seed(11)
    step = ng.compile(lambda x, y: ng.mse_loss(twin(x), y), optimizer=topt,
                      cache_dir=str(tmp_path))
    got = [step(x, y).item() for x, y in batches]
    assert step.stats[0]["mode"] == "njit"
    assert got == want                                  # bit-identical, verify calls included
    for a, b in zip(model.parameters(), twin.parameters()):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert ng.random.get_state()["counters"]["cpu"] == len(batches)
    x, y = batches[0]                                   # the same batch: a new mask each call
    assert len({step(x, y).item() for _ in range(3)}) == 3


def test_a_run_resumed_mid_window_continues_bit_identically(tmp_path):
    batches = _batches()
    model, opt = _model()
    ng.manual_seed(21)
    want = _eager(model, opt, batches)
    model, opt = _model()
    ng.manual_seed(21)
    first = _eager(model, opt, batches[:4])            # 4 micro-steps: mid-window (k = 3)
    path = str(tmp_path / "ck.npz")
    ng.save(path, {"model": model.state_dict(), "opt": opt.state_dict(),
                   "random": ng.random.get_state()})
    ng.manual_seed(999)                                 # anything in between is forgotten
    ng.dropout(ng.tensor(np.ones(3)), 0.5)
    state = ng.load(path)
    model, opt = _model(seed=5)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    ng.random.set_state(state["random"])
    assert first + _eager(model, opt, batches[4:]) == want


# ------------------------------------------------------------ CUDA
def test_cuda_dropout_one_launch_each_way_and_the_counter_advances_once():
    dev = cuda_dev()
    x = dev.param(np.ones((5, 7), np.float32))        # several blocks of the simulator's grid
    ng.dropout(x, 0.5)                                  # the device's state array exists now
    ng.manual_seed(4)
    before = counter("cuda")
    copies = ng.cuda.transfer_count()
    assert cuda_launches(lambda t: ng.dropout(t, 0.5), x) == (1, 1)
    assert ng.cuda.transfer_count() == copies + 1      # cuda_launches' gradient upload only
    assert counter("cuda") == before + 1
    a, b = ng.dropout(x, 0.5).numpy(), ng.dropout(x, 0.5).numpy()
    assert counter("cuda") == before + 3 and not np.array_equal(a, b)
    ng.manual_seed(4)
    ng.dropout(x, 0.5)
    np.testing.assert_array_equal(ng.dropout(x, 0.5).numpy(), a)


def test_cuda_compiled_replays_draw_fresh_masks(tmp_path):
    dev = cuda_dev()
    W = dev.param(np.full((2, 3), 0.5, np.float32))
    x = dev.tensor(np.ones((3, 4), np.float32))
    y = dev.tensor(np.zeros((2, 4), np.float32))
    step = ng.compile(lambda a, b: ng.mse_loss(ng.dropout(W @ a, 0.5), b), verify=False,
                      cache_dir=str(tmp_path))
    ng.manual_seed(8)
    losses = [step(x, y).item() for _ in range(4)]
    assert step.stats[0]["mode"] == "replay" and counter("cuda") == 4
    assert len(set(losses)) > 1

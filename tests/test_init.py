"""ng.nn.init against torch.nn.init's gains, fans and bounds; sample statistics
within tolerances a wrong formula would break."""
import math

import numpy as np
import pytest
import torch

import numbagrad as ng

init = ng.nn.init
SHAPES = [(64, 48), (32, 8, 3, 3), (16, 4, 2, 3, 3)]


def test_calculate_gain_is_torchs():
    for name in ["linear", "conv1d", "conv2d", "conv3d", "conv_transpose2d", "sigmoid", "tanh",
                 "relu", "selu"]:
        assert init.calculate_gain(name) == torch.nn.init.calculate_gain(name), name
    for slope in (None, 0, 0.2, 3):
        assert init.calculate_gain("leaky_relu", slope) == pytest.approx(
            torch.nn.init.calculate_gain("leaky_relu", slope), rel=1e-15)
    with pytest.raises(ValueError, match="unsupported nonlinearity 'gelu'"):
        init.calculate_gain("gelu")
    with pytest.raises(ValueError, match="negative_slope"):
        init.calculate_gain("leaky_relu", "a")


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_fans_and_uniform_bounds_are_torchs(shape):
    fan_in, fan_out = torch.nn.init._calculate_fan_in_and_fan_out(torch.empty(shape))
    assert init._fans(ng.param(np.zeros(shape)), "test") == (fan_in, fan_out)
    cases = [
        (lambda t, g: init.xavier_uniform_(t, gain=2.0, generator=g),
         2.0 * math.sqrt(6.0 / (fan_in + fan_out))),
        (lambda t, g: init.kaiming_uniform_(t, a=math.sqrt(5), generator=g),
         torch.nn.init.calculate_gain("leaky_relu", math.sqrt(5)) * math.sqrt(3.0 / fan_in)),
        (lambda t, g: init.kaiming_uniform_(t, mode="fan_out", nonlinearity="relu", generator=g),
         math.sqrt(2.0) * math.sqrt(3.0 / fan_out)),
    ]
    for fill, bound in cases:
        w = ng.param(np.zeros(shape, np.float32))
        values = fill(w, np.random.default_rng(0)).numpy()
        assert np.abs(values).max() <= np.float32(bound)
        assert np.abs(values).max() > 0.98 * bound              # the whole interval is used
        assert abs(values.std() / (bound / math.sqrt(3)) - 1) < 0.05


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_normal_initialisers_have_torchs_std(shape):
    fan_in, fan_out = torch.nn.init._calculate_fan_in_and_fan_out(torch.empty(shape))
    cases = [
        (lambda t, g: init.xavier_normal_(t, gain=0.5, generator=g),
         0.5 * math.sqrt(2.0 / (fan_in + fan_out))),
        (lambda t, g: init.kaiming_normal_(t, nonlinearity="tanh", generator=g),
         5.0 / 3 / math.sqrt(fan_in)),
        (lambda t, g: init.kaiming_normal_(t, mode="fan_out", generator=g),
         math.sqrt(2.0 / (1 + 0.01 ** 2)) / math.sqrt(fan_out)),
        (lambda t, g: init.normal_(t, 0.5, 0.1, generator=g), 0.1),
    ]
    for fill, std in cases:
        values = fill(ng.param(np.zeros(shape)), np.random.default_rng(1)).numpy()
        n = values.size
        assert abs(values.std() / std - 1) < 5 / math.sqrt(2 * n)    # std's sampling error
    torch.manual_seed(0)    # torch's own sample agrees (a check of the formula above)
    t = torch.nn.init.kaiming_normal_(torch.empty(shape), nonlinearity="tanh")
    assert abs(float(t.std()) / (5.0 / 3 / math.sqrt(fan_in)) - 1) < 5 / math.sqrt(2 * t.numel())


def test_trunc_normal_stays_in_bounds_with_torchs_statistics():
    shape = (200, 100)
    w = init.trunc_normal_(ng.param(np.zeros(shape)), mean=0.3, std=1.0, a=-0.5, b=1.5,
                           generator=np.random.default_rng(2)).numpy()
    assert w.min() >= -0.5 and w.max() <= 1.5
    torch.manual_seed(0)
    t = torch.nn.init.trunc_normal_(torch.empty(shape, dtype=torch.float64), mean=0.3, std=1.0,
                                    a=-0.5, b=1.5).numpy()
    assert abs(w.mean() - t.mean()) < 0.02 and abs(w.std() - t.std()) < 0.02
    with pytest.warns(UserWarning, match="more than 2 std"):
        init.trunc_normal_(ng.param(np.zeros(3)), mean=10.0, std=1.0, a=-2, b=2)
    with pytest.raises(ValueError, match="a < b"):
        init.trunc_normal_(ng.param(np.zeros(3)), a=1, b=0)


def test_simple_fills_and_uniform(dev):
    w = dev.param(np.zeros((3, 4), np.float32))
    data = w.data
    assert init.constant_(w, 0.25) is w and w.data is data          # in place
    np.testing.assert_array_equal(w.numpy(), np.full((3, 4), 0.25, np.float32))
    np.testing.assert_array_equal(init.ones_(w).numpy(), 1)
    np.testing.assert_array_equal(init.zeros_(w).numpy(), 0)
    u = init.uniform_(w, -2, 3, generator=np.random.default_rng(4)).numpy()
    assert u.min() >= -2 and u.max() < 3 and u.dtype == np.float32
    np.testing.assert_array_equal(
        u, np.random.default_rng(4).uniform(-2, 3, (3, 4)).astype(np.float32))   # same seed


def test_init_writes_into_a_param_an_optimizer_holds():
    w = ng.param(np.zeros((4, 3)))
    opt = ng.optim.SGD([w], lr=1.0)
    init.xavier_uniform_(w, generator=np.random.default_rng(0))
    want = w.numpy()
    assert want.any()
    with ng.grad_tape():
        loss = (w * ng.tensor(np.ones((4, 3)))).sum()
    loss.backward()
    opt.step()
    np.testing.assert_allclose(w.numpy(), want - 1.0)      # the update saw the new values


def test_bad_input_raises_and_changes_nothing():
    w = ng.param(np.ones(5))
    with pytest.raises(ValueError, match="fewer than 2 dims"):
        init.xavier_uniform_(w)
    with pytest.raises(ValueError, match="fewer than 2 dims"):
        init.kaiming_normal_(w)
    w2 = ng.param(np.ones((2, 2)))
    with pytest.raises(ValueError, match="mode 'fan_avg' is not supported"):
        init.kaiming_uniform_(w2, mode="fan_avg")
    with pytest.raises(TypeError, match="generator must be a NumPy Generator"):
        init.normal_(w2, generator=0)
    with pytest.raises(TypeError, match="expected an ng Tensor"):
        init.zeros_(np.zeros(3))
    with pytest.raises(ValueError, match="a .* must not exceed b"):
        init.uniform_(w2, 1, 0)
    with pytest.raises(ValueError, match="std must be >= 0"):
        init.normal_(w2, 0, -1)
    np.testing.assert_array_equal(w.numpy(), 1)
    np.testing.assert_array_equal(w2.numpy(), 1)
    with pytest.warns(UserWarning, match="no elements"):
        init.kaiming_uniform_(ng.param(np.zeros((0, 3))))

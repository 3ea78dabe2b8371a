"""Creation ops (ops/creation.py) against NumPy and PyTorch, on both devices."""
from __future__ import annotations

import numpy as np
import pytest

import numbagrad as ng

torch = pytest.importorskip("torch")


def host(t):
    return t.numpy() if t.device == "cpu" else ng.kernels.to_host(t._kern, t._data)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_filled_and_ranged_ones_match_torch(dev, dtype):
    d = dev.name
    tdt = torch.float32 if dtype == np.float32 else torch.float64
    cases = [
        (ng.zeros(2, 3, dtype=dtype, device=d), torch.zeros(2, 3, dtype=tdt)),
        (ng.ones((4,), dtype=dtype, device=d), torch.ones((4,), dtype=tdt)),
        (ng.full((2, 0, 3), 7.5, dtype=dtype, device=d), torch.full((2, 0, 3), 7.5, dtype=tdt)),
        (ng.arange(5, dtype=dtype, device=d), torch.arange(5, dtype=tdt)),
        (ng.arange(-1, 1, 0.3, dtype=dtype, device=d), torch.arange(-1, 1, 0.3, dtype=tdt)),
        (ng.arange(3, -2, -0.5, dtype=dtype, device=d), torch.arange(3, -2, -0.5, dtype=tdt)),
        (ng.linspace(-1, 2.5, 7, dtype=dtype, device=d), torch.linspace(-1, 2.5, 7, dtype=tdt)),
        (ng.linspace(0.1, 0.7, 10, dtype=dtype, device=d),
         torch.linspace(0.1, 0.7, 10, dtype=tdt)),
        (ng.linspace(3, 4, 1, dtype=dtype, device=d), torch.linspace(3, 4, 1, dtype=tdt)),
        (ng.linspace(3, 4, 0, dtype=dtype, device=d), torch.linspace(3, 4, 0, dtype=tdt)),
        (ng.eye(3, dtype=dtype, device=d), torch.eye(3, dtype=tdt)),
        (ng.eye(2, 4, dtype=dtype, device=d), torch.eye(2, 4, dtype=tdt)),
    ]
    # (arange and linspace: within an ulp or two of PyTorch's, whose vectorised
    # and float32 kernels round otherwise than start + i * step in float64)
    rtol = 3e-7 if dtype == np.float32 else 1e-15
    for got, want in cases:
        assert got.shape == tuple(want.shape) and got.dtype == dtype and got.device == d
        np.testing.assert_allclose(host(got), want.numpy(), rtol=rtol, atol=1e-15)


def test_like_forms_take_shape_dtype_and_device(dev):
    x = dev.tensor(np.ones((2, 3), np.float32))
    for fn, value in ((ng.zeros_like, 0.0), (ng.ones_like, 1.0),
                      (lambda t, **k: ng.full_like(t, -2.0, **k), -2.0)):
        y = fn(x)
        assert (y.shape, y.dtype, y.device) == ((2, 3), np.float32, dev.name)
        np.testing.assert_array_equal(host(y), np.full((2, 3), value, np.float32))
        assert fn(x, dtype=np.float64).dtype == np.float64
        assert fn(x, device="cpu").device == "cpu"
    assert ng.empty_like(x).shape == (2, 3)
    assert ng.rand_like(x).dtype == np.float32 and ng.randn_like(x).device == dev.name


def test_default_dtype_and_requires_grad():
    ng.set_default_dtype(np.float32)
    try:
        assert ng.zeros(2).dtype == np.float32 and ng.rand(2).dtype == np.float32
    finally:
        ng.set_default_dtype(np.float64)
    w = ng.zeros(3, requires_grad=True)
    assert w.requires_grad
    with ng.grad_tape():
        loss = ng.sum(w * 2.0)
    loss.backward()
    np.testing.assert_array_equal(w.grad, [2.0, 2.0, 2.0])


def test_the_random_ones_are_reproducible_from_the_seed_and_fresh_per_call(dev):
    d = dev.name
    ng.manual_seed(5)
    a, b = host(ng.rand(3, 4, device=d)), host(ng.rand(3, 4, device=d))
    ng.manual_seed(5)
    np.testing.assert_array_equal(host(ng.rand(3, 4, device=d)), a)
    assert not np.array_equal(a, b)
    assert ((a >= 0) & (a < 1)).all()
    ng.manual_seed(5)
    n1 = host(ng.randn(7, device=d))
    ng.manual_seed(5)
    np.testing.assert_array_equal(host(ng.normal(1.0, 0.0, (7,), device=d)), np.ones(7))
    ng.manual_seed(5)
    np.testing.assert_allclose(host(ng.normal(1.0, 2.0, (7,), device=d)), 1.0 + 2.0 * n1,
                               rtol=1e-15)


def test_both_devices_draw_the_same_numbers_from_one_state():
    if not ng.cuda_available():
        pytest.skip("CUDA unusable here")
    out = {}
    for d in ("cpu", "cuda"):
        ng.manual_seed(11)
        out[d] = (host(ng.rand(33, device=d)), host(ng.randn(33, dtype=np.float32, device=d)))
    np.testing.assert_array_equal(out["cpu"][0], out["cuda"][0])
    np.testing.assert_allclose(out["cpu"][1], out["cuda"][1], rtol=1e-6)


def test_the_draws_have_the_right_distribution():
    ng.manual_seed(0)
    u = ng.rand(100_000).numpy()
    z = ng.randn(100_000).numpy()
    u32 = ng.rand(100_000, dtype=np.float32).numpy()
    # standard errors: 0.0009 (uniform mean), 0.003 (normal mean and std)
    assert abs(u.mean() - 0.5) < 0.005 and abs(u.var() - 1 / 12) < 0.002
    assert abs(z.mean()) < 0.015 and abs(z.std() - 1) < 0.015
    assert abs(np.mean(np.abs(z) < 1) - 0.6827) < 0.01
    assert u32.max() < 1 and u32.min() >= 0 and abs(u32.mean() - 0.5) < 0.005
    # 53 random bits in float64: no two of 100,000 draws collide
    assert np.unique(u).size == u.size


def test_bad_arguments_name_the_problem():
    with pytest.raises(ValueError, match="zeros: sizes must be >= 0"):
        ng.zeros(2, -1)
    with pytest.raises(TypeError, match="ones: sizes must be integers"):
        ng.ones(2.5)
    with pytest.raises(TypeError, match="zeros: tensors hold .* not complex128"):
        ng.zeros(2, dtype=np.complex128)
    with pytest.raises(TypeError, match="ones: only float tensors can require gradients, not "
                                        "int64"):
        ng.ones(2, dtype=np.int64, requires_grad=True)
    with pytest.raises(ValueError, match="arange: step"):
        ng.arange(0, 5, -1)
    with pytest.raises(ValueError, match="step non-zero"):
        ng.arange(0, 5, 0)
    with pytest.raises(ValueError, match="normal: std"):
        ng.normal(0.0, -1.0, (2,))
    with pytest.raises(TypeError, match="full: fill_value"):
        ng.full((2,), "x")
    with pytest.raises(TypeError, match="requires_grad must be a bool"):
        ng.zeros(2, requires_grad=1)


def test_a_compiled_step_draws_fresh_numbers_each_call():
    w = ng.param(np.zeros(4))
    opt = ng.optim.SGD([w], lr=0.1)

    def step():
        noise = ng.rand(4) + ng.zeros(4) + ng.ones(4)
        return ng.sum((w - noise) * (w - noise))

    compiled = ng.compile(step, opt)
    ng.manual_seed(3)
    first = [compiled().item() for _ in range(3)]
    w.data = np.zeros(4)
    ng.manual_seed(3)
    again = [compiled().item() for _ in range(3)]
    assert first == again and len(set(first)) == 3


def test_randint_multinomial_and_one_hot(dev):
    d = dev.name
    host = ng.kernels.get(d).to_host if d != "cpu" else np.asarray
    ng.manual_seed(1)
    r = host(ng.randint(-3, 4, (2000,), device=d))
    assert r.dtype == np.int64 and r.min() == -3 and r.max() == 3
    assert abs(np.mean(r == 0) - 1 / 7) < 0.03
    probs = np.array([[0.1, 0.0, 0.6, 0.3], [1.0, 1.0, 0.0, 2.0]])
    picks = host(ng.multinomial(dev.tensor(probs), 3))
    assert picks.shape == (2, 3)
    for row, p in zip(picks, probs):
        assert len(set(row)) == 3 and all(p[row] > 0)          # no class twice, none of p 0
    many = host(ng.multinomial(dev.tensor(probs), 4000, replacement=True))
    for row, p in zip(many, probs):
        freq = np.bincount(row, minlength=4) / row.size
        np.testing.assert_allclose(freq, p / p.sum(), atol=0.03)
    oh = ng.one_hot(np.array([[0, 2], [1, 0]]), 3, device=d)
    want = torch.nn.functional.one_hot(torch.tensor([[0, 2], [1, 0]]), 3).numpy()
    np.testing.assert_array_equal(host(oh._data), want)
    assert ng.one_hot(np.array([4])).shape == (1, 5)


def test_sampling_errors():
    with pytest.raises(ValueError, match="randint: high"):
        ng.randint(3, 3, (2,))
    with pytest.raises(ValueError, match="multinomial: 5 samples without replacement"):
        ng.multinomial(ng.tensor(np.ones(4)), 5)
    with pytest.raises(ValueError, match="multinomial: probs must be finite"):
        ng.multinomial(ng.tensor(np.array([0.5, -0.1])), 1)
    with pytest.raises(ValueError, match=r"one_hot: indices must lie in \[0, 2\)"):
        ng.one_hot(np.array([2]), 2)

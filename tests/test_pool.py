"""max_pool2d, avg_pool2d and adaptive_avg_pool2d and their layers against
PyTorch on both devices: values and gradients, padding, overlapping
windows, ties, bad input and CUDA launches. Also the buffer pool's byte
bound (``numbagrad.buffers``): cold keys are dropped."""
import itertools
import math

import numpy as np
import pytest

import numbagrad as ng
from conftest import cuda_dev, cuda_launches, inputs, matches_torch
from numbagrad import buffers

try:
    import torch
except ImportError:   # the comparisons with PyTorch skip; the rest still runs
    torch = None
F = None if torch is None else torch.nn.functional
needs_torch = pytest.mark.skipif(torch is None, reason="needs torch")

# (op, x shape, arguments, keyword arguments)
CASES = [
    ("max_pool2d", (2, 3, 6, 5), (2,), {}),
    ("max_pool2d", (2, 2, 5, 6), (3,), dict(stride=2, padding=1)),            # overlapping
    ("max_pool2d", (1, 2, 6, 6), ((3, 2),), dict(stride=(1, 2), padding=(1, 1),
                                                dilation=(2, 1))),
    ("max_pool2d", (3, 5, 4), (2,), dict(stride=1)),                            # unbatched
    ("avg_pool2d", (2, 3, 6, 5), (2,), {}),
    ("avg_pool2d", (2, 2, 5, 6), (3,), dict(stride=2, padding=1)),
    ("avg_pool2d", (1, 2, 5, 6), ((3, 2),), dict(stride=(2, 1), padding=(1, 1),
                                                count_include_pad=False)),
    ("avg_pool2d", (3, 5, 4), (2,), dict(stride=1)),
    ("adaptive_avg_pool2d", (2, 3, 7, 5), ((3, 2),), {}),
    ("adaptive_avg_pool2d", (2, 3, 4, 6), (4,), {}),                             # upsampling
    ("adaptive_avg_pool2d", (2, 5, 6), ((None, 4),), {}),
    ("adaptive_avg_pool2d", (1, 2, 5, 5), (1,), {}),
]


@needs_torch
@pytest.mark.parametrize("name, xs, args, kw", CASES, ids=[f"{c[0]}-{i}"
                                                           for i, c in enumerate(CASES)])
def test_pool_matches_torch(name, xs, args, kw):
    matches_torch(lambda x: getattr(ng, name)(x, *args, **kw),
                  lambda x: getattr(F, name)(x, *args, **kw), inputs([xs], seed=3), name=name)


@needs_torch
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("name, args, kw", [("max_pool2d", (2,), dict(stride=1, padding=1)),
                                            ("avg_pool2d", (3,), dict(stride=2, padding=1)),
                                            ("adaptive_avg_pool2d", ((2, 3),), {})])
def test_pool_on_both_devices(dev, dtype, name, args, kw):
    x = inputs([(1, 2, 3, 4)], seed=6)[0].astype(dtype)
    p, t = dev.param(x), torch.tensor(x, requires_grad=True)
    weights = np.random.default_rng(0).normal(size=getattr(F, name)(t, *args, **kw).shape)
    with ng.grad_tape():
        out = getattr(ng, name)(p, *args, **kw)
        loss = (out * dev.tensor(weights.astype(dtype))).sum()
    grads = ng.backward(loss)
    want = getattr(F, name)(t, *args, **kw)
    (want * torch.tensor(weights.astype(dtype))).sum().backward()
    tol = dict(rtol=1e-9, atol=1e-12) if dtype == np.float64 else dict(rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out.numpy(), want.detach().numpy(), **tol)
    np.testing.assert_allclose(dev.host(grads[p.id]), t.grad.numpy(), **tol)


@pytest.mark.parametrize("name, args", [("max_pool2d", (2, 1, 1)), ("avg_pool2d", (3, 2, 1)),
                                        ("adaptive_avg_pool2d", ((2, 2),))])
def test_pool_gradcheck(dev, name, args):
    x = dev.param(inputs([(1, 2, 3, 3)], seed=7)[0])
    weights = dev.tensor(np.random.default_rng(1).normal(
        size=getattr(ng, name)(x, *args).shape))
    ng.gradcheck(lambda: (getattr(ng, name)(x, *args) * weights).sum(), [x],
                 directions=None if dev.name == "cpu" else 2)


@needs_torch
def test_max_pool_ties_padding_and_nan_follow_torch(dev):
    # ties: the gradient goes to the first max of each window in row-major
    # order (PyTorch's CPU kernel); padding is -inf, so all-negative windows
    # at the border never return 0; a nan is the max
    x = np.array([[[[1.0, 1.0, 0.0], [1.0, -2.0, -3.0], [-5.0, -4.0, np.nan]]]])
    p, t = dev.param(x), torch.tensor(x, requires_grad=True)
    with ng.grad_tape():
        out = ng.max_pool2d(p, 2, stride=1, padding=1)
        loss = out.sum()
    grads = ng.backward(loss)
    want = F.max_pool2d(t, 2, stride=1, padding=1)
    want.sum().backward()
    np.testing.assert_array_equal(out.numpy(), want.detach().numpy())
    np.testing.assert_array_equal(dev.host(grads[p.id]), t.grad.numpy())
    assert dev.host(grads[p.id])[0, 0, 0, 0] == 4     # each window of the tied 1s: the first


# ------------------------------------------------------------ bad input
BAD = [
    (lambda x: ng.max_pool2d(x, 0), ValueError, "kernel_size must be >= 1"),
    (lambda x: ng.max_pool2d(x, (2, 2, 2)), TypeError, "tuple of 2 ints"),
    (lambda x: ng.max_pool2d(x, 2, padding=2), ValueError, "at most half of kernel_size"),
    (lambda x: ng.avg_pool2d(x, 5), ValueError, "too small"),
    (lambda x: ng.max_pool2d(x, 2, stride=0), ValueError, "stride must be >= 1"),
    (lambda x: ng.max_pool2d(x[0, 0], 2), ValueError, "must be 3-D .unbatched. or 4-D"),
    (lambda x: ng.adaptive_avg_pool2d(x, 0), ValueError, "output_size must be >= 1"),
    (lambda x: ng.adaptive_avg_pool2d(x, (1, 2, 3)), TypeError, "int or a pair"),
]


@pytest.mark.parametrize("case", range(len(BAD)))
def test_bad_input_raises_before_anything_changes(case):
    fn, kind, words = BAD[case]
    x = ng.param(np.ones((2, 3, 4, 4)))
    with ng.grad_tape():
        with pytest.raises(kind, match=words) as info:
            fn(x)
    assert "pool2d" in str(info.value)
    assert x.grad is None and np.all(x.numpy() == 1)


# ------------------------------------------------------------ layers
@needs_torch
@pytest.mark.parametrize("kind, args, kw", [
    ("MaxPool2d", (3,), dict(stride=2, padding=1)),
    ("AvgPool2d", (2,), dict(stride=1, count_include_pad=False)),
    ("AdaptiveAvgPool2d", ((2, 3),), {}),
])
def test_pool_layers_match_torch(kind, args, kw):
    x = inputs([(2, 3, 5, 6)], seed=2)[0]
    mine, ref = getattr(ng.nn, kind)(*args, **kw), getattr(torch.nn, kind)(*args, **kw)
    assert mine.state_dict() == {}
    np.testing.assert_allclose(mine(ng.tensor(x)).numpy(), ref(torch.tensor(x)).numpy(),
                               rtol=1e-12)


# ------------------------------------------------------------ CUDA launches
def test_cuda_launch_bound():
    dev = cuda_dev()
    x = dev.param(inputs([(1, 2, 4, 4)])[0])
    for f in (lambda t: ng.max_pool2d(t, 2), lambda t: ng.avg_pool2d(t, 3, 1, 1),
              lambda t: ng.adaptive_avg_pool2d(t, 3)):
        assert cuda_launches(f, x) == (1, 1)    # one kernel forward, one for the gradient


# ------------------------------------------------------------ the buffer pool's byte bound
F64 = np.dtype(np.float64)
needs_pooling = pytest.mark.skipif(buffers.IDLE_REFS is None,
                                   reason="pooling is off (NUMBAGRAD_NO_POOL=1)")


def pooled_data_bytes() -> int:
    """The data bytes of every array this thread's pool holds, counted afresh."""
    return sum(a.nbytes for pool in buffers._local.free.values() for a in pool)


def charged_bytes() -> int:
    """What the pool should be charging for them: data plus a fixed cost per array."""
    return sum(a.nbytes + buffers._OBJECT_BYTES
               for pool in buffers._local.free.values() for a in pool)


@pytest.fixture
def small_pool(monkeypatch):
    """A pool bounded at 4.5 arrays of 1000 float64, empty to begin with and at the end."""
    each = 8000 + getattr(buffers, "_OBJECT_BYTES", 0)
    bound = 4 * each + each // 2
    monkeypatch.setattr(buffers, "MAX_BYTES", bound, raising=False)
    buffers.clear()
    yield bound
    buffers.clear()


@needs_pooling
def test_pool_stays_under_its_bound_dropping_cold_keys(small_pool):
    cpu = ng.kernels.get("cpu")
    shapes = [s for rank in (1, 2, 3) for s in itertools.product(
        [1, 2, 4, 5, 8, 10, 20, 25, 40, 50, 100, 125, 200, 250, 500, 1000], repeat=rank)
        if math.prod(s) == 1000]                  # many keys of 8000 bytes each
    hot, rest = shapes[0], shapes[1:40]
    buffers.take(cpu, hot, F64)
    kept = buffers.take(cpu, rest[0], F64)        # in use while its key is dropped
    kept[...] = 7.0
    for shape in rest:
        buffers.take(cpu, shape, F64)             # a new key, never used again
        first = buffers.take(cpu, hot, F64)       # the hot key: taken between every two
        again = buffers.take(cpu, hot, F64)       # `first` is held: a second array
        assert first is not again
        del first, again
        assert pooled_data_bytes() <= small_pool
    keys = [key[0] for key in buffers._local.free if key[2] is cpu]
    assert hot in keys and rest[0] not in keys    # the hot key stays, the cold ones went
    assert buffers._held_bytes() == charged_bytes() <= small_pool
    assert np.all(kept == 7.0)                    # dropped from the pool, still valid
    assert buffers.take(cpu, rest[0], F64) is not kept

    buffers.take(cpu, (small_pool,), np.uint8)    # alone past the bound: never pooled
    assert ((small_pool,), np.uint8, cpu) not in buffers._local.free
    assert buffers._held_bytes() == charged_bytes() <= small_pool


@needs_pooling
def test_a_step_larger_than_the_bound_keeps_reusing_the_part_that_fits(small_pool,
                                                                        monkeypatch):
    """Six keys a step, room for four: least-recently-used would drop each key
    just before its next use (six allocations a step); the pool keeps four."""
    cpu = ng.kernels.get("cpu")
    made = []
    empty = cpu.empty
    monkeypatch.setattr(cpu, "empty", lambda shape, dtype: made.append(shape) or
                        empty(shape, dtype))
    shapes = [(1000,), (2, 500), (4, 250), (5, 200), (8, 125), (10, 100)]
    per_step = []
    for _ in range(10):
        before = len(made)
        for shape in shapes:
            buffers.take(cpu, shape, F64)
        per_step.append(len(made) - before)
        assert pooled_data_bytes() <= small_pool
    assert per_step[0] == 6 and max(per_step[3:]) <= 2, per_step


@needs_pooling
def test_retire_and_clear_keep_the_count_exact(small_pool):
    cpu = ng.kernels.get("cpu")
    a = buffers.take(cpu, (1000,), F64)
    b = buffers.take(cpu, (1000,), F64)
    buffers.retire(cpu, a)
    assert buffers._held_bytes() == charged_bytes() == b.nbytes + buffers._OBJECT_BYTES
    buffers.clear()
    assert buffers._held_bytes() == charged_bytes() == 0


@needs_pooling
def test_training_over_many_batch_sizes_keeps_the_pool_bounded(monkeypatch):
    # The case, small: every step a new batch size, so new shapes. Unbounded,
    # the pool grew to 40 MiB here; a step at one batch size pools ~200 KiB, which
    # must still be reused.
    bound = 256 << 10
    monkeypatch.setattr(buffers, "MAX_BYTES", bound, raising=False)
    buffers.clear()
    rng = np.random.default_rng(0)
    model = ng.nn.Sequential(ng.nn.Linear(16, 64, rng=rng), ng.nn.Tanh(),
                             ng.nn.Linear(64, 4, rng=rng))
    opt = ng.optim.Adam(model.parameters(), lr=1e-2)

    def step(x, y):
        with ng.grad_tape():
            loss = ng.cross_entropy(model(ng.as_tensor(x)), y)
        loss.backward()
        opt.step()

    try:
        most = 0
        for batch in range(8, 400, 3):
            step(rng.normal(size=(batch, 16)), rng.integers(0, 4, batch))
            most = max(most, pooled_data_bytes())
        assert most <= bound, f"the pool grew to {most} bytes, bound {bound}"
        assert buffers._held_bytes() == charged_bytes() <= bound
        x, y = rng.normal(size=(128, 16)), rng.integers(0, 4, 128)
        for _ in range(3):
            step(x, y)
        before = {id(a) for pool in buffers._local.free.values() for a in pool}
        step(x, y)                                # a steady step: nothing new is pooled
        assert {id(a) for pool in buffers._local.free.values() for a in pool} == before
    finally:
        buffers.clear()

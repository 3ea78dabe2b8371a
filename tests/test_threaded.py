"""The CPU kernels' threaded twins (``foo_mt``, parallel=True): the same bits
as the serial kernels, picked by the op layer from ``kern.MT_MIN`` elements,
and recorded by ``ng.compile`` like any other kernel.

Shapes stay small (compiles of parallel kernels are slow): the spans and
blocks are ``SPAN`` elements, so a few thousand elements already make
several tasks, and the op-layer tests lower ``MT_MIN`` instead of growing
the tensors. Every operand is a C-contiguous 2-D array, so each kernel
compiles one overload per dtype.
"""
import numba
import numpy as np
import pytest

import numbagrad as ng
from numbagrad.kernels import cpu, cuda
from numbagrad.kernels import codes as S
from numbagrad.kernels.cpu import _threads

SPAN = _threads.SPAN
DTYPES = (np.float32, np.float64)
TWINS = ("unary", "unary_backward", "binary", "binary_backward", "sum_to", "axpby",
         "scaled_add", "softmax", "softmax_backward", "mse", "pointwise_loss", "cross_entropy",
         "group_norm", "group_norm_backward")


def rnorm(rng, shape, dtype):
    return rng.normal(size=shape).astype(dtype)


def both(name, args, *check):
    """Run serial and threaded ``name`` on fresh copies of the arrays in
    ``args`` (an array passed twice stays one array); the arrays at
    positions ``check`` must come out bit-equal."""
    results = []
    for kern in (getattr(cpu, name), getattr(cpu, name + "_mt")):
        copies = {}
        fresh = tuple(copies.setdefault(id(a), a.copy()) if isinstance(a, np.ndarray) else a
                      for a in args)
        assert kern(*fresh) is None
        results.append([fresh[i] for i in check])
    for serial, threaded in zip(*results):
        assert serial.dtype == threaded.dtype
        assert np.array_equal(serial, threaded, equal_nan=True), name


# Several spans/blocks in both directions: a tall block of rows, a wide row
# split into column blocks, and a shape whose blocks do not divide it.
SHAPES = ((3 * SPAN // 64 + 5, 64), (2, 2 * SPAN + 7))


@pytest.mark.parametrize("dt", DTYPES)
def test_elementwise_twins_give_the_serial_bits(dt):
    rng = np.random.default_rng(0)
    f = dt
    for shape in SHAPES:
        x = rnorm(rng, shape, dt)
        g = rnorm(rng, shape, dt)
        dest0 = rnorm(rng, shape, dt)
        # broadcast operands: a row, a column, a scalar (all C-contiguous)
        operands = (x, x[:1].copy(), x[:, :1].copy(), x[:1, :1].copy())
        for code, p in ((S.TANH, 0.0), (S.POW, 2.0), (S.LEAKY_RELU, 0.1), (S.RDIV_S, 3.0)):
            for xs in operands:
                for alpha, beta in ((1.0, 0.0), (0.5, 0.0), (0.5, 1.0)):
                    both("unary", (code, xs, dest0, f(p), f(alpha), f(beta)), 2)
            y = np.empty_like(x)
            cpu.unary(code, x, y, f(p), f(1), f(0))
            for beta in (0.0, 1.0):
                both("unary_backward", (code, x, y, g, dest0, beta, f(p)), 4)
        for code in (S.ADD, S.SUB, S.MUL, S.DIV):
            for b in operands:
                b = b + f(2)
                both("binary", (code, x, b, np.empty_like(x)), 3)
                for beta in (0.0, 1.0):
                    db0 = rnorm(rng, b.shape, dt)
                    both("binary_backward",
                         (code, x, b, g, dest0, beta, True, db0, beta, True),
                         4, 7)
                    both("binary_backward",   # one gradient only; the other is never written
                         (code, x, b, g, x, beta, False, db0, beta, True), 7)
            # x op x: one destination, written once per call (ops/elementwise.py)
            for first in (True, False):
                both("binary_backward",
                     (code, x, x, g, dest0, 1.0, first, dest0, 1.0, not first), 4)
        for beta in (0.0, 1.0):
            both("axpby", (0.3, x, beta, dest0), 3)
            both("scaled_add", (np.array(0.7, dt), x, beta, dest0), 3)


@pytest.mark.parametrize("dt", DTYPES)
def test_reduction_and_softmax_twins_give_the_serial_bits(dt):
    rng = np.random.default_rng(1)
    for shape in SHAPES + ((SPAN + 3, 1),):
        x = rnorm(rng, shape, dt)
        g = rnorm(rng, shape, dt)
        rows, cols = shape
        for out_shape in ((1, 1), (1, cols), (rows, 1), shape):
            out0 = rnorm(rng, out_shape, dt)
            for scale, beta in ((1.0, 0.0), (0.25, 1.0)):
                both("sum_to", (x, out0, scale, beta), 1)
        for axis in (0, 1):
            for log in (False, True):
                y = np.empty_like(x)
                both("softmax", (x, np.empty_like(x), axis, log), 1)
                cpu.softmax(x, y, axis, log)
                for beta in (0.0, 1.0):
                    both("softmax_backward", (y, g, g * 2, beta, axis, log), 2)


@pytest.mark.parametrize("dt", DTYPES)
def test_norm_twins_give_the_serial_bits(dt):
    """Layer norm (S == 1: eight partial sums a row) and group norm: the threaded
    twins split the rows into blocks (several here, the last one short), and a
    layer norm's weight and bias gradients into blocks of columns (99: the
    last one short)."""
    rng = np.random.default_rng(2)
    for shape in ((3 * SPAN // 64 + 5, 1, 64, 1), (SPAN // 99 + 7, 1, 99, 1),
                  (2 * SPAN // 12 + 3, 2, 3, 2)):
        n, g, k, _ = shape
        x, gout = rnorm(rng, shape, dt), rnorm(rng, shape, dt)
        w, b = rnorm(rng, (g, k), dt), rnorm(rng, (g, k), dt)
        mean, rstd = np.empty((n, g)), np.empty((n, g))
        for has_w in (True, False):
            both("group_norm", (x, w, b, np.empty_like(x), mean, rstd, 1e-5, has_w, has_w),
                 3, 4, 5)
        cpu.group_norm(x, w, b, np.empty_like(x), mean, rstd, 1e-5, True, True)
        dx0, dw0, db0 = rnorm(rng, shape, dt), rnorm(rng, (g, k), dt), rnorm(rng, (g, k), dt)
        for beta, need in ((0.0, True), (1.0, True), (1.0, False)):
            both("group_norm_backward", (x, w, gout, mean, rstd, dx0, beta, True, dw0, beta,
                                         need, db0, beta, need, True), 5, 8, 11)


@pytest.mark.parametrize("dt", DTYPES)
def test_full_sums_follow_the_fixed_span_order(dt):
    # Both twins add SPAN-element float64 partials in order: the result does
    # not depend on the thread count, and is the float64 sum to rounding.
    rng = np.random.default_rng(2)
    x = rnorm(rng, (5, 2 * SPAN + 1), dt)
    want = np.float64(0.0)
    flat = x.ravel().astype(np.float64)
    for lo in range(0, flat.size, SPAN):
        part = np.float64(0.0)
        for v in flat[lo:lo + SPAN]:
            part += v
        want += part
    out = np.empty((1, 1), dt)
    results = []
    for threads in (1, numba.config.NUMBA_NUM_THREADS):
        numba.set_num_threads(threads)
        try:
            cpu.sum_to_mt(x, out, 1.0, 0.0)
        finally:
            numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
        results.append(out.copy())
    cpu.sum_to(x, out, 1.0, 0.0)
    results.append(out.copy())
    assert all(np.array_equal(r, results[0]) for r in results)
    assert results[0][0, 0] == dt(want)


@pytest.mark.parametrize("dt", DTYPES)
def test_column_sums_add_row_after_row_in_the_dtype(dt):
    """A bias gradient (column sums) adds each row's scaled values into the
    running sums in the tensor's dtype, row after row, both twins: a NumPy
    loop of the same operations gives the same bits (wide-ranging values,
    so another order or width would show)."""
    rng = np.random.default_rng(12)
    for rows, cols in ((4099, 16), (7, 33), (1, 5)):
        x = (rng.normal(size=(rows, cols)) * 10.0 ** rng.integers(-6, 7, size=(rows, cols))
             ).astype(dt)
        for scale, beta in ((1.0, 0.0), (0.25, 0.5)):
            start = rng.normal(size=(1, cols)).astype(dt)
            s, b = dt(scale), dt(beta)
            want = s * x[0] if beta == 0 else b * start[0] + s * x[0]
            for r in range(1, rows):
                want = want + s * x[r]
            for name in ("sum_to", "sum_to_mt"):
                out = start.copy()
                getattr(cpu, name)(x, out, scale, beta)
                assert out.dtype == dt and np.array_equal(out[0], want), name


@pytest.mark.parametrize("dt", DTYPES)
def test_loss_twins_give_the_serial_bits(dt):
    rng = np.random.default_rng(3)
    for shape in SHAPES:
        x, t = rnorm(rng, shape, dt), rnorm(rng, shape, dt)
        t01 = rng.uniform(size=shape).astype(dt)
        for scale in (1.0, 1.0 / x.size):
            both("mse", (x, t, np.zeros((), dt), np.empty_like(x), scale), 2, 3)
            both("pointwise_loss",
                 (S.BCE_LOGITS, x, t01, np.zeros((), dt), np.empty_like(x), scale), 3, 4)
    for n, classes in ((3 * SPAN // 10 + 1, 10), (3, SPAN + 5)):
        logits = rnorm(rng, (n, classes), dt)
        labels = rng.integers(0, classes, size=n)
        both("cross_entropy",
             (logits, labels, np.zeros((), dt), np.empty_like(logits), 1.0 / n), 2, 3)


def test_float32_loss_gradients_are_float32_arithmetic():
    # scale arrives as a Python float and is rounded to float32 first: the
    # residual is float32(2 * scale) * d in float32, one rounding.
    rng = np.random.default_rng(4)
    f = np.float32
    x, t = rnorm(rng, (7, 9), f), rnorm(rng, (7, 9), f)
    resid, loss = np.empty_like(x), np.zeros((), f)
    scale = 1.0 / 3.0
    cpu.mse(x, t, loss, resid, scale)
    assert np.array_equal(resid, f(2.0 * scale) * (x - t))
    y = np.empty_like(x)
    cpu.axpby(0.1, x, 0.3, y := t.copy())
    assert np.array_equal(y, f(0.1) * x + f(0.3) * t)


def test_cuda_module_has_the_same_names():
    for name in TWINS:
        serial, threaded = cuda.KERNELS[name]
        assert threaded == serial and serial[0] is getattr(cuda, name)
        assert cpu.KERNELS[name][1] == (getattr(cpu, name + "_mt"), name + "_mt")
        assert isinstance(getattr(cpu, name + "_mt"), numba.core.registry.CPUDispatcher)
    assert cuda.MT_MIN > 2 ** 62


# ---------------------------------------------------------------- op layer
@pytest.fixture
def spy():
    """Records which of each twin the op layer called (name, threaded), as
    ``kernels.call`` reports it."""
    calls = []

    class Spy:
        def kernel(self, fn, name, args):
            base = name.removesuffix("_mt")
            if base in TWINS:
                calls.append((base, name != base))

        def allocated(self, array): ...
        def temp(self, kern, shape, dtype): return None
        def host_read(self): ...
        def host_copy(self, copy, source): ...

    with ng.kernels.observe(Spy()):
        yield calls


def mlp_run(dtype=np.float32, steps=2):
    """A small MLP with every threaded op on its path; its results."""
    rng = np.random.default_rng(5)
    x = rnorm(rng, (16, 24), dtype)
    labels = rng.integers(0, 6, size=16)
    target = rnorm(rng, (16, 6), dtype)
    model = ng.nn.Sequential(ng.nn.Linear(24, 32, dtype=dtype, rng=rng), ng.nn.Tanh(),
                             ng.nn.Linear(32, 6, dtype=dtype, rng=rng))
    opt = ng.optim.SGD(model.parameters(), lr=0.1)
    out = []
    for _ in range(steps):
        with ng.grad_tape():
            h = model(x)
            loss = (ng.cross_entropy(h, labels) + ng.mse_loss(h, target)
                    + ng.binary_cross_entropy_with_logits(h, ng.sigmoid(ng.tensor(target)))
                    + 0.1 * ng.mean(ng.log_softmax(h) * h)
                    + ng.sum(ng.relu(h.T) / 3.0))
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out, [p.numpy() for p in model.parameters()]


@pytest.mark.parametrize("dt", [np.float32])   # float64: the kernel tests above (compile time)
def test_the_op_layer_picks_the_twin_from_mt_min(monkeypatch, spy, dt):
    monkeypatch.setattr(cpu, "MT_MIN", _threads.NEVER)
    serial = mlp_run(dt)
    assert spy and not any(threaded for _, threaded in spy)
    used = {name for name, _ in spy}
    spy.clear()
    monkeypatch.setattr(cpu, "MT_MIN", 1)
    monkeypatch.setattr(cpu, "MT_MIN_MEMORY", 1)
    threaded = mlp_run(dt)
    # (tape.py accumulates gradients with axpby itself, outside the op layer,
    # and a bias gradient, column sums, always calls the serial sum_to)
    assert spy and all(threaded for name, threaded in spy if name not in ("axpby", "sum_to"))
    assert ("sum_to", True) in spy
    assert {name for name, _ in spy} == used
    assert {"unary", "unary_backward", "binary", "binary_backward", "sum_to", "softmax",
            "softmax_backward", "mse", "pointwise_loss", "cross_entropy"} <= used
    assert serial[0] == threaded[0]
    for a, b in zip(serial[1], threaded[1]):
        assert np.array_equal(a, b)
    # between the two: the size decides, call by call
    spy.clear()
    monkeypatch.setattr(cpu, "MT_MIN", 16 * 32)
    assert mlp_run(dt)[0] == serial[0]
    assert {t for _, t in spy} == {True, False}


def test_memory_bound_calls_wait_for_their_own_threshold(monkeypatch, spy):
    """From MT_MIN elements a compute-bound call (tanh, softmax, cross-entropy)
    takes its threaded twin, a memory-bound one (an add, a relu, an axpby, a
    mul's gradient) only from MT_MIN_MEMORY: waking passive workers cost
    more than such a kernel's work below it. The bits stay the same."""
    monkeypatch.setattr(cpu, "MT_MIN", 1)
    first = mlp_run()
    calls = set(spy)
    for name in ("binary", "binary_backward", "axpby", "mse"):
        assert (name, False) in calls and (name, True) not in calls, name
    assert ("unary", False) in calls                # relu
    for name in ("softmax", "cross_entropy", "pointwise_loss"):
        assert (name, True) in calls and (name, False) not in calls, name
    spy.clear()
    monkeypatch.setattr(cpu, "MT_MIN_MEMORY", 64)
    assert mlp_run()[0] == first[0]
    assert ("binary", True) in spy and ("axpby", True) in spy and ("unary", True) in spy
    assert not cpu.memory_bound("unary", (S.TANH,)) and cpu.memory_bound("unary", (S.RELU,))


def test_reshape_and_transpose_backward_and_scaled_losses(monkeypatch, spy):
    def run():
        rng = np.random.default_rng(6)
        w = ng.param(rnorm(rng, (6, 8), np.float64))
        with ng.grad_tape():
            loss = 3.0 * ng.mse_loss(ng.reshape(w, 8, 6).T, np.ones((6, 8)))
        loss.backward()
        return loss.item(), w.grad.copy()

    monkeypatch.setattr(cpu, "MT_MIN", _threads.NEVER)
    serial = run()
    spy.clear()
    monkeypatch.setattr(cpu, "MT_MIN", 1)
    monkeypatch.setattr(cpu, "MT_MIN_MEMORY", 1)
    threaded = run()
    assert ("axpby", True) in spy and ("scaled_add", True) in spy and ("unary", True) in spy
    assert serial[0] == threaded[0] and np.array_equal(serial[1], threaded[1])


# ---------------------------------------------------------------- compile
def test_compiled_step_with_threaded_kernels_is_bit_identical(monkeypatch, tmp_path):
    from numbagrad.compile import compile as ng_compile

    monkeypatch.setattr(cpu, "MT_MIN", 1)
    monkeypatch.setattr(cpu, "MT_MIN_MEMORY", 1)
    rng = np.random.default_rng(7)

    def make():
        r = np.random.default_rng(8)
        model = ng.nn.Sequential(ng.nn.Linear(12, 16, dtype=np.float32, rng=r), ng.nn.ReLU(),
                                 ng.nn.Linear(16, 5, dtype=np.float32, rng=r))
        return model, ng.optim.Adam(model.parameters(), lr=1e-2, accumulate_steps=2)

    def loss_fn(model):
        def fn(x, labels, y):
            h = model(x)
            return ng.cross_entropy(h, labels) + ng.mse_loss(ng.softmax(h), y)
        return fn

    batches = [(ng.tensor(rnorm(rng, (8, 12), np.float32)), rng.integers(0, 5, size=8),
                rng.uniform(size=(8, 5)).astype(np.float32)) for _ in range(3)]
    ma, oa = make()
    mb, ob = make()
    step = ng_compile(loss_fn(mb), optimizer=ob, cache_dir=str(tmp_path))
    fa = loss_fn(ma)
    for _ in range(2):
        for x, labels, y in batches:
            with ng.grad_tape():
                la = fa(x, labels, y)
            la.backward()
            oa.step()
            lb = step(x, labels, y)
            assert np.array_equal(np.asarray(la.numpy()), np.asarray(lb.numpy()))
    assert step.stats[-1]["mode"] == "njit"
    for a, b in zip(ma.parameters(), mb.parameters()):
        assert np.array_equal(a.numpy(), b.numpy())


@pytest.mark.parametrize("serial_faster", [True, False, "bursts", "moment"])
def test_a_compiled_step_keeps_the_twins_it_measured_faster(monkeypatch, tmp_path,
                                                            serial_faster):
    """After its warm-up a compiled step with threaded kernels times blocks of
    calls threaded and serial (here on a fake clock that makes one faster),
    keeps the faster, says which in ``stats``, and stays eager's bits.
    "bursts": threaded calls take 0.5 ms when quiet but most land in a burst
    (1.2 ms), serial ones 0.8 ms: the serial median wins, its best does not,
    so the threads stay. "moment": the threads are slower for the first 100
    calls only; the serial twins first kept are measured again after the
    check at call 128, and the threads come back."""
    from numbagrad.compile import compile as ng_compile
    from numbagrad.compile import runners

    monkeypatch.setattr(cpu, "MT_MIN", 1)
    monkeypatch.setattr(cpu, "MT_MIN_MEMORY", 1)
    rng = np.random.default_rng(9)

    def make():
        r = np.random.default_rng(10)
        model = ng.nn.Sequential(ng.nn.Linear(12, 16, dtype=np.float32, rng=r), ng.nn.Tanh(),
                                 ng.nn.Linear(16, 5, dtype=np.float32, rng=r))
        return model, ng.optim.SGD(model.parameters(), lr=1e-2, accumulate_steps=2)

    ma, oa = make()
    mb, ob = make()
    step = ng_compile(lambda x, y: ng.mse_loss(mb(x), y), optimizer=ob, cache_dir=str(tmp_path))
    x = ng.tensor(rnorm(rng, (8, 12), np.float32))
    y = ng.tensor(rnorm(rng, (8, 5), np.float32))
    now = [0.0]
    modes = []
    kept = []          # stats' "threads" after each call

    def clock():       # a call's time: 1 ms threaded, 2 ms serial (or the other way)
        flag = step._last.threads[0]
        modes.append(flag)
        if serial_faster == "bursts":
            quiet = sum(m == 1 for m in modes) % 8 == 0
            now[0] += 0.4e-3 if flag == 0 else (0.25e-3 if quiet else 0.6e-3)
        elif serial_faster == "moment":
            now[0] += 1e-3 if flag == 0 else (1.5e-3 if len(kept) < 100 else 0.5e-3)
        else:
            now[0] += 0.5e-3 * (1 + (flag == serial_faster))
        return now[0]
    monkeypatch.setattr(runners, "_clock", clock)
    choice = runners._ThreadChoice
    calls = choice.WARMUP + 2 * choice.BLOCK * choice.ROUNDS + 8
    if serial_faster == "moment":
        calls = 128 + choice.REWARMUP + 2 * choice.BLOCK * choice.ROUNDS + 8
    running = _threads.governor is not None
    _threads.stop_governor()             # the governor's switch stays on
    try:
        for i in range(calls):
            if i == 1:
                assert step.stats[-1]["threads"] == "measuring"
            with ng.grad_tape():
                la = ng.mse_loss(ma(x), y)
            la.backward()
            oa.step()
            assert step(x, y).numpy().tobytes() == la.numpy().tobytes(), i
            kept.append(step.stats[-1]["threads"])
    finally:
        if running:
            _threads.start_governor()
    serial = serial_faster is True
    if serial_faster == "moment":   # serial kept until the check at call 128, then measured
        assert kept[100:126] == ["serial"] * 26 and "measuring" in kept[127:]
    assert step.stats[-1]["threads"] == ("serial" if serial else "threaded")
    assert step._last.threads[0] == (0 if serial else 1)
    assert {0, 1} <= set(modes) and not isinstance(step._last.run, choice)
    for a, b in zip(ma.parameters(), mb.parameters()):
        assert a.numpy().tobytes() == b.numpy().tobytes()

"""Schedules, clipping, weight decay, samples-weighted windows, flush and the kernels.

The comparisons with PyTorch are in test_vs_torch.py; these check the
features against hand-computed values and against numbagrad's own full batch.
"""
import inspect
import itertools
import math
import sys

import numpy as np
import pytest
from conftest import Dev, mse_loss_of

import numbagrad as ng
from numbagrad.kernels import cpu
from numbagrad.kernels.cpu import optim as cpu_optim
from numbagrad.optim import schedules

LR = 0.1


def rnorm(seed, *shape):
    return np.random.default_rng(seed).normal(size=shape)


def snapshot(dev, opt):
    """Everything an optimizer holds that a no-op must leave alone."""
    state = opt.state_dict()
    return ([dev.host(p.data).copy() for p in opt.params], opt.t, opt.pending_steps,
            opt.pending_samples, state)


def assert_same(a, b):
    for x, y in zip(a[0], b[0]):
        np.testing.assert_array_equal(x, y)
    assert a[1:4] == b[1:4]
    sa, sb = a[4], b[4]
    for ga, gb in zip(sa["groups"], sb["groups"]):
        for key in ("grad", "live", "seen"):
            np.testing.assert_array_equal(ga[key], gb[key])
        for name in ga["slots"]:
            np.testing.assert_array_equal(ga["slots"][name], gb["slots"][name])


# ------------------------------------------------------------ schedules
def test_builtin_schedules_by_hand():
    c = schedules.constant(0.3)
    assert [c(t) for t in (0, 1, 100)] == [0.3, 0.3, 0.3]
    s = schedules.step(1.0, every=2, gamma=0.5)
    assert [s(t) for t in range(6)] == [1.0, 1.0, 0.5, 0.5, 0.25, 0.25]
    cos = schedules.cosine(1.0, total_updates=6, warmup=2, final=0.1)
    want = [0.5, 1.0] + [0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * i / 4)) for i in range(4)]
    np.testing.assert_allclose([cos(t) for t in range(6)], want, rtol=1e-15)
    assert cos(6) == cos(60) == 0.1
    assert cos(2) == 1.0                              # the peak, right after warm-up
    no_warmup = schedules.cosine(2.0, total_updates=4)
    assert no_warmup(0) == 2.0 and no_warmup(4) == 0.0


@pytest.mark.parametrize("make, match", [
    (lambda: schedules.constant(-1.0), "constant value must be >= 0"),
    (lambda: schedules.step(0.1, every=0, gamma=0.5), "every must be a positive integer"),
    (lambda: schedules.step(0.1, every=2, gamma=float("nan")), "gamma must be a finite"),
    (lambda: schedules.cosine(0.1, total_updates=0), "total_updates must be a positive"),
    (lambda: schedules.cosine(0.1, total_updates=5, warmup=6), r"warmup must be .* \[0, "),
    (lambda: schedules.cosine(0.1, total_updates=5, final=-1), "final must be >= 0"),
])
def test_schedules_reject_bad_arguments(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_schedules_round_trip_by_value():
    for sched in (schedules.constant(0.2), schedules.step(0.1, 3, 0.5),
                  schedules.cosine(0.1, 10, warmup=2, final=0.01)):
        again = schedules.from_dict(sched.to_dict())
        assert again == sched and again is not sched
        assert [again(t) for t in range(12)] == [sched(t) for t in range(12)]
    assert "cosine" in repr(schedules.cosine(0.1, 10))
    with pytest.raises(ValueError, match="unknown schedule"):
        schedules.from_dict({"schedule": "linear"})
    with pytest.raises(ValueError, match="t >= 0"):
        schedules.constant(0.1)(-1)


def test_a_callable_lr_is_evaluated_once_per_applied_update(dev):
    calls = []

    def lr(t):
        calls.append(t)
        return 0.1 / (1 + t)

    W0, x, y = rnorm(1, 2, 3), rnorm(2, 3, 1), np.zeros((2, 1))
    W = dev.param(W0)
    opt = ng.optim.SGD([W], lr=lr, accumulate_steps=3)
    ref_W = dev.param(W0)
    ref = ng.optim.SGD([ref_W], lr=1.0, accumulate_steps=3)
    for window in range(3):
        ref.lr = 0.1 / (1 + window)
        for _ in range(3):
            for p, o in ((W, opt), (ref_W, ref)):
                mse_loss_of(dev, p, x, y).backward()
                o.step()
        assert calls == list(range(window + 1))    # once per update, never per micro-step
    np.testing.assert_array_equal(W.numpy(), ref_W.numpy())
    assert opt.lr == 0.1 / 4 and calls[-1] == 3    # reading lr: the next update's value


def test_lr_reports_the_next_updates_rate_and_can_become_a_schedule():
    opt = ng.optim.SGD([ng.param(np.ones(2))], lr=schedules.step(1.0, every=1, gamma=0.5))
    assert opt.lr == 1.0
    opt.params[0].grad = np.ones(2)
    opt.step()
    assert opt.lr == 0.5
    opt.lr = 0.3
    assert opt.lr == 0.3
    opt.lr = lambda t: 0.01 * t
    assert opt.lr == 0.01
    with pytest.raises(ValueError, match="lr must be >= 0"):
        opt.lr = -0.1


def test_a_bad_value_from_the_schedule_raises_before_anything_changes(dev):
    W = dev.param(rnorm(3, 2, 3))
    opt = ng.optim.Adam([W], lr=lambda t: float("nan") if t == 1 else 0.01, accumulate_steps=2)
    x, y = rnorm(4, 3, 1), np.zeros((2, 1))
    for _ in range(2):
        mse_loss_of(dev, W, x, y).backward()
        opt.step()
    mse_loss_of(dev, W, x, y).backward()
    opt.step()
    mse_loss_of(dev, W, x, y).backward()
    with pytest.warns(RuntimeWarning, match="a state dict cannot hold"):
        before = snapshot(dev, opt)
    with pytest.raises(ValueError, match=r"lr\(1\) from the schedule"):
        opt.step()
    with pytest.warns(RuntimeWarning, match="a state dict cannot hold"):
        assert_same(before, snapshot(dev, opt))


# ----------------------------------------------------------- validation
@pytest.mark.parametrize("make, match", [
    (lambda p: ng.optim.SGD(p, lr=0.1, weight_decay=-1.0), "weight_decay must be >= 0"),
    (lambda p: ng.optim.AdamW(p, weight_decay=float("inf")), "weight_decay must be a finite"),
    (lambda p: ng.optim.SGD(p, lr=0.1, max_grad_norm=0.0), r"max_grad_norm must be > 0"),
    (lambda p: ng.optim.Adam(p, max_grad_norm="1"), "max_grad_norm must be a finite"),
    (lambda p: ng.optim.SGD(p, lr=0.1, nonfinite="warn"), "nonfinite must be one of"),
    (lambda p: ng.optim.AdamW(p, average="sample"), "or 'samples'"),
    (lambda p: ng.optim.SGD(p, lr="fast"), "lr must be a finite"),
])
def test_bad_new_hyper_parameters_raise_before_anything_is_built(make, match):
    W = ng.param(np.ones((2, 2)))
    data = W.data
    with pytest.raises((ValueError, TypeError), match=match):
        make([W])
    assert W._owner is None and W.data is data


@pytest.mark.parametrize("average, samples, match", [
    (True, 3, r"samples=3\) needs average='samples'"),
    (False, 1, "needs average='samples'"),
    ("samples", None, "every step.. must pass samples=n"),
    ("samples", 0, "samples must be a positive integer"),
    ("samples", 2.5, "samples must be a positive integer"),
    ("samples", True, "samples must be a positive integer"),
])
def test_samples_in_the_wrong_mode_is_an_error_that_changes_nothing(dev, average, samples,
                                                                     match):
    W = dev.param(rnorm(5, 2, 3))
    opt = ng.optim.SGD([W], lr=LR, accumulate_steps=2, average=average)
    x, y = rnorm(6, 3, 1), np.zeros((2, 1))
    mse_loss_of(dev, W, x, y).backward()
    opt.step(samples=1 if average == "samples" else None)
    mse_loss_of(dev, W, x, y).backward()
    before = snapshot(dev, opt)
    with pytest.raises(ValueError, match=match):
        opt.step(samples=samples)
    assert_same(before, snapshot(dev, opt))


# --------------------------------------------------- samples and flush
def train_windows(dev, windows, *, average, k, spelling="grad", reduction=None, flush=False,
                  opt_kind="sgd", w0=None):
    """Run ``windows`` (lists of (x, y) micro-batches) through one optimizer."""
    reduction = reduction or ("sum" if average in ("samples", False) else "mean")
    W = dev.param(rnorm(7, 2, 3) if w0 is None else w0)
    if opt_kind == "sgd":
        opt = ng.optim.SGD([W], lr=LR, momentum=0.5, accumulate_steps=k, average=average)
    else:
        opt = ng.optim.Adam([W], lr=0.05, accumulate_steps=k, average=average)
    for window in windows:
        for x, y in window:
            loss = mse_loss_of(dev, W, x, y, reduction=reduction)
            samples = x.shape[1] if average == "samples" else None
            if spelling == "grad":
                loss.backward()
                opt.step(samples=samples)
            else:
                opt.step(ng.backward(loss), samples=samples)
        if flush:
            assert opt.flush() is True
    return W, opt


def split(x, y, sizes):
    edges = np.cumsum([0, *sizes])
    return [(x[:, a:b], y[:, a:b]) for a, b in itertools.pairwise(edges)]


@pytest.mark.parametrize("spelling", ["grad", "mapping"])
@pytest.mark.parametrize("opt_kind", ["sgd", "adam"])
def test_samples_weighted_windows_of_3_5_2_equal_the_full_batch(dev, spelling, opt_kind):
    X, Y = rnorm(8, 2, 3, 10), rnorm(9, 2, 2, 10)
    full_W, full = train_windows(dev, [[(x, y)] for x, y in zip(X, Y)], average="samples",
                                 k=1, opt_kind=opt_kind)
    W, opt = train_windows(dev, [split(x, y, (3, 5, 2)) for x, y in zip(X, Y)],
                           average="samples", k=3, spelling=spelling, opt_kind=opt_kind)
    np.testing.assert_allclose(W.numpy(), full_W.numpy(), rtol=1e-10, atol=1e-12)
    assert opt.t == full.t == 2 and opt.pending_samples == 0
    # a plain 1/k average of these uneven micro-batches lands elsewhere
    mean_W, _ = train_windows(dev, [split(x, y, (3, 5, 2)) for x, y in zip(X, Y)],
                              average=True, k=3, opt_kind=opt_kind)
    assert not np.allclose(mean_W.numpy(), full_W.numpy(), rtol=1e-6)


@pytest.mark.parametrize("average", [True, False, "samples"])
@pytest.mark.parametrize("spelling", ["grad", "mapping"])
def test_flush_after_3_of_4_micro_steps_equals_the_full_batch_of_those_3(dev, average,
                                                                         spelling):
    X, Y = rnorm(10, 3, 6), rnorm(11, 2, 6)
    sizes = (2, 2, 2) if average is True else (1, 3, 2)
    # The full batch of those three: one mean over the 6 columns (average
    # True: equal micro-batches; "samples": any sizes), or the plain sum.
    full_W, _ = train_windows(dev, [[(X, Y)]], average=average, k=1,
                              reduction="mean" if average is True else "sum")
    W, opt = train_windows(dev, [split(X, Y, sizes)], average=average, k=4,
                           spelling=spelling, flush=True)
    np.testing.assert_allclose(W.numpy(), full_W.numpy(), rtol=1e-10, atol=1e-12)
    assert opt.t == 1 and opt.pending_steps == 0
    assert (W.grad is None) == (spelling == "grad")   # ng.backward also fills .grad
    # the next window starts empty: flushing it now does nothing
    before = snapshot(dev, opt)
    assert opt.flush() is False
    assert_same(before, snapshot(dev, opt))


def test_flush_on_an_empty_window_changes_nothing_even_with_a_live_grad(dev):
    W = dev.param(rnorm(12, 2, 3))
    opt = ng.optim.SGD([W], lr=LR, accumulate_steps=2)
    mse_loss_of(dev, W, rnorm(13, 3, 1), np.zeros((2, 1))).backward()   # no step() yet
    before = snapshot(dev, opt)
    assert opt.flush() is False
    assert_same(before, snapshot(dev, opt))
    assert W.grad is not None


def test_flush_then_full_windows_continue_normally(dev):
    W0, x, y = rnorm(14, 2, 3), rnorm(15, 3, 1), np.zeros((2, 1))
    W = dev.param(W0)
    opt = ng.optim.Adam([W], lr=0.01, accumulate_steps=3)
    mse_loss_of(dev, W, x, y).backward()
    opt.step()
    assert opt.flush() is True and opt.t == 1
    for i in range(3):
        mse_loss_of(dev, W, x, y).backward()
        assert opt.step() is (i == 2)
    assert opt.t == 2


# ------------------------------------------------------------ clipping
@pytest.mark.parametrize("max_norm", [0.05, 1e6])
def test_clipping_scales_the_averaged_total_by_its_global_norm(dev, max_norm):
    A0, B0 = rnorm(16, 2, 3), rnorm(17, 2, 3)
    x1, x2, y = rnorm(18, 3, 1), rnorm(19, 3, 1), np.zeros((2, 1))

    def grads(W0, xs):
        W = dev.param(W0)
        for x in xs:
            mse_loss_of(dev, W, x, y).backward()
        return dev.host(W.grad) / len(xs)

    gA, gB = grads(A0, (x1, x2)), grads(B0, (x2, x1))
    norm = math.sqrt((gA ** 2).sum() + (gB ** 2).sum())
    coef = min(1.0, max_norm / (norm + 1e-6))

    A, B = dev.param(A0), dev.param(B0)
    opt = ng.optim.SGD([A, B], lr=LR, accumulate_steps=2, max_grad_norm=max_norm)
    for xa, xb in ((x1, x2), (x2, x1)):
        mse_loss_of(dev, A, xa, y).backward()
        mse_loss_of(dev, B, xb, y).backward()
        opt.step()
    assert opt.last_grad_norm == pytest.approx(norm, rel=1e-12)
    np.testing.assert_allclose(A.numpy(), A0 - LR * coef * gA, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(B.numpy(), B0 - LR * coef * gB, rtol=1e-12, atol=1e-14)
    assert (coef < 1) == (max_norm < 1)


def test_last_grad_norm_is_none_until_an_update_or_when_nothing_needs_it():
    W = ng.param(np.ones(2))
    opt = ng.optim.SGD([W], lr=LR)
    assert opt.last_grad_norm is None
    W.grad = np.array([3.0, 4.0])
    opt.step()
    assert opt.last_grad_norm == 5.0     # computed by the default non-finite check
    fast = ng.optim.SGD([ng.param(np.ones(2))], lr=LR, nonfinite="ignore")
    fast.params[0].grad = np.array([3.0, 4.0])
    fast.step()
    assert fast.last_grad_norm is None   # no reduction pass at all


# -------------------------------------------------------- weight decay
def test_sgd_weight_decay_is_coupled_and_adamw_decay_decoupled(dev):
    W0, g = rnorm(20, 2, 3), rnorm(21, 2, 3)
    W = dev.param(W0)
    opt = ng.optim.SGD([W], lr=LR, weight_decay=0.3)
    W.grad = dev.tensor(g)
    opt.step()
    np.testing.assert_allclose(W.numpy(), W0 - LR * (g + 0.3 * W0), rtol=1e-14)

    W = dev.param(W0)
    opt = ng.optim.AdamW([W], lr=0.01, weight_decay=0.5)
    W.grad = dev.tensor(g)
    opt.step()
    # first Adam step moves every weight by lr * sign(g) (up to eps), after the decay
    want = W0 * (1 - 0.01 * 0.5) - 0.01 * g / (np.abs(g) + 1e-8)
    np.testing.assert_allclose(W.numpy(), want, rtol=1e-12)
    assert (opt.weight_decay, ng.optim.AdamW([dev.param(W0)]).weight_decay) == (0.5, 0.01)


def test_features_keep_the_flat_buffers_in_place(dev):
    W, b = dev.param(rnorm(22, 2, 3)), dev.param(rnorm(23, 2, 1))
    opt = ng.optim.AdamW([W, b], lr=schedules.cosine(0.01, 5, warmup=1), accumulate_steps=2,
                         average="samples", max_grad_norm=0.1, nonfinite="skip")
    x, y = rnorm(24, 3, 2), np.zeros((2, 2))
    addresses = None
    for i in range(5):
        mse_loss_of(dev, W, x, y, reduction="sum").backward()
        opt.step(samples=2)
        if i == 2:
            opt.flush()
        now = (dev.address(opt._groups[0].g), dev.address(opt._groups[0].w))
        assert addresses in (None, now)
        addresses = now
    assert dev.address(W.data) == addresses[1]


# ------------------------------------------------------------- kernels
def test_cpu_and_cuda_kernel_modules_expose_the_same_signatures():
    from numbagrad.kernels.cuda import optim as cuda_optim
    assert sorted(cpu_optim.__all__) == sorted(cuda_optim.__all__)
    for name in cpu_optim.__all__:
        assert (inspect.signature(getattr(cpu_optim, name))
                == inspect.signature(getattr(cuda_optim, name))), name
        assert getattr(cpu, name) is getattr(cpu_optim, name)


def flat_problem(dt, sizes, seed=0):
    rng = np.random.default_rng(seed)
    seg = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    n = int(seg[-1])
    w, g, m = (rng.normal(size=n).astype(dt) for _ in range(3))
    v = np.abs(rng.normal(size=n)).astype(dt)
    live = (np.arange(len(sizes)) % 3 != 1).astype(np.uint8)
    steps = np.arange(len(sizes), dtype=np.int64)
    return w, g, m, v, seg, live, steps


# segments straddling the parallel chunks, an empty one, a skipped one
SIZES = (5000, 20000, 0, 3, 9000, 11)


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_threaded_cpu_kernels_give_the_serial_bits(dt):
    w, g, m, v, seg, live, steps = flat_problem(dt, SIZES)
    f = dt
    args = {
        "adam": lambda k, a: k(*a[:4], seg, live, steps, a[4], 0.01, 0.9, 0.999, f(0.1),
                               f(0.999), f(0.001), f(1e-8), f(0.5), f(0.999)),
        "sgd": lambda k, a: k(a[0], a[1], a[2], seg, live, f(0.1), f(0.9), f(0.5), f(0.01))}
    for name, run in args.items():
        results = []
        for kern in (getattr(cpu_optim, f"_{name}_serial"),
                     getattr(cpu_optim, f"_{name}_parallel")):
            # the step counts out (adam writes all; sgd none: zeros, not garbage, then)
            arrays = [a.copy() for a in (w, g, m, v)] + [np.zeros_like(steps)]
            run(kern, arrays)
            results.append(arrays)
        for serial, threaded in zip(*results):
            np.testing.assert_array_equal(serial, threaded, err_msg=name)
    outs = [np.zeros(1), np.zeros(1)]
    cpu_optim._sumsq_serial(g, outs[0])
    cpu_optim._sumsq_parallel(g, outs[1])
    assert outs[0][0] == outs[1][0]
    np.testing.assert_allclose(outs[0][0], (g.astype(np.float64) ** 2).sum(), rtol=1e-12)


def test_float32_kernels_compute_in_float32():
    # The same formulas in NumPy float32, one rounding per operation: equal
    # bits show that no intermediate was widened to float64.
    f = np.float32
    w, g, m, v, seg, live, steps = flat_problem(f, (40, 17))
    live[:] = 1
    a = [x.copy() for x in (w, g, m, v)]
    out = np.empty_like(steps)
    cpu.adam_update(*a, seg, live, steps, out, 0.01, 0.9, 0.999, 1e-8, 0.5, 0.1)
    for s in range(2):
        sl = slice(seg[s], seg[s + 1])
        t = steps[s] + 1
        step_size, bc2 = f(0.01 / (1 - 0.9 ** t)), f(math.sqrt(1 - 0.999 ** t))
        gi = f(0.5) * g[sl]
        mi = m[sl] + f(1 - 0.9) * (gi - m[sl])
        vi = v[sl] * f(0.999) + f(1 - 0.999) * gi * gi
        wi = w[sl] * f(1 - 0.01 * 0.1) - step_size * (mi / (np.sqrt(vi) / bc2 + f(1e-8)))
        for got, want in zip((a[0][sl], a[2][sl], a[3][sl]), (wi, mi, vi)):
            assert got.dtype == np.float32
            np.testing.assert_array_equal(got, want)
    b = [x.copy() for x in (w, g, v)]
    cpu.sgd_update(*b, seg, live, 0.1, 0.9, 0.5, 0.01)
    vi = f(0.9) * v + (f(0.5) * g + f(0.01) * w)
    np.testing.assert_array_equal(b[2], vi)
    np.testing.assert_array_equal(b[0], w - f(0.1) * vi)


def test_the_threaded_path_trains_like_the_serial_one(monkeypatch):
    def run():
        W = ng.param(rnorm(25, 150, 200))
        opt = ng.optim.AdamW([W], lr=0.01, accumulate_steps=2, max_grad_norm=1.0)
        for i in range(4):
            W.grad = rnorm(26 + i, 150, 200)
            opt.step()
        return W.numpy(), opt.last_grad_norm

    monkeypatch.setattr(cpu, "MT_MIN", sys.maxsize)   # never threaded
    serial = run()
    monkeypatch.setattr(cpu, "MT_MIN", 1)             # always (with >1 thread)
    threaded = run()
    np.testing.assert_array_equal(serial[0], threaded[0])
    assert serial[1] == threaded[1]


def test_new_kernels_agree_between_cpu_and_cuda():
    if not ng.cuda_available():
        pytest.skip("CUDA unusable here")
    gpu = ng.kernels.get("cuda")
    cuda = Dev("cuda")
    for dt, tol in ((np.float32, 1e-6), (np.float64, 1e-14)):
        w, g, m, v, seg, live, steps = flat_problem(dt, (1, 15, 17, 2, 3), seed=3)
        out_c, out_d = np.zeros(1), gpu.from_host(np.zeros(1))
        cpu.sumsq(g, out_c)
        gpu.sumsq(gpu.from_host(g), out_d)
        np.testing.assert_allclose(cuda.host(out_d), out_c, rtol=1e-14)
        c = [a.copy() for a in (w, g, v)]
        cpu.sgd_update(*c, seg, live, 0.1, 0.9, 0.25, 0.05)
        d = [gpu.from_host(a) for a in (w, g, v)]
        gpu.sgd_update(*d, gpu.from_host(seg), gpu.from_host(live), 0.1, 0.9, 0.25, 0.05)
        for got, want in zip(d, c):
            np.testing.assert_allclose(cuda.host(got), want, rtol=tol, atol=tol)
        c = [a.copy() for a in (w, g, m, v)]
        c_steps = np.empty_like(steps)
        cpu.adam_update(*c, seg, live, steps, c_steps, 0.01, 0.9, 0.999, 1e-8, 0.5, 0.1)
        d = [gpu.from_host(a) for a in (w, g, m, v)]
        d_steps = gpu.empty(steps.shape, np.int64)
        gpu.adam_update(*d, gpu.from_host(seg), gpu.from_host(live), gpu.from_host(steps),
                        d_steps, 0.01, 0.9, 0.999, 1e-8, 0.5, 0.1)
        for got, want in zip(d, c):
            np.testing.assert_allclose(cuda.host(got), want, rtol=tol, atol=tol)
        np.testing.assert_array_equal(cuda.host(d_steps), c_steps)


@pytest.mark.parametrize("options, launches, reads", [
    ({}, 2, 1),                                           # the default non-finite check
    ({"max_grad_norm": 1.0, "nonfinite": "ignore"}, 2, 1),   # clipping alone
    ({"nonfinite": "ignore"}, 1, 0),                      # neither: the fused update only
])
def test_the_cuda_window_boundary_costs_one_reduction_and_one_small_read(options, launches,
                                                                         reads):
    if not ng.cuda_available():
        pytest.skip("CUDA unusable here")
    cuda = Dev("cuda")
    W = cuda.param(rnorm(27, 3, 4))
    opt = ng.optim.SGD([W], lr=LR, momentum=0.9, accumulate_steps=2, **options)
    x, y = rnorm(28, 4, 2), rnorm(29, 3, 2)
    counts = []
    for _ in range(4):
        mse_loss_of(cuda, W, x, y).backward()
        before = (ng.cuda.launch_count(), ng.cuda.transfer_count())
        applied = opt.step()
        counts.append((applied, ng.cuda.launch_count() - before[0],
                       ng.cuda.transfer_count() - before[1]))
    assert counts[2:] == [(False, 0, 0), (True, launches, reads)]


def test_the_dispatch_times_both_variants_and_runs_the_faster(monkeypatch):
    monkeypatch.setattr(cpu, "MT_MIN", 10)
    monkeypatch.setattr(cpu_optim.numba, "get_num_threads", lambda: 2)
    # threads allowed, whatever the governor makes of this machine's load now
    monkeypatch.setattr(cpu_optim, "ALLOWED", np.ones(1, np.int64))
    ran = []
    cost = {"serial": 1.0, "threaded": 3.0}   # seconds per call, by the fake clock
    now = [0.0]

    def variant(name):
        def run(*args):
            ran.append(name)
            now[0] += cost[name]
        return run

    d = cpu_optim._Dispatch(variant("serial"), variant("threaded"))
    d.clock = lambda: now[0]
    d(5, "small")                              # below the threshold: serial, untimed
    for _ in range(4 + 2 * cpu_optim.RETRY):
        d(100)
    # each variant twice (the first call may compile), then the faster, with the
    # other re-timed every RETRY calls
    assert ran[:5] == ["serial", "threaded", "threaded", "serial", "serial"]
    assert ran[5:].count("threaded") == 2
    cost.update(serial=5.0)                    # the machine got busy / quiet again
    ran.clear()
    for _ in range(2 * cpu_optim.RETRY):
        d(100)
    assert ran.count("threaded") > ran.count("serial")

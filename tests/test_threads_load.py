"""The thread governor (issue 35.1): threaded kernels switch to the serial
ones while the process's threads wait for a core, and back once a trial
finds the cores free; the bits never change.

The decisions are driven with injected measurements and a fake clock (no
real load, no timing); the switch itself, ``kernels.call``'s choice, the
compiled step and the opt-out run for real.
"""
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import numbagrad as ng
from numbagrad import kernels
from numbagrad.kernels import cpu
from numbagrad.kernels.cpu import _threads
from numbagrad.kernels import codes as S

ROOT = Path(__file__).resolve().parents[1]
G = _threads.Governor


class Fake:
    """A process whose two threads run and wait as the test says, on a clock
    the test moves."""

    def __init__(self):
        self.now = 100.0
        self.ns = {1: [0, 0], 2: [0, 0]}
        self.applied = []
        self.observed = False
        self.gov = G(sample=self.sample, clock=lambda: self.now, apply=self.applied.append,
                     observed=lambda: self.observed)
        self.gov.tick()    # the first sample: no window yet

    def sample(self):
        return {tid: tuple(v) for tid, v in self.ns.items()}

    def window(self, seconds, run, wait):
        """``seconds`` pass in which the threads ran ``run`` and waited ``wait``
        core-seconds; then one tick, whose answer is returned."""
        self.now += seconds
        for v in self.ns.values():
            v[0] += int(run / 2 * seconds * 1e9)
            v[1] += int(wait / 2 * seconds * 1e9)
        return self.gov.tick()


@pytest.fixture
def fake():
    return Fake()


@pytest.fixture
def quiet():
    """The real governor thread stopped (threads on), restarted afterwards."""
    running = _threads.governor is not None
    _threads.stop_governor()
    yield
    _threads.allow_threads(True)
    if running:
        _threads.start_governor()


def test_free_cores_keep_the_threads(fake):
    for _ in range(20):
        assert fake.window(G.INTERVAL, run=2.0, wait=0.01) == G.INTERVAL
    assert fake.gov.threaded and fake.applied == []


def test_waiting_for_cores_switches_to_serial_and_a_trial_switches_back(fake):
    assert fake.window(G.INTERVAL, run=0.5, wait=1.5) == G.INTERVAL
    assert not fake.gov.threaded and fake.applied == [False]
    # serial: no trial before the back-off, however free the cores
    waited = 0.0
    while waited + G.INTERVAL < G.FIRST_BACKOFF:
        fake.window(G.INTERVAL, run=1.0, wait=0.0)
        waited += G.INTERVAL
        assert fake.applied == [False]
    assert fake.window(G.INTERVAL, run=1.0, wait=0.0) == G.PROBE   # the trial
    assert fake.gov.threaded and fake.applied == [False, True]
    # the trial finds the cores still busy: serial again, twice the back-off
    fake.window(G.PROBE, run=0.4, wait=1.6)
    assert fake.applied == [False, True, False] and fake.gov.backoff == 2 * G.FIRST_BACKOFF
    for _ in range(int(2 * G.FIRST_BACKOFF / G.INTERVAL) - 1):
        fake.window(G.INTERVAL, run=1.0, wait=0.0)
    assert fake.window(G.INTERVAL, run=1.0, wait=0.0) == G.PROBE
    # now they are free: the threads stay on
    for _ in range(20):
        fake.window(G.INTERVAL, run=2.0, wait=0.0)
    assert fake.gov.threaded and fake.applied == [False, True, False, True]
    # after a settled while, new load starts again from the first back-off
    fake.window(G.INTERVAL, run=0.5, wait=1.5)
    assert not fake.gov.threaded and fake.gov.backoff == G.FIRST_BACKOFF


def test_failed_trials_back_off_up_to_the_maximum(fake):
    fake.window(G.INTERVAL, run=0.5, wait=1.5)
    for _ in range(10):
        while fake.window(G.INTERVAL, run=1.0, wait=0.0) != G.PROBE:
            pass
        fake.window(G.PROBE, run=0.4, wait=1.6)
        assert not fake.gov.threaded
    assert fake.gov.backoff == G.MAX_BACKOFF


def test_a_waiting_serial_thread_postpones_the_trial(fake):
    fake.window(G.INTERVAL, run=0.5, wait=1.5)
    for _ in range(40):      # 10 s in which even the one thread waits for a core
        assert fake.window(G.INTERVAL, run=0.3, wait=0.7) == G.INTERVAL
    assert fake.applied == [False]
    while fake.window(G.INTERVAL, run=1.0, wait=0.0) != G.PROBE:
        pass
    assert fake.applied == [False, True]


def test_idle_windows_are_no_evidence(fake):
    fake.window(G.INTERVAL, run=0.5, wait=1.5)
    for _ in range(40):      # 10 s idle in serial mode: no trial (the cores are unknown)
        assert fake.window(G.INTERVAL, run=0.0, wait=0.0) == G.INTERVAL
    for _ in range(40):      # short bursts between idle stretches, waiting a little: none
        assert fake.window(G.INTERVAL, run=0.3, wait=0.05) == G.INTERVAL
    assert fake.applied == [False]
    assert fake.window(G.INTERVAL, run=1.0, wait=0.0) == G.PROBE   # working, no waits
    for _ in range(40):      # a trial that ran nothing for 10 s has not settled
        fake.window(G.INTERVAL, run=0.0, wait=0.0)
    fake.window(G.INTERVAL, run=0.5, wait=1.5)
    assert fake.gov.backoff == 2 * G.FIRST_BACKOFF


def test_threads_that_started_or_ended_are_left_out(fake):
    fake.ns[3] = [10 ** 12, 10 ** 12]       # a new thread's lifetime counts
    assert fake.window(G.INTERVAL, run=2.0, wait=0.0) == G.INTERVAL
    del fake.ns[3]
    del fake.ns[2]
    assert fake.window(G.INTERVAL, run=2.0, wait=0.0) == G.INTERVAL
    assert fake.gov.threaded


def test_an_observer_keeps_the_threads_on(fake):
    fake.observed = True
    fake.window(G.INTERVAL, run=0.5, wait=1.5)
    assert fake.gov.threaded
    fake.observed = False
    fake.window(G.INTERVAL, run=0.5, wait=1.5)
    assert not fake.gov.threaded
    fake.gov.force()
    assert fake.gov.threaded and fake.applied == [False, True]


def test_no_measurements_stop_the_governor():
    gov = G(sample=lambda: None, apply=lambda on: None)
    assert gov.tick() is None


def test_schedstat_counts_this_thread():
    sample = _threads.schedstat()
    if sample is None:
        pytest.skip("no /proc/self/task/*/schedstat here")
    ran, waited = sample[threading.get_native_id()]
    assert ran > 0 and waited >= 0


def _tanh(x):
    out = np.empty_like(x)
    kernels.call(cpu, "unary", x.size, S.TANH, x, out, 0.0, 1.0, 0.0)
    return out


def test_the_switch_is_what_call_picks_and_the_bits_stay(quiet):
    x = np.random.default_rng(0).standard_normal((256, 512)).astype(np.float32)
    assert x.size >= cpu.MT_MIN or cpu.MT_MIN == _threads.NEVER
    assert cpu.KERNEL_FNS[1]["unary"] is cpu.unary_mt
    threaded = _tanh(x)
    _threads.allow_threads(False)
    assert _threads.ALLOWED[0] == 0
    assert cpu.KERNEL_FNS[1]["unary"] is cpu.unary and cpu.KERNEL_FNS[0]["unary"] is cpu.unary
    serial = _tanh(x)
    _threads.allow_threads(True)
    assert cpu.KERNEL_FNS[1]["unary"] is cpu.unary_mt and _threads.ALLOWED[0] == 1
    assert np.array_equal(threaded.view(np.int32), serial.view(np.int32))


def test_subscribing_an_observer_turns_the_threads_on(quiet, monkeypatch):
    gov = G(sample=lambda: {}, apply=_threads.allow_threads, observed=lambda: True)
    monkeypatch.setattr(_threads, "governor", gov)
    gov.switch(False, 0.0)
    assert _threads._force in kernels._hook._on_subscribe
    assert cpu.KERNEL_FNS[1]["unary"] is cpu.unary

    class Quiet(kernels.Observer):   # the protocol's methods: told, does nothing
        pass

    with kernels.observe(Quiet()):
        assert gov.threaded and cpu.KERNEL_FNS[1]["unary"] is cpu.unary_mt


def test_a_compiled_step_follows_the_switch_with_the_same_bits(quiet, monkeypatch, tmp_path):
    monkeypatch.setattr(cpu, "MT_MIN", 1)
    monkeypatch.setattr(cpu, "MT_MIN_MEMORY", 1)
    r = np.random.default_rng(3)
    x = ng.tensor(r.standard_normal((8, 12)).astype(np.float32))
    y = r.standard_normal((8, 5)).astype(np.float32)

    def run(switches):
        r = np.random.default_rng(4)
        model = ng.nn.Sequential(ng.nn.Linear(12, 16, dtype=np.float32, rng=r), ng.nn.Tanh(),
                                 ng.nn.Linear(16, 5, dtype=np.float32, rng=r))
        opt = ng.optim.SGD(model.parameters(), lr=0.1)
        step = ng.compile(lambda x, y: ng.mse_loss(model(x), y), optimizer=opt,
                          cache_dir=str(tmp_path))
        losses = []
        for on in switches:
            _threads.allow_threads(on)
            losses.append(step(x, y).item())
        _threads.allow_threads(True)
        assert step.stats[-1]["mode"] == "njit"
        return losses, [p.numpy().copy() for p in model.parameters()]

    on, on_params = run([True] * 6)
    mixed, mixed_params = run([True, True, False, False, True, False])
    assert on == mixed
    for a, b in zip(on_params, mixed_params):
        assert np.array_equal(a, b)
    generated = "".join(p.read_text() for p in tmp_path.rglob("*.py"))
    assert "_mt" in generated and "!= 0) else m[" in generated


def _probe(env_value):
    code = ("import threading; from numbagrad.kernels.cpu import _threads;"
            "print(_threads.governor is not None,"
            " any(t.name == 'numbagrad-thread-governor' for t in threading.enumerate()))")
    env = dict(os.environ, PYTHONPATH=str(ROOT), NUMBA_NUM_THREADS="2",
               NUMBAGRAD_PARALLEL_MIN="65536")
    env.pop("NUMBAGRAD_THREAD_GOVERNOR", None)
    if env_value is not None:
        env["NUMBAGRAD_THREAD_GOVERNOR"] = env_value
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120)


def test_the_opt_out_env_leaves_the_threads_to_the_threshold():
    off = _probe("0")
    assert off.returncode == 0, off.stderr
    assert off.stdout.split() == ["False", "False"]
    if _threads.schedstat() is not None:
        on = _probe(None)
        assert on.returncode == 0, on.stderr
        assert on.stdout.split() == ["True", "True"]
    bad = _probe("sometimes")
    assert bad.returncode != 0
    assert "NUMBAGRAD_THREAD_GOVERNOR must be an integer >= 0, got 'sometimes'" in bad.stderr


def test_split_gemms_run_their_blocks_on_one_thread_with_the_same_bits(quiet):
    """A split product's last bits depend on its blocks (kernels/cpu/matmul.py):
    switched off, the governor runs gemm/linear/bgemm's one-thread twins, the
    same blocks on the calling thread, so the bits never follow the load."""
    from numbagrad.kernels.cpu import matmul
    _threads.allow_threads(False)
    try:
        for name in ("gemm", "linear", "bgemm"):
            assert cpu.KERNEL_FNS[1][name] is getattr(matmul, name + "_st")
        assert cpu.KERNEL_FNS[1]["unary"] is cpu.unary
    finally:
        _threads.allow_threads(True)
    rng = np.random.default_rng(3)
    m, k, n = 512, 160, 96             # 7.9M multiply-adds: above the split's minimum
    assert m * k * n >= matmul._SPLIT_MIN
    for dtype in (np.float32, np.float64):
        a, b = (rng.standard_normal(s).astype(dtype) for s in ((m, k), (k, n)))
        bias = rng.standard_normal(n).astype(dtype)
        w = np.ascontiguousarray(b.T)
        outs = []
        for fns in ((matmul.gemm_mt, matmul.linear_mt, matmul.bgemm_mt),
                    (matmul.gemm_st, matmul.linear_st, matmul.bgemm_st)):
            g, lin = np.zeros((m, n), dtype), np.empty((m, n), dtype)
            bg = np.zeros((1, m, n), dtype)
            fns[0](a, b, g, False, False, 1.0, 0.0)
            fns[1](a, w, bias, lin, True, S.IDENT, 0.0)
            fns[2](a[None], b[None], bg, False, False, 1.0, 0.0, 1, 1, 1, 1)
            outs.append((g, lin, bg))
        for threaded, one in zip(*outs):
            np.testing.assert_array_equal(threaded, one)
        tol = 1e-4 if dtype == np.float32 else 1e-10   # entries ~ sqrt(k): absolute
        np.testing.assert_allclose(outs[0][0], a @ b, rtol=tol, atol=tol)


def test_a_one_thread_twin_called_first_from_the_cache_runs():
    """The governor may switch to the one-thread twins before any threaded
    kernel ran; loaded from Numba's disk cache (the second process) they read
    a thread count only a launched threading layer provides."""
    code = ("import numpy as np; from numbagrad.kernels.cpu import matmul as M;"
            "a = np.ones((512, 160)); b = np.ones((160, 96)); o = np.empty((512, 96));"
            "M.gemm_st(a, b, o, False, False, 1.0, 0.0); print(o.min(), o.max())")
    env = dict(os.environ, PYTHONPATH=str(ROOT), NUMBAGRAD_THREAD_GOVERNOR="0")
    for _ in range(2):   # the first may compile (launching the layer); the second loads
        run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-2000:]
        assert run.stdout.split() == ["160.0", "160.0"]


def test_the_optimizers_threaded_updates_stay_off_while_the_threads_are(monkeypatch, quiet):
    """The optimizer's own dispatch (which re-times its threaded update every
    RETRY calls) runs only the serial update while the governor has the
    threads off, and both again once they are back."""
    from numbagrad.kernels.cpu import optim as kopt
    calls = []
    serial, threaded = (lambda *a: calls.append(0)), (lambda *a: calls.append(1))
    monkeypatch.setattr(kopt.numba, "get_num_threads", lambda: 2)
    n = max(cpu.MT_MIN, 1) * 4
    for on, expected in ((False, {0}), (True, {0, 1})):
        d = kopt._Dispatch(serial, threaded)
        calls.clear()
        _threads.allow_threads(on)
        try:
            for _ in range(2 * kopt.RETRY + 4):
                d(n)
        finally:
            _threads.allow_threads(True)
        assert set(calls) == expected

"""What the CPU kernels' serial and multi-threaded twins share.

A kernel ``foo`` with a threaded twin ``foo_mt`` (``parallel=True``, the
same signature, the same bits) is picked by ``kernels.call(kern, "foo", n,
...)`` when n >= ``MT_MIN`` (n: the elements the call touches): one
compare, and both are plain @njit kernels, so ``ng.compile`` records
whichever ran. ``MT_MIN`` is ``PARALLEL_MIN`` below, or never when
``NUMBAGRAD_PARALLEL_MIN`` is 0 or Numba has one thread.

Elementwise kernels split their output into blocks of ``SPAN`` elements,
each computed by the serial kernel's own per-element expression, so the
bits cannot depend on the split. Kernels that sum (the losses, a full
``sum_to``) add ``SPAN``-element spans into float64 partial sums and the
partials in order, in both twins, so they agree bit for bit whatever the
thread count.

The governor (``Governor``, issue 35.1): a threaded call on a machine whose
cores other processes keep busy waits for the slowest of its threads, which
shares a core (seen: 5-10x the serial kernel's time, a transformer step 4x
slower than serial). A daemon thread, ``numbagrad-thread-governor``, reads
every ``INTERVAL`` (0.25 s) how long this process's threads sat runnable but
waiting for a core (the kernel's ``/proc/self/task/*/schedstat``; not on
other systems, where the governor stays off). Waiting for a fifth of what
they ran (and at least 2% of the window) means the cores are contended:
the threaded twins are switched off, serial kernels run every call, and
after a back-off (0.5 s, doubled each time a trial finds the cores still
busy, up to 4 s; postponed while even the serial thread waits) a ``PROBE``
window tries the threads again, which stay on once it finds the cores
free. The switch is ``kernels.cpu.KERNEL_FNS``, swapped between the
(serial, threaded) tables and (serial, serial) (the GEMMs, whose split
changes their last bits, run their ``ONE_THREAD`` twins instead: the same
blocks on one thread): ``kernels.call`` pays nothing new, and
``MT_MIN`` (which tests and the optimizer read) is left alone.
``ng.compile``'s generated step reads the same switch, ``ALLOWED[0]``,
before each threaded kernel. While an observer is subscribed (ng.compile
recording a step) the threads stay on, so a recording names the kernels the
threshold picks. The twins give the same bits, so switching never changes a
result. ``NUMBAGRAD_THREAD_GOVERNOR=0`` turns the governor off (threads as
the threshold says, always); the optimizer kernels time their own variants
(``optim._Dispatch``).
"""
from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections.abc import Callable

import numba
import numpy as np
from llvmlite import ir
from numba.core import cgutils
from numba.extending import intrinsic, overload

from .. import env_int

# numbagrad sets no OpenMP policy: Numba's workers wait as the runtime's
# default says (libgomp: spin a while, then sleep), as PyTorch's do, and
# importing numbagrad changes no environment variable. Spinning between
# kernels is what a step of many short threaded kernels wants (waking
# passively waiting workers cost 40-50 us a call): the compiled GPT step
# took 24-28 ms so against 29-37 ms with passively waiting workers. It
# is harmless because numbagrad never runs OpenBLAS's own threads
# (matmul.py: one thread pool, Numba's); with them, each pool's spinning
# threads took the core the other's next call needed. An explicit
# OMP_WAIT_POLICY or GOMP_SPINCOUNT is the user's to set.


def _cast_like(array, x):
    """``x`` rounded to ``array``'s dtype (jitted code only)."""
    return array.dtype.type(x)


@overload(_cast_like)
def _cast_like_impl(array, x):
    dt = array.dtype

    def impl(array, x):
        return dt(x)
    return impl


CHUNK = 1 << 14   # the optimizer kernels' elements per parallel task (and sumsq's order)
SPAN = 1 << 12    # elementwise/loss kernels' elements per task; the losses' summation unit

# Measured on the project's 2-core machine with scripts/time_threads.py (2
# threads, best of 3 interleaved blocks; threaded time / serial time):
#   compute-bound (tanh, binary_backward mul, softmax, cross-entropy, a full
#     sum_to): 0.50-0.84 from 2**14 in both dtypes;
#   memory-bound (relu, add, add with a broadcast bias, mse, axpby,
#     scaled_add): float32 1.3-1.7 at 2**14, 0.99-1.23 at 2**15, 0.82-0.95
#     at 2**16, 0.55-0.78 at 2**17; float64 1.1-1.5 at 2**14, 0.78-0.95 at
#     2**15, 0.61-0.66 at 2**16;
#   column sums (a bias gradient): 1.2-2.6 up to 2**17, so sum_to_mt runs
#     them as one task and the bias gradient calls sum_to.
# 2**16 is where every threaded kernel the ops use wins in both dtypes.
# With another process busy on a core a threaded call waits for it (seen:
# ~8 ms per call): the governor below then switches to the serial kernels
# (NUMBAGRAD_PARALLEL_MIN=0: never threaded). The optimizer kernels (optim.py)
# use this threshold too.
PARALLEL_MIN = env_int("NUMBAGRAD_PARALLEL_MIN", 1 << 16)
NEVER = sys.maxsize
MT_MIN = PARALLEL_MIN if PARALLEL_MIN and numba.config.NUMBA_NUM_THREADS > 1 else NEVER
# Measured while the workers waited passively (the policy before the one
# above), when a threaded call first woke them: 40-50 us here, more than a
# memory-bound kernel's whole work below ~2**20 elements; not measured again
# at the default policy. Then (scripts/time_threads.py, float32, threaded /
# serial): relu 13.6 at 2**16, 1.73 at 2**19, 0.85 at 2**21; add 8.2, 1.27,
# 0.64; relu' 4.4, 1.23, 0.59; mse 4.7, 1.12, 0.60; axpby 17.9, 1.64, 0.84;
# while tanh, softmax, cross-entropy and bce win (0.50-0.73) from 2**16. So
# a memory-bound call (``memory_bound``) takes its threaded twin only from
# NUMBAGRAD_PARALLEL_MIN_MEMORY elements, 2**21 by default.
MT_MIN_MEMORY = env_int("NUMBAGRAD_PARALLEL_MIN_MEMORY", 1 << 21) or NEVER
# kernels whose every call is memory-bound (binary_backward: the add's, the
# mul's; the broadcast operand's sums take its threaded twin from 2**21 too)
MEMORY_BOUND = frozenset({"axpby", "scaled_add", "binary", "binary_backward", "mse"})
_CHEAP: list = []   # [codes.CHEAP_UNARY], once memory_bound has asked


def memory_bound(name: str, args: tuple) -> bool:
    """Whether ``kernels.call(kern, name, n, *args)`` is a memory-bound call,
    threaded only from ``MT_MIN_MEMORY`` elements (asked for calls of at least
    ``MT_MIN`` elements only, so it costs small calls nothing)."""
    if name in MEMORY_BOUND:
        return True
    if name != "unary" and name != "unary_backward":
        return False
    if not _CHEAP:
        # unary codes as cheap as a copy (their records' ``cheap``; the others
        # call libm or, for float32's GELU, vmath's polynomials), read on first
        # use, not imported at the top: the kernels' cache stamps follow this
        # module's imports, and the threading helpers do not depend on the
        # records (``numbagrad._cache``)
        from ..codes import CHEAP_UNARY
        _CHEAP.append(CHEAP_UNARY)
    return args[0] in _CHEAP[0]


@intrinsic
def num_threads(typingctx):
    """Numba's current thread count inside jitted code, as ``numba.get_num_threads()``
    but through the threading layer's ``get_num_threads`` symbol (the one a
    prange's own launch calls), so that a kernel reading it still caches
    (``numba.get_num_threads`` reads a ctypes pointer, which Numba cannot
    cache). Typing it launches Numba's threads, which registers that symbol
    (as numba.get_num_threads does); tests/test_blas_threads.py runs it."""
    numba.get_num_threads()

    def codegen(context, builder, signature, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(cgutils.intp_t, []),
                                            "get_num_threads")
        return builder.call(fn, [])
    return numba.types.intp(), codegen


# ---------------------------------------------------------------- the governor
# 1: the threaded twins may run; 0: the cores are contended, serial kernels
# only. The governor's switch, read by ng.compile's generated steps (their
# meta holds its address).
ALLOWED = np.ones(1, np.int64)
GOVERNED = env_int("NUMBAGRAD_THREAD_GOVERNOR", 1)   # 0: never switch the threads off
_TABLES: list = []    # [(serial, serial), (serial, threaded)]: KERNEL_FNS by ALLOWED[0]
# name -> one-thread twin, for the kernels whose threaded twin splits a BLAS
# product into blocks whose last bits can differ from one whole call's (the
# GEMMs, kernels/cpu/matmul.py fills it): while off the governor runs these,
# the same blocks on the calling thread, so no result depends on the load.
ONE_THREAD: dict[str, Callable] = {}

Sample = dict   # thread id -> (ns run on a core, ns waited runnable), cumulative


def schedstat() -> Sample | None:
    """This process's threads' scheduler counts (``/proc/self/task/*/schedstat``:
    ns run, ns waited runnable for a core), or None where there are none."""
    out = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat", "rb") as f:
                ran, waited = f.read().split()[:2]
        except (OSError, ValueError):
            continue   # a thread that ended meanwhile
        out[int(tid)] = (int(ran), int(waited))
    return out or None


def _package() -> object | None:
    """The CPU kernels' package once it is initialised (has ``KERNEL_FNS``)."""
    package = sys.modules.get(__package__)
    return package if getattr(package, "KERNEL_FNS", None) is not None else None


def allow_threads(on: bool) -> None:
    """Switch the threaded twins on or off: ``ALLOWED[0]`` and the table
    ``kernels.call`` indexes (``KERNEL_FNS``: while off its threaded half is
    the serial one, or the ``ONE_THREAD`` twin). Results are the same bits either way."""
    package = _package()
    if package is None:
        return
    if not _TABLES:
        fns = package.KERNEL_FNS
        off = {name: ONE_THREAD.get(name, fn) for name, fn in fns[0].items()}
        _TABLES.extend([(fns[0], off), fns])
        hook = _hook()
        if hook is not None:   # a recording sees the kernels the threshold picks
            hook._on_subscribe.append(_force)
    ALLOWED[0] = int(on)
    package.KERNEL_FNS = _TABLES[int(on)]


def _hook() -> object | None:
    """``kernels._hook`` once imported (this module is imported before it)."""
    return sys.modules.get(__package__.rsplit(".", 1)[0] + "._hook")


def _observed() -> bool:
    hook = _hook()
    return hook is not None and hook._observer is not None


def governed_serial(kern: object, name: str, threaded: Callable | None = None
                    ) -> Callable | None:
    """The kernel the governor runs in place of the threaded twin ``name``
    ("..._mt") of device module ``kern`` (``threaded``, when given, must be
    that twin): its ``ONE_THREAD`` twin or else its serial kernel; None for
    any other kernel."""
    if not name.endswith("_mt"):
        return None
    base = name[:-3]
    pair = getattr(kern, "KERNELS", {}).get(base)
    if pair is None or pair[1][1] != name or (threaded is not None and pair[1][0] is not threaded):
        return None
    return ONE_THREAD.get(base, pair[0][0])


class Governor:
    """Decides, from measured waits for a core, whether the threaded twins run.

    ``tick()`` takes one ``sample()`` and compares it with the last: over the
    window, the process's threads waited ``wait`` ns for a core and ran
    ``run`` ns. ``contended`` windows (``wait >= WAIT_CORES * wall`` and
    ``wait >= WAIT_SHARE * run``) switch threaded mode off through
    ``apply(False)``; in serial mode, once ``backoff`` seconds have passed
    with no contended window, ``apply(True)`` starts a ``PROBE``-second trial,
    kept when its window is not contended. A trial that fails (threads
    switched off again within ``SETTLE`` s of switching on) doubles the
    back-off, up to ``MAX_BACKOFF``. A window in which the process was mostly
    idle (runnable less than ``IDLE`` of it) and did not wait is no evidence:
    it does not count towards ``SETTLE`` and starts no trial (seen: windows
    half idle between short bursts of work found the cores "free" and let
    the next burst start threaded on busy cores, 1.8x the serial time).
    ``sample``, ``clock``, ``apply`` and ``observed`` are parameters so tests
    can drive it without load or time.
    """

    INTERVAL = 0.25      # s between ticks
    PROBE = 0.05         # s a trial of the threads lasts
    FIRST_BACKOFF = 0.5  # s in serial mode before the first trial
    MAX_BACKOFF = 4.0
    SETTLE = 2.0         # s of threaded mode after which a contended window is news
    WAIT_CORES = 0.02    # waits per wall second (cores) that count as contention
    WAIT_SHARE = 0.2     # ... and per second run
    # runnable (run + wait) per wall second (cores) below which a window of
    # no contention says nothing: mostly idle, its few waits prove no free core
    IDLE = 0.5

    def __init__(self, sample: Callable[[], Sample | None] = schedstat,
                 clock: Callable[[], float] = time.monotonic,
                 apply: Callable[[bool], None] = allow_threads,
                 observed: Callable[[], bool] = _observed) -> None:
        self.sample, self.clock, self.apply, self.observed = sample, clock, apply, observed
        self.threaded = True
        self.since = -math.inf         # when the current mode began (no trial at first)
        self.backoff = self.FIRST_BACKOFF
        self.probe_at = 0.0            # serial mode: when the next trial starts
        self.switches = 0
        self.last: tuple[float, Sample] | None = None
        self.lock = threading.Lock()   # tick (governor thread) vs force (subscribing thread)

    def window(self, now: float, current: Sample) -> tuple[float, float, float]:
        """(wall, run, wait) in seconds since the last sample, over the threads
        present in both (one that started or ended meanwhile is left out)."""
        last, self.last = self.last, (now, current)
        if last is None or now <= last[0]:
            return 0.0, 0.0, 0.0
        run = wait = 0
        before = last[1]
        for tid, (ran, waited) in current.items():
            old = before.get(tid)
            if old is not None:
                run += ran - old[0]
                wait += waited - old[1]
        return now - last[0], run * 1e-9, wait * 1e-9

    def contended(self, wall: float, run: float, wait: float) -> bool:
        """Whether a window's threads waited for a core enough to say the cores
        are busy with other work."""
        return wall > 0 and wait >= self.WAIT_CORES * wall and wait >= self.WAIT_SHARE * run

    def tick(self) -> float | None:
        """Measure the window since the last tick and decide; the seconds until
        the next tick (None: no measurements here, stop)."""
        current = self.sample()
        if current is None:
            return None
        with self.lock:
            now = self.clock()
            wall, run, wait = self.window(now, current)
            busy = self.contended(wall, run, wait)
            if self.threaded:
                if busy and not self.observed():
                    failed = now - self.since < self.SETTLE
                    self.backoff = (min(2 * self.backoff, self.MAX_BACKOFF) if failed
                                    else self.FIRST_BACKOFF)
                    self.switch(False, now)
                    self.probe_at = now + self.backoff
                elif not busy and run + wait < self.IDLE * wall:
                    self.since += wall   # hardly ran: no evidence, not settling
                return self.INTERVAL
            if busy:       # even the serial thread waits: threads would wait more
                self.probe_at = max(self.probe_at, now + self.backoff)
            elif now >= self.probe_at and run + wait >= self.IDLE * wall:
                # a trial only while the serial kernels work: an idle window
                # says nothing of the cores, and a trial begun then would have
                # the next work start threaded on cores that may be busy
                self.switch(True, now)
                return self.PROBE
            return self.INTERVAL

    def switch(self, on: bool, now: float) -> None:
        self.threaded, self.since = on, now
        self.switches += 1
        self.apply(on)

    def force(self) -> None:
        """Threads on now, as the threshold says (an observer subscribes: a
        recording must name the kernels the threshold picks; the governor
        stops or has no measurements)."""
        with self.lock:
            if not self.threaded:
                self.switch(True, self.clock())


governor: Governor | None = None
_stop = threading.Event()
_thread: list[threading.Thread] = []   # the running governor's thread


def _loop(gov: Governor, stop: threading.Event) -> None:
    delay: float | None = gov.INTERVAL
    while delay is not None and not stop.wait(delay):
        if _package() is None:    # the kernels still import: nothing to switch yet
            continue
        if not _TABLES:
            allow_threads(True)   # the tables, and _force subscribed to observers
        try:
            delay = gov.tick()
        except Exception:   # noqa: BLE001 (never let a measurement take threads down)
            delay = None
    if delay is None and not stop.is_set():   # no measurements: threads as the threshold says
        gov.force()


def _force() -> None:
    """Threads on while an observer subscribes (``kernels._hook._on_subscribe``)."""
    if governor is not None:
        governor.force()
    if not ALLOWED[0]:
        allow_threads(True)


def start_governor() -> Governor | None:
    """Start the governor thread (``Governor`` with the real measurements)
    unless it runs, threads are never used, NUMBAGRAD_THREAD_GOVERNOR is 0, or
    this system has no scheduler counts; the governor, or None."""
    global governor, _stop
    if governor is not None:
        return governor
    if not GOVERNED or MT_MIN == NEVER or schedstat() is None:
        return None
    governor = Governor()
    _stop = threading.Event()
    _thread[:] = [threading.Thread(target=_loop, args=(governor, _stop), daemon=True,
                                   name="numbagrad-thread-governor")]
    _thread[0].start()
    return governor


def stop_governor() -> None:
    """Stop the governor thread and leave the threads on (tests; the opt-out
    is NUMBAGRAD_THREAD_GOVERNOR=0)."""
    global governor
    gov, governor = governor, None
    _stop.set()
    for thread in _thread:
        if thread is not threading.current_thread():
            thread.join(timeout=5.0)
    _thread.clear()
    if gov is not None:
        gov.force()
    if _TABLES:
        allow_threads(True)


def _after_fork() -> None:
    global governor
    if governor is not None:   # its thread did not survive the fork
        governor = None
        _thread.clear()
        if _TABLES:
            allow_threads(True)
        start_governor()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)
start_governor()

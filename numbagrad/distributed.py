"""Data-parallel training over MPI (mpi4py), like Horovod or DDP.

Import it only when needed (``import numbagrad.distributed as dist``): it
needs mpi4py and an MPI library (``pip install numbagrad[mpi]``; on a laptop
or CI also ``pip install mpich``). Launch with ``mpiexec -n N python
train.py`` (or ``python -m mpi4py train.py``).

Each rank runs its own shard through the usual loop. ``DistributedOptimizer``
sums the window's gradients across ranks with one in-place allreduce of the
optimizer's flat gradient buffer (one per device/dtype group) at the window
boundary only, and folds the averaging into the update kernel; the other
micro-steps talk to no one, as DDP's ``no_sync``. The buffer's spare tail
carries what the ranks must agree on through that same allreduce: the
window's micro-steps (or, with ``average="samples"``, its samples), whether
each rank flushes a partial window and whether it has run out of data
(``join()``). Clipping and the non-finite check see the reduced total, so
every rank decides the same.

A failing rank ends the job within seconds instead of leaving the others
waiting in a collective forever:

- importing this module in a job of more than one process (importing
  mpi4py's ``MPI`` initialises MPI) installs a ``sys.excepthook`` that prints
  an uncaught exception and aborts every rank, as ``-m mpi4py`` does, so an
  exception before ``init()`` is covered too;
- a rank that leaves without an exception (its script ends, ``sys.exit``)
  says so from an ``atexit`` handler: a small message to every other rank
  (tag ``BYE_TAG`` on ``COMM_WORLD``: a script's own receives on that
  communicator should name their tags). This module's collectives wait by
  polling a nonblocking collective, and one that waits for a rank that left
  raises a ``RuntimeError`` naming it (which then aborts the job). A rank
  that ends normally waits at exit for every other rank's goodbye, so every
  rank must import this module (they run the same script);
- ``init(timeout=...)`` or ``$NUMBAGRAD_MPI_TIMEOUT`` bounds every wait, for
  a rank that hangs or dies without a word;
- ranks whose data runs out at different micro-steps raise a clear error at
  the first window where they differ, unless every rank trains inside
  ``DistributedOptimizer.join()``, which handles uneven data.

Out of reach: a rank that fails before MPI is initialised in it (before it
imports mpi4py or this module) leaves the others inside ``MPI_Init``, so
import this module first; and collectives a script issues itself
(``comm.allreduce``, ``comm.Barrier``) are not watched.
"""
from __future__ import annotations

import atexit
import contextlib
import hashlib
import math
import os
import pickle
import signal
import sys
import time
import traceback
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from mpi4py import MPI

from . import kernels
from .optim import Optimizer
from .optim._checks import collect_params
from .optim.groups import COUNT_LIMIT, TAIL
from .tensor import note_writes

ABORT_DELAY = 0.5   # seconds between printing an uncaught exception and MPI_Abort
BYE_TAG = 28263     # COMM_WORLD point-to-point tag of a leaving rank's message
GRACE = 1.0         # seconds a collective may still take to complete after a rank left
CHECK_EVERY = 0.002  # seconds between checks for departed ranks and the deadline
SPIN = 1e-4         # seconds a wait polls before it yields the CPU between polls
TIMEOUT_ENV = "NUMBAGRAD_MPI_TIMEOUT"
# The first gradient buffer's tail in the window's allreduce, each element an
# integer summed over ranks: [0] joined + (ranks + 1) * flushing, [1] ranks not
# inside join(), [2:] the count (samples or micro-steps) as base-2**SHIFT digits.
SHIFT = 14
DIGITS = TAIL - 2
if 1 << (SHIFT * DIGITS) < COUNT_LIMIT:
    raise ImportError("the gradient buffer's tail cannot hold a window's count")

_comm: MPI.Comm | None = None
_previous_excepthook: Any = None
_installed = False
_timeout: float | None = None
_gone: dict[int, tuple[float, dict]] = {}   # world rank -> (when it said goodbye, its note)
_optimizers: list[weakref.ref] = []          # this process's DistributedOptimizers


def init(comm: MPI.Comm | None = None, *, timeout: float | None = None) -> MPI.Comm:
    """Choose the communicator (default ``MPI.COMM_WORLD``); return it.

    ``timeout`` (seconds; default ``$NUMBAGRAD_MPI_TIMEOUT``, else no limit)
    bounds how long any collective of this module waits for the other ranks
    before raising a ``RuntimeError``; it catches a rank that hangs.

    When the job has more than one process, it also makes sure the failure
    handling of the module docstring is installed (importing the module
    already did, unless mpi4py was told not to initialise MPI): an uncaught
    exception prints (through the hook it replaces) and, ``ABORT_DELAY``
    seconds later (for the launcher to forward the output), calls
    ``MPI.COMM_WORLD.Abort`` (exit status 1, or 130 for KeyboardInterrupt);
    a rank that exits otherwise tells the others. Interactive sessions
    (``python -i``) keep their hook; an exception in a thread other than the
    main one does not go through ``sys.excepthook``.
    """
    global _comm, _timeout
    if not MPI.Is_initialized():
        MPI.Init()
    _timeout = _checked_timeout(timeout, "init(timeout=)") if timeout is not None \
        else _env_timeout()
    _comm = comm if comm is not None else MPI.COMM_WORLD
    _install()
    return _comm


def _checked_timeout(value: Any, what: str) -> float:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a number of seconds, got {value!r}") from None
    if not seconds > 0 or math.isinf(seconds):
        raise ValueError(f"{what} must be a finite number of seconds > 0, got {value!r}")
    return seconds


def _env_timeout() -> float | None:
    value = os.environ.get(TIMEOUT_ENV, "").strip()
    return _checked_timeout(value, f"${TIMEOUT_ENV}") if value else None


def _install() -> None:
    """The excepthook and the goodbye at exit, once, in a job of more than one process."""
    global _installed, _previous_excepthook
    if _installed or MPI.COMM_WORLD.Get_size() < 2:
        return
    _installed = True
    atexit.register(_say_goodbye)
    if not sys.flags.interactive and sys.excepthook is not _abort_on_uncaught:
        _previous_excepthook = sys.excepthook
        sys.excepthook = _abort_on_uncaught


def _abort_on_uncaught(kind: type[BaseException], value: BaseException, tb: Any) -> None:
    """``sys.excepthook`` of a job: print the exception, then abort every rank.
    With Python's own hook the traceback and the abort line go out in one
    write: the default hook writes a traceback piece by piece, and two
    ranks failing at once interleaved theirs mid-line in the launcher's
    output."""
    try:
        world = MPI.COMM_WORLD
        line = (f"numbagrad.distributed: rank {world.Get_rank()} of {world.Get_size()} raised "
                f"{kind.__name__}; aborting the job (MPI_Abort)\n")
        hook = _previous_excepthook or sys.__excepthook__
        sys.stdout.flush()
        if hook is sys.__excepthook__:
            sys.stderr.write("".join(traceback.format_exception(kind, value, tb)) + line)
        else:
            hook(kind, value, tb)
            sys.stderr.write(line)
        sys.stdout.flush()
        sys.stderr.flush()
        # MPI_Abort ends the launcher too, which drops output it has not yet
        # forwarded (other ranks' tracebacks as well): give it a moment.
        time.sleep(ABORT_DELAY)
    finally:
        MPI.COMM_WORLD.Abort(128 + signal.SIGINT if issubclass(kind, KeyboardInterrupt) else 1)


def _progress() -> list[tuple[str, int, int]]:
    """(class, t, pending micro-steps) of each live DistributedOptimizer here."""
    found = [ref() for ref in _optimizers]
    return [(type(o._opt).__name__, o._opt.t, o._opt.pending_steps)
            for o in found if o is not None]


def _say_goodbye() -> None:
    """At exit: tell every other rank that this one has left, and hear theirs.

    Every rank sends its goodbye at exit, so a rank that ends first waits
    here for the others' (bounded by the timeout, if one is set): a message
    left unreceived at ``MPI_Finalize`` can make MPICH kill the job.
    """
    if not MPI.Is_initialized() or MPI.Is_finalized():
        return
    world = MPI.COMM_WORLD
    me, ranks = world.Get_rank(), world.Get_size()
    note = {"progress": _progress()}
    try:
        requests = [world.isend(note, dest=r, tag=BYE_TAG) for r in range(ranks) if r != me]
        start = time.monotonic()
        while True:
            _receive_goodbyes()
            if MPI.Request.Testall(requests) and len(_gone) >= ranks - 1:
                return
            if _timeout is not None and time.monotonic() - start > _timeout:
                missing = sorted(set(range(ranks)) - set(_gone) - {me})
                print(f"numbagrad.distributed: rank {me} exits without a goodbye from "
                      f"rank(s) {missing} after {_timeout:g} s", file=sys.stderr, flush=True)
                return
            time.sleep(CHECK_EVERY / 4)
    except MPI.Exception as exc:   # no goodbye: the others wait as they would without it
        print(f"numbagrad.distributed: rank {me} could not say goodbye: {exc}",
              file=sys.stderr, flush=True)


def _receive_goodbyes() -> None:
    world = MPI.COMM_WORLD
    status = MPI.Status()
    while world.Iprobe(source=MPI.ANY_SOURCE, tag=BYE_TAG, status=status):
        source = status.Get_source()
        _gone[source] = (time.monotonic(), world.recv(source=source, tag=BYE_TAG))


def _gone_members(comm: MPI.Comm) -> list[int]:
    """The world ranks of ``comm``'s members that have said goodbye."""
    left = list(_gone)
    world_group, group = MPI.COMM_WORLD.Get_group(), comm.Get_group()
    try:
        there = world_group.Translate_ranks(left, group)
    finally:
        world_group.Free()
        group.Free()
    return [r for r, t in zip(left, there) if t != MPI.UNDEFINED]


def _wait(request: MPI.Request, comm: MPI.Comm, what: str | Callable[[], str]) -> None:
    """Complete a nonblocking collective on ``comm``, as ``Wait`` would, but raise
    a ``RuntimeError`` if a member has left the job or the timeout passes.

    It polls ``Test`` (the collective progresses only inside MPI calls),
    giving up the CPU between polls after the first ``SPIN`` s, as MPI's
    blocking waits do (the ranks may share cores), and checks every
    ``CHECK_EVERY`` s.
    """
    if request.Test():
        return
    start = time.monotonic()
    spin, check = start + SPIN, start + CHECK_EVERY
    while not request.Test():
        now = time.monotonic()
        if now >= spin:
            _yield()
        if now >= check:
            check = now + CHECK_EVERY
            _check_peers(comm, what, now - start)


_yield = getattr(os, "sched_yield", None) or (lambda: time.sleep(0))


def _check_peers(comm: MPI.Comm, what: str | Callable[[], str], waited: float) -> None:
    _receive_goodbyes()
    left = _gone_members(comm) if _gone else []
    now = time.monotonic()
    late = [r for r in left if now - _gone[r][0] >= GRACE]
    if late:
        rank = min(late)
        held = "; ".join(f"its {name} at t={t} with {pos} micro-step(s) pending"
                         for name, t, pos in _gone[rank][1].get("progress", []))
        raise RuntimeError(
            f"{_say(what)} cannot complete: rank {rank} has left the job (its script ended "
            f"or called sys.exit(){'; ' + held if held else ''}) while rank "
            f"{MPI.COMM_WORLD.Get_rank()} waits for it. Every rank must take part in the "
            f"same collectives; if the ranks' data is uneven, run every rank's loop inside "
            f"`with opt.join():`")
    if _timeout is not None and waited >= _timeout:
        raise RuntimeError(
            f"{_say(what)} waited {waited:.1f} s for the other ranks (timeout {_timeout:g} s, "
            f"from init(timeout=) or ${TIMEOUT_ENV}): one of them is stuck or has died, or "
            f"the ranks run different numbers of windows (uneven data needs `with "
            f"opt.join():`)")


def _say(what: str | Callable[[], str]) -> str:
    return what() if callable(what) else what


def _allgather(comm: MPI.Comm, obj: Any, what: str) -> list:
    """Every rank's ``obj`` (pickled), gathered with two polled collectives."""
    data = np.frombuffer(pickle.dumps(obj), np.uint8)
    sizes = np.empty(comm.Get_size(), np.int64)
    _wait(comm.Iallgather(np.array([data.size], np.int64), sizes), comm, what)
    displs = np.zeros_like(sizes)
    np.cumsum(sizes[:-1], out=displs[1:])
    out = np.empty(int(sizes.sum()), np.uint8)
    _wait(comm.Iallgatherv(data, [out, sizes, displs, MPI.BYTE]), comm, what)
    return [pickle.loads(out[d:d + n].tobytes()) for d, n in zip(displs, sizes)]


def _world() -> MPI.Comm:
    return _comm if _comm is not None else init()


def rank() -> int:
    """This process's rank in the communicator."""
    return _world().Get_rank()


def size() -> int:
    """How many ranks take part."""
    return _world().Get_size()


def _each(values: list) -> str:
    return ", ".join(f"rank {r}: {v}" for r, v in enumerate(values))


def _compare(described: list[list[tuple[str, Any]]]) -> None:
    """Raise a ``ValueError`` naming the first field whose value differs across
    ranks (each rank's ``described`` is a list of (field, value))."""
    order: list[str] = []
    for fields in described:
        order += [name for name, _ in fields if name not in order]
    values_of = [dict(fields) for fields in described]
    for name in order:
        values = [mine.get(name, "(none)") for mine in values_of]
        if any(v != values[0] for v in values):
            raise ValueError(f"ranks disagree on {name} ({_each(values)}); every rank's "
                             f"optimizer must be the same, or their weights diverge")


def _agree(comm: MPI.Comm, fields: list[tuple[str, Any]], params: list,
           names: list[str], what: str) -> None:
    """Check with one small allgather that every rank has the same ``fields``
    (name, value) and param layout; raise on every rank where they differ.

    Every rank sees the same gathered values, so every rank raises the same
    ``ValueError``, naming the first difference and each rank's value.
    """
    layout = [(name, tuple(p.shape), str(p.dtype)) for name, p in zip(names, params)]
    gathered = _allgather(comm, (fields, layout), what)
    _compare([theirs for theirs, _ in gathered])
    counts = [len(theirs) for _, theirs in gathered]
    if len(set(counts)) > 1:
        raise ValueError(f"ranks have different numbers of params ({_each(counts)})")
    for j in range(counts[0]):
        entries = [theirs[j] for _, theirs in gathered]
        if any(e[1:] != entries[0][1:] for e in entries):
            shapes = [f"shape {e[1]} {e[2]}" for e in entries]
            raise ValueError(f"param {entries[0][0]} differs across ranks ({_each(shapes)})")


def _description(opt: Optimizer) -> list[tuple[str, Any]]:
    """What ranks must agree on: the class, every hyper-parameter and ``t``."""
    return [("the optimizer class", type(opt).__name__), *opt._hyper().items(),
            ("t (updates applied)", opt.t)]


def _max_ranks(dtype: Any) -> int:
    """The most ranks whose tail sums stay exact integers in ``dtype``."""
    exact = 2 ** (np.finfo(dtype).nmant + 1)
    return min(exact // ((1 << SHIFT) - 1), math.isqrt(exact + 1) - 1)


def broadcast_parameters(params: Any, root: int = 0) -> None:
    """Overwrite every param's data with ``root``'s, in place.

    ``params`` is what optimizers take: an iterable or a name -> param
    mapping. Call it once after building the model so all ranks start equal.
    It first checks (one small allgather) that every rank passes the same
    number of params with the same shapes and dtypes, and raises a
    ``ValueError`` on every rank otherwise.
    """
    comm = _world()
    plist, names = collect_params(params)
    what = "broadcast_parameters()"
    _agree(comm, [], plist, names, what)
    for p in plist:
        if p.device == "cpu":
            _wait(comm.Ibcast(p.data, root=root), comm, what)
        else:
            host = p.numpy()
            _wait(comm.Ibcast(host, root=root), comm, what)
            kernels.call(p._kern, "upload", 0, host, p.data)
    note_writes(plist)


class DistributedOptimizer:
    """Wraps an optimizer so its windows are reduced across ranks.

    Everything else (``step``, ``flush``, ``zero_grad``, ``t``, ``lr``, state
    dicts) behaves as the wrapped optimizer's; ``flush`` is collective. CUDA
    gradient buffers are staged through a preallocated host buffer unless
    ``cuda_aware=True`` says the MPI library can read device memory itself.

    Every param is updated at every window, reached or not (a param no rank
    reached gets a zero gradient), so that ranks can never diverge. At
    construction every rank must agree on the optimizer class, every
    hyper-parameter (``lr`` or its schedule's description, momentum, betas,
    eps, weight_decay, accumulate_steps, average, nonfinite, max_grad_norm),
    ``t`` and the param layout, or every rank raises a ``ValueError`` naming
    the first difference and each rank's value. The first window checks the
    same again (one allgather of a digest), catching a ``load_state_dict``
    or ``lr`` set differently since; later changes must be made on every rank
    alike (checking them would cost a collective per window). A callable
    ``lr`` that is not a built-in schedule is compared by name only.

    A rank whose window closes (its ``accumulate_steps``-th step) while
    another flushes a partial window, or that runs out of data inside
    ``join()`` while another is not inside it, makes every rank raise a
    ``RuntimeError`` naming each rank's state: their data is uneven, which
    ``join()`` handles.
    """

    def __init__(self, optimizer: Optimizer, comm: MPI.Comm | None = None,
                 cuda_aware: bool = False) -> None:
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"DistributedOptimizer wraps a numbagrad optimizer, "
                            f"got {type(optimizer).__name__}")
        win = optimizer._window
        if win.hook is not None:
            raise ValueError("this optimizer is already wrapped by a DistributedOptimizer")
        self._comm = comm if comm is not None else _world()
        self._size = self._comm.Get_size()
        dtype = win.groups[0].dtype
        if self._size > _max_ranks(dtype):
            raise ValueError(f"DistributedOptimizer counts in the {dtype} gradient buffer, "
                             f"exactly for up to {_max_ranks(dtype)} ranks; this communicator "
                             f"has {self._size} (make the first param float64)")
        params = list(optimizer.params)
        names = [win.names[p.id] for p in params]
        _agree(self._comm, _description(optimizer), params, names, "DistributedOptimizer()")
        self._opt = optimizer
        self._cuda_aware = cuda_aware
        self._staging: dict[int, np.ndarray] = {}   # device buffer id -> host twin
        self._agreed = False      # the first window's check is still to come
        self._in_join = False     # inside join()
        self._joined = False      # left join()'s body: shadowing the others' windows
        self._all_joined = False  # every rank has left join()'s body
        self.allreduce_seconds = 0.0   # time spent in allreduce, for benchmarks
        self.allreduce_calls = 0
        win.hook = self
        win.all_live = True
        _optimizers[:] = [ref for ref in _optimizers if ref() is not None]
        _optimizers.append(weakref.ref(self))

    # -------------------------------------------------- uneven data
    @contextlib.contextmanager
    def join(self) -> Iterator[DistributedOptimizer]:
        """Train on uneven data: ``with opt.join(): for batch in my_shard: ...``.

        As torch DDP's ``Join``: a rank whose loop has ended (its data ran
        out) keeps taking part in the other ranks' window allreduces with
        zero gradients, applying the same updates, so the ranks stay equal;
        the block ends on every rank once all have left their loops. A
        partial window left on a rank goes into the next allreduce, and
        what is left at the very end is applied as ``flush()`` would: the
        result is the one-process result over the same windows of data.
        Each window divides by the micro-steps (or samples) that reached it
        (``average=False``: by the ranks that have not left their loops,
        or add their last partial window). Whether a rank has left rides in
        the window's allreduce, so the cost is one allreduce per window,
        plus one at the end. Every rank must use it, one optimizer per
        ``join`` (two optimizers whose windows interleave cannot be
        shadowed). An exception in the block leaves it at once, without
        shadowing (the excepthook then ends the job).
        """
        if self._in_join:
            raise RuntimeError("join() is already active for this optimizer")
        self._in_join = True
        try:
            yield self
            self._joined = True
            while not self._all_joined:
                self._opt.flush()
        finally:
            self._in_join = self._joined = self._all_joined = False

    # -------------------------------------------------- the window hook
    def reduce(self, buffers: list, sizes: list[int], pos: int, count: int
               ) -> tuple[int, int] | None:
        """Sum each flat gradient buffer across ranks in place, one allreduce each.

        The first buffer's tail carries ``count`` and this rank's state (see
        the module docstring); the tail is zero again on return. Returns
        (ranks in their loops, summed count), or None when there is nothing
        to apply; raises on every rank where the ranks are out of step.
        """
        if not self._agreed:
            self._check_first_window()
        groups = self._opt._window.groups
        kept = None
        if pos == 0 and any(p._live for g in groups for p in g.params):
            # A .grad from backward() without step() on an empty window: summed
            # in if another rank's window applies, kept as it was if none does
            # (a buffer not live must hold zeros: backward adds into it).
            kept = [kernels.to_host(g.kern, flat) for g, flat in zip(groups, buffers)]
        start = time.perf_counter()
        tail = self._tail(pos, count)
        summed = None
        for index, (flat, n) in enumerate(zip(buffers, sizes)):
            mine = tail if index == 0 else None
            if isinstance(flat, np.ndarray):
                got = self._reduce_host(flat, n, mine)
            elif not self._cuda_aware:
                host = self._staging.get(id(flat))
                if host is None:   # made at the first window, reused after
                    host = self._staging[id(flat)] = np.empty(flat.shape, flat.dtype)
                flat.copy_to_host(host)
                got = self._reduce_host(host, n, mine)
                flat.copy_to_device(host)
            else:
                kern = groups[index].kern
                if mine is not None:
                    kernels.call(kern, "upload", 0, mine, flat[n:n + TAIL])
                # Launches are asynchronous and MPI reads device memory
                # directly: the gradient kernels must have finished first.
                kern.synchronize()
                self._allreduce(flat)
                got = None
                if mine is not None:
                    got = kernels.to_host(kern, flat[n:n + TAIL])
                    kernels.call(kern, "fill", 0, flat[n:n + TAIL], 0.0)
            if index == 0:
                summed = got
            self.allreduce_calls += 1
        self.allreduce_seconds += time.perf_counter() - start
        settled = self._settle(summed, pos)
        if settled is None:   # nothing applies: every buffer back as it was (zero, or kept)
            for g, flat, host in zip(groups, buffers, kept or [None] * len(groups)):
                if host is None:
                    kernels.call(g.kern, "fill", 0, flat, 0.0)
                else:
                    kernels.call(g.kern, "upload", 0, host, flat)
        return settled

    def _tail(self, pos: int, count: int) -> np.ndarray:
        joined = self._joined and pos == 0
        flushing = not joined and pos < self._opt._window.accumulate_steps
        mask = (1 << SHIFT) - 1
        return np.array([joined + (self._size + 1) * flushing, not self._in_join,
                         *[(count >> (SHIFT * j)) & mask for j in range(DIGITS)]], np.float64)

    def _reduce_host(self, flat: np.ndarray, n: int, tail: np.ndarray | None
                     ) -> np.ndarray | None:
        if tail is not None:
            flat[n:n + TAIL] = tail
        self._allreduce(flat)
        if tail is None:
            return None
        summed = flat[n:n + TAIL].astype(np.float64)
        flat[n:n + TAIL] = 0.0
        return summed

    def _allreduce(self, flat: Any) -> None:
        _wait(self._comm.Iallreduce(MPI.IN_PLACE, flat, op=MPI.SUM), self._comm,
              lambda: f"the gradient allreduce of the window for update t={self._opt.t}")

    def _settle(self, summed: np.ndarray, pos: int) -> tuple[int, int] | None:
        """What the window's reduced tail says: (ranks, count), None or an error."""
        size = self._size
        state = round(float(summed[0]))
        joined, flushing = state % (size + 1), state // (size + 1)
        outside = round(float(summed[1]))
        total = sum(round(float(d)) << (SHIFT * j) for j, d in enumerate(summed[2:]))
        stepping = size - joined - flushing
        if outside and (joined or (flushing and stepping)):
            self._out_of_step(pos, joined)
        if joined == size:
            self._all_joined = True
            return None
        return (size - joined, total) if total else None

    def _out_of_step(self, pos: int, joined: int) -> None:
        """Every rank found the ranks out of step: gather their states, raise."""
        k = self._opt._window.accumulate_steps
        mine = (self._in_join, self._joined and pos == 0, self._opt.t, pos)
        states = _allgather(self._comm, mine, "gathering the ranks' states after a mismatch")

        def describe(r: int, inside: bool, shadow: bool, t: int, p: int) -> str:
            where = ", inside join()" if inside else ""
            if shadow:
                return f"rank {r} has left join(): its data ran out (t={t})"
            if p == k:
                return f"rank {r} closes a window of {k} micro-steps (t={t}{where})"
            return f"rank {r} calls flush() with {p} of {k} micro-step(s) (t={t}{where})"
        each = "; ".join(describe(r, *s) for r, s in enumerate(states))
        problem = ("a rank ran out of data inside join(), but not every rank is inside join()"
                   if joined else "the ranks are out of step")
        raise RuntimeError(f"{problem}: {each}. Their data ran out at different micro-steps "
                           f"(uneven shards): give every rank the same number of micro-steps, "
                           f"or run every rank's loop inside `with opt.join():`")

    def _check_first_window(self) -> None:
        """One allgather of a digest of the description; on a difference, name it."""
        mine = _description(self._opt)
        digest = np.frombuffer(hashlib.sha256(repr(mine).encode()).digest(), np.uint8)
        everyone = np.empty((self._size, digest.size), np.uint8)
        what = "the first window's check that the ranks' optimizers agree"
        _wait(self._comm.Iallgather(digest, everyone), self._comm, what)
        if (everyone != everyone[0]).any():
            _compare(_allgather(self._comm, mine, what))
        self._agreed = True

    # The wrapped optimizer's API (step, flush, zero_grad, t, state dicts...)
    # is served by __getattr__; lr needs a property so that setting it reaches it.
    @property
    def optimizer(self) -> Optimizer:
        return self._opt

    @property
    def lr(self) -> float:
        return self._opt.lr

    @lr.setter
    def lr(self, value: float) -> None:
        self._opt.lr = value

    def __getattr__(self, name: str) -> Any:
        if name == "_opt":   # not set yet: construction failed part-way
            raise AttributeError(name)
        return getattr(self._opt, name)


if MPI.Is_initialized():
    _timeout = _env_timeout()
    _install()

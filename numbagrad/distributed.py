"""Data-parallel training over MPI (mpi4py), like Horovod or DDP.

Import it only when needed (``import numbagrad.distributed as dist``): it
needs mpi4py and an MPI library (``pip install numbagrad[mpi]``; on a laptop
or CI also ``pip install mpich``). Launch with ``mpiexec -n N python
train.py`` (or ``python -m mpi4py train.py``): after ``init()`` an uncaught
exception in any rank is printed and aborts the whole job, as ``-m mpi4py``
does, instead of leaving the other ranks waiting in a collective forever.

Each rank runs its own shard through the usual loop. ``DistributedOptimizer``
sums the window's gradients across ranks with one in-place allreduce of the
optimizer's flat gradient buffer (one per device/dtype group) at the window
boundary only, and folds the averaging into the update kernel; the other
micro-steps talk to no one, as DDP's ``no_sync``. With ``average="samples"``
the window's sample count rides in the same allreduce. Clipping and the
non-finite check see the reduced total, so every rank decides the same.
"""
from __future__ import annotations

import signal
import sys
import time
from typing import Any

import numpy as np
from mpi4py import MPI

from . import kernels
from .optim import Optimizer
from .optim._checks import collect_params
from .optim.groups import TAIL, decode_count, encode_count

ABORT_DELAY = 0.5   # seconds between printing an uncaught exception and MPI_Abort
_comm: MPI.Comm | None = None
_previous_excepthook: Any = None


def init(comm: MPI.Comm | None = None) -> MPI.Comm:
    """Choose the communicator (default ``MPI.COMM_WORLD``); return it.

    When the job has more than one process, it also installs a
    ``sys.excepthook`` that prints an uncaught exception (through the hook
    it replaces) and, ``ABORT_DELAY`` seconds later (for the launcher to
    forward the output), calls ``MPI.COMM_WORLD.Abort``, as ``python -m
    mpi4py`` does: a rank that raises ends every rank (exit status 1, or
    130 for KeyboardInterrupt) rather than leaving them waiting in an
    allreduce. Interactive sessions (``python -i``) keep their hook. An
    exception in a thread other than the main one, or ``sys.exit(n)``, does
    not go through ``sys.excepthook`` and aborts nothing.
    """
    global _comm, _previous_excepthook
    if not MPI.Is_initialized():
        MPI.Init()
    _comm = comm if comm is not None else MPI.COMM_WORLD
    if (MPI.COMM_WORLD.Get_size() > 1 and not sys.flags.interactive
            and sys.excepthook is not _abort_on_uncaught):
        _previous_excepthook = sys.excepthook
        sys.excepthook = _abort_on_uncaught
    return _comm


def _abort_on_uncaught(kind: type[BaseException], value: BaseException, tb: Any) -> None:
    """``sys.excepthook`` after ``init()``: print the exception, then abort every rank."""
    try:
        (_previous_excepthook or sys.__excepthook__)(kind, value, tb)
        world = MPI.COMM_WORLD
        print(f"numbagrad.distributed: rank {world.Get_rank()} of {world.Get_size()} raised "
              f"{kind.__name__}; aborting the job (MPI_Abort)", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        # MPI_Abort ends the launcher too, which drops output it has not yet
        # forwarded (other ranks' tracebacks as well): give it a moment.
        time.sleep(ABORT_DELAY)
    finally:
        MPI.COMM_WORLD.Abort(128 + signal.SIGINT if issubclass(kind, KeyboardInterrupt) else 1)


def _world() -> MPI.Comm:
    return _comm if _comm is not None else init()


def rank() -> int:
    """This process's rank in the communicator."""
    return _world().Get_rank()


def size() -> int:
    """How many ranks take part."""
    return _world().Get_size()


def _agree(comm: MPI.Comm, fields: list[tuple[str, Any]], params: list,
           names: list[str]) -> None:
    """Check with one small allgather that every rank has the same ``fields``
    (name, value) and param layout; raise on every rank where they differ.

    Every rank sees the same gathered values, so every rank raises the same
    ``ValueError``, naming the first difference and each rank's value.
    """
    layout = [(name, tuple(p.shape), str(p.dtype)) for name, p in zip(names, params)]
    gathered = comm.allgather((fields, layout))

    def each(values: list) -> str:
        return ", ".join(f"rank {r}: {v}" for r, v in enumerate(values))

    for i, (field, _) in enumerate(fields):
        values = [theirs[i][1] for theirs, _ in gathered]
        if any(v != values[0] for v in values):
            raise ValueError(f"ranks disagree on {field} ({each(values)})")
    counts = [len(theirs) for _, theirs in gathered]
    if len(set(counts)) > 1:
        raise ValueError(f"ranks have different numbers of params ({each(counts)})")
    for j in range(counts[0]):
        entries = [theirs[j] for _, theirs in gathered]
        if any(e[1:] != entries[0][1:] for e in entries):
            shapes = [f"shape {e[1]} {e[2]}" for e in entries]
            raise ValueError(f"param {entries[0][0]} differs across ranks ({each(shapes)})")


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
    _agree(comm, [], plist, names)
    for p in plist:
        if p.device == "cpu":
            comm.Bcast(p.data, root=root)
        else:
            host = p.numpy()
            comm.Bcast(host, root=root)
            kernels.call(p._kern, "upload", 0, host, p.data)


class DistributedOptimizer:
    """Wraps an optimizer so its windows are reduced across ranks.

    Everything else (``step``, ``flush``, ``zero_grad``, ``t``, ``lr``, state
    dicts) behaves as the wrapped optimizer's; ``flush`` is collective. CUDA
    gradient buffers are staged through a preallocated host buffer unless
    ``cuda_aware=True`` says the MPI library can read device memory itself.

    Every param is updated at every window, reached or not (a param no rank
    reached gets a zero gradient), so that ranks can never diverge. At
    construction every rank must agree on the optimizer class,
    accumulate_steps, average, nonfinite, max_grad_norm and param layout,
    or every rank raises a ``ValueError`` naming the first difference.
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
        params = list(optimizer.params)
        names = [win.names[p.id] for p in params]
        _agree(self._comm, [("the optimizer class", type(optimizer).__name__),
                            ("accumulate_steps", win.accumulate_steps),
                            ("average", win.average), ("nonfinite", win.nonfinite),
                            ("max_grad_norm", win.max_grad_norm)], params, names)
        self._opt = optimizer
        self._cuda_aware = cuda_aware
        self._staging: dict[int, np.ndarray] = {}   # device buffer id -> host twin
        self.allreduce_seconds = 0.0   # time spent in allreduce, for benchmarks
        self.allreduce_calls = 0
        win.hook = self
        win.all_live = True

    # -------------------------------------------------- the window hook
    def reduce(self, buffers: list, sizes: list[int], samples: int | None
               ) -> tuple[int, int | None]:
        """Sum each flat gradient buffer across ranks in place, one allreduce each.

        The first buffer's tail carries ``samples`` (when given); the tail is
        zero again on return. Returns (ranks, summed samples or None).
        """
        start = time.perf_counter()
        total = None
        for index, (flat, n) in enumerate(zip(buffers, sizes)):
            count = samples if index == 0 else None
            if isinstance(flat, np.ndarray):
                total = self._reduce_host(flat, n, count, total)
            elif not self._cuda_aware:
                host = self._staging.get(id(flat))
                if host is None:   # made at the first window, reused after
                    host = self._staging[id(flat)] = np.empty(flat.shape, flat.dtype)
                flat.copy_to_host(host)
                total = self._reduce_host(host, n, count, total)
                flat.copy_to_device(host)
            else:
                kern = self._opt._window.groups[index].kern
                if count is not None:
                    kernels.call(kern, "upload", 0, encode_count(count), flat[n:n + TAIL])
                # Launches are asynchronous and MPI reads device memory
                # directly: the gradient kernels must have finished first.
                kern.synchronize()
                self._comm.Allreduce(MPI.IN_PLACE, flat, op=MPI.SUM)
                if count is not None:
                    total = decode_count(kernels.to_host(kern, flat[n:n + TAIL]))
                    kernels.call(kern, "fill", 0, flat[n:n + TAIL], 0.0)
            self.allreduce_calls += 1
        self.allreduce_seconds += time.perf_counter() - start
        return self._comm.Get_size(), total

    def _reduce_host(self, flat: np.ndarray, n: int, count: int | None,
                     total: int | None) -> int | None:
        if count is not None:
            flat[n:n + TAIL] = encode_count(count)
        self._comm.Allreduce(MPI.IN_PLACE, flat, op=MPI.SUM)
        if count is not None:
            total = decode_count(flat[n:n + TAIL])
            flat[n:n + TAIL] = 0.0
        return total

    def total_positions(self, pos: int) -> int:
        """Every rank's window position, summed (``flush`` agrees on it first)."""
        return int(self._comm.allreduce(int(pos), op=MPI.SUM))

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

"""Data-parallel training over MPI (mpi4py), like Horovod or DDP.

Import it only when needed (``import numbagrad.distributed as dist``): it
needs mpi4py and an MPI library (``pip install numbagrad[mpi]``; on a laptop
or CI also ``pip install mpich``). Launch with
``mpiexec -n N python -m mpi4py train.py``: ``-m mpi4py`` turns an exception
in any rank into an abort of the whole job instead of a hang.

Each rank runs its own shard through the usual loop. ``DistributedOptimizer``
sums the window's gradients across ranks with one in-place allreduce of the
optimizer's flat gradient buffer (one per device/dtype group) at the window
boundary only, and folds the 1/size averaging into the update kernel; the
other micro-steps talk to no one, as DDP's ``no_sync``.
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np
from mpi4py import MPI

from .optim import Optimizer, _collect_params

_comm: MPI.Comm | None = None


def init(comm: MPI.Comm | None = None) -> MPI.Comm:
    """Choose the communicator (default ``MPI.COMM_WORLD``); return it."""
    global _comm
    if not MPI.Is_initialized():
        MPI.Init()
    _comm = comm if comm is not None else MPI.COMM_WORLD
    return _comm


def _world() -> MPI.Comm:
    return _comm if _comm is not None else init()


def rank() -> int:
    """This process's rank in the communicator."""
    return _world().Get_rank()


def size() -> int:
    """How many ranks take part."""
    return _world().Get_size()


def broadcast_parameters(params: Any, root: int = 0) -> None:
    """Overwrite every param's data with ``root``'s, in place.

    ``params`` is what optimizers take: an iterable or a name -> param
    mapping. Call it once after building the model so all ranks start equal.
    """
    comm = _world()
    plist, _ = _collect_params(params)
    for p in plist:
        if p.device == "cpu":
            comm.Bcast(p.data, root=root)
        else:
            host = p.numpy()
            comm.Bcast(host, root=root)
            p._kern.upload(host, p.data)


class DistributedOptimizer:
    """Wraps an SGD or Adam optimizer so its windows are averaged across ranks.

    Everything else (``step``, ``zero_grad``, ``t``, ``lr``, state dicts)
    behaves as the wrapped optimizer's. CUDA gradient buffers are staged
    through a preallocated host buffer unless ``cuda_aware=True`` says the
    MPI library can read device memory itself.

    Every param is updated at every window, reached or not (a param no rank
    reached gets a zero gradient), so that ranks can never diverge.
    """

    def __init__(self, optimizer: Optimizer, comm: MPI.Comm | None = None,
                 cuda_aware: bool = False) -> None:
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"DistributedOptimizer wraps a numbagrad optimizer, "
                            f"got {type(optimizer).__name__}")
        if optimizer._window_hook is not None:
            raise ValueError("this optimizer is already wrapped by a DistributedOptimizer")
        self._opt = optimizer
        self._comm = comm if comm is not None else _world()
        self._cuda_aware = cuda_aware
        self._staging: dict[int, np.ndarray] = {}   # device buffer id -> host twin
        self.allreduce_seconds = 0.0   # time spent in allreduce, for benchmarks
        self.allreduce_calls = 0
        optimizer._window_hook = self._allreduce
        optimizer._all_live = True

    def _allreduce(self, buffers: list) -> float:
        start = time.perf_counter()
        for flat in buffers:
            host = None
            if not isinstance(flat, np.ndarray) and not self._cuda_aware:
                host = self._staging.get(id(flat))
                if host is None:   # made at the first window, reused after
                    host = self._staging[id(flat)] = np.empty(flat.shape, flat.dtype)
            if host is None:
                self._comm.Allreduce(MPI.IN_PLACE, flat, op=MPI.SUM)
            else:
                flat.copy_to_host(host)
                self._comm.Allreduce(MPI.IN_PLACE, host, op=MPI.SUM)
                flat.copy_to_device(host)
            self.allreduce_calls += 1
        self.allreduce_seconds += time.perf_counter() - start
        return 1.0 / self._comm.Get_size()

    # The wrapped optimizer's API (step, zero_grad, t, state dicts...) is
    # served by __getattr__; lr needs a property so that setting it reaches it.
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
        return getattr(self._opt, name)

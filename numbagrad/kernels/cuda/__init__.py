"""CUDA kernels: ``@cuda.jit`` functions from numba-cuda behind host launchers.

The launchers here have the names and destination-passing signatures of
``kernels/cpu``. Each one issues exactly one kernel launch, counted by
``launch_count()``; every host<->device copy goes through ``from_host``,
``to_host`` or ``upload`` and is counted by ``transfer_count()``. As on the
CPU, each family module lists the launchers it registers in ``__all__`` (the
rule is in ``kernels/_registry.py``): this package imports them all, binds
them here (``cuda.unary``) beside ``_core``'s memory helpers and counters,
and builds ``KERNELS``, whose names must be the CPU's (``tests/test_registry.py``).

Launch shapes come from the environment, read once at import:
``NUMBAGRAD_CUDA_TILE`` (GEMM threads per block side, default 16),
``NUMBAGRAD_CUDA_WPT`` (GEMM outputs per thread per side, default 4),
``NUMBAGRAD_CUDA_THREADS`` (threads per block of the 1-D kernels, a power
of two, default 256) and ``NUMBAGRAD_CUDA_BLOCKS`` (grid cap of the 1-D
grid-stride kernels, default 1024). Tests shrink them under the simulator.
"""
from __future__ import annotations

import sys

from .. import _registry
from ._core import (MAX_BLOCKS, THREADS, TILE, WPT, empty, from_host,  # noqa: F401
                    is_c_contiguous, is_device_array, kernel_sources, launch_count,
                    synchronize, to_host, transfer_count, upload)
from .indexing import as_strided  # noqa: F401  (a view helper, not a kernel)

name = "cuda"


def entry_point(dispatcher, args: tuple) -> None:
    """None: CUDA launchers are Python functions; ``kernels.call_typed``
    dispatches them as ``call`` does."""
    return None


def signature(dispatcher, args: tuple) -> tuple:
    """Unused (``entry_point`` finds nothing here); the CPU's counterpart."""
    return ()


# No threaded twins: ``kernels.call`` never reaches MT_MIN here.
MT_MIN = MT_MIN_MEMORY = sys.maxsize


def memory_bound(name: str, args: tuple) -> bool:
    """Unused (never threaded); the CPU's counterpart."""
    return False


# every family module's launchers, bound here (``upload`` is _core's)
KERNELS = _registry.register(globals(), own=("upload",))
KERNEL_FNS = _registry.split(KERNELS)

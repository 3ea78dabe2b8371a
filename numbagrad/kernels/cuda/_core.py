"""What every CUDA kernel family shares: launch shapes, counters, memory, registry.

Each family module (``matmul``, ``losses``, ``elementwise``, ``optim``...)
registers its kernel factories with ``@kernel(name, signature)``; ``compiled``
jits one on first use for the live launch shapes, and ``kernel_sources``
lists every one with explicit signatures so tests can compile all to PTX.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np

import numba
from numba import cuda, float32, float64, types

from .. import env_int

TILE = env_int("NUMBAGRAD_CUDA_TILE", 16, minimum=1)
WPT = env_int("NUMBAGRAD_CUDA_WPT", 4, minimum=1)
THREADS = env_int("NUMBAGRAD_CUDA_THREADS", 256, minimum=1)
MAX_BLOCKS = env_int("NUMBAGRAD_CUDA_BLOCKS", 1024, minimum=1)
if THREADS & (THREADS - 1):
    raise ValueError(f"NUMBAGRAD_CUDA_THREADS must be a power of two, got {THREADS}")

_counts = {"launches": 0, "transfers": 0}


def launch_count() -> int:
    """Kernel launches issued by numbagrad so far."""
    return _counts["launches"]


def transfer_count() -> int:
    """Host<->device copies made by numbagrad so far."""
    return _counts["transfers"]


# --------------------------------------------------------------- memory
def empty(shape: tuple, dtype) -> object:
    """An uninitialised C-contiguous device array."""
    return cuda.device_array(shape, dtype)


def from_host(array: np.ndarray) -> object:
    """Host data as a new device array."""
    _counts["transfers"] += 1
    # (np.ascontiguousarray would make a 0-d array 1-D)
    return cuda.to_device(array if array.flags.c_contiguous else np.ascontiguousarray(array))


def to_host(array) -> np.ndarray:
    """A host copy of a device array."""
    _counts["transfers"] += 1
    return array.copy_to_host()


def upload(host: np.ndarray, out) -> None:
    """Copy host data into an existing device array of the same shape."""
    if out.size == 0:   # nothing to copy (the simulator refuses an empty copy's strides)
        return
    _counts["transfers"] += 1
    out.copy_to_device(np.ascontiguousarray(host, dtype=out.dtype).reshape(out.shape))


def is_device_array(obj) -> bool:
    return cuda.devicearray.is_cuda_ndarray(obj)


def is_c_contiguous(array) -> bool:
    return array.is_c_contiguous()


def synchronize() -> None:
    cuda.synchronize()



class Config(NamedTuple):
    """Launch shapes a kernel source is specialised for."""
    tile: int = TILE
    wpt: int = WPT
    threads: int = THREADS


_FACTORIES: dict[str, Callable] = {}     # name -> factory(config, numba dtype)
_SIGNATURES: dict[str, Callable] = {}    # name -> signature(numba dtype)
_DTYPES: dict[str, tuple] = {}          # name -> the dtypes the PTX check compiles
# every dtype a tensor may hold: integer and bool tensors run the kernels
# whose formulas are type-generic (compare, where, astype, gathers, copies)
_NUMBA_TYPES = {np.dtype(np.float32): float32, np.dtype(np.float64): float64,
                **{np.dtype(t): numba.from_dtype(np.dtype(t))
                   for t in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.bool_,
                             np.uint16, np.uint32)}}   # (uint16, uint32: bits, ops/_half.py)
_jitted: dict[tuple, object] = {}


def kernel(name: str, signature: Callable, dtypes: tuple = (float32, float64)) -> Callable:
    """Register ``factory(config, dtype) -> python kernel`` under ``name``;
    ``dtypes``: those ``kernel_sources`` gives it (the others compile on use)."""
    def register(factory: Callable) -> Callable:
        _FACTORIES[name] = factory
        _SIGNATURES[name] = signature
        _DTYPES[name] = dtypes
        return factory
    return register


def kernel_sources(tile: int = TILE, wpt: int = WPT, threads: int = THREADS) -> list:
    """(name, python function, signature) for every kernel and dtype."""
    config = Config(tile, wpt, threads)
    return [(name, factory(config, dt), _SIGNATURES[name](dt))
            for name, factory in _FACTORIES.items() for dt in _DTYPES[name]]


def compiled(name: str, dtype) -> object:
    """The jitted kernel ``name`` for ``dtype`` at the live launch shapes."""
    key = (name, dtype)
    fn = _jitted.get(key)
    if fn is None:
        fn = _jitted[key] = cuda.jit(_FACTORIES[name](Config(), _NUMBA_TYPES[np.dtype(dtype)]))
    return fn


def launch(name: str, dtype, grid, block, *args) -> None:
    """Launch one kernel, counted by ``launch_count()``."""
    _counts["launches"] += 1
    compiled(name, dtype)[grid, block](*args)


def grid(n: int) -> int:
    """Blocks for a 1-D grid-stride kernel over ``n`` items."""
    return max(1, min(MAX_BLOCKS, -(-n // THREADS)))


def flat(array):
    return array if len(array.shape) == 1 else array.ravel()


def array_type(dt, ndim: int, layout: str = "C"):
    return types.Array(dt, ndim, layout)


# ------------------------------------------------------- block reductions
@cuda.jit(device=True)
def block_total(cache, total, partial, counter):
    """Add up every thread's ``total`` in one launch: a shared-memory tree
    per block (``cache`` is the block's shared array, blockDim.x long), then
    the last block to finish adds the block partials. Returns (True, the
    grand total) on that block's thread 0 and (False, 0.0) elsewhere;
    deterministic for a fixed grid, and ``counter`` is left reset."""
    tid = cuda.threadIdx.x
    cache[tid] = total
    cuda.syncthreads()
    half = cuda.blockDim.x // 2
    while half > 0:
        if tid < half:
            cache[tid] += cache[tid + half]
        cuda.syncthreads()
        half //= 2
    if tid == 0:
        partial[cuda.blockIdx.x] = cache[0]
        cuda.threadfence()
        ticket = cuda.atomic.add(counter, 0, 1)
        if ticket == cuda.gridDim.x - 1:
            grand = 0.0
            for blk in range(cuda.gridDim.x):
                grand += cuda.atomic.add(partial, blk, 0.0)   # a coherent read
            counter[0] = 0
            return True, grand
    return False, 0.0


_sums: list = []   # [block partials, finished-blocks counter], made once


def sums() -> list:
    """The scratch ``block_total`` needs: per-block partials and a counter
    that the last block resets, so it is made once and reused."""
    if not _sums:
        _sums[:] = [cuda.device_array(MAX_BLOCKS, np.float64), from_host(np.zeros(1, np.int32))]
    return _sums


_flag: list = []   # [the index error flag], made once


def index_flag() -> object:
    """The one-element int32 device array that index-reading kernels set to 1
    when an index lies outside their range (they skip it; a kernel cannot
    raise). It stays 0 while nothing is wrong, so only a launcher asked to
    check reads it back (``index_flag_raised``); made once."""
    if not _flag:
        _flag.append(from_host(np.zeros(1, np.int32)))
    return _flag[0]


def index_flag_raised() -> bool:
    """Whether a kernel set the index flag since it was last read: one counted
    4-byte copy (which waits for the kernel); a raised flag is cleared."""
    flag = index_flag()
    if to_host(flag)[0] == 0:
        return False
    upload(np.zeros(1, np.int32), flag)
    return True


def checked_code(kernel: str, code: int, count: int) -> int:
    """``code`` if it names one of the ``count`` ops of ``kernel``, else a
    ValueError (a device-side raise would not reach the host)."""
    if not 0 <= code < count:
        raise ValueError(f"{kernel}: unknown op code {code} (known: 0..{count - 1})")
    return int(code)

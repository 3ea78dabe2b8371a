"""CUDA kernel of ``scatter``/``scatter_reduce``'s non-sum forms (see
``kernels.cpu.scatter``): one thread per element of ``dest``, folding in
the values aimed at it in order with the CPU's ``fold`` (no atomics, so the
last of repeated indices wins an assignment, as on the CPU)."""
from __future__ import annotations

# the kernels this module registers
__all__ = ["scatter_reduce_nd"]

from numba import cuda, int64

from ..cpu.scatter import fold
from ._core import THREADS, Config, array_type, grid, kernel, launch
from .indexing import RANK, _a6, _as6, _check_rank

_I6 = array_type(int64, RANK, "A")
_fold = cuda.jit(device=True)(fold)


@kernel("scatter_reduce_nd", lambda dt: (_a6(dt), _I6, _a6(dt), int64))
def _scatter_reduce_nd_source(config: Config, dtype):
    def scatter_reduce_nd_kernel(values, index, dest, mode):
        k = cuda.grid(1)
        stride = cuda.gridsize(1)
        while k < dest.size:
            m = k
            c5 = m % dest.shape[5]
            m //= dest.shape[5]
            c4 = m % dest.shape[4]
            m //= dest.shape[4]
            c3 = m % dest.shape[3]
            m //= dest.shape[3]
            c2 = m % dest.shape[2]
            m //= dest.shape[2]
            c1 = m % dest.shape[1]
            c0 = m // dest.shape[1]
            if c0 < values.shape[0] and c1 < values.shape[1] and c2 < values.shape[2] \
                    and c3 < values.shape[3] and c4 < values.shape[4]:
                a = dest[c0, c1, c2, c3, c4, c5]
                for i in range(values.shape[5]):
                    if index[c0, c1, c2, c3, c4, i] == c5:
                        a = _fold(mode, a, values[c0, c1, c2, c3, c4, i])
                dest[c0, c1, c2, c3, c4, c5] = a
            k += stride

    return scatter_reduce_nd_kernel


def scatter_reduce_nd(values, index, dest, mode) -> None:
    """See ``kernels.cpu.scatter_reduce_nd``; ranks up to 6."""
    _check_rank("scatter_reduce_nd", dest)
    if dest.size:
        launch("scatter_reduce_nd", dest.dtype, grid(dest.size), THREADS, _as6(values),
               _as6(index), _as6(dest), int(mode))

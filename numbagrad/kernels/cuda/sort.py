"""CUDA kernel of sort (see ``kernels.cpu.sort``): one thread per row, a
stable insertion sort of its indices with the CPU kernel's comparison, so
both devices give the same order."""
from __future__ import annotations

# the kernels this module registers
__all__ = ["argsort_rows"]

from numba import cuda, int64

from ..cpu.sort import comparator
from ._core import THREADS, Config, array_type, kernel, launch

_before = comparator(cuda.jit(device=True))


@kernel("argsort_rows", lambda dt: (array_type(dt, 2), array_type(int64, 2), int64))
def _argsort_rows_source(config: Config, dtype):
    def argsort_rows_kernel(x, out, descending):
        r = cuda.grid(1)
        if r >= x.shape[0]:
            return
        n = x.shape[1]
        for j in range(n):
            k = j
            v = x[r, j]
            while k > 0 and _before(v, x[r, out[r, k - 1]], descending != 0):
                out[r, k] = out[r, k - 1]
                k -= 1
            out[r, k] = j

    return argsort_rows_kernel


def argsort_rows(x, out, descending) -> None:
    """See ``kernels.cpu.argsort_rows``."""
    rows = x.shape[0]
    if rows and x.shape[1]:
        launch("argsort_rows", x.dtype, max(1, -(-rows // THREADS)), THREADS, x, out,
               int(bool(descending)))

"""CPU kernel of sort: the stable order of each row (``argsort_rows``).

The comparison is PyTorch's: nan counts as larger than every number (last
ascending, first descending), and equal elements keep their order (a
stable sort, also descending). ``comparator`` compiles it for either device
(``kernels/cuda/sort.py`` shares it).
"""
from __future__ import annotations

# the kernels this module registers
__all__ = ["argsort_rows"]

import numpy as np
from numba import njit


def comparator(jit):
    """``before(a, b, descending)``: whether a goes strictly before b,
    compiled with ``jit`` (njit or a CUDA device jit)."""
    @jit
    def before(a, b, descending):
        if descending:
            return a > b or (a != a and b == b)
        return a < b or (b != b and a == a)

    return before


_before = comparator(njit(error_model="numpy", inline="always"))


@njit(cache=True, error_model="numpy")
def argsort_rows(x, out, descending):
    """out[r] = the stable order of row x[r] (ascending, or descending): a
    bottom-up merge sort of the indices, taking the right run's element only
    when it goes strictly before the left's. ``x`` (rows, n), ``out`` int64."""
    rows, n = x.shape
    tmp = np.empty(n, np.int64)
    for r in range(rows):
        row, order = x[r], out[r]
        for j in range(n):
            order[j] = j
        width = 1
        while width < n:
            for lo in range(0, n, 2 * width):
                mid, hi = min(lo + width, n), min(lo + 2 * width, n)
                i, j, k = lo, mid, lo
                while i < mid and j < hi:
                    if _before(row[order[j]], row[order[i]], descending):
                        tmp[k] = order[j]
                        j += 1
                    else:
                        tmp[k] = order[i]
                        i += 1
                    k += 1
                while i < mid:
                    tmp[k] = order[i]
                    i += 1
                    k += 1
                while j < hi:
                    tmp[k] = order[j]
                    j += 1
                    k += 1
            for j in range(n):
                order[j] = tmp[j]
            width *= 2

"""CPU kernel of ``scatter``/``scatter_reduce``'s non-sum forms (the sums
are ``indexing.scatter_add_nd``): values folded into ``dest`` at their
indices along the last axis, in order, so that the last of repeated
indices wins an assignment (the CUDA kernel folds in the same order, with
the plain-Python ``fold`` here jitted by ``kernels/cuda/scatter.py`` too)."""
from __future__ import annotations

# the kernels this module registers
__all__ = ["scatter_reduce_nd"]

import numpy as np
from numba import njit

ASSIGN, MULTIPLY, MAXIMUM, MINIMUM = 0, 1, 2, 3


def fold(mode, a, b):
    """``a`` (op)= ``b`` for scatter mode ``mode``: ASSIGN takes b, MULTIPLY
    a * b, MAXIMUM (MINIMUM) the larger (smaller); nan, once in, stays (as
    PyTorch's amax)."""
    if mode == ASSIGN:
        return b
    if mode == MULTIPLY:
        return a * b
    return b if a == a and (b != b or (b > a if mode == MAXIMUM else b < a)) else a


_fold = njit(error_model="numpy", inline="always")(fold)


@njit(cache=True, error_model="numpy")
def scatter_reduce_nd(values, index, dest, mode):
    """dest[..., index[..., i]] (op)= values[..., i] for every i in order, the
    axis last (permuted views, any strides, one rank; ``values``/``index``
    at most dest's size off the axis): ``mode`` 0 assigns, 1 multiplies,
    2 keeps the max, 3 the min (``fold``)."""
    for idx in np.ndindex(values.shape[:-1]):
        d, v, ir = dest[idx], values[idx], index[idx]
        for i in range(v.size):
            r = ir[i]
            if 0 <= r < d.size:
                d[r] = _fold(mode, d[r], v[i])

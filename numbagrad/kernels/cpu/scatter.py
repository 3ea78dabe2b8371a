"""CPU kernel of ``scatter``/``scatter_reduce``'s non-sum forms (the sums
are ``indexing.scatter_add_nd``): values folded into ``dest`` at their
indices along the last axis, in order, so that the last of repeated
indices wins an assignment (the CUDA kernel folds in the same order)."""
from __future__ import annotations

# the kernels this module registers
__all__ = ["scatter_reduce_nd"]

import numpy as np
from numba import njit

ASSIGN, MULTIPLY, MAXIMUM, MINIMUM = 0, 1, 2, 3


@njit(cache=True, error_model="numpy")
def scatter_reduce_nd(values, index, dest, mode):
    """dest[..., index[..., i]] (op)= values[..., i] for every i in order, the
    axis last (permuted views, any strides, one rank; ``values``/``index``
    at most dest's size off the axis): ``mode`` 0 assigns, 1 multiplies,
    2 keeps the max, 3 the min (nan, once in, stays: as PyTorch's amax)."""
    for idx in np.ndindex(values.shape[:-1]):
        d, v, ir = dest[idx], values[idx], index[idx]
        for i in range(v.size):
            r = ir[i]
            if r < 0 or r >= d.size:
                continue
            a, b = d[r], v[i]
            if mode == 0:
                d[r] = b
            elif mode == 1:
                d[r] = a * b
            elif a == a and (b != b or (b > a if mode == 2 else b < a)):
                d[r] = b

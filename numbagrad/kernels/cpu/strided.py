"""CPU kernels over N-d strided arrays: the broadcast/strided copy and the
reduction that is its gradient. Any rank (Numba compiles one version per
rank); inputs are read through their strides, so transposed, permuted,
sliced and broadcast (size-1) operands need no copy.

The ops use the 2-D kernels of ``elementwise`` whenever an operation
collapses to two dims (most do) and these for the rest.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ._threads import _cast_like


@njit(cache=True, error_model="numpy")
def expand_nd(x, out, alpha, beta):
    """out = alpha * x + beta * out, ``x`` of ``out``'s rank with each dim equal
    to out's or 1 (broadcast along it), any strides; ``out`` C-contiguous,
    rank >= 1 (the ops view a 0-d array as one element). With beta == 0
    ``out`` is never read."""
    a, b = _cast_like(out, alpha), _cast_like(out, beta)
    if out.size == 0:
        return
    xb = np.broadcast_to(x, out.shape)
    for idx in np.ndindex(out.shape[:-1]):
        o, v = out[idx], xb[idx]
        if b == 0:
            for j in range(o.size):
                o[j] = a * v[j]
        else:
            for j in range(o.size):
                o[j] = a * v[j] + b * o[j]


@njit(cache=True, error_model="numpy")
def sum_to_nd(g, dest, scale, beta):
    """dest = scale * (g summed over every dim where ``dest`` has size 1 and
    ``g`` does not) + beta * dest; ``g`` and ``dest`` of one rank >= 1, g any
    strides, dest C-contiguous. Each sum runs in float64 over g's elements in
    C order (the CUDA kernel's order); an empty sum is 0."""
    s, b = _cast_like(dest, scale), _cast_like(dest, beta)
    acc = np.zeros(dest.size, np.float64)
    shape = dest.shape
    last = shape[-1]
    for idx in np.ndindex(g.shape[:-1]):
        k = 0
        for d in range(g.ndim - 1):
            k = k * shape[d] + (0 if shape[d] == 1 else idx[d])
        k *= last
        row = g[idx]
        if last == 1:
            total = acc[k]
            for j in range(row.size):
                total += row[j]
            acc[k] = total
        else:
            for j in range(row.size):
                acc[k + j] += row[j]
    flat = dest.reshape(-1)
    for k in range(flat.size):
        total = s * acc[k]
        flat[k] = total if b == 0 else total + b * flat[k]

"""CPU elementwise kernels."""
from __future__ import annotations

from numba import njit


@njit(cache=True, error_model="numpy")
def fill(out, value):
    """out[...] = value."""
    o = out.ravel()
    for i in range(o.size):
        o[i] = value


@njit(cache=True, error_model="numpy")
def axpby(alpha, x, beta, y):
    """y = alpha * x + beta * y; with beta == 0 ``y`` is never read."""
    xs = x.ravel()
    ys = y.ravel()
    if beta == 0.0:
        for i in range(ys.size):
            ys[i] = alpha * xs[i]
    else:
        for i in range(ys.size):
            ys[i] = alpha * xs[i] + beta * ys[i]

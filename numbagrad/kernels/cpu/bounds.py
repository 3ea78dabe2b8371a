"""CPU kernels of ``clamp`` with both bounds (one bound is a unary code):
flat arrays, PyTorch's min(max(x, lo), hi) and its gradient mask."""
from __future__ import annotations

__all__ = ["clamp", "clamp_backward"]   # the kernels this module registers

from numba import njit


@njit(cache=True, error_model="numpy")
def clamp(x, out, lo, hi):
    """out = min(max(x, lo), hi) (nan stays nan, a nan bound gives nan; every element
    hi where lo > hi)."""
    for i in range(x.size):
        v = x[i]
        v = lo if v < lo or lo != lo else v   # a nan bound gives nan
        out[i] = hi if v > hi or hi != hi else v


@njit(cache=True, error_model="numpy")
def clamp_backward(x, gout, dest, lo, hi, beta):
    """dest = gout where lo <= x <= hi, else 0; + beta * dest."""
    for i in range(x.size):
        d = gout[i] if lo <= x[i] <= hi else 0.0
        dest[i] = d if beta == 0 else d + beta * dest[i]

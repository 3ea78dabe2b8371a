"""CPU softmax kernels along one axis of a 2-D array (a vector is one row)."""
from __future__ import annotations

import math

from numba import njit


@njit(cache=True, error_model="numpy")
def softmax(x, out, axis, log):
    """out = softmax(x) (or log_softmax when ``log``) along ``axis`` (0 or 1),
    stable: the max of each slice is subtracted before exponentiating."""
    lanes = x.shape[1] if axis == 0 else x.shape[0]
    length = x.shape[axis]
    for lane in range(lanes):
        peak = x[0, lane] if axis == 0 else x[lane, 0]
        for k in range(1, length):
            v = x[k, lane] if axis == 0 else x[lane, k]
            if v > peak:
                peak = v
        acc = 0.0
        for k in range(length):
            acc += math.exp((x[k, lane] if axis == 0 else x[lane, k]) - peak)
        lse = peak + math.log(acc)
        for k in range(length):
            v = (x[k, lane] if axis == 0 else x[lane, k]) - lse
            y = v if log else math.exp(v)
            if axis == 0:
                out[k, lane] = y
            else:
                out[lane, k] = y


@njit(cache=True, error_model="numpy")
def softmax_backward(y, gout, dest, beta, axis, log):
    """dest = J^T gout + beta * dest for y = softmax(x) (``log``: log_softmax):
    softmax: y * (g - sum(g * y)); log_softmax: g - exp(y) * sum(g)."""
    lanes = y.shape[1] if axis == 0 else y.shape[0]
    length = y.shape[axis]
    for lane in range(lanes):
        acc = 0.0
        for k in range(length):
            g = gout[k, lane] if axis == 0 else gout[lane, k]
            acc += g if log else g * (y[k, lane] if axis == 0 else y[lane, k])
        for k in range(length):
            g = gout[k, lane] if axis == 0 else gout[lane, k]
            yv = y[k, lane] if axis == 0 else y[lane, k]
            d = g - math.exp(yv) * acc if log else yv * (g - acc)
            if axis == 0:
                dest[k, lane] = d if beta == 0.0 else d + beta * dest[k, lane]
            else:
                dest[lane, k] = d if beta == 0.0 else d + beta * dest[lane, k]

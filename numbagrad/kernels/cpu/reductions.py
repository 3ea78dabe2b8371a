"""CPU softmax kernels along one axis of a 2-D array (a vector is one row).

Each lane (a slice along ``axis``) is computed on its own, so the ``_mt``
twins (``parallel=True``) share blocks of lanes among threads and give the
serial kernels' bits.
"""
from __future__ import annotations

# the kernels this module registers
__all__ = ["softmax", "softmax3", "softmax3_backward", "softmax_backward"]

import math

from numba import njit, prange

from .. import bodies
from ._threads import SPAN, _cast_like


@njit(error_model="numpy", inline="always")
def _lane_blocks(lanes, length):
    """(lanes per block, blocks): about SPAN elements a block."""
    per = max(1, SPAN // max(length, 1))
    return per, (lanes + per - 1) // per


@njit(cache=True, error_model="numpy")
def _softmax_lanes(x, out, axis, log, l0, l1):
    length = x.shape[axis]
    if length == 0:   # empty lanes: nothing to write (nor to read)
        return
    for lane in range(l0, l1):
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
def softmax(x, out, axis, log):
    """out = softmax(x) (or log_softmax when ``log``) along ``axis`` (0 or 1),
    stable: the max of each slice is subtracted before exponentiating."""
    lanes = x.shape[1] if axis == 0 else x.shape[0]
    per, blocks = _lane_blocks(lanes, x.shape[axis])
    for t in range(blocks):
        _softmax_lanes(x, out, axis, log, t * per, min(t * per + per, lanes))


@njit(cache=True, error_model="numpy", parallel=True)
def softmax_mt(x, out, axis, log):
    """``softmax`` on threads: the same blocks of lanes, shared among them."""
    lanes = x.shape[1] if axis == 0 else x.shape[0]
    per, blocks = _lane_blocks(lanes, x.shape[axis])
    for t in prange(blocks):
        _softmax_lanes(x, out, axis, log, t * per, min(t * per + per, lanes))


_softmax_backward_lane = njit(error_model="numpy", inline="always")(
    bodies.softmax_backward_lane)


@njit(cache=True, error_model="numpy")
def _softmax_backward_lanes(y, gout, dest, beta, axis, log, l0, l1):
    for lane in range(l0, l1):
        _softmax_backward_lane(y, gout, dest, beta, axis, log, lane)


@njit(cache=True, error_model="numpy")
def softmax_backward(y, gout, dest, beta, axis, log):
    """dest = J^T gout + beta * dest for y = softmax(x) (``log``: log_softmax):
    softmax: y * (g - sum(g * y)); log_softmax: g - exp(y) * sum(g)."""
    b = _cast_like(dest, beta)
    lanes = y.shape[1] if axis == 0 else y.shape[0]
    per, blocks = _lane_blocks(lanes, y.shape[axis])
    for t in range(blocks):
        _softmax_backward_lanes(y, gout, dest, b, axis, log, t * per, min(t * per + per, lanes))


@njit(cache=True, error_model="numpy", parallel=True)
def softmax_backward_mt(y, gout, dest, beta, axis, log):
    """``softmax_backward`` on threads: the same blocks of lanes, shared among them."""
    b = _cast_like(dest, beta)
    lanes = y.shape[1] if axis == 0 else y.shape[0]
    per, blocks = _lane_blocks(lanes, y.shape[axis])
    for t in prange(blocks):
        _softmax_backward_lanes(y, gout, dest, b, axis, log, t * per, min(t * per + per, lanes))


# ------------------------------------------- softmax along a middle axis
# (outer, n, inner) arrays, the softmax along axis 1: lanes of stride
# ``inner`` in memory, read in place (no move of the axis last).
@njit(cache=True, error_model="numpy")
def softmax3(x, out, log):
    """out = softmax(x) (``log``: log_softmax) along axis 1 of 3-D ``x`` (any
    strides) into ``out`` of its shape, stable as ``softmax``."""
    for o in range(x.shape[0]):
        _softmax_lanes(x[o], out[o], 0, log, 0, x.shape[2])


@njit(cache=True, error_model="numpy")
def softmax3_backward(y, gout, dest, beta, log):
    """``softmax_backward`` along axis 1 of 3-D arrays."""
    b = _cast_like(dest, beta)
    for o in range(y.shape[0]):
        _softmax_backward_lanes(y[o], gout[o], dest[o], b, 0, log, 0, y.shape[2])

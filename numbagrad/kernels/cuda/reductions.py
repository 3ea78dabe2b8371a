"""CUDA softmax kernels: one thread per slice along the axis."""
from __future__ import annotations

# the kernels this module registers
__all__ = ["softmax", "softmax3", "softmax3_backward", "softmax_backward"]

import math

from numba import cuda, float64, int64, types

from .. import bodies
from ._core import THREADS, Config, array_type, grid, kernel, launch

_softmax_backward_lane = cuda.jit(device=True)(bodies.softmax_backward_lane)


@kernel("softmax", lambda dt: (array_type(dt, 2, "A"), array_type(dt, 2, "A"), int64,
                               types.boolean))
def _softmax_source(config: Config, dtype):
    def softmax_kernel(x, out, axis, log):
        lanes = x.shape[1] if axis == 0 else x.shape[0]
        length = x.shape[axis]
        lane = cuda.grid(1) if length > 0 else lanes   # empty lanes: nothing to do
        stride = cuda.gridsize(1)
        while lane < lanes:
            peak = x[0, lane] if axis == 0 else x[lane, 0]
            for k in range(1, length):
                peak = max(peak, x[k, lane] if axis == 0 else x[lane, k])
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
            lane += stride

    return softmax_kernel


@kernel("softmax_backward", lambda dt: (array_type(dt, 2, "A"), array_type(dt, 2, "A"),
                                        array_type(dt, 2, "A"), float64, int64, types.boolean))
def _softmax_backward_source(config: Config, dtype):
    def softmax_backward_kernel(y, gout, dest, beta, axis, log):
        lanes = y.shape[1] if axis == 0 else y.shape[0]
        lane = cuda.grid(1)
        stride = cuda.gridsize(1)
        while lane < lanes:
            _softmax_backward_lane(y, gout, dest, beta, axis, log, lane)
            lane += stride

    return softmax_backward_kernel


def _a3(dt):
    return array_type(dt, 3, "A")


@kernel("softmax3", lambda dt: (_a3(dt), _a3(dt), types.boolean))
def _softmax3_source(config: Config, dtype):
    def softmax3_kernel(x, out, log):
        # One thread per lane (o, i): x[o, :, i], stride ``inner`` in memory.
        outer, length, inner = x.shape
        lanes = outer * inner if length > 0 else 0   # empty lanes: nothing to do
        lane = cuda.grid(1)
        stride = cuda.gridsize(1)
        while lane < lanes:
            o, i = lane // inner, lane % inner
            peak = x[o, 0, i]
            for k in range(1, length):
                peak = max(peak, x[o, k, i])
            acc = 0.0
            for k in range(length):
                acc += math.exp(x[o, k, i] - peak)
            lse = peak + math.log(acc)
            for k in range(length):
                v = x[o, k, i] - lse
                out[o, k, i] = v if log else math.exp(v)
            lane += stride

    return softmax3_kernel


@kernel("softmax3_backward", lambda dt: (_a3(dt), _a3(dt), _a3(dt), float64, types.boolean))
def _softmax3_backward_source(config: Config, dtype):
    def softmax3_backward_kernel(y, gout, dest, beta, log):
        outer, inner = y.shape[0], y.shape[2]
        lane = cuda.grid(1)
        stride = cuda.gridsize(1)
        while lane < outer * inner:
            o, i = lane // inner, lane % inner
            _softmax_backward_lane(y[o], gout[o], dest[o], beta, 0, log, i)
            lane += stride

    return softmax3_backward_kernel


# ------------------------------------------------------------ launchers
def softmax(x, out, axis, log) -> None:
    """See ``kernels.cpu.softmax``."""
    lanes = x.shape[1] if axis == 0 else x.shape[0]
    launch("softmax", x.dtype, grid(lanes), THREADS, x, out, int(axis), bool(log))


def softmax_backward(y, gout, dest, beta, axis, log) -> None:
    """See ``kernels.cpu.softmax_backward``."""
    lanes = y.shape[1] if axis == 0 else y.shape[0]
    launch("softmax_backward", y.dtype, grid(lanes), THREADS, y, gout, dest, float(beta),
           int(axis), bool(log))


def softmax3(x, out, log) -> None:
    """See ``kernels.cpu.softmax3``: one thread per lane."""
    launch("softmax3", x.dtype, grid(x.shape[0] * x.shape[2]), THREADS, x, out, bool(log))


def softmax3_backward(y, gout, dest, beta, log) -> None:
    """See ``kernels.cpu.softmax3_backward``."""
    launch("softmax3_backward", y.dtype, grid(y.shape[0] * y.shape[2]), THREADS, y, gout, dest,
           float(beta), bool(log))

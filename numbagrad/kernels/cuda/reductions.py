"""CUDA softmax kernels: one thread per slice along the axis."""
from __future__ import annotations

import math

from numba import cuda, float64, int64, types

from .. import elements
from ._core import THREADS, Config, array_type, grid, kernel, launch

_softmax_backward_lane = cuda.jit(device=True)(elements.softmax_backward_lane)


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

"""CUDA kernels of ``clamp`` with both bounds (see ``kernels.cpu.bounds``)."""
from __future__ import annotations

__all__ = ["clamp", "clamp_backward"]   # the kernels this module registers

from numba import cuda, float64

from ._core import THREADS, Config, array_type, grid, kernel, launch


@kernel("clamp", lambda dt: (array_type(dt, 1, "A"), array_type(dt, 1, "A"), dt, dt))
def _clamp_source(config: Config, dtype):
    def clamp_kernel(x, out, lo, hi):
        i = cuda.grid(1)
        while i < x.size:
            v = x[i]
            v = lo if v < lo or lo != lo else v   # a nan bound gives nan
            out[i] = hi if v > hi or hi != hi else v
            i += cuda.gridsize(1)
    return clamp_kernel


@kernel("clamp_backward", lambda dt: (array_type(dt, 1, "A"), array_type(dt, 1, "A"),
                                      array_type(dt, 1, "A"), dt, dt, float64))
def _clamp_backward_source(config: Config, dtype):
    def clamp_backward_kernel(x, gout, dest, lo, hi, beta):
        i = cuda.grid(1)
        while i < x.size:
            d = gout[i] if lo <= x[i] and x[i] <= hi else 0.0
            dest[i] = d if beta == 0.0 else d + beta * dest[i]
            i += cuda.gridsize(1)
    return clamp_backward_kernel


def clamp(x, out, lo, hi) -> None:
    """See ``kernels.cpu.clamp``."""
    if x.size:
        dt = out.dtype.type
        launch("clamp", out.dtype, grid(x.size), THREADS, x, out, dt(lo), dt(hi))


def clamp_backward(x, gout, dest, lo, hi, beta) -> None:
    """See ``kernels.cpu.clamp_backward``."""
    if x.size:
        dt = dest.dtype.type
        launch("clamp_backward", dest.dtype, grid(x.size), THREADS, x, gout, dest, dt(lo), dt(hi),
               float(beta))

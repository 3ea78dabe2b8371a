"""CUDA elementwise kernels: grid-stride loops over flat or 2-D arrays."""
from __future__ import annotations

from numba import cuda, float64

from ._core import THREADS, Config, array_type, flat, grid, kernel, launch


@kernel("fill", lambda dt: (array_type(dt, 1), float64))
def _fill_source(config: Config, dtype):
    def fill_kernel(out, value):
        i = cuda.grid(1)
        stride = cuda.gridsize(1)
        while i < out.size:
            out[i] = value
            i += stride

    return fill_kernel


@kernel("axpby", lambda dt: (float64, array_type(dt, 1), float64, array_type(dt, 1)))
def _axpby_source(config: Config, dtype):
    def axpby_kernel(alpha, x, beta, y):
        i = cuda.grid(1)
        stride = cuda.gridsize(1)
        while i < y.size:
            if beta == 0.0:
                y[i] = alpha * x[i]
            else:
                y[i] = alpha * x[i] + beta * y[i]
            i += stride

    return axpby_kernel



# ------------------------------------------------------------ launchers
def fill(out, value) -> None:
    """out[...] = value."""
    if out.size:
        launch("fill", out.dtype, grid(out.size), THREADS, flat(out), float(value))


def axpby(alpha, x, beta, y) -> None:
    """y = alpha * x + beta * y; with beta == 0 ``y`` is never read."""
    if y.size:
        launch("axpby", y.dtype, grid(y.size), THREADS,
               float(alpha), flat(x), float(beta), flat(y))

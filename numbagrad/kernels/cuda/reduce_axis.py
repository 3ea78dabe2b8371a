"""CUDA kernels of the axis reductions (see ``kernels.cpu.reduce_axis``): one
thread per lane x[o, :, i] of an (outer, n, inner) view, the lane bodies
shared with the CPU in ``kernels.bodies``; one launch per call."""
from __future__ import annotations

# the kernels this module registers
__all__ = ["cumsum", "extrema", "extrema_backward", "logsumexp", "logsumexp_backward", "variance",
           "variance_backward"]

from numba import cuda, float64, int64, types

from .. import bodies
from ._core import THREADS, Config, array_type, grid, kernel, launch

_device = cuda.jit(device=True)
_extrema_lane = _device(bodies.extrema_lane)
_extrema_backward_lane = _device(bodies.extrema_backward_lane)
_logsumexp_lane = _device(bodies.logsumexp_lane)
_logsumexp_backward_lane = _device(bodies.logsumexp_backward_lane)
_variance_lane = _device(bodies.variance_lane)
_variance_backward_lane = _device(bodies.variance_backward_lane)
_cumsum_lane = _device(bodies.cumsum_lane)


def _a(dt, ndim):
    return array_type(dt, ndim, "A")


@kernel("extrema", lambda dt: (_a(dt, 3), _a(dt, 2), _a(int64, 2), types.boolean))
def _extrema_source(config: Config, dtype):
    def extrema_kernel(x, out, idx, want_max):
        inner = x.shape[2]
        k = cuda.grid(1)
        while k < x.shape[0] * inner:
            _extrema_lane(x, out, idx, want_max, k // inner, k % inner)
            k += cuda.gridsize(1)
    return extrema_kernel


@kernel("extrema_backward", lambda dt: (_a(dt, 3), _a(dt, 2), _a(dt, 2), _a(dt, 3), float64))
def _extrema_backward_source(config: Config, dtype):
    def extrema_backward_kernel(x, y, gout, dest, beta):
        inner = x.shape[2]
        k = cuda.grid(1)
        while k < x.shape[0] * inner:
            _extrema_backward_lane(x, y, gout, dest, beta, k // inner, k % inner)
            k += cuda.gridsize(1)
    return extrema_backward_kernel


@kernel("logsumexp", lambda dt: (_a(dt, 3), _a(dt, 2)))
def _logsumexp_source(config: Config, dtype):
    def logsumexp_kernel(x, out):
        inner = x.shape[2]
        k = cuda.grid(1)
        while k < x.shape[0] * inner:
            _logsumexp_lane(x, out, k // inner, k % inner)
            k += cuda.gridsize(1)
    return logsumexp_kernel


@kernel("logsumexp_backward", lambda dt: (_a(dt, 3), _a(dt, 2), _a(dt, 2), _a(dt, 3),
                                          float64))
def _logsumexp_backward_source(config: Config, dtype):
    def logsumexp_backward_kernel(x, y, gout, dest, beta):
        inner = x.shape[2]
        k = cuda.grid(1)
        while k < x.shape[0] * inner:
            _logsumexp_backward_lane(x, y, gout, dest, beta, k // inner, k % inner)
            k += cuda.gridsize(1)
    return logsumexp_backward_kernel


@kernel("variance", lambda dt: (_a(dt, 3), _a(dt, 2), _a(dt, 2), float64, float64,
                                types.boolean))
def _variance_source(config: Config, dtype):
    def variance_kernel(x, out, mean, inv_n, inv_div, root):
        inner = x.shape[2]
        k = cuda.grid(1)
        while k < x.shape[0] * inner:
            _variance_lane(x, out, mean, inv_n, inv_div, root, k // inner, k % inner)
            k += cuda.gridsize(1)
    return variance_kernel


@kernel("variance_backward", lambda dt: (_a(dt, 3), _a(dt, 2), _a(dt, 2), _a(dt, 2),
                                         _a(dt, 3), float64, types.boolean, float64))
def _variance_backward_source(config: Config, dtype):
    def variance_backward_kernel(x, mean, y, gout, dest, scale, root, beta):
        inner = x.shape[2]
        k = cuda.grid(1)
        while k < x.shape[0] * inner:
            _variance_backward_lane(x, mean, y, gout, dest, scale, root, beta, k // inner,
                                    k % inner)
            k += cuda.gridsize(1)
    return variance_backward_kernel


@kernel("cumsum", lambda dt: (_a(dt, 3), _a(dt, 3), types.boolean, float64))
def _cumsum_source(config: Config, dtype):
    def cumsum_kernel(x, out, reverse, beta):
        inner = x.shape[2]
        k = cuda.grid(1)
        while k < x.shape[0] * inner:
            _cumsum_lane(x, out, reverse, beta, k // inner, k % inner)
            k += cuda.gridsize(1)
    return cumsum_kernel


# ------------------------------------------------------------ launchers
def _run(name, x, *args) -> None:
    lanes = x.shape[0] * x.shape[2]
    if lanes:
        launch(name, x.dtype, grid(lanes), THREADS, x, *args)


def extrema(x, out, idx, want_max) -> None:
    """See ``kernels.cpu.extrema``."""
    _run("extrema", x, out, idx, bool(want_max))


def extrema_backward(x, y, gout, dest, beta) -> None:
    """See ``kernels.cpu.extrema_backward``."""
    _run("extrema_backward", x, y, gout, dest, float(beta))


def logsumexp(x, out) -> None:
    """See ``kernels.cpu.logsumexp``."""
    _run("logsumexp", x, out)


def logsumexp_backward(x, y, gout, dest, beta) -> None:
    """See ``kernels.cpu.logsumexp_backward``."""
    _run("logsumexp_backward", x, y, gout, dest, float(beta))


def variance(x, out, mean, inv_n, inv_div, root) -> None:
    """See ``kernels.cpu.variance``."""
    _run("variance", x, out, mean, float(inv_n), float(inv_div), bool(root))


def variance_backward(x, mean, y, gout, dest, scale, root, beta) -> None:
    """See ``kernels.cpu.variance_backward``."""
    _run("variance_backward", x, mean, y, gout, dest, float(scale), bool(root), float(beta))


def cumsum(x, out, reverse, beta) -> None:
    """See ``kernels.cpu.cumsum``."""
    _run("cumsum", x, out, bool(reverse), float(beta))

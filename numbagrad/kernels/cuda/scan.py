"""CUDA kernels of the scans (see ``kernels.cpu.scan``): one thread per lane
x[o, :, i] of an (outer, n, inner) view, the lane bodies shared with the CPU
in ``kernels.bodies``; one launch per call."""
from __future__ import annotations

# the kernels this module registers
__all__ = ["cumextrema", "cumextrema_backward", "cumprod", "cumprod_backward", "logcumsumexp",
           "logcumsumexp_backward"]

from numba import cuda, float64, int64, types

from .. import bodies
from ._core import THREADS, Config, array_type, grid, kernel, launch

_device = cuda.jit(device=True)
_cumprod_lane = _device(bodies.cumprod_lane)
_cumprod_backward_lane = _device(bodies.cumprod_backward_lane)
_cumextrema_lane = _device(bodies.cumextrema_lane)
_cumextrema_backward_lane = _device(bodies.cumextrema_backward_lane)
_logcumsumexp_lane, _logcumsumexp_backward_lane = (
    _device(f) for f in bodies.logcumsumexp_lanes(_device(bodies.log_add)))


def _a(dt, ndim=3):
    return array_type(dt, ndim, "A")


@kernel("cumprod", lambda dt: (_a(dt), _a(dt)))
def _cumprod_source(config: Config, dtype):
    def cumprod_kernel(x, out):
        inner = x.shape[2]
        k = cuda.grid(1)
        while k < x.shape[0] * inner:
            _cumprod_lane(x, out, k // inner, k % inner)
            k += cuda.gridsize(1)
    return cumprod_kernel


@kernel("cumprod_backward", lambda dt: (_a(dt), _a(dt), _a(dt), _a(dt), float64))
def _cumprod_backward_source(config: Config, dtype):
    def cumprod_backward_kernel(x, y, gout, dest, beta):
        inner = x.shape[2]
        k = cuda.grid(1)
        while k < x.shape[0] * inner:
            _cumprod_backward_lane(x, y, gout, dest, beta, k // inner, k % inner)
            k += cuda.gridsize(1)
    return cumprod_backward_kernel


@kernel("cumextrema", lambda dt: (_a(dt), _a(dt), _a(int64), types.boolean))
def _cumextrema_source(config: Config, dtype):
    def cumextrema_kernel(x, out, idx, want_max):
        inner = x.shape[2]
        k = cuda.grid(1)
        while k < x.shape[0] * inner:
            _cumextrema_lane(x, out, idx, want_max, k // inner, k % inner)
            k += cuda.gridsize(1)
    return cumextrema_kernel


@kernel("cumextrema_backward", lambda dt: (_a(int64), _a(dt), _a(dt), float64))
def _cumextrema_backward_source(config: Config, dtype):
    def cumextrema_backward_kernel(idx, gout, dest, beta):
        inner = idx.shape[2]
        k = cuda.grid(1)
        while k < idx.shape[0] * inner:
            _cumextrema_backward_lane(idx, gout, dest, beta, k // inner, k % inner)
            k += cuda.gridsize(1)
    return cumextrema_backward_kernel


@kernel("logcumsumexp", lambda dt: (_a(dt), _a(dt)))
def _logcumsumexp_source(config: Config, dtype):
    def logcumsumexp_kernel(x, out):
        inner = x.shape[2]
        k = cuda.grid(1)
        while k < x.shape[0] * inner:
            _logcumsumexp_lane(x, out, k // inner, k % inner)
            k += cuda.gridsize(1)
    return logcumsumexp_kernel


@kernel("logcumsumexp_backward", lambda dt: (_a(dt), _a(dt), _a(dt), _a(dt), float64))
def _logcumsumexp_backward_source(config: Config, dtype):
    def logcumsumexp_backward_kernel(x, y, gout, dest, beta):
        inner = x.shape[2]
        k = cuda.grid(1)
        while k < x.shape[0] * inner:
            _logcumsumexp_backward_lane(x, y, gout, dest, beta, k // inner, k % inner)
            k += cuda.gridsize(1)
    return logcumsumexp_backward_kernel


# ------------------------------------------------------------ launchers
def _run(name, x, *args, dtype=None) -> None:
    lanes = x.shape[0] * x.shape[2]
    if lanes:
        launch(name, dtype or x.dtype, grid(lanes), THREADS, x, *args)


def cumprod(x, out) -> None:
    """See ``kernels.cpu.cumprod``."""
    _run("cumprod", x, out)


def cumprod_backward(x, y, gout, dest, beta) -> None:
    """See ``kernels.cpu.cumprod_backward``."""
    _run("cumprod_backward", x, y, gout, dest, float(beta))


def cumextrema(x, out, idx, want_max) -> None:
    """See ``kernels.cpu.cumextrema``."""
    _run("cumextrema", x, out, idx, bool(want_max))


def cumextrema_backward(idx, gout, dest, beta) -> None:
    """See ``kernels.cpu.cumextrema_backward``."""
    _run("cumextrema_backward", idx, gout, dest, float(beta), dtype=dest.dtype)


def logcumsumexp(x, out) -> None:
    """See ``kernels.cpu.logcumsumexp``."""
    _run("logcumsumexp", x, out)


def logcumsumexp_backward(x, y, gout, dest, beta) -> None:
    """See ``kernels.cpu.logcumsumexp_backward``."""
    _run("logcumsumexp_backward", x, y, gout, dest, float(beta))

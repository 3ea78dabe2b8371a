"""CPU kernels of the scans beside cumsum (cumprod, cummax/cummin,
logcumsumexp) and their gradients: each array viewed as (outer, n, inner),
one lane x[o, :, i] at a time with the bodies in ``kernels.bodies`` (shared
with CUDA, so the devices agree). Serial: no ``_mt`` twins yet.
"""
from __future__ import annotations

# the kernels this module registers
__all__ = ["cumextrema", "cumextrema_backward", "cumprod", "cumprod_backward", "logcumsumexp",
           "logcumsumexp_backward"]

from numba import njit

from .. import bodies

_inline = njit(error_model="numpy", inline="always")
_cumprod_lane = _inline(bodies.cumprod_lane)
_cumprod_backward_lane = _inline(bodies.cumprod_backward_lane)
_cumextrema_lane = _inline(bodies.cumextrema_lane)
_cumextrema_backward_lane = _inline(bodies.cumextrema_backward_lane)
_logcumsumexp_lane, _logcumsumexp_backward_lane = (
    _inline(f) for f in bodies.logcumsumexp_lanes(_inline(bodies.log_add)))


@njit(cache=True, error_model="numpy")
def cumprod(x, out):
    """out = running products of x along n."""
    for o in range(x.shape[0]):
        for i in range(x.shape[2]):
            _cumprod_lane(x, out, o, i)


@njit(cache=True, error_model="numpy")
def cumprod_backward(x, y, gout, dest, beta):
    """dest = the gradient of y = cumprod(x) for gout + beta * dest."""
    for o in range(x.shape[0]):
        for i in range(x.shape[2]):
            _cumprod_backward_lane(x, y, gout, dest, beta, o, i)


@njit(cache=True, error_model="numpy")
def cumextrema(x, out, idx, want_max):
    """out, idx = running max (min) of x along n and its (last) index."""
    for o in range(x.shape[0]):
        for i in range(x.shape[2]):
            _cumextrema_lane(x, out, idx, want_max, o, i)


@njit(cache=True, error_model="numpy")
def cumextrema_backward(idx, gout, dest, beta):
    """dest = gout added at idx along n + beta * dest."""
    for o in range(idx.shape[0]):
        for i in range(idx.shape[2]):
            _cumextrema_backward_lane(idx, gout, dest, beta, o, i)


@njit(cache=True, error_model="numpy")
def logcumsumexp(x, out):
    """out = running log(sum(exp(x))) along n."""
    for o in range(x.shape[0]):
        for i in range(x.shape[2]):
            _logcumsumexp_lane(x, out, o, i)


@njit(cache=True, error_model="numpy")
def logcumsumexp_backward(x, y, gout, dest, beta):
    """dest = the gradient of y = logcumsumexp(x) for gout + beta * dest."""
    for o in range(x.shape[0]):
        for i in range(x.shape[2]):
            _logcumsumexp_backward_lane(x, y, gout, dest, beta, o, i)

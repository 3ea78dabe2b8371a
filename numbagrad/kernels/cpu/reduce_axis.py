"""CPU kernels of the axis reductions (max/min, argmax/argmin, logsumexp,
var/std, cumsum): each array viewed as (outer, n, inner) after collapsing,
one lane x[o, :, i] at a time with the bodies in ``kernels.bodies``
(shared with CUDA, so the devices agree). Serial: no ``_mt`` twins yet.
"""
from __future__ import annotations

# the kernels this module registers
__all__ = ["cumsum", "extrema", "extrema_backward", "logsumexp", "logsumexp_backward", "variance",
           "variance_backward"]

from numba import njit

from .. import bodies

_inline = njit(error_model="numpy", inline="always")
_extrema_lane = _inline(bodies.extrema_lane)
_extrema_backward_lane = _inline(bodies.extrema_backward_lane)
_logsumexp_lane = _inline(bodies.logsumexp_lane)
_logsumexp_backward_lane = _inline(bodies.logsumexp_backward_lane)
_variance_lane = _inline(bodies.variance_lane)
_variance_backward_lane = _inline(bodies.variance_backward_lane)
_cumsum_lane = _inline(bodies.cumsum_lane)


@njit(cache=True, error_model="numpy")
def extrema(x, out, idx, want_max):
    """out[o, i], idx[o, i] = the max (or min) of x[o, :, i] and its first index
    (n >= 1: the op refuses an empty axis)."""
    for o in range(x.shape[0]):
        for i in range(x.shape[2]):
            _extrema_lane(x, out, idx, want_max, o, i)


@njit(cache=True, error_model="numpy")
def extrema_backward(x, y, gout, dest, beta):
    """dest = gout shared evenly by each lane's elements equal to y + beta * dest."""
    for o in range(x.shape[0]):
        for i in range(x.shape[2]):
            _extrema_backward_lane(x, y, gout, dest, beta, o, i)


@njit(cache=True, error_model="numpy")
def logsumexp(x, out):
    """out[o, i] = log(sum(exp(x[o, :, i])))."""
    for o in range(x.shape[0]):
        for i in range(x.shape[2]):
            _logsumexp_lane(x, out, o, i)


@njit(cache=True, error_model="numpy")
def logsumexp_backward(x, y, gout, dest, beta):
    """dest = gout * exp(x - y) + beta * dest."""
    for o in range(x.shape[0]):
        for i in range(x.shape[2]):
            _logsumexp_backward_lane(x, y, gout, dest, beta, o, i)


@njit(cache=True, error_model="numpy")
def variance(x, out, mean, inv_n, inv_div, root):
    """out = var (or std, ``root``) of each lane, ``mean`` its mean."""
    for o in range(x.shape[0]):
        for i in range(x.shape[2]):
            _variance_lane(x, out, mean, inv_n, inv_div, root, o, i)


@njit(cache=True, error_model="numpy")
def variance_backward(x, mean, y, gout, dest, scale, root, beta):
    """dest = d var (or std) / dx * gout + beta * dest."""
    for o in range(x.shape[0]):
        for i in range(x.shape[2]):
            _variance_backward_lane(x, mean, y, gout, dest, scale, root, beta, o, i)


@njit(cache=True, error_model="numpy")
def cumsum(x, out, reverse, beta):
    """out = running sums of x along n (from the end when ``reverse``) + beta * out."""
    for o in range(x.shape[0]):
        for i in range(x.shape[2]):
            _cumsum_lane(x, out, reverse, beta, o, i)

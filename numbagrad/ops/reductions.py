"""Reductions (sum, mean) and the softmax family, each forward beside its backward."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import buffers, kernels
from ..kernels import codes
from ..kernels.cpu import integer as ic
from ..tape import Node, _Backward
from ..tensor import Tensor
from . import _integer
from ._common import (alias, axes_of, broadcast_into, contiguous, describe, mean_scale, ones,
                      operand, padded2d, reduce_into, reshaped, result, scalar_of, view2d)


def _reduce(x: Any, axis: Any, keepdims: bool, mean: bool, op: str) -> Tensor:
    x = operand(x, op, ints=True)
    shape = x._data.shape
    ndim = len(shape)
    if x._data.dtype.kind != "f":     # integers and bools: no gradient
        if mean:
            raise TypeError(f"mean: the mean of an integer or bool tensor ({describe(x)}) "
                            "has no dtype to infer, as in PyTorch; use x.float().mean()")
        axes = tuple(range(ndim)) if axis is None else axes_of(x, axis, op)
        return _integer.reduce(ic.SUM, x, axes, keepdims, op)
    if axis is None:
        keep = (1,) * ndim
        out_shape = keep if keepdims else ()
        count = x._data.size
    elif type(axis) is int and -ndim <= axis < ndim:     # the common case, quickly
        a = axis % ndim
        rest = tuple(shape[:a]), tuple(shape[a + 1:])
        keep = rest[0] + (1,) + rest[1]
        out_shape = keep if keepdims else rest[0] + rest[1]
        count = shape[a]
    else:
        axes = axes_of(x, axis, op)
        keep = tuple(1 if d in axes else n for d, n in enumerate(shape))
        out_shape = keep if keepdims else tuple(n for d, n in enumerate(shape)
                                                if d not in axes)
        count = math.prod(shape[d] for d in axes)     # elements per output
    scale = mean_scale(count) if mean else 1.0
    kern, dtype = x._kern, x._data.dtype
    out = buffers.take(kern, out_shape, dtype)
    s, zero = scalar_of(dtype, scale), scalar_of(dtype, 0.0)
    if ndim <= 2:    # the 2-D kernel reads x through its strides
        keep2 = padded2d(keep)
        kernels.call(kern, "sum_to", x._data.size, view2d(x._data), reshaped(out, keep2), s,
                     zero)
    else:
        reduce_into(kern, contiguous(x), reshaped(out, keep), s, zero)
    return result(out, kern, (x,), _reduce_backward, (keep, scale))


def _reduce_backward(ctx: _Backward, node: Node, gout: Any) -> None:
    (x,) = node.inputs
    keep, scale = node.saved
    kern, dtype = x._kern, x._data.dtype
    g = ones(kern, keep, dtype) if gout is None else reshaped(gout, keep)
    dest, beta = ctx.dest(x)
    if len(keep) <= 2:
        kernels.call(kern, "unary", dest.size, codes.IDENT, reshaped(g, padded2d(keep)),
                     view2d(dest), scalar_of(dtype, 0.0), scalar_of(dtype, scale),
                     scalar_of(dtype, beta))
    else:
        broadcast_into(kern, g, tuple(dest.shape), dest, scalar_of(dtype, scale),
                       scalar_of(dtype, beta))


def sum(x: Any, axis: Any = None, keepdims: bool = False, *, dim: Any = None,  # noqa: A001
        keepdim: bool | None = None) -> Tensor:
    """Sum over ``axis`` (alias ``dim``; None: all), with NumPy's result shapes."""
    if dim is not None:
        axis = alias("sum", axis, "axis", dim, "dim")
    if keepdim is not None:
        keepdims = alias("sum", keepdims or None, "keepdims", keepdim, "keepdim")
    return _reduce(x, axis, keepdims, False, "sum")


def mean(x: Any, axis: Any = None, keepdims: bool = False, *, dim: Any = None,
         keepdim: bool | None = None) -> Tensor:
    """Mean over ``axis`` (alias ``dim``; None: all), with NumPy's result
    shapes; a mean over no elements is nan, as PyTorch (and NumPy, which
    also warns)."""
    if dim is not None:
        axis = alias("mean", axis, "axis", dim, "dim")
    if keepdim is not None:
        keepdims = alias("mean", keepdims or None, "keepdims", keepdim, "keepdim")
    return _reduce(x, axis, keepdims, True, "mean")


# ------------------------------------------------------------ softmax family
def _softmax(x: Any, axis: int, log: bool, op: str) -> Tensor:
    x = operand(x, op)
    if x.ndim == 0:
        raise ValueError(f"{op}: needs a tensor of at least 1 dim, got {describe(x)}")
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool) \
            or not -x.ndim <= axis < x.ndim:
        raise np.exceptions.AxisError(f"{op}: axis {axis!r} is out of range for a tensor of "
                                      f"{describe(x)}")
    kern, shape = x._kern, tuple(x._data.shape)
    out = buffers.take(kern, shape, x._data.dtype)
    if x.ndim <= 2:
        ax = 1 if x.ndim == 1 else int(axis) % 2
        kernels.call(kern, "softmax", out.size, view2d(x._data), view2d(out), ax, log)
        return result(out, kern, (x,), _softmax_backward, (out, ax, log, None))
    # N-d: lanes along `axis` of the (before, length, after) view
    axis = int(axis) % x.ndim
    lanes3 = (math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:]))
    xd = contiguous(x)
    if lanes3[2] == 1 or lanes3[0] == 1:
        ax = 1 if lanes3[2] == 1 else 0
        two = lanes3[:2] if ax == 1 else lanes3[1:]
        kernels.call(kern, "softmax", out.size, reshaped(xd, two), reshaped(out, two), ax, log)
        return result(out, kern, (x,), _softmax_backward, (out, ax, log, two))
    # lanes strided in memory (stride `after`): read in place, one kernel each way
    kernels.call(kern, "softmax3", out.size, reshaped(xd, lanes3), reshaped(out, lanes3), log)
    return result(out, kern, (x,), _softmax_backward, (out, 1, log, lanes3))


def _softmax_backward(ctx: _Backward, node: Node, gout: Any) -> None:
    (x,) = node.inputs
    y, ax, log, view = node.saved
    kern = x._kern
    dest, beta = ctx.dest(x)
    if gout is None:
        gout = ones(kern, y.shape, y.dtype)
    if view is not None and len(view) == 3:
        kernels.call(kern, "softmax3_backward", y.size, reshaped(y, view), reshaped(gout, view),
                     reshaped(dest, view), beta, log)
        return
    two = (lambda a: view2d(a)) if view is None else (lambda a: reshaped(a, view))
    kernels.call(kern, "softmax_backward", y.size, two(y), two(gout), two(dest), beta, ax, log)


def softmax(x: Any, axis: int = -1, *, dim: Any = None) -> Tensor:
    """exp(x) / sum(exp(x)) along ``axis``, with the max subtracted first; any
    axis of an N-d tensor is one kernel forward and one backward (a middle
    axis read in place, lanes of stride prod(shape[axis + 1:]))."""
    if dim is not None:
        axis = alias("softmax", None if axis == -1 else axis, "axis", dim, "dim")
    return _softmax(x, axis, False, "softmax")


def log_softmax(x: Any, axis: int = -1, *, dim: Any = None) -> Tensor:
    """x - logsumexp(x) along ``axis``, numerically stable."""
    if dim is not None:
        axis = alias("log_softmax", None if axis == -1 else axis, "axis", dim, "dim")
    return _softmax(x, axis, True, "log_softmax")


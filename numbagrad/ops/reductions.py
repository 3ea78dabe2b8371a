"""Reductions (sum, mean) and the softmax family, each forward beside its backward."""
from __future__ import annotations

from typing import Any

from .. import buffers, kernels
from ..kernels import scalar as codes
from ..tape import Node, _Backward
from ..tensor import Tensor
from ._common import (as2d, describe, mean_scale, ones, operand, reshaped, result, scalar_of,
                      view2d)


def _axis(x: Tensor, axis: Any, op: str) -> int | None:
    """``axis`` normalised to None (every axis) or a non-negative int."""
    ndim = x.ndim
    if axis is None:
        return None
    if isinstance(axis, tuple):
        axes = sorted({_axis(x, a, op) for a in axis})
        return None if len(axes) == ndim else (axes[0] if axes else _no_axes(op, x))
    if not isinstance(axis, int) or isinstance(axis, bool):
        raise TypeError(f"{op}: axis must be None, an int or a tuple of ints, got {axis!r}")
    if not -ndim <= axis < ndim:
        raise ValueError(f"{op}: axis {axis} is out of range for a tensor of {describe(x)}")
    axis %= ndim
    return None if ndim == 1 else axis


def _no_axes(op: str, x: Tensor):
    raise ValueError(f"{op}: an empty tuple of axes reduces nothing (tensor of {describe(x)})")


def _reduce(x: Any, axis: Any, keepdims: bool, mean: bool, op: str) -> Tensor:
    x = operand(x, op)
    ax = _axis(x, axis, op)
    shape = x._data.shape
    r, c = as2d(shape)
    if ax is None:
        out2 = (1, 1)
        out_shape = (1,) * len(shape) if keepdims else ()
    elif ax == 0:
        out2 = (1, c)
        out_shape = (1, c) if keepdims else (c,)
    else:
        out2 = (r, 1)
        out_shape = (r, 1) if keepdims else (r,)
    count = r * c if ax is None else (r if ax == 0 else c)   # elements per output
    scale = mean_scale(count) if mean else 1.0
    kern, dtype = x._kern, x._data.dtype
    out = buffers.take(kern, out_shape, dtype)
    kernels.call(kern, "sum_to", x._data.size, view2d(x._data), reshaped(out, out2),
                 scalar_of(dtype, scale), scalar_of(dtype, 0.0))
    return result(out, kern, (x,), _reduce_backward, (out2, scale))


def _reduce_backward(ctx: _Backward, node: Node, gout: Any) -> None:
    (x,) = node.inputs
    out2, scale = node.saved
    kern, dtype = x._kern, x._data.dtype
    g2 = ones(kern, out2, dtype) if gout is None else reshaped(gout, out2)
    dest, beta = ctx.dest(x)
    kernels.call(kern, "unary", dest.size, codes.IDENT, g2, view2d(dest), scalar_of(dtype, 0.0),
                 scalar_of(dtype, scale), scalar_of(dtype, beta))


def sum(x: Any, axis: Any = None, keepdims: bool = False) -> Tensor:  # noqa: A001
    """Sum over ``axis`` (None: all), with NumPy's result shapes."""
    return _reduce(x, axis, keepdims, False, "sum")


def mean(x: Any, axis: Any = None, keepdims: bool = False) -> Tensor:
    """Mean over ``axis`` (None: all), with NumPy's result shapes; a mean over
    no elements is nan, as PyTorch (and NumPy, which also warns)."""
    return _reduce(x, axis, keepdims, True, "mean")


# ------------------------------------------------------------ softmax family
def _softmax(x: Any, axis: int, log: bool, op: str) -> Tensor:
    x = operand(x, op)
    if x.ndim == 0:
        raise ValueError(f"{op}: needs a 1-D or 2-D tensor, got {describe(x)}")
    if not isinstance(axis, int) or isinstance(axis, bool) or not -x.ndim <= axis < x.ndim:
        raise ValueError(f"{op}: axis {axis!r} is out of range for a tensor of {describe(x)}")
    ax = 1 if x.ndim == 1 else axis % 2
    kern = x._kern
    out = buffers.take(kern, x._data.shape, x._data.dtype)
    kernels.call(kern, "softmax", out.size, view2d(x._data), view2d(out), ax, log)
    return result(out, kern, (x,), _softmax_backward, (out, ax, log))


def _softmax_backward(ctx: _Backward, node: Node, gout: Any) -> None:
    (x,) = node.inputs
    y, ax, log = node.saved
    kern = x._kern
    if gout is None:
        gout = ones(kern, y.shape, y.dtype)
    dest, beta = ctx.dest(x)
    kernels.call(kern, "softmax_backward", y.size, view2d(y), view2d(gout), view2d(dest), beta, ax,
                 log)


def softmax(x: Any, axis: int = -1) -> Tensor:
    """exp(x) / sum(exp(x)) along ``axis``, with the max subtracted first."""
    return _softmax(x, axis, False, "softmax")


def log_softmax(x: Any, axis: int = -1) -> Tensor:
    """x - logsumexp(x) along ``axis``, numerically stable."""
    return _softmax(x, axis, True, "log_softmax")


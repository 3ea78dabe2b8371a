"""max/min (torch.amax/amin) and argmax/argmin over any axes, and the lane
plan that the axis reductions share (``ops/statistics.py`` too): the input
viewed as (outer, n, inner), n the reduced elements of each output."""
from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from .. import buffers, kernels
from ..tape import Node, _Backward
from ..tensor import Tensor
from ._common import (axes_of, axis_of, contiguous, copy_strided, describe, ones, operand,
                      permuted, reshaped, result, scalar_of)


class Lanes(NamedTuple):
    """How a reduction over ``axes`` reads its input: ``x3`` (outer, n, inner),
    C-contiguous; ``perm``: None when that is a view of the input, else the
    axis order of the copy it was made from (the reduced axes last); ``keep``
    the input's shape with the reduced axes 1; ``out`` the result's shape."""
    x3: Any
    perm: tuple | None
    keep: tuple
    out: tuple

    @property
    def n(self) -> int:
        return self.x3.shape[1]

    def out2(self, array: Any) -> Any:
        """``array`` (of the result's shape) as the kernels' (outer, inner)."""
        return reshaped(array, (self.x3.shape[0], self.x3.shape[2]))


def lanes(x: Tensor, axis: Any, keepdims: bool, op: str) -> Lanes:
    """The plan for reducing ``x`` over ``axis`` (None, an int or a tuple of ints)."""
    if not isinstance(keepdims, (bool, np.bool_)):
        raise TypeError(f"{op}: keepdims must be a bool, got {keepdims!r}")
    axes = axes_of(x, axis, op)
    shape = tuple(x._data.shape)
    keep = tuple(1 if d in axes else n for d, n in enumerate(shape))
    out = keep if keepdims else tuple(n for d, n in enumerate(shape) if d not in axes)
    xd = contiguous(x)
    n = math.prod(shape[d] for d in axes)
    if not axes or axes == tuple(range(axes[0], axes[-1] + 1)):
        first, last = (axes[0], axes[-1] + 1) if axes else (0, 0)
        x3 = reshaped(xd, (math.prod(shape[:first]), n, math.prod(shape[last:])))
        return Lanes(x3, None, keep, out)
    kept = tuple(d for d in range(len(shape)) if d not in axes)
    perm = kept + axes
    moved = buffers.take(x._kern, tuple(shape[d] for d in perm), xd.dtype)
    copy_strided(x._kern, permuted(xd, perm), moved)
    return Lanes(reshaped(moved, (math.prod(shape[d] for d in kept), n, 1)), perm, keep, out)


def gradient_into(ctx: _Backward, x: Tensor, plan: Lanes, run: Any) -> None:
    """``run(dest3, beta)`` writes x's gradient as (outer, n, inner): straight
    into x's destination, or into a work array moved back into it."""
    dest, beta = ctx.dest(x)
    if plan.perm is None:
        run(reshaped(dest, plan.x3.shape), beta)
        return
    kern, dtype = x._kern, dest.dtype
    work = buffers.take(kern, plan.x3.shape, dtype)
    run(work, 0.0)
    moved = tuple(dest.shape[d] for d in plan.perm)
    copy_strided(kern, permuted(reshaped(work, moved), tuple(np.argsort(plan.perm))), dest,
                 scalar_of(dtype, 1.0), scalar_of(dtype, beta))


def grad_of(kern: Any, plan: Lanes, gout: Any, dtype: Any) -> Any:
    """The output gradient as (outer, inner) (None: ones)."""
    return plan.out2(ones(kern, plan.out, dtype) if gout is None else gout)


# ------------------------------------------------------------ max / min
def _extremum(x: Any, axis: Any, keepdims: bool, want_max: bool, op: str) -> Tensor:
    x = operand(x, op)
    plan = lanes(x, axis, keepdims, op)
    if plan.n == 0:
        raise ValueError(f"{op}: cannot reduce over a size-0 axis (tensor of {describe(x)}, "
                         f"axis={axis!r}): the {op} of nothing is undefined, as in PyTorch")
    kern, dtype = x._kern, x._data.dtype
    out = buffers.take(kern, plan.out, dtype)
    idx = buffers.take(kern, plan.out, np.int64)
    kernels.call(kern, "extrema", out.size, plan.x3, plan.out2(out), plan.out2(idx), want_max)
    return result(out, kern, (x,), _extremum_backward, (plan, out))


def _extremum_backward(ctx: _Backward, node: Node, gout: Any) -> None:
    (x,) = node.inputs
    plan, y = node.saved
    g = grad_of(x._kern, plan, gout, y.dtype)
    gradient_into(ctx, x, plan, lambda dest3, beta: kernels.call(
        x._kern, "extrema_backward", dest3.size, plan.x3, plan.out2(y), g, dest3, beta))


def max(x: Any, axis: Any = None, keepdims: bool = False) -> Tensor:  # noqa: A001
    """The maximum over ``axis`` (None: all; an int or a tuple), as
    ``torch.amax``: nan propagates, and elements tied for the maximum share
    the gradient evenly. A size-0 axis is an error (as PyTorch; NumPy too)."""
    return _extremum(x, axis, keepdims, True, "max")


def min(x: Any, axis: Any = None, keepdims: bool = False) -> Tensor:  # noqa: A001
    """The minimum over ``axis``, as ``torch.amin`` (see ``max``)."""
    return _extremum(x, axis, keepdims, False, "min")


# ------------------------------------------------------------ argmax / argmin
def _arg(x: Any, axis: Any, keepdims: bool, want_max: bool, op: str) -> Any:
    x = operand(x, op)
    if isinstance(axis, tuple):
        raise TypeError(f"{op}: axis must be None or an int, got the tuple {axis!r}")
    ndim = x.ndim
    if axis is None:     # the index into the flattened tensor
        plan = lanes(x, None, False, op)
        plan = Lanes(reshaped(plan.x3, (1, x.size, 1)), None, plan.keep,
                     (1,) * ndim if keepdims else ())
    else:
        plan = lanes(x, axis_of(axis, ndim, op) if ndim else axis, keepdims, op)
    if plan.n == 0:
        raise ValueError(f"{op}: cannot reduce over a size-0 axis (tensor of {describe(x)}, "
                         f"axis={axis!r})")
    kern = x._kern
    values = buffers.take(kern, plan.out, x._data.dtype)
    idx = kernels.empty(kern, plan.out, np.int64)
    kernels.call(kern, "extrema", values.size, plan.x3, plan.out2(values), plan.out2(idx),
                 want_max)
    return idx


def argmax(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    """The index of the first maximum along ``axis`` (None: into the flattened
    tensor), as NumPy and PyTorch; nan counts as the maximum. Not
    differentiable: an int64 NumPy array on "cpu", a device array on "cuda"."""
    return _arg(x, axis, keepdims, True, "argmax")


def argmin(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    """The index of the first minimum along ``axis`` (see ``argmax``)."""
    return _arg(x, axis, keepdims, False, "argmin")

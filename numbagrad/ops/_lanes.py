"""The lane plan the axis reductions share (``ops/extrema.py``,
``ops/statistics.py``): the input viewed as (outer, n, inner), n the reduced
elements of each output, the layout ``kernels/*/reduce_axis.py`` read."""
from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from .. import buffers
from ..tape import _Backward
from ..tensor import Tensor
from ._common import axes_of, contiguous, copy_strided, ones, permuted, reshaped, scalar_of


class Lanes(NamedTuple):
    """How a reduction over ``axes`` reads its input: ``x3`` (outer, n, inner),
    C-contiguous; ``perm``: None when that is a view of the input, else the
    axis order of the copy it was made from (the reduced axes last); ``out``
    the result's shape."""
    x3: Any
    perm: tuple | None
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
    out = tuple(1 if d in axes else n for d, n in enumerate(shape) if keepdims or d not in axes)
    xd = contiguous(x)
    n = math.prod(shape[d] for d in axes)
    if not axes or axes == tuple(range(axes[0], axes[-1] + 1)):
        first, last = (axes[0], axes[-1] + 1) if axes else (0, 0)
        x3 = reshaped(xd, (math.prod(shape[:first]), n, math.prod(shape[last:])))
        return Lanes(x3, None, out)
    kept = tuple(d for d in range(len(shape)) if d not in axes)
    perm = kept + axes
    moved = buffers.take(x._kern, tuple(shape[d] for d in perm), xd.dtype)
    copy_strided(x._kern, permuted(xd, perm), moved)
    return Lanes(reshaped(moved, (math.prod(shape[d] for d in kept), n, 1)), perm, out)


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
    copy_strided(kern, permuted(reshaped(work, moved), tuple(int(d) for d in np.argsort(plan.perm))), dest,
                 scalar_of(dtype, 1.0), scalar_of(dtype, beta))


def grad_of(kern: Any, plan: Lanes, gout: Any, dtype: Any) -> Any:
    """The output gradient as (outer, inner) (None: ones)."""
    return plan.out2(ones(kern, plan.out, dtype) if gout is None else gout)

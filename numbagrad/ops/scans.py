"""The scans beside ``cumsum`` (``cumprod``, ``cummax``/``cummin``,
``logcumsumexp``) and ``prod``, which is the last of a ``cumprod``; each
forward beside its backward, one ``kernels/*/scan.py`` kernel each way on
the (outer, n, inner) view of the scanned dim."""
from __future__ import annotations

import math
from collections import namedtuple
from typing import Any

import numpy as np

from .. import buffers, kernels
from ..kernels.cpu import integer as ic
from ..tape import Node, _Backward
from ..tensor import Tensor
from . import _integer
from ._common import alias, axis_of, contiguous, ones, operand, reshaped, result
from .reductions import sum as _sum
from .shape import reshape

# torch.return_types.cummax / .cummin
CummaxResult = namedtuple("cummax", ("values", "indices"))
CumminResult = namedtuple("cummin", ("values", "indices"))
CummaxResult.__doc__ = "``cummax(x, dim)``: ``values`` (a Tensor) and ``indices`` (as ``argmax``)."
CumminResult.__doc__ = "``cummin(x, dim)``: ``values`` (a Tensor) and ``indices`` (as ``argmin``)."


def _scan_shape(x: Tensor, axis: Any, op: str) -> tuple[tuple, tuple]:
    """((outer, n, inner), result shape) of a scan along ``axis``: None runs
    over the flattened tensor (as NumPy and ``cumsum``), a 0-d tensor takes
    axis 0 or -1 (as PyTorch)."""
    shape = tuple(x._data.shape)
    if axis is None or not shape:
        if axis is not None:
            axis_of(axis, 1, op)
        return (1, x.size, 1), (x.size,) if axis is None else ()
    a = axis_of(axis, len(shape), op)
    return (math.prod(shape[:a]), shape[a], math.prod(shape[a + 1:])), shape


def _dim(op: str, axis: Any, dim: Any) -> Any:
    return axis if dim is None else alias(op, axis, "axis", dim, "dim")


def _grad3(kern: Any, gout: Any, shape3: tuple, dtype: Any) -> Any:
    return ones(kern, shape3, dtype) if gout is None else reshaped(gout, shape3)


def _lane_scan(x: Any, axis: Any, dim: Any, op: str, backward: Any, need_dim: bool) -> Tensor:
    """The scan ``op`` (a ``kernels/*/scan.py`` kernel x -> out along the
    lanes) of ``x`` along ``axis`` (alias ``dim``), recorded with
    ``backward`` (``_lane_scan_backward`` under the op's name)."""
    x = operand(x, op)
    axis = _dim(op, axis, dim)
    if need_dim and axis is None:
        raise TypeError(f"{op}: a dim is needed (torch.{op}(x, dim))")
    shape3, out_shape = _scan_shape(x, axis, op)
    kern = x._kern
    x3 = reshaped(contiguous(x), shape3)
    out = buffers.take(kern, out_shape, x._data.dtype)
    kernels.call(kern, op, out.size, x3, reshaped(out, shape3))
    return result(out, kern, (x,), backward, (op, shape3, x3, out))


def _lane_scan_backward(ctx: _Backward, node: Node, gout: Any) -> None:
    """The gradient of ``_lane_scan``: its op's ``_backward`` kernel."""
    (x,) = node.inputs
    op, shape3, x3, y = node.saved
    kern = x._kern
    g = _grad3(kern, gout, shape3, y.dtype)
    dest, beta = ctx.dest(x)
    kernels.call(kern, f"{op}_backward", dest.size, x3, reshaped(y, shape3), g,
                 reshaped(dest, shape3), beta)


# ------------------------------------------------------------ cumprod / prod
def cumprod(x: Any, axis: Any = None, *, dim: Any = None) -> Tensor:
    """Running products along ``axis`` (alias ``dim``), PyTorch's
    ``torch.cumprod`` (float64 accumulation); axis=None runs over the
    flattened tensor, as NumPy's (PyTorch needs a dim). The gradient is
    exact where x is 0 (no division by x), as PyTorch's."""
    return _lane_scan(x, axis, dim, "cumprod", _cumprod_backward, need_dim=False)


def _cumprod_backward(ctx: _Backward, node: Node, gout: Any) -> None:
    # (named for the op, as the tape's in-place-write error reports it)
    _lane_scan_backward(ctx, node, gout)


def prod(x: Any, axis: Any = None, keepdims: bool = False, *, dim: Any = None,
         keepdim: bool | None = None) -> Tensor:
    """The product over ``axis`` (alias ``dim``; None: every element), as
    ``torch.prod``: 1 over nothing; the gradient is the product of the
    other elements, exact with zeros (one zero: the product of the rest
    there, 0 elsewhere; two or more: 0), as PyTorch's. It is the last
    element of a ``cumprod`` (exact, where a log-sum would not be). An
    integer or bool tensor's product is int64, as PyTorch's."""
    op = "prod"
    axis = _dim(op, axis, dim)
    if keepdim is not None:
        keepdims = alias(op, keepdims or None, "keepdims", keepdim, "keepdim")
    if not isinstance(keepdims, (bool, np.bool_)):
        raise TypeError(f"{op}: keepdims must be a bool, got {keepdims!r}")
    if isinstance(axis, (tuple, list)):
        raise TypeError(f"{op}: axis must be None or an int, as torch.prod, got {axis!r}")
    x = operand(x, op, ints=True)
    shape = tuple(x.shape)
    if x.dtype.kind != "f":
        if axis is not None and not shape:
            axis_of(axis, 1, op)
        axes = tuple(range(len(shape))) if axis is None or not shape else \
            (axis_of(axis, len(shape), op),)
        return _integer.reduce(ic.PROD, x, axes, bool(keepdims), op)
    if axis is None or not shape:
        if axis is not None:
            axis_of(axis, 1, op)
        a, flat = 0, reshape(x, (x.size,))
        kept = (1,) * len(shape) if keepdims else ()
    else:
        a = axis_of(axis, len(shape), op)
        flat = x
        kept = shape[:a] + ((1,) if keepdims else ()) + shape[a + 1:]
    n = flat.shape[a]
    if n == 0:     # 1 over nothing, still on the tape (its gradient is empty)
        return reshape(_sum(flat, a) * 0.0 + 1.0, kept)
    key = (slice(None),) * a + (slice(n - 1, n),)
    return reshape(cumprod(flat, a)[key], kept)


# ------------------------------------------------------------ cummax / cummin
def _cumextremum(x: Any, axis: Any, want_max: bool, op: str) -> tuple:
    x = operand(x, op)
    if axis is None:
        raise TypeError(f"{op}: a dim is needed (torch.{op}(x, dim))")
    shape3, out_shape = _scan_shape(x, axis, op)
    kern = x._kern
    out = buffers.take(kern, out_shape, x._data.dtype)
    # a pooled array (so that ng.compile replays the kernel that writes it),
    # retired from the pool: the caller keeps it
    idx = buffers.take(kern, out_shape, np.int64)
    kernels.call(kern, "cumextrema", out.size, reshaped(contiguous(x), shape3),
                 reshaped(out, shape3), reshaped(idx, shape3), want_max)
    buffers.retire(kern, idx)
    values = result(out, kern, (x,), _cumextremum_backward, (shape3, idx))
    return (CummaxResult if want_max else CumminResult)(values, idx)


def _cumextremum_backward(ctx: _Backward, node: Node, gout: Any) -> None:
    (x,) = node.inputs
    shape3, idx = node.saved
    kern = x._kern
    g = _grad3(kern, gout, shape3, x._data.dtype)
    dest, beta = ctx.dest(x)
    kernels.call(kern, "cumextrema_backward", dest.size, reshaped(idx, shape3), g,
                 reshaped(dest, shape3), beta)


def cummax(x: Any, axis: Any = None, *, dim: Any = None) -> CummaxResult:
    """The running maximum along ``axis`` (alias ``dim``) and where each was
    taken, the named tuple ``(values, indices)`` of ``torch.cummax``: ties
    take the later index, and nan, once seen, is the maximum (a later nan
    takes its index, a tie), as PyTorch's. Indices are int64 arrays as ``argmax``'s (NumPy on
    "cpu", a device array on "cuda"); the values' gradient goes to the
    element each value came from."""
    return _cumextremum(x, _dim("cummax", axis, dim), True, "cummax")


def cummin(x: Any, axis: Any = None, *, dim: Any = None) -> CumminResult:
    """The running minimum along ``axis`` and its indices, as
    ``torch.cummin`` (see ``cummax``)."""
    return _cumextremum(x, _dim("cummin", axis, dim), False, "cummin")


# ------------------------------------------------------------ logcumsumexp
def logcumsumexp(x: Any, axis: Any = None, *, dim: Any = None) -> Tensor:
    """Running log(sum(exp(x))) along ``axis`` (alias ``dim``), as
    ``torch.logcumsumexp``: stable for large |x|, -inf adds nothing (all
    -inf so far: -inf), +inf and nan stick; the gradient is PyTorch's
    formula (sign-split log-sums, so nan where PyTorch's is nan)."""
    return _lane_scan(x, axis, dim, "logcumsumexp", _logcumsumexp_backward, need_dim=True)


def _logcumsumexp_backward(ctx: _Backward, node: Node, gout: Any) -> None:
    _lane_scan_backward(ctx, node, gout)

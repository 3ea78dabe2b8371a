"""amax/amin, max/min (torch.max/min: values and indices) and argmax/argmin
over any axes, each forward beside its backward; one ``reduce_axis`` kernel
each way on ``_lanes``' plan."""
from __future__ import annotations

from collections import namedtuple
from typing import Any

import numpy as np

from .. import buffers, kernels
from ..tape import Node, _Backward
from ..tensor import Tensor
from . import activations, indexing, shape
from ._common import alias, axis_of, describe, operand, result
from ._lanes import grad_of, gradient_into, lanes


# ------------------------------------------------------------ max / min
def _extremum(x: Any, axis: Any, keepdims: bool, want_max: bool, op: str) -> Tensor:
    x = operand(x, op, ints=True)
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


def amax(x: Any, axis: Any = None, keepdims: bool = False, *, dim: Any = None,
         keepdim: bool | None = None) -> Tensor:
    """The maximum over ``axis`` (alias ``dim``; None: all; an int or a
    tuple), as ``torch.amax``: nan propagates, and elements tied for the
    maximum share the gradient evenly. A size-0 axis is an error (as PyTorch;
    NumPy too)."""
    if dim is not None:
        axis = alias("amax", axis, "axis", dim, "dim")
    if keepdim is not None:
        keepdims = alias("amax", keepdims or None, "keepdims", keepdim, "keepdim")
    return _extremum(x, axis, keepdims, True, "amax")


def amin(x: Any, axis: Any = None, keepdims: bool = False, *, dim: Any = None,
         keepdim: bool | None = None) -> Tensor:
    """The minimum over ``axis`` (alias ``dim``), as ``torch.amin`` (see ``amax``)."""
    if dim is not None:
        axis = alias("amin", axis, "axis", dim, "dim")
    if keepdim is not None:
        keepdims = alias("amin", keepdims or None, "keepdims", keepdim, "keepdim")
    return _extremum(x, axis, keepdims, False, "amin")


# torch.return_types.max / .min: what max/min over one axis return
MaxResult = namedtuple("max", ("values", "indices"))
MinResult = namedtuple("min", ("values", "indices"))
MaxResult.__doc__ = "``max(x, axis)``: ``values`` (a Tensor) and ``indices`` (as ``argmax``)."
MinResult.__doc__ = "``min(x, axis)``: ``values`` (a Tensor) and ``indices`` (as ``argmin``)."


def _with_indices(x: Any, axis: Any, keepdims: bool, want_max: bool, op: str) -> tuple:
    """PyTorch's ``torch.max(x, dim)``: (values, indices) over the one axis
    ``axis``; the values are ``x`` gathered at the indices, so the gradient
    goes to the element picked (the first of any ties), not split."""
    x = operand(x, op, ints=True)
    if isinstance(axis, (tuple, list)):
        raise TypeError(f"{op}: axis must be an int to return (values, indices), as "
                        f"torch.{op}, got {axis!r}; a{op}(x, {axis!r}) reduces several axes")
    if not isinstance(keepdims, bool):
        raise TypeError(f"{op}: keepdims must be a bool, got {keepdims!r}")
    kind = MaxResult if want_max else MinResult
    if x.ndim == 0:
        axis_of(axis, 1, op)        # a 0-d tensor takes axis 0 or -1, as PyTorch
        return kind(shape.reshape(x, ()), _arg(x, None, False, want_max, op))
    a = axis_of(axis, x.ndim, op)
    idx = _arg(x, a, True, want_max, op)
    values = indexing._gather(x, a, idx, op)
    if keepdims:
        return kind(values, idx)
    squeezed = tuple(n for d, n in enumerate(idx.shape) if d != a)
    return kind(shape.squeeze(values, a), idx.reshape(squeezed))


def max(x: Any, axis: Any = None, keepdims: bool = False, *, dim: Any = None,  # noqa: A001
        keepdim: bool | None = None) -> Any:
    """PyTorch's ``torch.max``. With no axis: the maximum of every element, a
    0-d Tensor (as ``amax``). With an int ``axis`` (alias ``dim``): the named
    tuple ``(values, indices)`` over it, as ``torch.max(x, dim)``: the values'
    gradient goes to the index picked (the first maximum, nan counting as
    the maximum), not split among ties as ``amax``'s. With a Tensor second
    argument: ``maximum(x, other)``. (NumPy's ``np.max(x, axis)`` returns the
    values only: that is ``amax``.)"""
    if dim is not None:
        axis = alias("max", axis, "axis", dim, "dim")
    if keepdim is not None:
        keepdims = alias("max", keepdims or None, "keepdims", keepdim, "keepdim")
    if axis is None:
        if keepdims:
            raise TypeError("max: keepdims=True needs an axis (as torch.max); "
                            "amax(x, keepdims=True) keeps every dim")
        return _extremum(x, None, False, True, "max")
    if isinstance(axis, Tensor):
        return activations.maximum(x, axis)
    return _with_indices(x, axis, keepdims, True, "max")


def min(x: Any, axis: Any = None, keepdims: bool = False, *, dim: Any = None,  # noqa: A001
        keepdim: bool | None = None) -> Any:
    """PyTorch's ``torch.min`` (see ``max``): no axis, a 0-d Tensor; an int
    axis, the named tuple ``(values, indices)``; a Tensor, ``minimum``."""
    if dim is not None:
        axis = alias("min", axis, "axis", dim, "dim")
    if keepdim is not None:
        keepdims = alias("min", keepdims or None, "keepdims", keepdim, "keepdim")
    if axis is None:
        if keepdims:
            raise TypeError("min: keepdims=True needs an axis (as torch.min); "
                            "amin(x, keepdims=True) keeps every dim")
        return _extremum(x, None, False, False, "min")
    if isinstance(axis, Tensor):
        return activations.minimum(x, axis)
    return _with_indices(x, axis, keepdims, False, "min")


# ------------------------------------------------------------ argmax / argmin
def _arg(x: Any, axis: Any, keepdims: bool, want_max: bool, op: str) -> Any:
    x = operand(x, op, ints=True)
    if isinstance(axis, tuple):
        raise TypeError(f"{op}: axis must be None or an int, got the tuple {axis!r}")
    if axis is not None and x.ndim == 0:
        axis_of(axis, 1, op)        # a 0-d tensor takes axis 0 or -1, as PyTorch
        axis = None
    # axis None: every axis, the (1, size, 1) view, so the index into the flattened tensor
    plan = lanes(x, axis, keepdims, op)
    if plan.n == 0:
        raise ValueError(f"{op}: cannot reduce over a size-0 axis (tensor of {describe(x)}, "
                         f"axis={axis!r})")
    kern = x._kern
    values = buffers.take(kern, plan.out, x._data.dtype)
    idx = kernels.empty(kern, plan.out, np.int64)
    kernels.call(kern, "extrema", values.size, plan.x3, plan.out2(values), plan.out2(idx),
                 want_max)
    return idx


def argmax(x: Any, axis: Any = None, keepdims: bool = False, *, dim: Any = None,
           keepdim: bool | None = None) -> Any:
    """The index of the first maximum along ``axis`` (alias ``dim``; None:
    into the flattened tensor), as NumPy and PyTorch; nan counts as the
    maximum. Not differentiable: an int64 NumPy array on "cpu", a device
    array on "cuda"."""
    if dim is not None:
        axis = alias("argmax", axis, "axis", dim, "dim")
    if keepdim is not None:
        keepdims = alias("argmax", keepdims or None, "keepdims", keepdim, "keepdim")
    return _arg(x, axis, keepdims, True, "argmax")


def argmin(x: Any, axis: Any = None, keepdims: bool = False, *, dim: Any = None,
           keepdim: bool | None = None) -> Any:
    """The index of the first minimum along ``axis`` (alias ``dim``; see ``argmax``)."""
    if dim is not None:
        axis = alias("argmin", axis, "axis", dim, "dim")
    if keepdim is not None:
        keepdims = alias("argmin", keepdims or None, "keepdims", keepdim, "keepdim")
    return _arg(x, axis, keepdims, False, "argmin")

"""max/min (torch.amax/amin) and argmax/argmin over any axes, each forward
beside its backward; one ``reduce_axis`` kernel each way on ``_lanes``' plan."""
from __future__ import annotations

from typing import Any

import numpy as np

from .. import buffers, kernels
from ..tape import Node, _Backward
from ..tensor import Tensor
from ._common import axis_of, describe, operand, result
from ._lanes import grad_of, gradient_into, lanes


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


def argmax(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    """The index of the first maximum along ``axis`` (None: into the flattened
    tensor), as NumPy and PyTorch; nan counts as the maximum. Not
    differentiable: an int64 NumPy array on "cpu", a device array on "cuda"."""
    return _arg(x, axis, keepdims, True, "argmax")


def argmin(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    """The index of the first minimum along ``axis`` (see ``argmax``)."""
    return _arg(x, axis, keepdims, False, "argmin")

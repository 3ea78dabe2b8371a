"""logsumexp, var, std and cumsum over any axes, each forward beside its
backward; one kernel each way (``kernels/*/reduce_axis.py``) on ``_lanes``'
plan."""
from __future__ import annotations

import math
import warnings
from typing import Any

from .. import buffers, kernels
from ..tape import Node, _Backward
from ..tensor import Tensor
from ._common import (alias, axis_of, contiguous, describe, is_scalar, mean_scale, ones, operand,
                      reshaped, result)
from ._lanes import grad_of, gradient_into, lanes
from .reductions import mean as _mean


def logsumexp(x: Any, axis: Any = None, keepdims: bool = False, *, dim: Any = None,
              keepdim: bool | None = None) -> Tensor:
    """log(sum(exp(x))) over ``axis`` (None: all; PyTorch requires a dim),
    stable for large |x|; over nothing it is -inf, as PyTorch."""
    if dim is not None:
        axis = alias("logsumexp", axis, "axis", dim, "dim")
    if keepdim is not None:
        keepdims = alias("logsumexp", keepdims or None, "keepdims", keepdim, "keepdim")
    op = "logsumexp"
    x = operand(x, op)
    plan = lanes(x, axis, keepdims, op)
    kern = x._kern
    out = buffers.take(kern, plan.out, x._data.dtype)
    kernels.call(kern, op, out.size, plan.x3, plan.out2(out))
    return result(out, kern, (x,), _logsumexp_backward, (plan, out))


def _logsumexp_backward(ctx: _Backward, node: Node, gout: Any) -> None:
    (x,) = node.inputs
    plan, y = node.saved
    g = grad_of(x._kern, plan, gout, y.dtype)
    gradient_into(ctx, x, plan, lambda dest3, beta: kernels.call(
        x._kern, "logsumexp_backward", dest3.size, plan.x3, plan.out2(y), g, dest3, beta))


def _variance(x: Any, axis: Any, correction: Any, keepdims: bool, root: bool,
              op: str) -> Tensor:
    x = operand(x, op)
    if not is_scalar(correction):
        raise TypeError(f"{op}: correction must be a real number, got {correction!r}")
    plan = lanes(x, axis, keepdims, op)
    divisor = max(0.0, plan.n - float(correction))
    if divisor == 0 and plan.n:
        warnings.warn(f"{op}: degrees of freedom <= 0 ({plan.n} elements per result, "
                      f"correction={correction}) for a tensor of {describe(x)}: the result "
                      "is inf or nan, as PyTorch", RuntimeWarning, stacklevel=3)
    inv_div = 1.0 / divisor if divisor else math.inf
    kern, dtype = x._kern, x._data.dtype
    out = buffers.take(kern, plan.out, dtype)
    mean = buffers.take(kern, plan.out, dtype)
    kernels.call(kern, "variance", out.size, plan.x3, plan.out2(out), plan.out2(mean),
                 mean_scale(plan.n), inv_div, root)
    return result(out, kern, (x,), _variance_backward, (plan, out, mean, 2 * inv_div, root))


def _variance_backward(ctx: _Backward, node: Node, gout: Any) -> None:
    (x,) = node.inputs
    plan, y, mean, scale, root = node.saved
    g = grad_of(x._kern, plan, gout, y.dtype)
    gradient_into(ctx, x, plan, lambda dest3, beta: kernels.call(
        x._kern, "variance_backward", dest3.size, plan.x3, plan.out2(mean), plan.out2(y), g,
        dest3, scale, root, beta))


def var(x: Any, axis: Any = None, correction: float = 1, keepdims: bool = False, *,
        dim: Any = None, keepdim: bool | None = None) -> Tensor:
    """The variance over ``axis``: sum((x - mean)^2) / max(0, n - correction),
    PyTorch's ``torch.var`` (its default correction=1, where NumPy's ddof is
    0); with no degrees of freedom left it warns and is inf or nan."""
    if dim is not None:
        axis = alias("var", axis, "axis", dim, "dim")
    if keepdim is not None:
        keepdims = alias("var", keepdims or None, "keepdims", keepdim, "keepdim")
    return _variance(x, axis, correction, keepdims, False, "var")


def std(x: Any, axis: Any = None, correction: float = 1, keepdims: bool = False, *,
        dim: Any = None, keepdim: bool | None = None) -> Tensor:
    """sqrt(var(x, ...)), PyTorch's ``torch.std`` (see ``var``); its gradient
    is 0 where the std is 0, as PyTorch's."""
    if dim is not None:
        axis = alias("std", axis, "axis", dim, "dim")
    if keepdim is not None:
        keepdims = alias("std", keepdims or None, "keepdims", keepdim, "keepdim")
    return _variance(x, axis, correction, keepdims, True, "std")


def cumsum(x: Any, axis: Any = None, *, dim: Any = None) -> Tensor:
    """Running sums along ``axis``, PyTorch's ``torch.cumsum`` (float64
    accumulation); axis=None runs over the flattened tensor, as NumPy
    (PyTorch needs a dim)."""
    if dim is not None:
        axis = alias("cumsum", axis, "axis", dim, "dim")
    op = "cumsum"
    x = operand(x, op)
    shape = tuple(x._data.shape)
    if axis is None or not shape:
        if axis is not None:
            axis_of(axis, 1, op)        # a 0-d tensor takes axis 0 or -1, as PyTorch
        shape3, out_shape = (1, x.size, 1), (x.size,) if axis is None else ()
    else:
        a = axis_of(axis, len(shape), op)
        shape3 = (math.prod(shape[:a]), shape[a], math.prod(shape[a + 1:]))
        out_shape = shape
    kern = x._kern
    out = buffers.take(kern, out_shape, x._data.dtype)
    kernels.call(kern, op, out.size, reshaped(contiguous(x), shape3), reshaped(out, shape3),
                 False, 0.0)
    return result(out, kern, (x,), _cumsum_backward, (shape3,))


def _cumsum_backward(ctx: _Backward, node: Node, gout: Any) -> None:
    (x,) = node.inputs
    (shape3,) = node.saved
    kern = x._kern
    g = ones(kern, shape3, x._data.dtype) if gout is None else reshaped(gout, shape3)
    dest, beta = ctx.dest(x)
    kernels.call(kern, "cumsum", dest.size, g, reshaped(dest, shape3), True, beta)


def var_mean(x: Any, axis: Any = None, correction: float = 1, keepdims: bool = False, *,
             dim: Any = None, keepdim: bool | None = None) -> tuple[Tensor, Tensor]:
    """(var, mean) over ``axis``, as ``torch.var_mean`` (two reductions)."""
    v = var(x, axis, correction, keepdims, dim=dim, keepdim=keepdim)
    return v, _mean(x, axis, keepdims, dim=dim, keepdim=keepdim)


def std_mean(x: Any, axis: Any = None, correction: float = 1, keepdims: bool = False, *,
             dim: Any = None, keepdim: bool | None = None) -> tuple[Tensor, Tensor]:
    """(std, mean) over ``axis``, as ``torch.std_mean``."""
    s = std(x, axis, correction, keepdims, dim=dim, keepdim=keepdim)
    return s, _mean(x, axis, keepdims, dim=dim, keepdim=keepdim)

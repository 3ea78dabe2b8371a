"""Shape ops: transpose and reshape, views of their input's data (no copy)."""
from __future__ import annotations

from typing import Any

import numpy as np

from .. import kernels
from ..kernels import scalar as codes
from ..tape import Node, _Backward
from ..tensor import Tensor, _seen, _wrappers
from ._common import contiguous, describe, ones, operand, reshaped, result, scalar_of


def transpose(x: Any) -> Tensor:
    """``x.T``: a 2-D tensor's transpose as a strided view (a GEMM reads it
    through its transpose flag); vectors and 0-d tensors are returned as is."""
    x = operand(x, "transpose")
    if x.ndim < 2:
        return x
    return _view_of(x, result(x._data.T, x._kern, (x,), _transpose_backward, (), pool=x._pool))


def _view_of(x: Tensor, out: Tensor) -> Tensor:
    """``out``, a view of ``x``'s data, noted as wrapping an accumulator when ``x`` is."""
    if _seen.wrapped and x in _wrappers:
        _wrappers.add(out)
    return out


def _transpose_backward(ctx: _Backward, node: Node, gout: Any) -> None:
    (x,) = node.inputs
    kern, dtype = x._kern, x._data.dtype
    if gout is None:
        gout = ones(kern, x.shape[::-1], dtype)
    dest, beta = ctx.dest(x)
    kernels.call(kern, "unary", dest.size, codes.IDENT, gout.T, dest, scalar_of(dtype, 0.0),
                 scalar_of(dtype, 1.0), scalar_of(dtype, beta))


def reshape(x: Any, *shape: Any) -> Tensor:
    """``x.reshape(*shape)`` with NumPy's rules (one -1 allowed), at most 2-D.

    A view when the data is C-contiguous, else a copy.
    """
    x = operand(x, "reshape")
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    try:
        new = np.empty(x.shape, dtype=np.uint8).reshape(shape).shape   # NumPy's checks
    except (TypeError, ValueError) as exc:
        raise ValueError(f"reshape: cannot reshape a tensor of {describe(x)} to "
                         f"{shape}: {exc}") from None
    if len(new) > 2:
        raise ValueError(f"reshape: tensors have at most 2 dims, got shape {new}")
    data = contiguous(x)
    pool = x._pool if data is x._data else data
    return _view_of(x, result(reshaped(data, new), x._kern, (x,), _reshape_backward, (),
                              pool=pool))


def _reshape_backward(ctx: _Backward, node: Node, gout: Any) -> None:
    (x,) = node.inputs
    kern = x._kern
    dest, beta = ctx.dest(x)
    if gout is None:
        gout = ones(kern, x.shape, x._data.dtype)
    kernels.call(kern, "axpby", dest.size, 1.0, reshaped(gout, dest.shape), beta, dest)


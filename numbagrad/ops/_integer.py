"""The integer and bool side of the elementwise ops and reductions.

Integer and bool tensors never carry a gradient: these build plain results
from the ``int_*`` kernels (``kernels/cpu/integer.py``, one per device).
The public ops (``add``, ``maximum``, ``sum``, ``&``, ...) call here when
their operands, promoted by ``_common.pair`` (PyTorch's ``result_type``),
are integers or bools. Integer division by zero is a ZeroDivisionError and a
negative integer exponent a ValueError, as PyTorch's, checked before
anything is written.
"""
from __future__ import annotations

import numpy as np

from .. import buffers, kernels
from ..kernels.cpu import integer as ic
from ..kernels.cpu.masks import RANK
from ..tensor import Tensor
from ._common import broadcast_shape, contiguous, describe, reshaped, result
from .masks import _padded

_BOOL = np.dtype(np.bool_)
_INT64 = np.dtype(np.int64)
# what two bool operands give: the op's bool meaning (True + True is True)
_BOOL_OK = {ic.ADD, ic.MUL, ic.MAX, ic.MIN, ic.AND, ic.OR, ic.XOR}
_DIVIDES = {ic.FLOORDIV, ic.REMAINDER, ic.FMOD, ic.TRUNCDIV}


def binary(code: int, a: Tensor, b: Tensor, op: str) -> Tensor:
    """a <op> b for two integer or bool tensors of one dtype and device."""
    dtype = a.dtype
    if dtype == _BOOL and code not in _BOOL_OK:
        raise TypeError(f"{op}: not defined for two bool tensors ({describe(a)} and "
                        f"{describe(b)}); convert them with .long()")
    shape = broadcast_shape(a.shape, b.shape, op)
    # (an empty result reads no divisor and no exponent, as PyTorch's)
    empty = 0 in shape
    if code in _DIVIDES and not empty and not b.numpy().all():
        raise ZeroDivisionError(f"{op}: integer division by zero (divisor of {describe(b)})")
    if code == ic.POW and not empty and (b.numpy() < 0).any():
        raise ValueError(f"{op}: integers to negative integer powers are not allowed "
                         f"(exponent of {describe(b)}); use floats")
    kern, rank = a._kern, max(len(shape), RANK)
    out = buffers.take(kern, shape, dtype)
    kernels.call(kern, "int_binary", out.size, code, _padded(contiguous(a), rank),
                 _padded(contiguous(b), rank), _padded(out, rank))
    return result(out, kern, (), None)


def unary(code: int, x: Tensor, op: str) -> Tensor:
    """<op> x for an integer or bool tensor (NOT gives bool)."""
    if x.dtype == _BOOL and code in (ic.NEG, ic.SIGN):
        raise TypeError(f"{op}: not defined for a bool tensor ({describe(x)}); use ~ or "
                        "logical_not to negate one, or convert it with .long()")
    if x.dtype == _BOOL and code == ic.INVERT:
        code = ic.NOT
    dtype = _BOOL if code == ic.NOT else x.dtype
    kern = x._kern
    out = buffers.take(kern, x.shape, dtype)
    kernels.call(kern, "int_unary", out.size, code, _padded(contiguous(x), 1), _padded(out, 1))
    return result(out, kern, (), None)


def reduce(code: int, x: Tensor, axes: tuple, keepdim: bool, op: str) -> Tensor:
    """The reduction ``code`` of an integer or bool tensor over ``axes``:
    sums and products in int64 (as PyTorch's ``sum``), extrema in x's dtype,
    arg-extrema int64 (the first index of the extreme)."""
    from .shape import permute      # (shape builds on _common, as this module)
    nd = len(x.shape)
    keep = [d for d in range(nd) if d not in axes]
    inner = int(np.prod([x.shape[d] for d in axes], dtype=np.int64))
    if inner == 0 and code not in (ic.SUM, ic.PROD):
        raise IndexError(f"{op}: cannot reduce over a zero-size dimension of {describe(x)}")
    moved = permute(x, keep + list(axes)) if keep + list(axes) != list(range(nd)) else x
    rows = int(np.prod([x.shape[d] for d in keep], dtype=np.int64))
    dtype = x.dtype if code in (ic.RMAX, ic.RMIN) else _INT64
    kern = x._kern
    out = buffers.take(kern, (rows,), dtype)
    kernels.call(kern, "int_reduce", rows * max(inner, 1), code,
                 reshaped(contiguous(moved), (rows, inner)), out)
    shape = tuple(1 if d in axes else n for d, n in enumerate(x.shape)) if keepdim else \
        tuple(x.shape[d] for d in keep)
    return result(reshaped(out, shape), kern, (), None, pool=out)

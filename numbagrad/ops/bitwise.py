"""Bitwise and logical ops: ``& | ^ ~ << >>`` and ``logical_*``.

The bitwise ops take integer and bool tensors only (as PyTorch's; a float
operand is a TypeError), their operands promoted by PyTorch's rules
(``_dtypes.result_type``); on bools ``~`` is logical not. The logical ops take
any dtype (non-zero is true, nan included) and give bool tensors. None has a
gradient. The kernels are the integer family's (``kernels/cpu/integer.py``).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..kernels.cpu import integer as ic
from ..tensor import Tensor
from . import _integer
from ._common import describe, operand, pair
from .masks import ne

_BOOL = np.dtype(np.bool_)


def _bitwise(code: int, a: Any, b: Any, op: str) -> Tensor:
    a, b = pair(a, b, op, ints=True)
    if a.dtype.kind == "f":
        raise TypeError(f"{op}: takes integer or bool tensors, got {describe(a)} and "
                        f"{describe(b)} (as PyTorch)")
    if a.dtype == _BOOL and code in (ic.SHL, ic.SHR):
        raise TypeError(f"{op}: cannot shift bool tensors ({describe(a)}); convert them "
                        "with .long()")
    return _integer.binary(code, a, b, op)


def bitwise_and(a: Any, b: Any) -> Tensor:
    """a & b elementwise (``torch.bitwise_and``; logical and on bools)."""
    return _bitwise(ic.AND, a, b, "bitwise_and")


def bitwise_or(a: Any, b: Any) -> Tensor:
    """a | b elementwise (``torch.bitwise_or``)."""
    return _bitwise(ic.OR, a, b, "bitwise_or")


def bitwise_xor(a: Any, b: Any) -> Tensor:
    """a ^ b elementwise (``torch.bitwise_xor``)."""
    return _bitwise(ic.XOR, a, b, "bitwise_xor")


def bitwise_left_shift(a: Any, b: Any) -> Tensor:
    """a << b elementwise (``torch.bitwise_left_shift``; wraps as the
    integer type does)."""
    return _bitwise(ic.SHL, a, b, "bitwise_left_shift")


def bitwise_right_shift(a: Any, b: Any) -> Tensor:
    """a >> b elementwise, arithmetic (sign-filling) for signed types
    (``torch.bitwise_right_shift``)."""
    return _bitwise(ic.SHR, a, b, "bitwise_right_shift")


def bitwise_not(x: Any) -> Tensor:
    """~x elementwise (``torch.bitwise_not``): -x - 1 for integers, not x
    for bools."""
    x = operand(x, "bitwise_not", ints=True)
    if x.dtype.kind == "f":
        raise TypeError(f"bitwise_not: takes integer or bool tensors, got {describe(x)} "
                        "(as PyTorch)")
    return _integer.unary(ic.INVERT, x, "bitwise_not")


def _truth(x: Any, op: str) -> Any:
    """``x`` as a bool tensor (non-zero is true), or a Python number as a bool."""
    if isinstance(x, (bool, int, float, np.generic)) and not isinstance(x, np.ndarray):
        return bool(x)
    t = operand(x, op, ints=True)
    return t if t.dtype == _BOOL else ne(t, 0)


def logical_and(a: Any, b: Any) -> Tensor:
    """Both non-zero, elementwise: a bool tensor (``torch.logical_and``)."""
    return _bitwise(ic.AND, _truth(a, "logical_and"), _truth(b, "logical_and"), "logical_and")


def logical_or(a: Any, b: Any) -> Tensor:
    """Either non-zero, elementwise: a bool tensor (``torch.logical_or``)."""
    return _bitwise(ic.OR, _truth(a, "logical_or"), _truth(b, "logical_or"), "logical_or")


def logical_xor(a: Any, b: Any) -> Tensor:
    """Exactly one non-zero, elementwise: a bool tensor (``torch.logical_xor``)."""
    return _bitwise(ic.XOR, _truth(a, "logical_xor"), _truth(b, "logical_xor"), "logical_xor")


def logical_not(x: Any) -> Tensor:
    """Zero, elementwise: a bool tensor (``torch.logical_not``)."""
    t = _truth(x, "logical_not")
    return _integer.unary(ic.NOT, t, "logical_not") if isinstance(t, Tensor) else not t

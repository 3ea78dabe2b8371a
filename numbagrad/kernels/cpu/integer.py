"""CPU kernels of integer and bool tensors: elementwise arithmetic, bitwise
ops, and the reductions along a last axis.

Integer tensors never carry a gradient, so these kernels have no backward.
Operands of ``int_binary`` are C-contiguous arrays of one rank R >= ``RANK``
broadcast where a dim is 1 (as ``compare``'s, ``kernels/cpu/masks.py``);
the result is cast to ``out``'s dtype, wrapping on overflow as PyTorch's
integer arithmetic does. ``//`` and ``%`` round toward -inf (Python's and
PyTorch's ``floor_divide``/``remainder``), ``FMOD`` and ``TRUNCDIV`` toward
zero (C's); a shift by a negative amount or by 64 or more is PyTorch's (0,
or -1 for a negative x shifted right). The op checks divisors and exponents before a launch, so the
formulas never divide by zero. The plain-Python formulas here are jitted by
``kernels/cuda/integer.py`` too.
"""
from __future__ import annotations

__all__ = ["int_binary", "int_reduce", "int_unary"]   # the kernels this module registers

import numpy as np
from numba import njit

from .masks import offset

(ADD, SUB, MUL, MAX, MIN, FLOORDIV, REMAINDER, FMOD, TRUNCDIV, POW, AND, OR, XOR, SHL,
 SHR) = range(15)
N_BINARY = 15
_ZERO = np.int64(0)
NEG, ABS, SIGN, INVERT, NOT = range(5)
N_UNARY = 5
SUM, PROD, RMAX, RMIN, ARGMAX, ARGMIN = range(6)
N_REDUCE = 6


def int_scalar(code, x, y):
    """x <op> y for integer binary ``code`` (y != 0 for the divisions, y >= 0
    for POW: the op checks), in int64 for every integer dtype: Numba widens
    uint8 to uint64, and uint64 next to an int64 literal to float64, whose
    wrapped results (0 - 1) came back as 0 once cast to uint8. int64
    results wrap as the store into ``out`` does. (Widened by adding an int64
    0, not by a cast: the CUDA simulator's cast gives a Python int, which
    does not wrap.)"""
    x = x + _ZERO
    y = y + _ZERO
    if y == -1 and code >= FLOORDIV and code <= TRUNCDIV:
        # INT64_MIN / -1 overflows (LLVM's sdiv is undefined there): the
        # quotient is -x, wrapped as PyTorch's, and the remainder 0
        return -x if code == FLOORDIV or code == TRUNCDIV else x - x
    if code == ADD:
        return x + y
    if code == SUB:
        return x - y
    if code == MUL:
        return x * y
    if code == MAX:
        return x if x >= y else y
    if code == MIN:
        return x if x <= y else y
    if code == FLOORDIV:
        return x // y
    if code == REMAINDER:
        return x % y
    if code == FMOD:
        r = x % y
        return r - y if r != 0 and (r < 0) != (x < 0) else r
    if code == TRUNCDIV:
        q = x // y
        return q + 1 if x % y != 0 and (x < 0) != (y < 0) else q
    if code == POW:
        r = x - x + 1     # 1, of x's type
        e = y
        while e > 0:
            if e & 1:
                r *= x
            e >>= 1
            if e > 0:     # (squared only when used: no overflow past the result's)
                x *= x
        return r
    if code == AND:
        return x & y
    if code == OR:
        return x | y
    if code == XOR:
        return x ^ y
    if code == SHL:     # a shift past the width (or negative) gives 0, as PyTorch's
        return x << y if 0 <= y < 64 else x - x
    if code == SHR:     # ... and the sign's fill
        return x >> y if 0 <= y < 64 else (x - x if x >= 0 else x - x - 1)
    raise ValueError("int_binary: unknown op code")


def int_unary_scalar(code, x):
    """<op> x for integer unary ``code`` (NOT: x == 0, the bool one)."""
    if code == NEG:
        return -x
    if code == ABS:
        return x if x >= 0 else -x
    if code == SIGN:
        return 1 if x > 0 else (-1 if x < 0 else 0)
    if code == INVERT:
        return ~x
    if code == NOT:
        return x == 0
    raise ValueError("int_unary: unknown op code")


def int_reduce_row(code, x, r):
    """The reduction ``code`` of row ``r`` of ``x`` (rows x n; n >= 1 for the
    extrema): SUM and PROD accumulate in int64, ARGMAX/ARGMIN give the first
    index of the extreme, as PyTorch."""
    n = x.shape[1]
    if code == SUM or code == PROD:
        acc = 0 if code == SUM else 1
        for j in range(n):
            acc = acc + x[r, j] if code == SUM else acc * x[r, j]
        return acc
    best = x[r, 0]
    at = 0
    for j in range(1, n):
        v = x[r, j]
        if (v > best) if (code == RMAX or code == ARGMAX) else (v < best):
            best = v
            at = j
    return best if code == RMAX or code == RMIN else at


_scalar = njit(int_scalar)
_unary_scalar = njit(int_unary_scalar)
_reduce_row = njit(int_reduce_row)
_offset = njit(offset)


@njit(cache=True)
def int_binary(code, a, b, out):
    """out = a <op> b, broadcast (see the module docstring)."""
    if code < 0 or code >= N_BINARY:
        raise ValueError("int_binary: unknown op code")
    o, av, bv = out.ravel(), a.ravel(), b.ravel()
    same_a = a.shape == out.shape
    same_b = b.shape == out.shape
    for k in range(o.size):
        o[k] = _scalar(code, av[k if same_a else _offset(k, out, a)],
                       bv[k if same_b else _offset(k, out, b)])


@njit(cache=True)
def int_unary(code, x, out):
    """out = <op> x, flat arrays of one size."""
    if code < 0 or code >= N_UNARY:
        raise ValueError("int_unary: unknown op code")
    o, xv = out.ravel(), x.ravel()
    for k in range(o.size):
        o[k] = _unary_scalar(code, xv[k])


@njit(cache=True)
def int_reduce(code, x, out):
    """out[r] = the reduction of row ``x[r]`` (see ``int_reduce_row``)."""
    if code < 0 or code >= N_REDUCE:
        raise ValueError("int_reduce: unknown op code")
    for r in range(x.shape[0]):
        out[r] = _reduce_row(code, x, r)

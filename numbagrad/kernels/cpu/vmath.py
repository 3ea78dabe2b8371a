"""Vectorisable float32 transcendentals for the CPU's elementwise loops.

Numba has no vector math library here (no SVML), so ``math.erf`` and
``math.exp`` in a loop are one libm call per element and block LLVM's
vectoriser: the exact GELU over a (768, 512) float32 block took 5.7 ms
forward and 7.7 ms backward, 30% of the GPT step (now 0.9 and 0.5 ms, one
thread; the backward reads Phi from the output). These are written with
arithmetic, masks and bit casts only, so the loops vectorise; they run
in float64 and are used for float32 arrays only, where their error (the
erfc approximation's 1.2e-7 relative, Numerical Recipes' ``erfcc``) is
below the result's rounding. float64 arrays keep libm's exact functions.
Their polynomials run on ``_fma`` (``llvm.fma``: one rounding, on every CPU,
a vector FMA where the CPU has one): the GELU over that block 1.16 -> 0.82
ms forward and its gradient 0.6 ms on this session's busier CPU, float32
results unchanged over 3 million inputs (exp_neg's float64 in 1 ulp).

``unary(code, x, p)`` and ``unary_grad(code, x, y, p)`` stand in for
``codes.unary``/``unary_grad`` in the loops: for a float32 ``x`` they pick
the fast form of the codes whose record asks for one (``fast32``: this
module's ``fast_<name>`` and ``fast_<name>_grad``), and otherwise are the
exact formulas. ``EXACT`` holds the CPU's compiled dispatchers over the
records (``codes.dispatchers``), which the other kernel modules use.
"""
from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic, overload

from .. import codes



@intrinsic
def _bits(typingctx, x):
    """The int64 whose bits are the float64 ``x``'s."""
    if x != types.float64:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(64))
    return types.int64(types.float64), codegen


@intrinsic
def _fma(typingctx, a, b, c):
    """a * b + c with one rounding (``llvm.fma``): a vector FMA where the CPU
    has one, the same bits everywhere (no ``fastmath`` contraction, which
    would also fuse the callers' own arithmetic)."""
    if not (a == b == c == types.float64):
        return None

    def codegen(context, builder, signature, args):
        f64 = ir.DoubleType()
        fma = builder.module.declare_intrinsic("llvm.fma", [f64], ir.FunctionType(
            f64, [f64, f64, f64]))
        return builder.call(fma, args)
    return types.float64(types.float64, types.float64, types.float64), codegen


@intrinsic
def _from_bits(typingctx, i):
    """The float64 whose bits are the int64 ``i``'s."""
    if i != types.int64:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())
    return types.float64(types.int64), codegen


_LOG2E = 1.4426950408889634
_LN2_HI = 0.6931471803691238         # ln 2's first 32 bits: n * _LN2_HI is exact
_LN2_LO = 1.9082149292705877e-10
_ROUND = 6755399441055744.0          # 1.5 * 2**52: adding it rounds to an integer ...
_ROUND_BITS = 0x4338000000000000     # ... which then sits in its low bits
_SQRT1_2 = 0.7071067811865476
_INV_SQRT_2PI = 0.3989422804014327
_GELU_EDGE = 16.0    # beyond it float32's GELU is x (x > 0) or -0 / 0 (x < 0)


@njit(error_model="numpy", inline="always")
def exp_neg(x):
    """e**x for x in [-700, 1]: 2**n * e**r with |r| <= ln(2) / 2 and a
    degree-7 Taylor polynomial (relative error below 1e-8)."""
    k = x * _LOG2E + _ROUND
    n = k - _ROUND
    r = _fma(-n, _LN2_LO, _fma(-n, _LN2_HI, x))
    p = _fma(r, _fma(r, _fma(r, _fma(r, _fma(r, _fma(r, _fma(r, 1 / 5040, 1 / 720), 1 / 120),
                                                1 / 24), 1 / 6), 0.5), 1.0), 1.0)
    return p * _from_bits((_bits(k) - _ROUND_BITS + 1023) << 52)


@njit(error_model="numpy", inline="always")
def _erfc_pos(z):
    """erfc(z) for 0 <= z <= 12, relative error below 1.2e-7 (Numerical
    Recipes' Chebyshev fit ``erfcc``)."""
    t = 1.0 / _fma(0.5, z, 1.0)
    p = _fma(t, _fma(t, 0.17087277, -0.82215223), 1.48851587)
    p = _fma(t, _fma(t, _fma(t, p, -1.13520398), 0.27886807), -0.18628806)
    p = _fma(t, _fma(t, _fma(t, _fma(t, p, 0.09678418), 0.37409196), 1.00002368), -1.26551223)
    return t * exp_neg(_fma(-z, z, p))


# The helpers are inlined into the kernels' loops (IR inlining, so LLVM sees
# one loop body to vectorise) and use no ternaries: selects are written as
# masks and 0/1 factors, which inline cleanly.
@njit(error_model="numpy", inline="always")
def _kept(v, keep):
    """v where ``keep``, else +0.0 (a bit mask: no branch, and nan-free)."""
    return _from_bits(_bits(v) & -np.int64(keep))


@njit(error_model="numpy", inline="always")
def _outside(x, inside, value):
    """``value`` where ``inside``, else GELU's limit: 1 for x > 0, else 0."""
    w = np.float64(inside)
    return w * value + (1.0 - w) * np.float64(x > 0)


@njit(error_model="numpy", inline="always")
def _gelu_cdf(x):
    """Phi(x) for GELU; outside [-16, 16] (and at nan) 1 for x > 0, else 0.
    It comes from erfc, so its left tail keeps its relative accuracy (1 +
    erf(x) would cancel)."""
    inside = abs(x) <= _GELU_EDGE                           # false at nan
    xc = _kept(x, inside)                                   # x inside, else 0: finite work
    half_tail = 0.5 * _erfc_pos(abs(xc) * _SQRT1_2)
    neg = np.float64(xc < 0)
    return _outside(x, inside, neg * half_tail + (1.0 - neg) * (1.0 - half_tail))


@njit(error_model="numpy", inline="always")
def gelu(x):
    """x * Phi(x); nan at nan and -inf, as PyTorch's."""
    return x * _gelu_cdf(x)


@njit(error_model="numpy", inline="always")
def gelu_grad(x, y):
    """Phi(x) + x * phi(x), Phi read from the output y = x * Phi(x) (one exp
    and one division: half the work of recomputing erfc); 0.5 where |x| <
    1e-30. nan at nan and +-inf, as PyTorch's."""
    inside = abs(x) <= _GELU_EDGE                           # false at nan
    xc = _kept(x, inside)
    ratio = inside & (abs(x) >= 1e-30)
    wr = np.float64(ratio)
    cdf = _kept(y, ratio) / (_kept(x, ratio) + (1.0 - wr)) + (1.0 - wr) * 0.5  # y / x, else 0.5
    pdf = exp_neg(-0.5 * xc * xc) * _INV_SQRT_2PI
    return _outside(x, inside, cdf) + x * (np.float64(inside) * pdf)


# The float32 fast forms the records ask for (``fast32``), by name:
# ``fast_<name>(x, p)`` and ``fast_<name>_grad(x, y, p)``.
@njit(error_model="numpy", inline="always")
def fast_gelu(x, p):
    return gelu(np.float64(x))


@njit(error_model="numpy", inline="always")
def fast_gelu_grad(x, y, p):
    return gelu_grad(np.float64(x), np.float64(y))


def _fast_forms() -> dict:
    forms = {}
    for code in sorted(codes.FAST32):
        name = codes.UNARY[code].name
        try:
            forms[code] = (globals()[f"fast_{name}"], globals()[f"fast_{name}_grad"])
        except KeyError:
            raise ImportError(f"the unary record {name!r} asks for a float32 fast form "
                              f"(fast32=True), but kernels/cpu/vmath.py has no fast_{name} "
                              f"and fast_{name}_grad") from None
    return forms


# The CPU's dispatchers over the records: libm's exact formulas, and the
# same with the fast forms (float32 arrays' unary and unary_grad).
EXACT = codes.dispatchers(njit, njit(inline="always"))
_FAST = codes.with_fast_forms(njit, EXACT, _fast_forms())
_exact_unary, _exact_unary_grad = EXACT["unary"], EXACT["unary_grad"]
_fast_unary, _fast_unary_grad = _FAST["unary"], _FAST["unary_grad"]


def unary(code, x, p):
    """``codes.unary``, with the fast forms for a float32 ``x``."""
    return _exact_unary(code, x, p)


def unary_grad(code, x, y, p):
    """``codes.unary_grad``, with the fast forms for a float32 ``x``."""
    return _exact_unary_grad(code, x, y, p)


@overload(unary, inline="always")
def _unary_impl(code, x, p):
    if x == types.float32:
        return lambda code, x, p: _fast_unary(code, x, p)
    return lambda code, x, p: _exact_unary(code, x, p)


@overload(unary_grad, inline="always")
def _unary_grad_impl(code, x, y, p):
    if x == types.float32:
        return lambda code, x, y, p: _fast_unary_grad(code, x, y, p)
    return lambda code, x, y, p: _exact_unary_grad(code, x, y, p)


def exp_shifted(row, top):
    """row = exp(row - top) elementwise for a 1-D row, where row - top <= 0
    (up to top's rounding), -inf (0) or nan: a softmax's exponentials. A
    float32 row's through ``exp_neg`` (its loop vectorises), others' libm's."""
    for j in range(row.size):
        row[j] = math.exp(row[j] - top)


@overload(exp_shifted, inline="always")
def _exp_shifted_impl(row, top):
    if row.dtype == types.float32:
        def fast(row, top):
            for j in range(row.size):
                row[j] = exp_neg(max(np.float64(row[j] - top), -700.0))
        return fast

    def exact(row, top):
        for j in range(row.size):
            row[j] = math.exp(row[j] - top)
    return exact


@njit(error_model="numpy", inline="always")
def sigmoid64(x):
    """1 / (1 + e**-x) of a float64 through ``exp_neg``, without branches so a
    loop of it vectorises; for float32 results (its error is below their
    rounding). nan stays nan."""
    a = abs(x)
    e = exp_neg(-(a if a < 700.0 else 700.0))
    r = 1.0 / (1.0 + e)
    return r if x >= 0 else (e * r if x < 0 else x)


@njit(error_model="numpy", inline="always")
def tanh64(x):
    """tanh of a float64 through ``exp_neg`` ((1 - e) / (1 + e), e = e**-2|x|;
    its Taylor series below |x| = 1/8, where that difference cancels),
    without branches so a loop of it vectorises; for float32 results."""
    a = abs(x)
    e = exp_neg(-2.0 * (a if a < 350.0 else 350.0))
    a2 = a * a
    small = a * (1.0 + a2 * (-1 / 3 + a2 * (2 / 15 + a2 * (-17 / 315 + a2 * (62 / 2835)))))
    t = small if a < 0.125 else (1.0 - e) / (1.0 + e)
    return t if x >= 0 else (-t if x < 0 else x)

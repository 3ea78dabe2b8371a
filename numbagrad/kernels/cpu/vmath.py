"""Vectorisable float32 transcendentals for the CPU's elementwise loops.

Numba has no vector math library here (no SVML), so ``math.erf`` and
``math.exp`` in a loop are one libm call per element and block LLVM's
vectoriser: the exact GELU over a (768, 512) float32 block took 5.7 ms
forward and 7.7 ms backward, 30% of the GPT step. These are written with
arithmetic, masks and bit casts only, so the loops vectorise, and are used
for float32 arrays only; float64 arrays keep libm's exact functions.
Their polynomials run on ``_fma`` (``llvm.fma``: one rounding, on every CPU,
a vector FMA where the CPU has one), so their bits do not depend on the
CPU or its vector width.

The GELU and its gradient run in float32 lanes (twice float64's per vector,
and a cheaper division): over that block 0.82 -> 0.40 ms forward and 0.57 ->
0.26 ms backward on one thread, 0.41 -> 0.20 and 0.30 -> 0.13 ms on two.
Their error: within 5e-7 relative of the float64 formula (the left tail
too; 6.3 float32 ulps at worst, where float64 lanes gave 2.2), the gradient
within 2.5e-7 absolute. PyTorch's own float32 GELU (``1 + erf``) is 2e-4 off
on (-3, 0), 17% at -5 and 0 below -5.7, its gradient up to 2.8e-7 off.
Numerical Recipes' ``erfcc`` (1.2e-7 relative) gives erfc; the exponent
-x*x/2 is carried as an exact pair, since rounding it would cost 8e-6
relative at x = -16.
``exp_neg`` and the activations built on it (sigmoid, tanh, softmax's
exponentials) run in float64 lanes.

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
    if not (a == b == c and a in (types.float32, types.float64)):
        return None

    def codegen(context, builder, signature, args):
        f = ir.FloatType() if a == types.float32 else ir.DoubleType()
        fma = builder.module.declare_intrinsic("llvm.fma", [f], ir.FunctionType(f, [f, f, f]))
        return builder.call(fma, args)
    return a(a, a, a), codegen


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


_EXP_TAYLOR = (1 / 5040, 1 / 720, 1 / 120, 1 / 24, 1 / 6, 0.5, 1.0, 1.0)


@njit(error_model="numpy", inline="always")
def _exp_taylor(r, c):
    """e**r for |r| <= ln(2) / 2: the degree-7 Taylor polynomial whose
    coefficients ``c`` are ``_EXP_TAYLOR`` in r's float type, by Horner on _fma."""
    return _fma(r, _fma(r, _fma(r, _fma(r, _fma(r, _fma(r, _fma(r, c[0], c[1]), c[2]), c[3]),
                                        c[4]), c[5]), c[6]), c[7])


@njit(error_model="numpy", inline="always")
def exp_neg(x):
    """e**x for x in [-700, 1]: 2**n * e**r with |r| <= ln(2) / 2 and a
    degree-7 Taylor polynomial (relative error below 1e-8)."""
    k = x * _LOG2E + _ROUND
    n = k - _ROUND
    r = _fma(-n, _LN2_LO, _fma(-n, _LN2_HI, x))
    return _exp_taylor(r, _EXP_TAYLOR) * _from_bits((_bits(k) - _ROUND_BITS + 1023) << 52)


# float32 lanes: twice float64's per vector, and a cheaper division.
@intrinsic
def _bits32(typingctx, x):
    """The int32 whose bits are the float32 ``x``'s, widened to int64
    (Numba's integer arithmetic is int64's)."""
    if x != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.sext(builder.bitcast(args[0], ir.IntType(32)), ir.IntType(64))
    return types.int64(types.float32), codegen


@intrinsic
def _from_bits32(typingctx, i):
    """The float32 whose bits are the low 32 of the int64 ``i``."""
    if i != types.int64:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.trunc(args[0], ir.IntType(32)), ir.FloatType())
    return types.float32(types.int64), codegen


_F = np.float32     # float32 constants: a Python float would widen the lanes to float64
_LOG2E_F = _F(_LOG2E)
_LN2_HI_F = _F(0.693145751953125)       # ln 2's first 16 bits: n * _LN2_HI_F is exact
_LN2_LO_F = _F(1.4286068203094172e-06)
_ROUND_F = _F(12582912.0)               # 1.5 * 2**23, float32's _ROUND
_ROUND_BITS_F = 0x4B400000
_EXP_TAYLOR_F = tuple(_F(c) for c in _EXP_TAYLOR)
_ERFC_F = tuple(_F(c) for c in (0.17087277, -0.82215223, 1.48851587, -1.13520398, 0.27886807,
                                -0.18628806, 0.09678418, 0.37409196, 1.00002368, -1.26551223))
_ZERO_F, _HALF_F, _ONE_F = _F(0.0), _F(0.5), _F(1.0)
_SQRT1_2_F = _F(0.7071067811865476)
_INV_SQRT_2PI_F = _F(0.3989422804014327)
_GELU_EDGE_F = _F(16.0)  # beyond it float32's GELU is x (x > 0) or -0 / 0 (x < 0)
_TINY_F = _F(1e-30)


@njit(error_model="numpy", inline="always")
def _exp_parts(a, b):
    """e**(a + b) of float32s as (m, n), e**(a + b) = m * 2**n with m in
    [0.7, 1.5]: ``a`` large and exact (-x*x/2), ``b`` small, so a - n ln 2
    loses nothing before b joins it (a sum a + b rounded first would cost
    up to 2**-24 * |a| of relative accuracy, 8e-6 at x = -16). n <= 2."""
    k = _fma(a + b, _LOG2E_F, _ROUND_F)
    n = k - _ROUND_F
    r = _fma(-n, _LN2_LO_F, _fma(-n, _LN2_HI_F, a) + b)
    return _exp_taylor(r, _EXP_TAYLOR_F), _bits32(k) - _ROUND_BITS_F


@njit(error_model="numpy", inline="always")
def _scaled(v, n):
    """v * 2**n for n in [-252, 2] with one rounding (two normal factors,
    so the product only rounds where it leaves float32's normal range)."""
    n1 = n >> 1
    return v * _from_bits32((n1 + 127) << 23) * _from_bits32((n - n1 + 127) << 23)


# The helpers are inlined into the kernels' loops (IR inlining, so LLVM sees
# one loop body to vectorise) and use no ternaries: selects are written as
# bit masks, which inline cleanly.
@njit(error_model="numpy", inline="always")
def _select(keep, a, b):
    """``a`` where ``keep``, else ``b``, bit for bit."""
    k = np.int64(keep)
    return _from_bits32((_bits32(a) & -k) | (_bits32(b) & (k - 1)))


@njit(error_model="numpy", inline="always")
def _x_squared(x):
    """-x*x/2 as hi + lo, exactly (x*x rounded, and its rounding by FMA)."""
    hi = x * x
    return -_HALF_F * hi, -_HALF_F * _fma(x, x, -hi)


@njit(error_model="numpy", inline="always")
def gelu(x):
    """x * Phi(x) of a float32 in float32: x * erfc(|x|/sqrt2) / 2 for x < 0,
    x minus that for x >= 0 (Numerical Recipes' ``erfcc``, so the left tail
    keeps its relative accuracy where 1 + erf would cancel). -0 below -16, x
    above 16 (and -0 at -0); nan at nan and -inf, as PyTorch's."""
    inside = abs(x) <= _GELU_EDGE_F                         # false at nan
    xc = _select(inside, x, _ZERO_F)                        # x inside, else 0: finite work
    e = _ERFC_F
    t = _ONE_F / _fma(_HALF_F, abs(xc) * _SQRT1_2_F, _ONE_F)
    p = _fma(t, _fma(t, e[0], e[1]), e[2])
    p = _fma(t, _fma(t, _fma(t, p, e[3]), e[4]), e[5])
    p = _fma(t, _fma(t, _fma(t, _fma(t, p, e[6]), e[7]), e[8]), e[9])
    a, b = _x_squared(xc)
    m, n = _exp_parts(a, p + b)
    tail = _scaled(xc * _HALF_F * t * m, n)                 # x * erfc(|x|/sqrt2) / 2
    return _select(inside, _select(xc > _ZERO_F, xc - tail, tail), x * _F(x > _ZERO_F))


@njit(error_model="numpy", inline="always")
def gelu_grad(x, y):
    """Phi(x) + x * phi(x) of float32s, Phi read from the output y = x * Phi(x)
    (one exp and one division: half the work of recomputing erfc); 0.5 where
    |x| < 1e-30; 1 above 16, -0 below -16, nan at nan and +-inf, as
    PyTorch's."""
    inside = abs(x) <= _GELU_EDGE_F                         # false at nan
    xc = _select(inside, x, _ZERO_F)
    ratio = inside & (abs(x) >= _TINY_F)
    cdf = _select(ratio, _select(ratio, y, _ZERO_F) / _select(ratio, x, _ONE_F), _HALF_F)  # y / x
    a, b = _x_squared(xc)
    m, n = _exp_parts(a, b)
    edge = x * _ZERO_F                                      # -0 below -16, nan at +-inf
    return _select(inside, cdf + _scaled(xc * _INV_SQRT_2PI_F * m, n),
                   _select(x > _ZERO_F, edge + _ONE_F, edge))


# The float32 fast forms the records ask for (``fast32``), by name:
# ``fast_<name>(x, p)`` and ``fast_<name>_grad(x, y, p)``.
@njit(error_model="numpy", inline="always")
def fast_gelu(x, p):
    return gelu(x)


@njit(error_model="numpy", inline="always")
def fast_gelu_grad(x, y, p):
    return gelu_grad(x, y)


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

"""Per-element math shared by every device: plain Python, compiled per device.

One record per elementwise code (``UNARY``, ``BINARY``) holds its formula,
its derivative and what the rest of the package needs to know of it; the
code's constant, ``N_UNARY``, the CPU's cheap set, linear's activations and
epilogue, and each device's dispatch over the codes (``dispatchers``) are
derived from the records. ``kernels/cpu`` compiles them with ``njit`` and
``kernels/cuda`` with ``cuda.jit(device=True)``, so an op's formula and its
derivative are written once. ``code`` picks the op (frozen into the compiled
kernels), ``p`` is its scalar parameter (a slope, an exponent, a constant).
The bodies of the loops built on them (a broadcast gradient's sum, a softmax
lane, an Adam element) are shared the same way, in ``elements``.

Gradients that do not depend on ``x`` are constants, never forms like
``x * 0 + 1``: those are nan at x = +-inf and nan, where PyTorch's gradient
is the constant (d(x + c)/dx = 1 at x = inf). Numba types a dispatcher's
result as float64 (its branches' common type), so finite inputs give the
same bits either way.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from . import dispatch


_SOFTPLUS_THRESHOLD = 20.0
_SQRT1_2 = 0.7071067811865476          # 1 / sqrt(2)
_INV_SQRT_2PI = 0.3989422804014327     # 1 / sqrt(2 pi)
_SQRT_2_PI = 0.7978845608028654        # sqrt(2 / pi)
_KAPPA = 0.044715
_TWO_SQRT_PI = 1.1283791670955126      # 2 / sqrt(pi)
_BCE_EPS = 9.999999960041972e-13       # PyTorch's EPSILON, 1e-12 as a float32
_LN2 = 0.6931471805599453
_INV_LN2 = 1.4426950408889634          # 1 / ln 2
_INV_LN10 = 0.4342944819032518         # 1 / ln 10
_TWO52 = 4503599627370496.0            # 2**52: every float beyond is an integer
_SELU_ALPHA = 1.6732632423543772
_SELU_SCALE = 1.0507009873554805
_ONE_SIXTH = 0.16666666666666666
_QUICK_GELU = 1.702


# ------------------------------------------------------------ unary formulas
# One forward f(x, p) and one derivative f'(x, y, p) per code (y = f(x, p),
# the output, which some derivatives read instead of recomputing). They
# stay plain arithmetic and ``math`` calls: each device compiles them.
def _one(x, y, p):
    return 1.0


def _minus_one(x, y, p):
    return -1.0


def _ident(x, p):
    return x


def _neg(x, p):
    return -x


def _relu(x, p):
    return x if not x <= 0 else 0.0   # nan stays nan, -inf gives 0 (PyTorch)


def _relu_grad(x, y, p):
    return 0.0 if x <= 0 else 1.0


def _leaky_relu(x, p):
    return x if x > 0 else x * p


def _leaky_relu_grad(x, y, p):
    return 1.0 if x > 0 else p


def _tanh(x, p):
    return math.tanh(x)


def _tanh_grad(x, y, p):
    return 1 - y * y


def _sigmoid(x, p):
    if x >= 0:
        return 1 / (1 + math.exp(-x))
    e = math.exp(x)
    return e / (1 + e)


def _sigmoid_grad(x, y, p):
    return y * (1 - y)


def _exp(x, p):
    return math.exp(x)


def _exp_grad(x, y, p):
    return y


def _log(x, p):
    return math.log(x) if x > 0 else (-math.inf if x == 0 else math.nan)


def _log_grad(x, y, p):
    return 1 / x


def _sqrt(x, p):
    return math.sqrt(x) if x >= 0 else math.nan


def _sqrt_grad(x, y, p):
    return 0.5 / y


def _pow(x, p):
    return x ** p


def _pow_grad(x, y, p):
    return 0.0 if p == 0 else p * x ** (p - 1)


def _add_s(x, p):
    return x + p


def _mul_s(x, p):
    return x * p


def _mul_s_grad(x, y, p):
    return p


def _rsub_s(x, p):
    return p - x


def _div_s(x, p):
    return x / p


def _div_s_grad(x, y, p):
    return 1 / p


def _rdiv_s(x, p):
    return p / x


def _rdiv_s_grad(x, y, p):
    return -p / (x * x)


def _gelu(x, p):     # PyTorch's order of operations
    return x * 0.5 * (1 + math.erf(x * _SQRT1_2))


def _gelu_grad(x, y, p):
    return 0.5 * (1 + math.erf(x * _SQRT1_2)) + x * (math.exp(-0.5 * x * x) * _INV_SQRT_2PI)


def _gelu_tanh(x, p):
    return 0.5 * x * (1 + math.tanh(_SQRT_2_PI * (x + _KAPPA * x * x * x)))


def _gelu_tanh_grad(x, y, p):
    t = math.tanh(_SQRT_2_PI * (x + _KAPPA * x * x * x))
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * (_SQRT_2_PI * (1 + 3 * _KAPPA * x * x))


def _silu(x, p):     # PyTorch's x / (1 + exp(-x)), without overflowing exp for x < 0
    if x >= 0:
        return x / (1 + math.exp(-x))
    e = math.exp(x)
    return x * e / (1 + e)


def _silu_grad(x, y, p):
    if x >= 0:
        s = 1 / (1 + math.exp(-x))
    else:
        e = math.exp(x)
        s = e / (1 + e)
    return s * (1 + x * (1 - s))


def _softplus(x, p):   # p: the threshold (beta 1)
    return x if x > p else math.log1p(math.exp(x))


def _softplus_grad(x, y, p):
    if x > p:
        return 1.0
    z = math.exp(x)
    return z / (z + 1)


def _abs(x, p):
    return abs(x)


def _abs_grad(x, y, p):   # 0 at 0 (PyTorch's sign)
    return 1.0 if x > 0 else (-1.0 if x < 0 else 0.0)


def _clamp_min(x, p):     # nan stays nan; a nan bound gives nan
    return p if x < p or p != p else x


def _clamp_min_grad(x, y, p):
    return 1.0 if x >= p else 0.0


def _clamp_max(x, p):
    return p if x > p or p != p else x


def _clamp_max_grad(x, y, p):
    return 1.0 if x <= p else 0.0


def _softplus_beta(x, p):   # p: beta (threshold 20, PyTorch's default)
    return x if x * p > _SOFTPLUS_THRESHOLD else math.log1p(math.exp(x * p)) / p


def _softplus_beta_grad(x, y, p):
    if x * p > _SOFTPLUS_THRESHOLD:
        return 1.0
    z = math.exp(x * p)
    return z / (z + 1)


def _rpow_s(x, p):   # p ** x; 0 ** x spelled out: the simulator's NumPy warns at 0 ** -1
    if p == 0 and x == x:
        return 0.0 if x > 0 else (1.0 if x == 0 else math.inf)
    return p ** x


def _rpow_s_grad(x, y, p):   # y log(p); 0 where p == 0 and x >= 0, as PyTorch
    if p == 0:
        return 0.0 if x >= 0 else y * -math.inf   # inf, or nan at nan
    return y * math.log(p) if p > 0 else math.nan


def _erf(x, p):
    return math.erf(x)


def _erf_grad(x, y, p):    # 2 / sqrt(pi) exp(-x^2): 0 at +-inf, as PyTorch's
    return _TWO_SQRT_PI * math.exp(-x * x)


def _zero(x, y, p):
    return 0.0


# --- math functions (issue 30). Each guards its domain as PyTorch answers
# it (nan outside, +-inf at a pole): Python's math raises there, and the
# CUDA simulator and the plain-Python dispatchers run these as Python.
def _sin(x, p):
    return math.sin(x) if x - x == 0 else math.nan    # x - x: 0 for finite x only


def _sin_grad(x, y, p):
    return math.cos(x) if x - x == 0 else math.nan


def _cos(x, p):
    return math.cos(x) if x - x == 0 else math.nan


def _cos_grad(x, y, p):
    return -math.sin(x) if x - x == 0 else math.nan


def _tan(x, p):
    return math.tan(x) if x - x == 0 else math.nan


def _tan_grad(x, y, p):    # PyTorch's 1 + tan(x)^2
    return 1 + y * y


def _asin(x, p):
    return math.asin(x) if -1 <= x <= 1 else math.nan


def _asin_grad(x, y, p):   # 1 / sqrt(1 - x^2): inf at +-1, nan beyond
    d = 1 - x * x
    return 1 / math.sqrt(d) if d > 0 else (math.inf if d == 0 else math.nan)


def _acos(x, p):
    return math.acos(x) if -1 <= x <= 1 else math.nan


def _acos_grad(x, y, p):
    d = 1 - x * x
    return -1 / math.sqrt(d) if d > 0 else (-math.inf if d == 0 else math.nan)


def _atan(x, p):
    return math.atan(x)


def _atan_grad(x, y, p):
    return 1 / (1 + x * x)


def _sinh(x, p):
    return math.sinh(x)


def _sinh_grad(x, y, p):
    return math.cosh(x)


def _cosh(x, p):
    return math.cosh(x)


def _cosh_grad(x, y, p):
    return math.sinh(x)


def _asinh(x, p):
    return math.asinh(x)


def _asinh_grad(x, y, p):   # PyTorch's (x^2 + 1)^-1/2: 0 at +-inf
    return 1 / math.sqrt(x * x + 1)


def _acosh(x, p):
    return math.acosh(x) if x >= 1 else math.nan


def _acosh_grad(x, y, p):   # PyTorch's (x^2 - 1)^-1/2, also for x <= -1
    d = x * x - 1
    return 1 / math.sqrt(d) if d > 0 else (math.inf if d == 0 else math.nan)


def _atanh(x, p):
    if -1 < x < 1:
        return math.atanh(x)
    return math.copysign(math.inf, x) if x == 1 or x == -1 else math.nan


def _atanh_grad(x, y, p):   # PyTorch's 1 / (1 - x^2), also beyond +-1
    d = 1 - x * x
    return 1 / d if d != 0 else math.inf


def _erfc(x, p):
    return math.erfc(x)


def _erfc_grad(x, y, p):
    return -_TWO_SQRT_PI * math.exp(-x * x)


def _exp2(x, p):
    return 2.0 ** x if not x >= 1025 else math.inf   # (Python's ** raises past the range)


def _exp2_grad(x, y, p):
    return y * _LN2


def _log2(x, p):
    return math.log2(x) if x > 0 else (-math.inf if x == 0 else math.nan)


def _log2_grad(x, y, p):
    return _INV_LN2 / x


def _log10(x, p):
    return math.log10(x) if x > 0 else (-math.inf if x == 0 else math.nan)


def _log10_grad(x, y, p):
    return _INV_LN10 / x


def _log1p(x, p):
    return math.log1p(x) if x > -1 else (-math.inf if x == -1 else math.nan)


def _log1p_grad(x, y, p):
    return 1 / (1 + x)


def _expm1(x, p):
    return math.expm1(x)


def _expm1_grad(x, y, p):   # PyTorch's y + 1
    return y + 1


def _rsqrt(x, p):
    return 1 / math.sqrt(x) if x > 0 else (math.copysign(math.inf, x) if x == 0 else math.nan)


def _rsqrt_grad(x, y, p):   # PyTorch's -y^3 / 2
    return -0.5 * y * y * y


def _reciprocal(x, p):
    return 1 / x if x != 0 else math.copysign(math.inf, x)


def _reciprocal_grad(x, y, p):   # PyTorch's -y^2
    return -y * y


def _sign(x, p):     # 0 at 0 and at nan, as torch.sign (NumPy: nan)
    return 1.0 if x > 0 else (-1.0 if x < 0 else 0.0)


# Rounding: anything of magnitude 2**52 and beyond (inf, nan too) is an
# integer already; a zero result keeps x's sign (ceil(-0.5) = -0.0).
def _floor(x, p):
    if not abs(x) < _TWO52:
        return x
    f = float(math.floor(x))
    return f if f != 0 else math.copysign(0.0, x)


def _ceil(x, p):
    if not abs(x) < _TWO52:
        return x
    f = float(math.ceil(x))
    return f if f != 0 else math.copysign(0.0, x)


def _trunc(x, p):
    if not abs(x) < _TWO52:
        return x
    f = float(math.floor(x) if x >= 0 else math.ceil(x))   # (NumPy's float32: no __trunc__)
    return f if f != 0 else math.copysign(0.0, x)


def _round(x, p):    # half to even, as torch.round and np.round
    if not abs(x) < _TWO52:
        return x
    f = float(math.floor(x))
    d = x - f
    if d > 0.5 or (d == 0.5 and f * 0.5 != math.floor(f * 0.5)):   # f odd
        f += 1
    return f if f != 0 else math.copysign(0.0, x)


# --- activations (issue 30): PyTorch's formulas and its gradients at the kinks
# (PyTorch tests x <= 0 for the negative side: nan takes the positive one)
def _elu(x, p):     # p: alpha
    return p * math.expm1(x) if x <= 0 else x


def _elu_grad(x, y, p):
    return p * math.exp(x) if x <= 0 else 1.0


def _selu(x, p):
    return _SELU_SCALE * (_SELU_ALPHA * math.expm1(x) if x <= 0 else x)


def _selu_grad(x, y, p):
    return _SELU_SCALE * _SELU_ALPHA * math.exp(x) if x <= 0 else _SELU_SCALE


def _celu(x, p):    # p: alpha
    return p * math.expm1(x / p) if x <= 0 else x


def _celu_grad(x, y, p):
    return math.exp(x / p) if x <= 0 else 1.0


def _above_grad(x, y, p):    # hardtanh's lower bound: the gradient stops at it
    return 0.0 if x <= p else 1.0     # (nan passes it, as PyTorch's)


def _below_grad(x, y, p):    # ... and at its upper one
    return 0.0 if x >= p else 1.0


def _hardsigmoid(x, p):   # PyTorch's min(max(x + 3, 0), 6) / 6
    r = x + 3.0
    return (0.0 if r < 0 else (6.0 if r > 6 else r)) / 6.0


def _hardsigmoid_grad(x, y, p):
    return _ONE_SIXTH if -3 < x < 3 else 0.0


def _hardswish(x, p):     # PyTorch's x * min(max(x + 3, 0), 6) / 6
    r = x + 3.0
    return x * (0.0 if r < 0 else (6.0 if r > 6 else r)) / 6.0


def _hardswish_grad(x, y, p):   # PyTorch's: 0 up to -3 (included), 1 from 3
    if x <= -3:
        return 0.0
    return x / 3.0 + 0.5 if x < 3 else 1.0


def _mish(x, p):    # x tanh(softplus(x)); tanh(softplus(x)) is 1.0 from x = 20
    return x * math.tanh(math.log1p(math.exp(x))) if x <= 20 else x


def _mish_grad(x, y, p):
    t = math.tanh(math.log1p(math.exp(x))) if x <= 20 else 1.0
    s = 1 / (1 + math.exp(-x)) if x > -700 else 0.0
    return t + x * s * (1 - t * t)


def _softsign(x, p):
    return x / (1 + abs(x))


def _softsign_grad(x, y, p):   # as PyTorch's autograd of x / (1 + |x|): nan at +-inf
    b = 1 + abs(x)
    s = 1.0 if x > 0 else (-1.0 if x < 0 else 0.0)
    return 1 / b + s * (-x / (b * b))


def _logsigmoid(x, p):   # min(x, 0) - log1p(exp(-|x|)), PyTorch's stable form
    return (x if x < 0 else 0.0) - math.log1p(math.exp(-abs(x)))


def _logsigmoid_grad(x, y, p):
    z = math.exp(-abs(x))
    return 1 - z / (1 + z) if x < 0 else z / (1 + z)


def _quick_gelu(x, p):   # x sigmoid(1.702 x) (CLIP's GELU approximation)
    z = _QUICK_GELU * x
    if z >= 0:
        return x / (1 + math.exp(-z))
    e = math.exp(z)
    return x * e / (1 + e)


def _quick_gelu_grad(x, y, p):
    z = _QUICK_GELU * x
    if z >= 0:
        s = 1 / (1 + math.exp(-z))
    else:
        e = math.exp(z)
        s = e / (1 + e)
    return s + x * _QUICK_GELU * s * (1 - s)



@dataclass(frozen=True)
class UnaryCode:
    """One unary code: everything the package knows of it, in one place.

    ``name``: the op's name (``linear``'s ``activation=`` for a fused one;
    ``NAME.upper()`` is the code's constant here). ``forward(x, p)`` and
    ``grad(x, y, p)``: its formula and derivative (y the output). ``cheap``:
    as cheap as a copy per element (no libm call, no polynomial), so the
    CPU threads it only from ``MT_MIN_MEMORY`` elements (memory-bound).
    ``grad_from_output``: ``grad(y, y, p)`` is the derivative, the output
    read in place of the input (relu, tanh, sigmoid, ...): what the gradient
    needs is y alone. ``fast32``: float32 arrays use a vectorisable form on
    the CPU, ``fast_<name>(x, p)`` and ``fast_<name>_grad(x, y, p)`` of
    ``kernels/cpu/vmath.py``. ``fuse``: ``linear(..., activation=name)``
    applies it, in the GEMM's epilogue when its gradient comes from the
    output, else (the GEMM writes the pre-activation, which the backward
    needs) in one unary pass after. ``own_loop``: the CPU compiles a loop
    specialised to this code (the code folded, the loop vectorised), which
    costs every elementwise kernel seconds of compile time per dtype; False
    runs it in the one loop the other such codes share, which picks the
    formula per element (a predictable branch: right for libm-bound or
    rarely hot codes, where vectorising gains little).
    """

    name: str
    forward: Callable
    grad: Callable
    cheap: bool = False
    grad_from_output: bool = False
    fast32: bool = False
    fuse: bool = False
    own_loop: bool = True


# Unary codes, y = f(x, p): one record each, the code its position. Adding a
# code is its record here (and its formulas above) plus the op's row in
# ``ops/table.py``: everything else follows (docs/adding_an_op.md).
UNARY = (
    UnaryCode("ident", _ident, _one, cheap=True, grad_from_output=True),
    UnaryCode("neg", _neg, _minus_one, cheap=True),
    UnaryCode("relu", _relu, _relu_grad, cheap=True, grad_from_output=True, fuse=True),
    UnaryCode("leaky_relu", _leaky_relu, _leaky_relu_grad, cheap=True,   # p >= 0
              grad_from_output=True, fuse=True),
    UnaryCode("tanh", _tanh, _tanh_grad, grad_from_output=True, fuse=True),
    UnaryCode("sigmoid", _sigmoid, _sigmoid_grad, grad_from_output=True, fuse=True),
    UnaryCode("exp", _exp, _exp_grad),
    UnaryCode("log", _log, _log_grad),
    UnaryCode("sqrt", _sqrt, _sqrt_grad),
    UnaryCode("pow", _pow, _pow_grad),
    UnaryCode("add_s", _add_s, _one, cheap=True),
    UnaryCode("mul_s", _mul_s, _mul_s_grad, cheap=True),
    UnaryCode("rsub_s", _rsub_s, _minus_one, cheap=True),
    UnaryCode("div_s", _div_s, _div_s_grad, cheap=True),
    UnaryCode("rdiv_s", _rdiv_s, _rdiv_s_grad, cheap=True),
    UnaryCode("gelu", _gelu, _gelu_grad, fast32=True, fuse=True),
    UnaryCode("gelu_tanh", _gelu_tanh, _gelu_tanh_grad),
    UnaryCode("silu", _silu, _silu_grad, fuse=True),
    UnaryCode("softplus", _softplus, _softplus_grad),
    UnaryCode("abs", _abs, _abs_grad, cheap=True),
    UnaryCode("clamp_min", _clamp_min, _clamp_min_grad, cheap=True),
    UnaryCode("clamp_max", _clamp_max, _clamp_max_grad, cheap=True),
    UnaryCode("softplus_beta", _softplus_beta, _softplus_beta_grad),
    UnaryCode("rpow_s", _rpow_s, _rpow_s_grad),     # p ** x: a Python number raised to a tensor
    UnaryCode("erf", _erf, _erf_grad),
    # issue 30: math functions and activations, in the shared loop (own_loop=False)
    UnaryCode("sin", _sin, _sin_grad, own_loop=False),
    UnaryCode("cos", _cos, _cos_grad, own_loop=False),
    UnaryCode("tan", _tan, _tan_grad, own_loop=False),
    UnaryCode("asin", _asin, _asin_grad, own_loop=False),
    UnaryCode("acos", _acos, _acos_grad, own_loop=False),
    UnaryCode("atan", _atan, _atan_grad, own_loop=False),
    UnaryCode("sinh", _sinh, _sinh_grad, own_loop=False),
    UnaryCode("cosh", _cosh, _cosh_grad, own_loop=False),
    UnaryCode("asinh", _asinh, _asinh_grad, own_loop=False),
    UnaryCode("acosh", _acosh, _acosh_grad, own_loop=False),
    UnaryCode("atanh", _atanh, _atanh_grad, own_loop=False),
    UnaryCode("erfc", _erfc, _erfc_grad, own_loop=False),
    UnaryCode("exp2", _exp2, _exp2_grad, own_loop=False),
    UnaryCode("log2", _log2, _log2_grad, own_loop=False),
    UnaryCode("log10", _log10, _log10_grad, own_loop=False),
    UnaryCode("log1p", _log1p, _log1p_grad, own_loop=False),
    UnaryCode("expm1", _expm1, _expm1_grad, own_loop=False),
    UnaryCode("rsqrt", _rsqrt, _rsqrt_grad, own_loop=False),
    UnaryCode("reciprocal", _reciprocal, _reciprocal_grad, own_loop=False),
    UnaryCode("sign", _sign, _zero, cheap=True, own_loop=False),
    UnaryCode("floor", _floor, _zero, cheap=True, own_loop=False),
    UnaryCode("ceil", _ceil, _zero, cheap=True, own_loop=False),
    UnaryCode("trunc", _trunc, _zero, cheap=True, own_loop=False),
    UnaryCode("round", _round, _zero, cheap=True, own_loop=False),
    UnaryCode("elu", _elu, _elu_grad, own_loop=False),
    UnaryCode("selu", _selu, _selu_grad, own_loop=False),
    UnaryCode("celu", _celu, _celu_grad, own_loop=False),
    UnaryCode("hardtanh_min", _clamp_min, _above_grad, cheap=True, own_loop=False),
    UnaryCode("hardtanh_max", _clamp_max, _below_grad, cheap=True, own_loop=False),
    UnaryCode("hardsigmoid", _hardsigmoid, _hardsigmoid_grad, cheap=True, own_loop=False),
    UnaryCode("hardswish", _hardswish, _hardswish_grad, cheap=True, own_loop=False),
    UnaryCode("mish", _mish, _mish_grad, own_loop=False),
    UnaryCode("softsign", _softsign, _softsign_grad, own_loop=False),
    UnaryCode("logsigmoid", _logsigmoid, _logsigmoid_grad, own_loop=False),
    UnaryCode("quick_gelu", _quick_gelu, _quick_gelu_grad, own_loop=False),
    # (a new record goes here, at the end: a record's code is its position)
)


# ----------------------------------------------------------- binary formulas
def _add(a, b):
    return a + b


def _sub(a, b):
    return a - b


def _mul(a, b):
    return a * b


def _div(a, b):
    return a / b


def _max(a, b):      # nan wins, as torch.maximum
    return a if a > b or a != a else b


def _min(a, b):
    return a if a < b or a != a else b


def _d_one(a, b):
    return 1.0


def _d_minus_one(a, b):
    return -1.0


def _d_mul_a(a, b):
    return b


def _d_mul_b(a, b):
    return a


def _d_div_a(a, b):
    return 1 / b


def _d_div_b(a, b):
    return -a / (b * b)


# maximum/minimum: half each at a tie, as PyTorch
def _d_max_a(a, b):
    return 0.5 if a == b else (0.0 if a < b else 1.0)


def _d_max_b(a, b):
    return 0.5 if a == b else (0.0 if a > b else 1.0)


# --- issue 30's binary functions. Each guards what Python's float
# arithmetic raises at (a zero divisor, a negative base): the CUDA simulator
# runs them as Python.
def _atan2(a, b):
    return math.atan2(a, b)


def _d_atan2_a(a, b):     # b / (a^2 + b^2), PyTorch's; nan at (0, 0)
    d = a * a + b * b
    return b / d if d != 0 else math.nan


def _d_atan2_b(a, b):
    d = a * a + b * b
    return -a / d if d != 0 else math.nan


def _copysign(a, b):
    return math.copysign(a, b)


def _d_copysign_a(a, b):   # +-1, and 0 where a == 0 (PyTorch's)
    if a == 0 or a != a:
        return 0.0 if a == 0 else math.nan
    return 1.0 if (a > 0) == (math.copysign(1.0, b) > 0) else -1.0


def _d_zero(a, b):
    return 0.0


def _fmod(a, b):     # C's fmod: the sign of a (exact: % of magnitudes is)
    if b == 0 or a - a != 0 or b != b:
        return math.nan
    return math.copysign(abs(a) % abs(b), a) if b - b == 0 else a


def _d_fmod_b(a, b):   # -trunc(a / b), PyTorch's
    if b == 0:
        return math.nan
    q = a / b
    if not abs(q) < _TWO52:
        return -q
    return -float(math.floor(q) if q >= 0 else math.ceil(q))


def _remainder(a, b):   # torch.remainder's: the sign of b (a zero keeps a's)
    if b == 0 or a - a != 0 or b != b:
        return math.nan
    m = math.copysign(abs(a) % abs(b), a) if b - b == 0 else a    # fmod
    return m + b if m != 0 and (b < 0) != (m < 0) else m


def _d_remainder_b(a, b):   # -floor(a / b), PyTorch's
    if b == 0:
        return math.nan
    q = a / b
    return -float(math.floor(q)) if abs(q) < _TWO52 else -q


def _floor_divide(a, b):   # Python's a // b, which is torch's rounding_mode="floor"
    if b == 0:
        if a != a or a == 0:
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1.0, b)
    return a // b


def _logaddexp(a, b):    # log(exp(a) + exp(b)), PyTorch's form
    if a == b and a - a != 0:   # both +inf or both -inf
        return a
    m = a if a > b or b != b else b
    return m + math.log1p(math.exp(-abs(a - b)))


def _d_logaddexp_a(a, b):   # 1 / (1 + exp(b - a)), PyTorch's
    d = b - a
    return 1 / (1 + math.exp(d)) if d < 700 else 0.0


def _d_logaddexp_b(a, b):
    d = a - b
    return 1 / (1 + math.exp(d)) if d < 700 else 0.0


def _pow_ab(a, b):   # a ** b, IEEE's pow: nan for a < 0 and a non-integer b
    if a < 0 and a - a == 0 and b - b == 0 and b % 1.0 != 0:
        return math.nan
    if a == 0 and b < 0:
        return math.copysign(math.inf, a) if b % 2.0 == 1.0 else math.inf
    return a ** b


def _d_pow_ab_a(a, b):   # b a^(b - 1), 0 where b == 0 (PyTorch's)
    if b == 0:
        return 0.0
    c = b - 1
    if a < 0 and a - a == 0 and c - c == 0 and c % 1.0 != 0:
        return math.nan
    if a == 0 and c < 0:
        return b * (math.copysign(math.inf, a) if c % 2.0 == 1.0 else math.inf)
    return b * a ** c


def _d_pow_ab_b(a, b):   # a^b log(a), 0 where a == 0 and b >= 0 (PyTorch's)
    if a == 0 and b >= 0:
        return 0.0
    if a < 0:
        return math.nan
    y = math.inf if a == 0 else a ** b
    return y * (math.log(a) if a > 0 else -math.inf)


@dataclass(frozen=True)
class BinaryCode:
    """One binary code, y = forward(a, b), with d(y)/da = ``grad_a(a, b)`` and
    d(y)/db = ``grad_b(a, b)``; ``NAME.upper()`` is its constant here.
    ``own_loop``: as ``UnaryCode``'s (False: the CPU's one shared loop)."""

    name: str
    forward: Callable
    grad_a: Callable
    grad_b: Callable
    own_loop: bool = True


BINARY = (
    BinaryCode("add", _add, _d_one, _d_one),
    BinaryCode("sub", _sub, _d_one, _d_minus_one),
    BinaryCode("mul", _mul, _d_mul_a, _d_mul_b),
    BinaryCode("div", _div, _d_div_a, _d_div_b),
    BinaryCode("max", _max, _d_max_a, _d_max_b),
    BinaryCode("min", _min, _d_max_b, _d_max_a),   # min(a, b)'s d/da is max's d/db
    # issue 30, in the shared loop
    BinaryCode("atan2", _atan2, _d_atan2_a, _d_atan2_b, own_loop=False),
    BinaryCode("copysign", _copysign, _d_copysign_a, _d_zero, own_loop=False),
    BinaryCode("fmod", _fmod, _d_one, _d_fmod_b, own_loop=False),
    BinaryCode("remainder", _remainder, _d_one, _d_remainder_b, own_loop=False),
    BinaryCode("floor_divide", _floor_divide, _d_zero, _d_zero, own_loop=False),
    BinaryCode("logaddexp", _logaddexp, _d_logaddexp_a, _d_logaddexp_b, own_loop=False),
    BinaryCode("pow_tensor", _pow_ab, _d_pow_ab_a, _d_pow_ab_b, own_loop=False),   # a ** b
)

# ------------------------------------------------ what follows from the records
if {r.name for r in UNARY} & {r.name for r in BINARY}:   # one constant per name
    raise ValueError(f"kernels/codes.py: a unary and a binary record share the names "
                     f"{sorted({r.name for r in UNARY} & {r.name for r in BINARY})}")
# each record's constant: IDENT = 0, ..., ADD = 0, ...
globals().update({r.name.upper(): c for c, r in enumerate(UNARY)})
globals().update({r.name.upper(): c for c, r in enumerate(BINARY)})
N_UNARY = len(UNARY)
N_BINARY = len(BINARY)
# codes as cheap as a copy (the CPU's memory-bound threading threshold)
CHEAP_UNARY = frozenset(c for c, r in enumerate(UNARY) if r.cheap)
# the codes the CPU runs in its family's one shared loop (no loop of their own)
SHARED_LOOP = frozenset(c for c, r in enumerate(UNARY) if not r.own_loop)
SHARED_BINARY_LOOP = frozenset(c for c, r in enumerate(BINARY) if not r.own_loop)
# the codes with a float32 fast form on the CPU
FAST32 = frozenset(c for c, r in enumerate(UNARY) if r.fast32)
# linear's activations: name -> code
ACTIVATIONS = {r.name: c for c, r in enumerate(UNARY) if r.fuse}
# the codes a GEMM's epilogue applies (IDENT: none); the other fused ones
# need their pre-activation kept for the backward
EPILOGUE = frozenset({IDENT} | {c for c in ACTIVATIONS.values()    # noqa: F821 (IDENT: above)
                               if UNARY[c].grad_from_output})
PRE_KEPT = frozenset(ACTIVATIONS.values()) - EPILOGUE


def dispatchers(jit: Callable, jit_formula: Callable | None = None) -> dict[str, Callable]:
    """``unary(code, x, p)``, ``unary_grad(code, x, y, p)``, ``binary(code, a,
    b)``, ``binary_grad_a`` and ``binary_grad_b`` for one device: ladders
    generated from the records (``dispatch.ladder``) over each record's
    functions compiled by ``jit_formula`` (default ``jit``; the CPU passes
    ``njit(inline="always")``, so each ladder is one function, as a written-out
    chain would be), the whole ladder compiled by ``jit``. An unknown code
    raises ValueError. With a constant code (a kernel's loop inlined per code)
    the compiler folds the ladder to that one branch."""
    compiled: dict[Callable, Any] = {}     # a formula shared by codes is compiled once
    out = {}
    for kind, records, fields in (("unary", UNARY, ("forward", "grad")),
                                  ("binary", BINARY, ("forward", "grad_a", "grad_b"))):
        for field in fields:
            fn = f"{kind}{'' if field == 'forward' else '_' + field}"
            names = {}
            for c, r in enumerate(records):
                f = getattr(r, field)
                names[f"_{fn}_{c}"] = compiled[f] = compiled.get(f) or (jit_formula or jit)(f)
            params = ("x, p" if field == "forward" else "x, y, p") if kind == "unary" else "a, b"
            out[fn] = jit(dispatch.ladder(fn, params, range(len(records)),
                                          f"return _{fn}_{{code}}({params})", names,
                                          f"{fn}: unknown op code"))
    return out


def with_fast_forms(jit: Callable, exact: Mapping[str, Callable],
                    fast: Mapping[int, tuple[Callable, Callable]]) -> dict[str, Callable]:
    """``unary`` and ``unary_grad`` that run ``fast``'s (forward, grad) for its
    codes (compiled already: vmath's float32 forms) and hand every other code
    to ``exact``'s (``dispatchers``): a short ladder, so a loop that inlines
    it with a constant code stays small."""
    out = {}
    for k, (fn, params) in enumerate((("unary", "x, p"), ("unary_grad", "x, y, p"))):
        names = {f"_fast_{c}": forms[k] for c, forms in fast.items()}
        names["_exact"] = exact[fn]
        out[fn] = jit(dispatch.ladder(fn, params, sorted(fast), f"return _fast_{{code}}({params})",
                                      names, f"{fn}: unknown op code",
                                      otherwise=f"return _exact(code, {params})"))
    return out


# The package's own plain-Python ones (tests and references call them).
_python = dispatchers(lambda f: f)
unary = _python["unary"]
unary_grad = _python["unary_grad"]
binary = _python["binary"]
binary_grad_a = _python["binary_grad_a"]
binary_grad_b = _python["binary_grad_b"]

# Pointwise losses: (pred, target) -> one term of the sum, and its d/dpred.
# (MSE has a kernel of its own, vectorised, in each device's losses module.)
BCE_LOGITS = 0
N_POINTWISE = 1
# Per-element losses with a parameter p (ops/losses.py, the issue-17 section):
# (pred, target, p) -> one term, and its d/dpred.
# (SQUARED and LOGITS_BCE are mse_loss's and binary_cross_entropy_with_logits'
# terms for reduction="none"; reduced, those two have kernels of their own.)
L1, SMOOTH_L1, HUBER, BCE, SQUARED, LOGITS_BCE = range(6)
N_LOSS = 6

# Every chain of ``code ==`` tests below ends in a raise: a code without a
# branch is an error, never another op's formula. (The kernels inline these
# with a constant code, so the raise costs nothing there; the CUDA launchers
# check the code on the host, where a device-side raise would not be seen.)


def pointwise_loss(code, x, t):
    """One term of the loss sum, before the reduction's scale (``code`` picks the
    loss; binary cross-entropy with logits is the only one so far)."""
    if code == BCE_LOGITS:
        # PyTorch's stable form: max(x, 0) - x t + log1p(exp(-|x|)).
        return max(x, 0) - x * t + math.log1p(math.exp(-abs(x)))
    raise ValueError("pointwise_loss: unknown loss code")


def pointwise_loss_grad(code, x, t):
    """d(term)/dx."""
    if code == BCE_LOGITS:
        if x >= 0:
            s = 1 / (1 + math.exp(-x))
        else:
            e = math.exp(x)
            s = e / (1 + e)
        return s - t
    raise ValueError("pointwise_loss_grad: unknown loss code")


def loss_term(code, x, t, p):
    """One per-element loss of ``pred`` x against ``target`` t (PyTorch's
    formulas): L1, smooth L1 (p: beta), Huber (p: delta), binary
    cross-entropy of a probability x (each log clamped at -100)."""
    if code == L1:
        return abs(x - t)
    if code == SMOOTH_L1:
        d = abs(x - t)
        return 0.5 * d * d / p if d < p else d - 0.5 * p
    if code == HUBER:
        d = abs(x - t)
        return 0.5 * d * d if d < p else p * (d - 0.5 * p)
    if code == BCE:
        lx = max(math.log(x), -100.0) if x > 0 else -100.0
        l1x = max(math.log1p(-x), -100.0) if x < 1 else -100.0
        return (t - 1) * l1x - t * lx
    if code == SQUARED:
        return (x - t) * (x - t)
    if code == LOGITS_BCE:   # pointwise_loss's BCE_LOGITS term
        return max(x, 0) - x * t + math.log1p(math.exp(-abs(x)))
    raise ValueError("loss_term: unknown loss code")


def loss_term_grad(code, x, t, p):
    """d(loss_term)/dx (PyTorch's: sign(0) = 0; BCE's denominator clamped at
    float32(1e-12))."""
    if code == L1:
        d = x - t
        return 1.0 if d > 0 else (-1.0 if d < 0 else 0.0)
    if code == SMOOTH_L1:
        d = x - t
        if d < -p:
            return -1.0
        return 1.0 if d > p else d / p
    if code == HUBER:
        d = x - t
        if d < -p:
            return -p
        return p if d > p else d
    if code == BCE:
        return (x - t) / max((1 - x) * x, _BCE_EPS)
    if code == SQUARED:
        return 2.0 * (x - t)
    if code == LOGITS_BCE:   # pointwise_loss_grad's
        if x >= 0:
            return 1 / (1 + math.exp(-x)) - t
        e = math.exp(x)
        return e / (1 + e) - t
    raise ValueError("loss_term_grad: unknown loss code")


def loss_term_grad_target(code, x, t, p):
    """d(loss_term)/dt, PyTorch's target gradient: -d/dx for the losses of
    x - t (written out: a kernel's formula cannot call another); binary cross-entropy's log(1 - x) - log(x), unclamped (inf at x = 0,
    as PyTorch); with logits, -x."""
    if code == BCE:
        lx = math.log(x) if x > 0 else (-math.inf if x == 0 else math.nan)
        l1x = math.log1p(-x) if x < 1 else (-math.inf if x == 1 else math.nan)
        return l1x - lx
    if code == LOGITS_BCE:
        return -x
    # The losses of d = x - t are odd in d: d/dt is d/dx's formula at t - x.
    d = t - x
    if code == L1:
        return 1.0 if d > 0 else (-1.0 if d < 0 else 0.0)
    if code == SMOOTH_L1:
        if d < -p:
            return -1.0
        return 1.0 if d > p else d / p
    if code == HUBER:
        if d < -p:
            return -p
        return p if d > p else d
    if code == SQUARED:
        return 2.0 * d
    raise ValueError("loss_term_grad_target: unknown loss code")

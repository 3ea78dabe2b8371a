"""Per-element math shared by every device: plain Python, compiled per device.

``kernels/cpu`` wraps these with ``njit`` and ``kernels/cuda`` with
``cuda.jit(device=True)``, so an op's formula and its derivative are written
once. ``code`` picks the op (the constants below, frozen into the compiled
kernels), ``p`` is its scalar parameter (a slope, an exponent, a constant).
The bodies of the loops built on them (a broadcast gradient's sum, a softmax
lane, an Adam element) are shared the same way, in ``elements``.

Gradients that do not depend on ``x`` are constants, never forms like
``x * 0 + 1``: those are nan at x = +-inf and nan, where PyTorch's gradient
is the constant (d(x + c)/dx = 1 at x = inf). Numba types every branch's
result as float64 either way, so finite inputs give the same bits.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class UnaryCode:
    """What the rest of the package needs to know of one unary code, beside
    its formula and derivative in ``unary``/``unary_grad`` below.

    ``name``: the op's name (``linear``'s ``activation=`` for a fused one).
    ``cheap``: as cheap as a copy per element (no libm call, no polynomial),
    so the CPU threads it only from ``MT_MIN_MEMORY`` elements.
    ``grad_from_output``: ``unary_grad(code, y, y, p)`` is the derivative,
    the output read in place of the input (relu, tanh, sigmoid, ...).
    ``fuse``: ``linear(..., activation=name)`` applies it: in the GEMM's
    epilogue when its gradient comes from the output, else (the GEMM writes
    the pre-activation, which the backward needs) in one unary pass after.
    """

    name: str
    cheap: bool = False
    grad_from_output: bool = False
    fuse: bool = False


# Unary codes, y = f(x, p): one record each, in code order. SOFTPLUS's p is
# its threshold (beta 1), SOFTPLUS_BETA's its beta (threshold 20, PyTorch's
# default), clamp's its bound.
UNARY = (
    UnaryCode("ident", cheap=True, grad_from_output=True),
    UnaryCode("neg", cheap=True),
    UnaryCode("relu", cheap=True, grad_from_output=True, fuse=True),
    UnaryCode("leaky_relu", cheap=True, grad_from_output=True, fuse=True),  # p >= 0
    UnaryCode("tanh", grad_from_output=True, fuse=True),
    UnaryCode("sigmoid", grad_from_output=True, fuse=True),
    UnaryCode("exp"),
    UnaryCode("log"),
    UnaryCode("sqrt"),
    UnaryCode("pow"),
    UnaryCode("add_s", cheap=True),
    UnaryCode("mul_s", cheap=True),
    UnaryCode("rsub_s", cheap=True),
    UnaryCode("div_s", cheap=True),
    UnaryCode("rdiv_s", cheap=True),
    UnaryCode("gelu", fuse=True),
    UnaryCode("gelu_tanh"),
    UnaryCode("silu", fuse=True),
    UnaryCode("softplus"),
    UnaryCode("abs", cheap=True),
    UnaryCode("clamp_min", cheap=True),
    UnaryCode("clamp_max", cheap=True),
    UnaryCode("softplus_beta"),
    UnaryCode("rpow_s"),     # p ** x: a Python number raised to a tensor
)
IDENT, NEG, RELU, LEAKY_RELU, TANH, SIGMOID, EXP, LOG, SQRT, POW, \
    ADD_S, MUL_S, RSUB_S, DIV_S, RDIV_S, \
    GELU, GELU_TANH, SILU, SOFTPLUS, ABS, CLAMP_MIN, CLAMP_MAX, SOFTPLUS_BETA, \
    RPOW_S = range(len(UNARY))
N_UNARY = len(UNARY)
# What follows from the records (nothing per code is kept anywhere else):
# codes as cheap as a copy (the CPU's memory-bound threading threshold)
CHEAP_UNARY = frozenset(c for c, r in enumerate(UNARY) if r.cheap)
# linear's activations: name -> code
ACTIVATIONS = {r.name: c for c, r in enumerate(UNARY) if r.fuse}
# the codes a GEMM's epilogue applies (IDENT: none); the other fused ones
# need their pre-activation kept for the backward
EPILOGUE = frozenset({IDENT} | {c for c in ACTIVATIONS.values()
                               if UNARY[c].grad_from_output})
PRE_KEPT = frozenset(ACTIVATIONS.values()) - EPILOGUE
_SOFTPLUS_THRESHOLD = 20.0
# Binary codes: y = f(a, b).
ADD, SUB, MUL, DIV, MAX, MIN = range(6)
N_BINARY = 6
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
_SQRT1_2 = 0.7071067811865476          # 1 / sqrt(2)
_INV_SQRT_2PI = 0.3989422804014327     # 1 / sqrt(2 pi)
_SQRT_2_PI = 0.7978845608028654        # sqrt(2 / pi)
_KAPPA = 0.044715
_BCE_EPS = 9.999999960041972e-13       # PyTorch's EPSILON, 1e-12 as a float32

# Every chain of ``code ==`` tests below ends in a raise: a code without a
# branch is an error, never another op's formula. (The kernels inline these
# with a constant code, so the raise costs nothing there; the CUDA launchers
# check the code on the host, where a device-side raise would not be seen.)


def unary(code, x, p):
    if code == IDENT:
        return x
    if code == NEG:
        return -x
    if code == RELU:
        return x if not x <= 0 else 0.0   # nan stays nan, -inf gives 0 (PyTorch)
    if code == LEAKY_RELU:
        return x if x > 0 else x * p
    if code == TANH:
        return math.tanh(x)
    if code == SIGMOID:
        if x >= 0:
            return 1 / (1 + math.exp(-x))
        e = math.exp(x)
        return e / (1 + e)
    if code == EXP:
        return math.exp(x)
    if code == LOG:
        return math.log(x) if x > 0 else (-math.inf if x == 0 else math.nan)
    if code == SQRT:
        return math.sqrt(x) if x >= 0 else math.nan
    if code == POW:
        return x ** p
    if code == ADD_S:
        return x + p
    if code == MUL_S:
        return x * p
    if code == RSUB_S:
        return p - x
    if code == DIV_S:
        return x / p
    if code == RDIV_S:
        return p / x
    if code == GELU:     # PyTorch's order of operations
        return x * 0.5 * (1 + math.erf(x * _SQRT1_2))
    if code == GELU_TANH:
        return 0.5 * x * (1 + math.tanh(_SQRT_2_PI * (x + _KAPPA * x * x * x)))
    if code == SILU:    # PyTorch's x / (1 + exp(-x)), without overflowing exp for x < 0
        if x >= 0:
            return x / (1 + math.exp(-x))
        e = math.exp(x)
        return x * e / (1 + e)
    if code == SOFTPLUS:
        return x if x > p else math.log1p(math.exp(x))
    if code == ABS:
        return abs(x)
    if code == CLAMP_MIN:
        return p if x < p or p != p else x        # nan stays nan; a nan bound gives nan
    if code == CLAMP_MAX:
        return p if x > p or p != p else x
    if code == SOFTPLUS_BETA:
        return x if x * p > _SOFTPLUS_THRESHOLD else math.log1p(math.exp(x * p)) / p
    if code == RPOW_S:   # 0 ** x spelled out: the simulator's NumPy warns at 0 ** -1
        if p == 0 and x == x:
            return 0.0 if x > 0 else (1.0 if x == 0 else math.inf)
        return p ** x
    raise ValueError("unary: unknown op code")


def unary_grad(code, x, y, p):
    """dy/dx, given the input ``x`` and the output ``y`` (PyTorch's at +-inf
    and nan too: relu's is 1 and leaky_relu's the slope where x is nan)."""
    if code == IDENT or code == ADD_S:
        return 1.0
    if code == NEG or code == RSUB_S:
        return -1.0
    if code == RELU:
        return 0.0 if x <= 0 else 1.0
    if code == LEAKY_RELU:
        return 1.0 if x > 0 else p
    if code == TANH:
        return 1 - y * y
    if code == SIGMOID:
        return y * (1 - y)
    if code == EXP:
        return y
    if code == LOG:
        return 1 / x
    if code == SQRT:
        return 0.5 / y
    if code == POW:
        return 0.0 if p == 0 else p * x ** (p - 1)
    if code == MUL_S:
        return p
    if code == DIV_S:
        return 1 / p
    if code == RDIV_S:
        return -p / (x * x)
    if code == GELU:
        return 0.5 * (1 + math.erf(x * _SQRT1_2)) + x * (math.exp(-0.5 * x * x) * _INV_SQRT_2PI)
    if code == GELU_TANH:
        t = math.tanh(_SQRT_2_PI * (x + _KAPPA * x * x * x))
        return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * (_SQRT_2_PI * (1 + 3 * _KAPPA * x * x))
    if code == SILU:
        if x >= 0:
            s = 1 / (1 + math.exp(-x))
        else:
            e = math.exp(x)
            s = e / (1 + e)
        return s * (1 + x * (1 - s))
    if code == SOFTPLUS:
        if x > p:
            return 1.0
        z = math.exp(x)
        return z / (z + 1)
    if code == ABS:      # 0 at 0 (PyTorch's sign)
        return 1.0 if x > 0 else (-1.0 if x < 0 else 0.0)
    if code == CLAMP_MIN:
        return 1.0 if x >= p else 0.0
    if code == CLAMP_MAX:
        return 1.0 if x <= p else 0.0
    if code == SOFTPLUS_BETA:
        if x * p > _SOFTPLUS_THRESHOLD:
            return 1.0
        z = math.exp(x * p)
        return z / (z + 1)
    if code == RPOW_S:   # y log(p); 0 where p == 0 and x >= 0, as PyTorch
        if p == 0:
            return 0.0 if x >= 0 else y * -math.inf   # inf, or nan at nan
        return y * math.log(p) if p > 0 else math.nan
    raise ValueError("unary_grad: unknown op code")


def binary(code, a, b):
    if code == ADD:
        return a + b
    if code == SUB:
        return a - b
    if code == MUL:
        return a * b
    if code == DIV:
        return a / b
    if code == MAX:      # nan wins, as torch.maximum
        return a if a > b or a != a else b
    if code == MIN:
        return a if a < b or a != a else b
    raise ValueError("binary: unknown op code")


def binary_grad_a(code, a, b):
    """d(a op b)/da."""
    if code == MUL:
        return b
    if code == DIV:
        return 1 / b
    if code == ADD or code == SUB:
        return 1.0
    # maximum/minimum: half each at a tie, as PyTorch
    if code == MAX:
        return 0.5 if a == b else (0.0 if a < b else 1.0)
    if code == MIN:
        return 0.5 if a == b else (0.0 if a > b else 1.0)
    raise ValueError("binary_grad_a: unknown op code")


def binary_grad_b(code, a, b):
    """d(a op b)/db."""
    if code == ADD:
        return 1.0
    if code == SUB:
        return -1.0
    if code == MUL:
        return a
    if code == DIV:
        return -a / (b * b)
    if code == MAX:
        return 0.5 if a == b else (0.0 if a > b else 1.0)
    if code == MIN:
        return 0.5 if a == b else (0.0 if a < b else 1.0)
    raise ValueError("binary_grad_b: unknown op code")


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

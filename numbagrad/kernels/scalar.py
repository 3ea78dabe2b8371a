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
import math

# Unary codes: y = f(x, p).
IDENT, NEG, RELU, LEAKY_RELU, TANH, SIGMOID, EXP, LOG, SQRT, POW, \
    ADD_S, MUL_S, RSUB_S, DIV_S, RDIV_S = range(15)
N_UNARY = 15
# Binary codes: y = f(a, b).
ADD, SUB, MUL, DIV = range(4)
N_BINARY = 4
# Pointwise losses: (pred, target) -> one term of the sum, and its d/dpred.
# (MSE has a kernel of its own, vectorised, in each device's losses module.)
BCE_LOGITS = 0
N_POINTWISE = 1

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
    raise ValueError("binary: unknown op code")


def binary_grad_a(code, a, b):
    """d(a op b)/da."""
    if code == MUL:
        return b
    if code == DIV:
        return 1 / b
    if code == ADD or code == SUB:
        return 1.0
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

"""Activations of issue 17 (gelu, silu, softplus, abs, clamp, maximum,
minimum), built on ``elementwise``'s unary and binary kernels (clamp with
both bounds on ``kernels/*/bounds.py``): one launch forward, one per
gradient written (softplus with beta != 1 and threshold != 20 excepted:
three unary passes)."""
from __future__ import annotations

from typing import Any

from .. import buffers, kernels
from ..kernels import codes
from ..tape import Node, _Backward
from ..tensor import Tensor
from . import elementwise as ew
from ._common import contiguous, ones, operand, pair, real_number, reshaped, result, scalar_of


def gelu(x: Any, approximate: str = "none") -> Tensor:
    """x * Phi(x), PyTorch's ``F.gelu``: ``approximate="tanh"`` uses
    0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return ew._unary(codes.GELU if approximate == "none" else codes.GELU_TANH, x, 0.0, "gelu")


def silu(x: Any) -> Tensor:
    """x * sigmoid(x), PyTorch's ``F.silu`` (x / (1 + exp(-x)); for x < 0 the
    same as x e^x / (1 + e^x), which cannot overflow)."""
    return ew._unary(codes.SILU, x, 0.0, "silu")


def softplus(x: Any, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    """log(1 + exp(beta x)) / beta, and x itself where beta x > threshold
    (PyTorch's ``F.softplus``). A kernel code takes one parameter: beta = 1
    (any threshold) and threshold = 20 (any beta) are one unary pass; other
    pairs run where(beta x > threshold, x, softplus(beta x) / beta), a few
    passes each way (x itself, as PyTorch, also where beta x overflows)."""
    beta = real_number(beta, "softplus", "beta")
    threshold = real_number(threshold, "softplus", "threshold")
    if beta == 1.0:
        return ew._unary(codes.SOFTPLUS, x, threshold, "softplus")
    if threshold == 20.0:
        return ew._unary(codes.SOFTPLUS_BETA, x, beta, "softplus")
    from .masks import where
    x = operand(x, "softplus")
    scaled = ew._unary(codes.MUL_S, x, beta, "softplus")
    soft = ew._unary(codes.DIV_S, ew._unary(codes.SOFTPLUS, scaled, threshold, "softplus"),
                     beta, "softplus")
    return where(scaled > threshold, x, soft)


def abs(x: Any) -> Tensor:  # noqa: A001 (ng.abs, as torch.abs)
    """|x| elementwise; its gradient at 0 is 0, as PyTorch's."""
    return ew._unary(codes.ABS, x, 0.0, "abs")


def clamp(x: Any, min: Any = None, max: Any = None) -> Tensor:  # noqa: A002
    """min(max(x, min), max) with scalar bounds, PyTorch's ``torch.clamp``
    (nan stays nan, a nan bound makes every element nan with a zero
    gradient, and where min > max every element is max). The gradient
    passes where min <= x <= max."""
    if min is None and max is None:
        raise ValueError("clamp: at least one of min and max must be given")
    lo = None if min is None else real_number(min, "clamp", "min")
    hi = None if max is None else real_number(max, "clamp", "max")
    if hi is None:
        return ew._unary(codes.CLAMP_MIN, x, lo, "clamp")
    if lo is None:
        return ew._unary(codes.CLAMP_MAX, x, hi, "clamp")
    x = operand(x, "clamp")
    kern, xd = x._kern, contiguous(x)
    out = buffers.take(kern, xd.shape, xd.dtype)
    kernels.call(kern, "clamp", out.size, _flat(xd), _flat(out), scalar_of(xd.dtype, lo),
                 scalar_of(xd.dtype, hi))
    return result(out, kern, (x,), _clamp_backward, (xd, lo, hi))


def _clamp_backward(ctx: _Backward, node: Node, gout: Any) -> None:
    (x,) = node.inputs
    xd, lo, hi = node.saved
    kern, dtype = x._kern, xd.dtype
    g = ones(kern, xd.shape, dtype) if gout is None else gout
    dest, beta = ctx.dest(x)
    kernels.call(kern, "clamp_backward", dest.size, _flat(xd), _flat(g), _flat(dest),
                 scalar_of(dtype, lo), scalar_of(dtype, hi), beta)


def _flat(array: Any) -> Any:
    return reshaped(array, (array.size,))


clip = clamp


def maximum(a: Any, b: Any) -> Tensor:
    """Elementwise maximum with NumPy broadcasting (nan wins, as in both
    NumPy and PyTorch); where a == b each input gets half the gradient
    (PyTorch's). Python scalars are taken as 0-d tensors."""
    return ew._binary(codes.MAX, a, b, "maximum")


def minimum(a: Any, b: Any) -> Tensor:
    """Elementwise minimum; see ``maximum``."""
    return ew._binary(codes.MIN, a, b, "minimum")


# --- issue 30's activations: one unary pass each (hardtanh and relu6: two,
# one per bound, so the gradient stops at both bounds as PyTorch's)
def elu(x: Any, alpha: float = 1.0) -> Tensor:
    """x where x > 0, else alpha (exp(x) - 1): PyTorch's ``F.elu`` (gradient
    alpha exp(x) for x <= 0)."""
    return ew._unary(codes.ELU, x, real_number(alpha, "elu", "alpha"), "elu")


def selu(x: Any) -> Tensor:
    """scale * elu(x, alpha) with PyTorch's fixed alpha and scale (``F.selu``)."""
    return ew._unary(codes.SELU, x, 0.0, "selu")


def celu(x: Any, alpha: float = 1.0) -> Tensor:
    """max(0, x) + min(0, alpha (exp(x / alpha) - 1)): PyTorch's ``F.celu``.
    The gradient is exactly exp(x / alpha) for x <= 0; PyTorch's backward
    uses 1 / float32(alpha), which differs by ~3e-8 relative where alpha is
    not a float32 (1.3)."""
    alpha = real_number(alpha, "celu", "alpha")
    if alpha == 0:
        raise ValueError("celu: alpha must not be 0 (it divides x)")
    return ew._unary(codes.CELU, x, alpha, "celu")


def hardtanh(x: Any, min_val: float = -1.0, max_val: float = 1.0) -> Tensor:
    """x clamped to [min_val, max_val], PyTorch's ``F.hardtanh``: unlike
    ``clamp``'s, the gradient is 0 at the bounds themselves (it passes
    where min_val < x < max_val)."""
    lo = real_number(min_val, "hardtanh", "min_val")
    hi = real_number(max_val, "hardtanh", "max_val")
    if lo > hi:
        raise ValueError(f"hardtanh: min_val ({lo}) must not be above max_val ({hi})")
    low = ew._unary(codes.HARDTANH_MIN, x, lo, "hardtanh")
    return ew._unary(codes.HARDTANH_MAX, low, hi, "hardtanh")


def relu6(x: Any) -> Tensor:
    """min(max(x, 0), 6): PyTorch's ``F.relu6``, which is hardtanh(x, 0, 6)
    (gradient 0 at 0 and at 6)."""
    return hardtanh(x, 0.0, 6.0)


def hardsigmoid(x: Any) -> Tensor:
    """min(max(x + 3, 0), 6) / 6: PyTorch's ``F.hardsigmoid`` (gradient 1/6
    strictly inside (-3, 3); PyTorch's is float32's 1/6, 3e-8 off in float64)."""
    return ew._unary(codes.HARDSIGMOID, x, 0.0, "hardsigmoid")


def hardswish(x: Any) -> Tensor:
    """x * hardsigmoid(x): PyTorch's ``F.hardswish`` (gradient 0 up to -3
    included, x / 3 + 1/2 below 3, 1 from 3)."""
    return ew._unary(codes.HARDSWISH, x, 0.0, "hardswish")


def mish(x: Any) -> Tensor:
    """x tanh(softplus(x)): PyTorch's ``F.mish``."""
    return ew._unary(codes.MISH, x, 0.0, "mish")


def softsign(x: Any) -> Tensor:
    """x / (1 + |x|): PyTorch's ``F.softsign`` (nan at +-inf, as PyTorch)."""
    return ew._unary(codes.SOFTSIGN, x, 0.0, "softsign")


def logsigmoid(x: Any) -> Tensor:
    """log(sigmoid(x)) = min(x, 0) - log1p(exp(-|x|)): PyTorch's
    ``F.logsigmoid``, stable at both ends."""
    return ew._unary(codes.LOGSIGMOID, x, 0.0, "logsigmoid")


def quick_gelu(x: Any) -> Tensor:
    """x * sigmoid(1.702 x), the GELU approximation of CLIP (OpenAI's and
    Hugging Face's ``QuickGELU``; PyTorch has no function of it)."""
    return ew._unary(codes.QUICK_GELU, x, 0.0, "quick_gelu")

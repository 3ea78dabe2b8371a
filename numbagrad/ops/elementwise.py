"""Elementwise ops with NumPy broadcasting, each forward beside its backward.

Unary ops (and binary ones with a Python scalar) run one ``unary`` kernel;
tensor-tensor ones one ``binary`` kernel. The backward of a broadcast operand
sums over the broadcast dimensions inside the kernel and adds straight into
the destination (a param's accumulator, say a bias, included).
"""
from __future__ import annotations

import math
from typing import Any

from .. import buffers, kernels
from ..kernels import scalar as codes
from ..tape import Node, _Backward
from ..tensor import Tensor
from ._common import (broadcast_into, broadcast_shape, collapse, contiguous, contiguous_array,
                      is_scalar, ones, operand, padded2d, pair, reduce_into, reshaped, result,
                      scalar_of, view2d)


# ------------------------------------------------------------------ unary
def _unary(code: int, x: Any, p: float, op: str) -> Tensor:
    x = operand(x, op)
    kern, xd = x._kern, x._data
    dtype = xd.dtype
    if len(xd.shape) > 2:     # the 2-D kernels read a (strided) matrix; N-d is one row
        xd = contiguous(x)
    out = buffers.take(kern, xd.shape, dtype)
    kernels.call(kern, "unary", out.size, code, view2d(xd), view2d(out), scalar_of(dtype, p),
                 scalar_of(dtype, 1.0), scalar_of(dtype, 0.0))
    return result(out, kern, (x,), _unary_backward, (code, p, out, xd))


def _unary_backward(ctx: _Backward, node: Node, gout: Any) -> None:
    (x,) = node.inputs
    code, p, y, xd = node.saved
    kern = x._kern
    if gout is None:
        gout = ones(kern, y.shape, y.dtype)
    dest, beta = ctx.dest(x)
    kernels.call(kern, "unary_backward", y.size, code, view2d(xd), view2d(y), view2d(gout),
                 view2d(dest), beta, scalar_of(y.dtype, p))


def relu(x: Any) -> Tensor:
    """max(x, 0) elementwise (gradient 0 at 0, as PyTorch)."""
    return _unary(codes.RELU, x, 0.0, "relu")


def leaky_relu(x: Any, negative_slope: float = 0.01) -> Tensor:
    """x where x > 0, else negative_slope * x."""
    if not is_scalar(negative_slope):
        raise TypeError(f"leaky_relu: negative_slope must be a real number, "
                        f"got {negative_slope!r}")
    return _unary(codes.LEAKY_RELU, x, float(negative_slope), "leaky_relu")


def tanh(x: Any) -> Tensor:
    """Hyperbolic tangent elementwise."""
    return _unary(codes.TANH, x, 0.0, "tanh")


def sigmoid(x: Any) -> Tensor:
    """1 / (1 + exp(-x)), computed without overflow for large |x|."""
    return _unary(codes.SIGMOID, x, 0.0, "sigmoid")


def exp(x: Any) -> Tensor:
    """e ** x elementwise."""
    return _unary(codes.EXP, x, 0.0, "exp")


def log(x: Any) -> Tensor:
    """Natural logarithm elementwise (-inf at 0, nan below, as NumPy)."""
    return _unary(codes.LOG, x, 0.0, "log")


def sqrt(x: Any) -> Tensor:
    """Square root elementwise (nan below 0, as NumPy)."""
    return _unary(codes.SQRT, x, 0.0, "sqrt")


def neg(x: Any) -> Tensor:
    """-x."""
    return _unary(codes.NEG, x, 0.0, "neg")


def pow(x: Any, p: float) -> Tensor:  # noqa: A001 (ng.pow, as torch.pow)
    """x ** p for a Python real exponent ``p``."""
    if not is_scalar(p):
        raise TypeError(f"pow: the exponent must be a Python real number, got "
                        f"{type(p).__name__}; tensor exponents are not supported")
    return _unary(codes.POW, x, float(p), "pow")


# ----------------------------------------------------------------- binary
# With a scalar on one side a binary op is a unary one: (code, p) for
# tensor-op-scalar and for scalar-op-tensor.
_WITH_SCALAR = {
    codes.ADD: (lambda s: (codes.ADD_S, s), lambda s: (codes.ADD_S, s)),
    codes.SUB: (lambda s: (codes.ADD_S, -s), lambda s: (codes.RSUB_S, s)),
    codes.MUL: (lambda s: (codes.MUL_S, s), lambda s: (codes.MUL_S, s)),
    codes.DIV: (lambda s: (codes.DIV_S, s), lambda s: (codes.RDIV_S, s)),
}
_NAMES = {codes.ADD: "add", codes.SUB: "sub", codes.MUL: "mul", codes.DIV: "div"}


def _binary(code: int, a: Any, b: Any, op: str | None = None) -> Tensor:
    op = _NAMES[code] if op is None else op   # (ops/activations.py names its own codes)
    if is_scalar(b) and not is_scalar(a):
        c, p = _WITH_SCALAR[code][0](float(b))
        return _unary(c, a, p, op)
    if is_scalar(a) and not is_scalar(b):
        c, p = _WITH_SCALAR[code][1](float(a))
        return _unary(c, b, p, op)
    a, b = pair(a, b, op)
    ad, bd = a._data, b._data
    shape = broadcast_shape(ad.shape, bd.shape, op)
    kern = a._kern
    out = buffers.take(kern, shape, ad.dtype)
    if len(ad.shape) <= 2 and len(bd.shape) <= 2:
        a2, b2 = view2d(ad), view2d(bd)
        saved = (code, shape, a2, b2, None)
    else:
        a2, b2, full = _nd_operands(kern, ad, bd, shape)
        saved = (code, shape, a2, b2, full)
    kernels.call(kern, "binary", out.size, code, a2, b2, view2d(out) if saved[4] is None
                 else reshaped(out, saved[4]))
    return result(out, kern, (a, b), _binary_backward, saved)


def _nd_operands(kern: Any, ad: Any, bd: Any, shape: tuple) -> tuple[Any, Any, tuple]:
    """N-d operands as the 2-D kernels read them: both C-contiguous and
    collapsed to 2 dims (size-1 dims broadcasting), or, where broadcasting
    does not collapse that far, both broadcast to ``shape`` (a copy each)
    and read as one row; with the 2-D shape of the output."""
    ad, bd = contiguous_array(kern, ad), contiguous_array(kern, bd)
    full, (pa, pb) = collapse(shape, ad.shape, bd.shape)
    if len(full) <= 2:
        return reshaped(ad, padded2d(pa)), reshaped(bd, padded2d(pb)), padded2d(full)
    row = (1, math.prod(shape))
    ad = ad if tuple(ad.shape) == shape else broadcast_into(kern, ad, shape)
    bd = bd if tuple(bd.shape) == shape else broadcast_into(kern, bd, shape)
    return reshaped(ad, row), reshaped(bd, row), row


def _binary_backward(ctx: _Backward, node: Node, gout: Any) -> None:
    a, b = node.inputs
    code, shape, a2, b2, full = node.saved
    kern = a._kern
    # g keeps the pooled seed referenced while only its view is used (see
    # _matmul_backward): otherwise the pool could hand it out as a destination.
    g = gout if gout is not None else ones(kern, shape, a._data.dtype)
    g2 = view2d(g) if full is None else reshaped(g, full)
    if a is b:   # x op x: both gradients land in one array, so one at a time
        for first in (True, False):
            dest, beta = ctx.dest(a)
            d2 = reshaped(dest, a2.shape)
            kernels.call(kern, "binary_backward", g.size, code, a2, b2, g2, d2, beta, first,
                         d2, beta, not first)
        return
    da, beta_a = ctx.dest(a) if a.requires_grad else (None, 0.0)
    db, beta_b = ctx.dest(b) if b.requires_grad else (None, 0.0)
    # Operands broadcast by a copy (N-d): their gradient is summed from a
    # full-size one afterwards.
    sum_a = full is not None and da is not None and a2.size != a._data.size
    sum_b = full is not None and db is not None and b2.size != b._data.size
    ta = buffers.take(kern, a2.shape, a2.dtype) if sum_a else None
    tb = buffers.take(kern, b2.shape, b2.dtype) if sum_b else None
    # An operand that needs no gradient passes its own data, never written.
    wa = a2 if da is None else (ta if sum_a else reshaped(da, a2.shape))
    wb = b2 if db is None else (tb if sum_b else reshaped(db, b2.shape))
    kernels.call(kern, "binary_backward", g.size, code, a2, b2, g2, wa,
                 0.0 if sum_a else beta_a, da is not None, wb, 0.0 if sum_b else beta_b,
                 db is not None)
    if sum_a:
        reduce_into(kern, reshaped(ta, shape), da, scalar_of(da.dtype, 1.0),
                    scalar_of(da.dtype, beta_a))
    if sum_b:
        reduce_into(kern, reshaped(tb, shape), db, scalar_of(db.dtype, 1.0),
                    scalar_of(db.dtype, beta_b))


def add(a: Any, b: Any) -> Tensor:
    """a + b with NumPy broadcasting (tensors, arrays or Python scalars)."""
    return _binary(codes.ADD, a, b)


def sub(a: Any, b: Any) -> Tensor:
    """a - b with NumPy broadcasting."""
    return _binary(codes.SUB, a, b)


def mul(a: Any, b: Any) -> Tensor:
    """a * b with NumPy broadcasting."""
    return _binary(codes.MUL, a, b)


def div(a: Any, b: Any) -> Tensor:
    """a / b with NumPy broadcasting."""
    return _binary(codes.DIV, a, b)

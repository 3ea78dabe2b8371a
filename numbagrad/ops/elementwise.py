"""Elementwise ops with NumPy broadcasting, each forward beside its backward.

Unary ops (and binary ones with a Python scalar) run one ``unary`` kernel;
tensor-tensor ones one ``binary`` kernel. The backward of a broadcast operand
sums over the broadcast dimensions inside the kernel and adds straight into
the destination (a param's accumulator, say a bias, included).

Operands of more than 2 dims have their adjacent dims merged first, where
every operand's strides and broadcast allow (``_merged``): what merges to 2
dims runs the 2-D kernels, the rest the N-d ones (``unary_nd``,
``binary_nd`` and their backwards), which read each operand through its
strides (a transpose, a slice, a broadcast: no copy). Either way an op is
one kernel forward and one backward (both gradients of a binary op in one,
broadcast sums included; ``x op x`` two).
"""
from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from .. import buffers, kernels
from ..kernels import codes
from ..kernels.cpu import integer as ic
from ..tape import Node, _Backward
from ..tensor import Tensor
from . import _integer
from ._common import (broadcast_shape, int_value, integral, is_scalar, ones, operand, pair,
                      reshaped, result, scalar_of, view2d)


# The rank the CPU's N-d kernels see from ranks 3 up to it (CUDA's own pad to 6).
_ND_RANK = 6


def _merged(kern: Any, shape: tuple, arrays: tuple) -> tuple[tuple, list]:
    """``shape``'s dims with adjacent ones merged wherever every array (right-
    aligned to ``shape``, each dim equal to its or 1, any strides) lets them
    merge into one strided dim, padded to at least 2 dims: (that shape, each
    array as a view of it: its size-1 dims where it is broadcast). A dim
    merges with the next where every array is broadcast along both or
    along neither, and its strides run on through them. On the CPU a shape
    of 3 to ``_ND_RANK`` dims is padded to ``_ND_RANK`` with leading 1s (the
    same elements in the same order: one compile serves those ranks)."""
    rank = len(shape)
    dims: list[list] = []   # [size, each array's stride, each array's broadcast flag]
    for d, n in enumerate(shape):
        if n == 1:
            continue
        strides, flags = [], []
        for a in arrays:
            e = d - rank + len(a.shape)
            flat = e < 0 or a.shape[e] == 1
            flags.append(flat)
            strides.append(0 if flat else a.strides[e])
        last = dims[-1] if dims else None
        if last and last[2] == flags and all(p == q * n for p, q in zip(last[1], strides)):
            last[0] *= n
            last[1] = strides
        else:
            dims.append([n, strides, flags])
    # at least 2 dims; on the CPU an N-d one has leading 1s up to _ND_RANK, so
    # that ranks 3 to _ND_RANK share one compiled N-d kernel
    least = _ND_RANK if kern.name == "cpu" and 2 < len(dims) < _ND_RANK else 2
    dims = [[1, [0] * len(arrays), [True] * len(arrays)]] * (least - len(dims)) + dims
    full = tuple(n for n, _, _ in dims)
    views = []
    for i, a in enumerate(arrays):
        vshape = tuple(1 if f[i] else n for n, _, f in dims)
        vstrides = tuple(st[i] for _, st, _ in dims)
        if kern.name == "cpu":   # a NumPy view keeps its base (ng.compile traces it)
            views.append(a.reshape(vshape, copy=False))
        else:
            views.append(kern.as_strided(a, vshape, vstrides, 0))
    return full, views


# ------------------------------------------------------------------ unary
def _unary(code: int, x: Any, p: float, op: str) -> Tensor:
    x = operand(x, op, ints=code in _INT_UNARY)
    kern, xd = x._kern, x._data
    dtype = xd.dtype
    if dtype.kind != "f":
        return _integer.unary(_INT_UNARY[code], x, op)
    out = buffers.take(kern, xd.shape, dtype)
    if len(xd.shape) <= 2:
        x2, o2, name = view2d(xd), view2d(out), "unary"
    else:     # N-d: read through its strides, merged to as few dims as they allow
        full, (x2,) = _merged(kern, tuple(xd.shape), (xd,))
        o2, name = reshaped(out, full), "unary" if len(full) == 2 else "unary_nd"
    kernels.call(kern, name, out.size, code, x2, o2, scalar_of(dtype, p), scalar_of(dtype, 1.0),
                 scalar_of(dtype, 0.0))
    return result(out, kern, (x,), _unary_backward, (code, p, out, x2, name))


def _unary_backward(ctx: _Backward, node: Node, gout: Any) -> None:
    (x,) = node.inputs
    code, p, y, x2, name = node.saved
    kern = x._kern
    if gout is None:
        gout = ones(kern, y.shape, y.dtype)
    dest, beta = ctx.dest(x)
    if len(y.shape) <= 2:
        kernels.call(kern, "unary_backward", y.size, code, x2, view2d(y), view2d(gout),
                     view2d(dest), beta, scalar_of(y.dtype, p))
        return
    two = x2.shape
    kernels.call(kern, name + "_backward", y.size, code, x2, reshaped(y, two),
                 reshaped(gout, two), reshaped(dest, two), beta, scalar_of(y.dtype, p))


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


def pow(x: Any, p: Any) -> Tensor:  # noqa: A001 (ng.pow, as torch.pow)
    """x ** p for a Python real exponent ``p``, or a Python real base ``x``
    raised to a tensor ``p`` (``2.0 ** t``; its gradient p's: x ** p * log(x),
    0 where x == 0 and p >= 0, as PyTorch's), or tensor to tensor with
    broadcasting (nan where x < 0 and p is not an integer, as PyTorch)."""
    if integral(x) or integral(p):    # integers to integer powers stay integers
        if integral(x) and x.dtype.kind != "b" and isinstance(p, numbers.Integral) \
                and not isinstance(p, (bool, np.bool_)):
            # an int exponent is checked, not wrapped into x's dtype, as PyTorch's
            if p < 0:
                raise ValueError(f"pow: integers to negative integer powers are not allowed "
                                 f"(exponent {p}); use floats")
            int_value(p, np.dtype(x.dtype), "pow", wrap=False)
        return _binary(codes.POW_TENSOR, x, p, "pow")
    if is_scalar(x) and not is_scalar(p):
        return _unary(codes.RPOW_S, p, float(x), "pow")
    if not is_scalar(p):     # a tensor exponent: one binary kernel, broadcast
        return _binary(codes.POW_TENSOR, x, p, "pow")
    return _unary(codes.POW, x, float(p), "pow")


def round(x: Any, decimals: int = 0) -> Tensor:  # noqa: A001 (ng.round, as torch.round)
    """Round half to even, as ``torch.round`` and ``np.round``; ``decimals``
    rounds x * 10**decimals and scales back (PyTorch's order: divides by
    10**-decimals first when negative). Gradient 0."""
    if isinstance(decimals, bool) or not isinstance(decimals, (int, np.integer)):
        raise TypeError(f"round: decimals must be an int, got {decimals!r}")
    if decimals == 0:
        return _unary(codes.ROUND, x, 0.0, "round")
    scale = 10.0 ** abs(int(decimals))
    up, down = (codes.MUL_S, codes.DIV_S) if decimals > 0 else (codes.DIV_S, codes.MUL_S)
    return _unary(down, _unary(codes.ROUND, _unary(up, x, scale, "round"), 0.0, "round"),
                  scale, "round")


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
# the codes integer and bool operands keep their dtype through (the integer
# kernels' codes); the others compute in floats, as PyTorch's true division
_INT_BINARY = {codes.ADD: ic.ADD, codes.SUB: ic.SUB, codes.MUL: ic.MUL, codes.MAX: ic.MAX,
               codes.MIN: ic.MIN, codes.FLOOR_DIVIDE: ic.FLOORDIV,
               codes.REMAINDER: ic.REMAINDER, codes.FMOD: ic.FMOD, codes.POW_TENSOR: ic.POW}
_BOOL = np.dtype(np.bool_)
_INT_UNARY = {codes.NEG: ic.NEG, codes.ABS: ic.ABS, codes.SIGN: ic.SIGN}


def _binary(code: int, a: Any, b: Any, op: str | None = None) -> Tensor:
    op = _NAMES[code] if op is None else op   # (ops/activations.py names its own codes)
    if integral(a) or integral(b):
        if code == codes.SUB and _BOOL in (getattr(a, "dtype", None), getattr(b, "dtype", None)):
            raise TypeError(f"{op}: subtracting a bool tensor is not supported (as PyTorch); "
                            "use ^ or logical_xor, or convert it with .long() or .float()")
        icode = _INT_BINARY.get(code)
        a, b = pair(a, b, op, ints=icode is not None)
        if a._data.dtype.kind != "f":
            return _integer.binary(icode, a, b, op)
    elif code in _WITH_SCALAR:
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
        a2, b2, o2, name = view2d(ad), view2d(bd), view2d(out), "binary"
    else:     # N-d: read through strides and broadcasts, merged to as few dims as they allow
        full, (a2, b2) = _merged(kern, shape, (ad, bd))
        o2, name = reshaped(out, full), "binary" if len(full) == 2 else "binary_nd"
    kernels.call(kern, name, out.size, code, a2, b2, o2)
    return result(out, kern, (a, b), _binary_backward, (code, a2, b2, o2.shape, name))


def _binary_backward(ctx: _Backward, node: Node, gout: Any) -> None:
    a, b = node.inputs
    code, a2, b2, full, name = node.saved
    kern = a._kern
    nd = name == "binary_nd"
    name += "_backward"
    # g keeps the pooled seed referenced while only its view is used (see
    # _matmul_backward): otherwise the pool could hand it out as a destination.
    g = gout if gout is not None else ones(kern, full, a._data.dtype)
    g2 = view2d(g) if len(g.shape) <= 2 else reshaped(g, full)
    if a is b:   # x op x: both gradients land in one array, so one at a time
        for first in (True, False):
            dest, beta = ctx.dest(a)
            d2 = reshaped(dest, a2.shape)
            kernels.call(kern, name, g.size, code, a2, b2, g2, d2, beta, first, d2, beta,
                         not first)
        return
    da, beta_a = ctx.dest(a) if a.requires_grad else (None, 0.0)
    db, beta_b = ctx.dest(b) if b.requires_grad else (None, 0.0)
    # An operand that needs no gradient passes its own data (the N-d kernel:
    # the C-contiguous gradient) in its place, never written.
    wa = (g2 if nd else a2) if da is None else reshaped(da, a2.shape)
    wb = (g2 if nd else b2) if db is None else reshaped(db, b2.shape)
    kernels.call(kern, name, g.size, code, a2, b2, g2, wa, beta_a, da is not None, wb, beta_b,
                 db is not None)


def add(a: Any, b: Any) -> Tensor:
    """a + b with NumPy broadcasting (tensors, arrays or Python scalars)."""
    return _binary(codes.ADD, a, b)


def sub(a: Any, b: Any) -> Tensor:
    """a - b with NumPy broadcasting."""
    return _binary(codes.SUB, a, b)


def mul(a: Any, b: Any) -> Tensor:
    """a * b with NumPy broadcasting."""
    return _binary(codes.MUL, a, b)


def div(a: Any, b: Any, *, rounding_mode: str | None = None) -> Tensor:
    """a / b with NumPy broadcasting; ``rounding_mode`` as ``torch.div``:
    "trunc" rounds toward zero (trunc(a / b)), "floor" down (Python's
    ``a // b``, ``floor_divide``); a rounded quotient has no gradient."""
    if rounding_mode is None:
        return _binary(codes.DIV, a, b)
    if rounding_mode == "trunc":
        if integral(a) or integral(b):
            a, b = pair(a, b, "div", ints=True)
            if a._data.dtype.kind != "f":
                return _integer.binary(ic.TRUNCDIV, a, b, "div")
        return _unary(codes.TRUNC, _binary(codes.DIV, a, b), 0.0, "div")
    if rounding_mode == "floor":
        return _binary(codes.FLOOR_DIVIDE, a, b, "div")
    raise ValueError(f"div: rounding_mode must be None, 'trunc' or 'floor', got "
                     f"{rounding_mode!r}")

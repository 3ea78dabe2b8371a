"""``norm``: vector p-norms over any dims (``torch.norm`` /
``torch.linalg.vector_norm``), made of differentiable ops (abs, pow, sum,
amax/amin, where) so that its gradient is theirs; zeros are guarded (a
``where`` on both sides of each root) so that the gradient is 0 there, as
PyTorch's, where sqrt(0)'s infinite slope would make it nan."""
from __future__ import annotations

import math
from typing import Any

from ..tensor import Tensor
from . import activations, elementwise, extrema, masks, reductions
from ._common import alias, operand, real_number


def _root(s: Tensor, p: float) -> Tensor:
    """s ** (1 / p), 0 with gradient 0 where s == 0 (p > 0)."""
    zero = masks.eq(s, 0.0)
    safe = masks.where(zero, 1.0, s)
    r = elementwise.sqrt(safe) if p == 2 else elementwise.pow(safe, 1.0 / p)
    return masks.where(zero, 0.0, r)


def norm(x: Any, p: Any = "fro", dim: Any = None, keepdim: bool = False, *, axis: Any = None,
         keepdims: bool | None = None) -> Tensor:
    """The vector p-norm of ``x`` over ``dim`` (None: every element; an int
    or a tuple), as ``torch.norm`` and ``torch.linalg.vector_norm``:
    (sum |x|^p)^(1/p) for a real p ("fro": 2), max |x| for inf, min |x| for
    -inf, the count of nonzeros for 0 (gradient 0). Its gradient is
    PyTorch's: 0 where the norm is 0 (p > 0), split evenly among ties for
    +-inf. Matrix norms ("nuc", or "fro" as a matrix norm differing from the
    vector one) are not provided; "fro" over any dims is the 2-norm of those
    elements, which is PyTorch's Frobenius norm."""
    op = "norm"
    if axis is not None:
        dim = alias(op, dim, "dim", axis, "axis")
    if keepdims is not None:
        keepdim = alias(op, keepdim or None, "keepdim", keepdims, "keepdims")
    if not isinstance(keepdim, bool):
        raise TypeError(f"{op}: keepdim must be a bool, got {keepdim!r}")
    if isinstance(p, str):
        if p != "fro":
            raise ValueError(f"{op}: p={p!r} is not supported (vector norms only: 'fro', a "
                             "real number, inf or -inf)")
        p = 2.0
    p = real_number(p, op, "p")
    if math.isnan(p):
        raise ValueError(f"{op}: p must not be nan")
    x = operand(x, op)
    a = activations.abs(x)
    if p == math.inf:
        return extrema.amax(a, dim, keepdim)
    if p == -math.inf:
        return extrema.amin(a, dim, keepdim)
    if p == 0:    # 1 per nonzero (nan counts), 0 per zero; the gradient is 0 everywhere
        return reductions.sum(masks.where(masks.ne(x, 0.0), 1.0, x * 0.0), dim, keepdim)
    if p == 1:
        return reductions.sum(a, dim, keepdim)
    if p == 2:
        return _root(reductions.sum(x * x, dim, keepdim), p)
    if 0 < p < 1:     # |x|^p has an infinite slope at 0: guard it as the root
        zero = masks.eq(a, 0.0)
        t = masks.where(zero, 0.0, elementwise.pow(masks.where(zero, 1.0, a), p))
    else:
        t = elementwise.pow(a, p)
    s = reductions.sum(t, dim, keepdim)
    return _root(s, p) if p > 0 else elementwise.pow(s, 1.0 / p)

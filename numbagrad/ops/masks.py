"""Comparisons, ``where`` and ``astype``: the ops that make and use masks.

A comparison returns a boolean tensor on its operands' device that never
carries a gradient; ``where`` takes it as its condition, ``astype`` turns
it into a float mask (arithmetic promotes it, as PyTorch's). Operands are
viewed at one rank, at least ``RANK``, with leading 1s, and broadcast
inside the kernels (one launch a forward, one a gradient): a kernel
compiles once per dtype (integer and bool ones too), not per rank.
"""
from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from .. import _dtypes, buffers, kernels
from ..kernels.cpu.masks import EQ, GE, GT, LE, LT, NE, RANK
from ..tape import Node, _Backward
from ..tensor import _FLOATS, Tensor
from ._common import (broadcast_shape, cast, contiguous, describe, int_value, is_scalar,
                      kept_copy, ones, operand, pair, reshaped, result, scalar_of)

_BOOL = np.dtype(np.bool_)
_NAMES = {LT: "lt", LE: "le", GT: "gt", GE: "ge", EQ: "eq", NE: "ne"}
_FLIP = {LT: GT, LE: GE, GT: LT, GE: LE, EQ: EQ, NE: NE}   # s < x is x > s


def _padded(data: Any, rank: int) -> Any:
    """``data`` (C-contiguous) viewed with leading 1s up to ``rank`` dims;
    rank 1: flat."""
    shape = data.shape if type(data.shape) is tuple else tuple(data.shape)
    if rank == 1:
        return data if len(shape) == 1 else reshaped(data, (data.size,))
    return data if len(shape) == rank else reshaped(data, (1,) * (rank - len(shape)) + shape)


def _mask(out: Any, kern: Any) -> Tensor:
    """A boolean result: never recorded, never requires grad."""
    return result(out, kern, (), None)


def _compare(code: int, a: Any, b: Any) -> Tensor:
    op = _NAMES[code]
    if is_scalar(a) and not is_scalar(b):
        a, b, code = b, a, _FLIP[code]
    with_scalar = is_scalar(b)
    if with_scalar:
        x = operand(a, op, ints=True)
        if x._data.dtype.kind != "f":     # an int tensor beside 2.5 compares in floats
            x = cast(x, _dtypes.result_type(x, b))
        y = x
        if x._data.dtype.kind in "iu" and isinstance(b, numbers.Integral):
            code, s = _exact(code, int(b), x._data.dtype)
        else:
            s = scalar_of(x.dtype, float(b))
    else:
        x, y = pair(a, b, op, ints=True)
        s = scalar_of(x.dtype, 0.0)
    shape = broadcast_shape(x.shape, y.shape, op)
    kern, rank = x._kern, max(len(shape), RANK)
    out = buffers.take(kern, shape, _BOOL)
    kernels.call(kern, "compare", out.size, code, _padded(contiguous(x), rank),
                 _padded(contiguous(y), rank), _padded(out, rank), s, with_scalar)
    return _mask(out, kern)


def _fill_value(v: Any, dtype: np.dtype) -> Any:
    """``where``'s scalar as a ``dtype`` scalar: an integral one into an
    integer dtype exactly (2**53 + 1 stays itself), range-checked as
    PyTorch's fills (``int_value``)."""
    if dtype.kind in "iub" and isinstance(v, numbers.Integral):
        return int_value(v, dtype, "where", wrap=False)
    return scalar_of(dtype, float(v))


def _exact(code: int, b: int, dtype: np.dtype) -> tuple[int, Any]:
    """The comparison ``x <code> b`` of integers of ``dtype`` with the
    integer ``b`` as (code, scalar of dtype): b itself (never through a float,
    which rounds above 2**53), or, for a b outside the dtype's range, a
    comparison with its nearest end that every x answers alike (NumPy 2's
    exact answer: uint8 x == -1 is False, where PyTorch wraps -1 to 255)."""
    info = np.iinfo(dtype)
    if b > info.max:      # x < b holds for every x
        return (LE if code in (LT, LE, NE) else GT), dtype.type(info.max)
    if b < info.min:      # x > b holds for every x
        return (GE if code in (GT, GE, NE) else LT), dtype.type(info.min)
    return code, dtype.type(b)


def lt(a: Any, b: Any) -> Tensor:
    """a < b elementwise with broadcasting: a boolean tensor (no gradient).

    A Python scalar is compared in the tensor's dtype, as PyTorch and NumPy
    2 do, an integer one exactly; an integer outside an integer tensor's
    range gives NumPy 2's exact answer (uint8 x < 256 is all True), where
    PyTorch wraps it into the dtype first (256 becomes 0). Tensors of
    different dtypes are an error (PyTorch would promote).
    """
    return _compare(LT, a, b)


def le(a: Any, b: Any) -> Tensor:
    """a <= b elementwise (see ``lt``)."""
    return _compare(LE, a, b)


def gt(a: Any, b: Any) -> Tensor:
    """a > b elementwise (see ``lt``)."""
    return _compare(GT, a, b)


def ge(a: Any, b: Any) -> Tensor:
    """a >= b elementwise (see ``lt``)."""
    return _compare(GE, a, b)


def eq(a: Any, b: Any) -> Tensor:
    """a == b elementwise (see ``lt``); nan equals nothing, as IEEE says."""
    return _compare(EQ, a, b)


def ne(a: Any, b: Any) -> Tensor:
    """a != b elementwise (see ``lt``)."""
    return _compare(NE, a, b)


def _condition(cond: Any, kern: Any) -> Tensor:
    """``where``'s condition as a boolean tensor on ``kern``'s device (None:
    the condition's own)."""
    if isinstance(cond, Tensor):
        t = cond
    elif isinstance(cond, np.ndarray) and cond.dtype == _BOOL:
        if kern is not None and kern.name != "cpu":
            raise ValueError(f"where: the condition is a host array (shape {cond.shape}) but "
                             f"the values are on {kern.name}; pass a comparison's result or "
                             "a cuda tensor")
        # (the backward reads the condition again: kept_copy)
        t = Tensor(kept_copy(np.ascontiguousarray(cond), cond), kernels.get("cpu"))
    elif kern is not None and kern.is_device_array(cond) and cond.dtype == _BOOL:
        t = Tensor(cond, kern)
    else:
        raise TypeError(f"where: the condition must be a boolean tensor or array (a "
                        f"comparison such as x > 0), got {_what(cond)}")
    if t.dtype != _BOOL:
        raise TypeError(f"where: the condition must be boolean, got a tensor of {describe(t)}; "
                        "compare it (x != 0) to make a mask")
    if kern is not None and t._kern is not kern:
        raise ValueError(f"where: the condition is on {t.device} (shape {t.shape}) but the "
                         f"values are on {kern.name}")
    return t


def _what(x: Any) -> str:
    if isinstance(x, Tensor):
        return f"a tensor of {describe(x)}"
    dtype = getattr(x, "dtype", None)
    return f"{type(x).__name__}" + (f" of dtype {dtype}" if dtype is not None else "")


def where(cond: Any, a: Any, b: Any) -> Tensor:
    """``a`` where ``cond`` is true, else ``b``, all three broadcast together.

    ``cond`` is a boolean tensor (a comparison) or boolean array; ``a`` and
    ``b`` are tensors, arrays or Python scalars of one dtype and device. The
    gradient goes to ``a`` where ``cond`` holds and to ``b`` elsewhere
    (summed over broadcast dims), as ``torch.where``; two scalars give a
    float64 tensor on the condition's device (PyTorch: its default dtype).
    As in PyTorch the condition must be boolean (NumPy's ``np.where`` takes
    any truth values); ``np.where(cond, a, b)`` on tensors runs this op.
    """
    sa, sb = is_scalar(a), is_scalar(b)
    if sa and sb:
        c = _condition(cond, None)
        kern, dtype, values = c._kern, np.dtype(np.float64), ()
        shapes = ()
    elif sa or sb:
        t = operand(b if sa else a, "where", "second value" if sa else "first value", ints=True)
        t = cast(t, _dtypes.result_type(t, a if sa else b))
        c = _condition(cond, t._kern)
        kern, dtype, values, shapes = t._kern, t.dtype, (t,), (t.shape,)
    else:
        ta, tb = pair(a, b, "where", ("first value", "second value"), ints=True)
        c = _condition(cond, ta._kern)
        kern, dtype, values, shapes = ta._kern, ta.dtype, (ta, tb), (ta.shape, tb.shape)
    shape = c.shape
    for s in shapes:
        shape = broadcast_shape(shape, s, "where")
    rank = max(len(shape), RANK)
    out = buffers.take(kern, shape, dtype)
    o = _padded(out, rank)
    datas = [_padded(contiguous(t), rank) for t in values]
    cd = _padded(contiguous(c), rank)
    pa = o if sa else datas[0]
    pb = o if sb else datas[-1]
    mode = (1 if sa else 0) | (2 if sb else 0)
    kernels.call(kern, "where", out.size, cd, pa, pb, o, _fill_value(a if sa else 0, dtype),
                 _fill_value(b if sb else 0, dtype), mode)
    picks = (True, False) if len(values) == 2 else ((False,) if sa else (True,))
    # the condition rides along as the last input (picks leave it out): a write into
    # it before the backward is refused, as any input's (tape._check_unmodified)
    return result(out, kern, values + (c,), _where_backward, (cd, shape, picks))


def _where_backward(ctx: _Backward, node: Node, gout: Any) -> None:
    cond, shape, picks = node.saved
    kern, rank = node.inputs[0]._kern, len(cond.shape)
    g = gout if gout is not None else ones(kern, shape, node.inputs[0].dtype)
    g = _padded(g, rank)    # (keeps a seed referenced while only its view is used)
    for t, pick in zip(node.inputs, picks):
        if t.requires_grad:    # one at a time: where(c, x, x) adds into one array
            dest, beta = ctx.dest(t)
            kernels.call(kern, "where_backward", dest.size, cond, g, _padded(dest, rank), beta,
                         pick)


def astype(x: Any, dtype: Any, copy: bool = False) -> Tensor:
    """``x`` cast to ``dtype`` (any a tensor holds: float32, float64, the
    integers, bool), as PyTorch's ``.to(dtype)``: differentiable between
    floats (the gradient is cast back); any other cast carries no gradient
    (floats to integers round toward zero, anything to bool is ``!= 0``).
    The same dtype returns ``x`` itself (no copy, as PyTorch's ``.to``;
    NumPy's ``astype`` would copy) unless ``copy`` (``clone()``)."""
    x = x if isinstance(x, Tensor) else operand(x, "astype", ints=True)
    if dtype is None:     # (np.dtype(None) would be float64)
        raise TypeError(f"astype: None is not a dtype (tensor of {describe(x)})")
    try:
        want = _dtypes.tensor_dtype(dtype, "astype")
    except TypeError as exc:
        raise TypeError(f"{exc} (tensor of {describe(x)})") from None
    if want == x.dtype and not copy:
        return x
    if (want.itemsize == 2 or x.dtype.itemsize == 2) \
            and (want in _dtypes.HALVES or x.dtype in _dtypes.HALVES):
        from ._half import cast as half_cast   # (half builds on this module)
        return half_cast(x, want, copy)
    kern = x._kern
    out = buffers.take(kern, x.shape, want)
    data = contiguous(x)
    if want == _BOOL and x.dtype != _BOOL:    # != 0 (a plain cast could round 0.5 to False)
        kernels.call(kern, "compare", out.size, NE, _padded(data, RANK), _padded(data, RANK),
                     _padded(out, RANK), x.dtype.type(0), True)
    else:
        kernels.call(kern, "astype", out.size, _padded(data, 1), _padded(out, 1), 0.0)
    if x.dtype not in _FLOATS or want not in _FLOATS:
        return _mask(out, kern)
    return result(out, kern, (x,), _astype_backward, (want,))


def _astype_backward(ctx: _Backward, node: Node, gout: Any) -> None:
    (x,) = node.inputs
    dest, beta = ctx.dest(x)
    g = gout if gout is not None else ones(x._kern, x.shape, node.saved[0])
    kernels.call(x._kern, "astype", dest.size, _padded(g, 1), _padded(dest, 1), beta)

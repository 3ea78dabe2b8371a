"""What every op shares: operand checks, 2-D views, and building results."""
from __future__ import annotations

import math
import numbers
import operator
from types import ModuleType
from typing import Any

import numpy as np

from .. import _defaults, _dtypes, buffers, kernels, tape
from ..tape import output
from ..tensor import Tensor, coerce


# the float dtypes' canonical objects: the hot paths test identity (anything
# else, equal or not, takes the checked path)
_F32, _F64 = np.dtype(np.float32), np.dtype(np.float64)


def is_scalar(value: Any) -> bool:
    """A Python or NumPy real number (not an array, not a tensor)."""
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


class IndexDtypeError(IndexError, TypeError):
    """Float or bool arrays given as integer indices: an IndexError, as
    PyTorch raises, and a TypeError (what numbagrad raised before)."""


class ArgumentLengthError(ValueError, TypeError):
    """A tuple argument of the wrong length (``padding=(1, 1, 1)`` for a 2-D
    op): a ValueError, as PyTorch raises, and a TypeError (numbagrad's
    earlier class for it)."""


def describe(t: Tensor) -> str:
    return f"shape {t.shape}, {t.dtype}, on {t.device}"


def integral(x: Any) -> bool:
    """Whether ``x`` (a tensor or an array) holds integers or bools."""
    dtype = getattr(x, "dtype", None)
    return dtype is not None and dtype is not _F32 and dtype is not _F64 \
        and np.dtype(dtype).kind in "biu"


def cast(t: Tensor, dtype: np.dtype) -> Tensor:
    """``t`` in ``dtype``: recorded between floats (the gradient is cast
    back), a plain copy from an integer or bool tensor (no gradient)."""
    if t._data.dtype == dtype:
        return t
    from .masks import astype     # (masks builds on this module)
    return astype(t, dtype)


def refuse_bool(t: Tensor, op: str) -> Tensor:
    """``t``, unless it is a boolean tensor (a comparison's mask), which the
    ops that compute in floats refuse as PyTorch's do (``relu``, ``matmul``,
    the losses): a TypeError that says how to make it a float mask."""
    if t._data.dtype == np.bool_:
        raise TypeError(f"{op}: a boolean tensor ({describe(t)}) cannot be used here; "
                        "make it a float mask with mask.astype(np.float32) (or np.float64)")
    return t


def operand(x: Any, op: str, what: str = "input", ints: bool = False) -> Tensor:
    """One operand as a Tensor (host data is copied for "cpu" only). An op
    that computes in floats (``ints`` False) takes an integer tensor in the
    default float dtype (as ``torch.exp(ints)``) and refuses a bool one;
    with ``ints`` the op takes them as they are."""
    if type(x) is not Tensor:
        x = coerce(x, kernels.get("cpu"), f"{op}: {what}")
    dtype = x._data.dtype
    # (identity is the quick test; an equal dtype object, as a memmap's, is a float too,
    # and so is a half: an op that is not half-aware then meets it as it is)
    if ints or dtype is _F64 or dtype is _F32 or _dtypes.is_float(dtype):
        return x
    return cast(refuse_bool(x, op), _defaults.get_default_dtype())


def pair(a: Any, b: Any, op: str, names: tuple = ("first operand", "second operand"),
         ints: bool = False, promote: bool = True) -> tuple[Tensor, Tensor]:
    """Both operands as tensors on one device with one dtype, PyTorch's
    ``result_type`` (``numbagrad/_dtypes.py``): a Python (or NumPy) number
    never changes a tensor's dtype within its category (``ng.maximum(x32,
    0)`` stays float32, where NumPy would promote), an int tensor beside a
    float one becomes that float. Integers and bools become the default
    float unless ``ints`` (the ops that compute on them); ``promote=False``
    (matmul, conv, the losses, as PyTorch): two floats of different widths
    and bool tensors are errors."""
    if type(a) is Tensor and type(b) is Tensor and a._kern is b._kern:
        dtype = a._data.dtype
        if (dtype is _F64 or dtype is _F32) and b._data.dtype is dtype:
            return a, b
    want = _dtypes.result_type(*(v if isinstance(v, Tensor) or _number(v)
                                 else np.asarray(v) for v in (a, b)))
    if not ints and want.kind != "f":
        want = _defaults.get_default_dtype()
    if isinstance(a, Tensor) and _number(b):
        b = _number_like(b, want, a._kern, op)
    elif isinstance(b, Tensor) and _number(a):
        a = _number_like(a, want, b._kern, op)
    if isinstance(a, Tensor):
        b = coerce(b, a._kern, f"{op}: {names[1]}")
    else:
        if not isinstance(b, Tensor):
            b = coerce(b, kernels.get("cpu"), f"{op}: {names[1]}")
        a = coerce(a, b._kern, f"{op}: {names[0]}")
    if a._kern is not b._kern:
        raise ValueError(f"{op}: operands are on different devices: {names[0]} on "
                         f"{a.device} (shape {a.shape}), {names[1]} on {b.device} "
                         f"(shape {b.shape})")
    if not promote:
        refuse_bool(a, op)
        refuse_bool(b, op)
    if not promote and a.dtype != b.dtype and _dtypes.is_float(a.dtype) \
            and _dtypes.is_float(b.dtype):
        raise TypeError(f"{op}: dtypes differ: {names[0]} {a.dtype} (shape {a.shape}), "
                        f"{names[1]} {b.dtype} (shape {b.shape}); convert one with "
                        "ng.tensor(x, dtype=...)")
    return cast(a, want), cast(b, want)


def _number(value: Any) -> bool:
    """A Python or NumPy number or bool (an operand ``result_type`` treats
    as a number, not as a tensor)."""
    return is_scalar(value) or isinstance(value, (bool, np.bool_))


def index_data(value: Any) -> Any:
    """An integer tensor given as indices (or a key item) as its array (a
    0-d one as its int), so index arrays and int64 tensors are taken alike;
    anything else as it is."""
    if isinstance(value, Tensor) and value.dtype.kind in "iu":
        return int(value.item()) if value.shape == () else value.data
    return value


def real_number(value: Any, op: str, what: str) -> float:
    """``value`` as a float, or a TypeError naming ``op`` and the argument."""
    if not is_scalar(value):
        raise TypeError(f"{op}: {what} must be a real number, got {value!r}")
    return float(value)


def kept_copy(array: Any, caller: Any) -> Any:
    """What an op's backward reads again of a caller's host array: ``array``
    (made from ``caller``), or a copy when it is the caller's own memory and
    an eager tape records, so that writing the caller's array before the
    backward cannot move the gradient (under ``ng.compile``'s recorder the
    backward runs in the same call: no copy)."""
    if array is caller and tape._state.box[0] > 0 and kernels._observer is None:
        return array.copy()
    return array


def int_value(value: Any, dtype: np.dtype, op: str, wrap: bool = True) -> Any:
    """An integral number as a scalar of the integer (or bool) ``dtype``,
    exactly (never through a float: 2**53 + 1 stays itself). ``wrap``: as
    PyTorch wraps a Python int beside a narrower integer tensor in
    arithmetic (uint8 + 300 is 44); else, as PyTorch's fills and exponents,
    only a value of the dtype's range, or of its signed twin's for an
    unsigned dtype (-1 fills a uint8 as 255), and an OverflowError
    otherwise. A number outside int64 and uint64 is an OverflowError."""
    if dtype.kind != "b" and not wrap:
        info = np.iinfo(dtype)
        low = -(info.max // 2) - 1 if dtype.kind == "u" else info.min
        if not low <= value <= info.max:
            raise OverflowError(f"{op}: {value} cannot be converted to {dtype} without "
                                f"overflow")
    try:
        wide = np.array(value, np.uint64 if value > np.iinfo(np.int64).max else np.int64)
    except OverflowError:
        raise OverflowError(f"{op}: the integer {value} is outside int64 and uint64, so it "
                            f"cannot meet a {dtype} tensor") from None
    return wide.astype(dtype)[()]


def _number_like(value: Any, dtype: np.dtype, kern: ModuleType, op: str = "a tensor op"
                 ) -> Tensor:
    """A number as a 0-d tensor of ``dtype`` on ``kern``'s device (an integral
    one wrapped into an integer dtype as PyTorch's, ``int_value``)."""
    if dtype.kind in "iub" and isinstance(value, numbers.Integral):
        value = int_value(value, dtype, op)
    host = np.array(value, dtype)
    return Tensor(host if kern.name == "cpu" else kernels.from_host(kern, host), kern)


def as2d(shape: tuple) -> tuple:
    """The 2-D form every elementwise kernel sees: a vector is one row, an
    N-d (C-contiguous) array one row of all its elements."""
    n = len(shape)
    if n == 2:
        return shape
    if n == 1:
        return (1, shape[0])
    return (1, math.prod(shape))


def collapse(shape: tuple, *operands: tuple) -> tuple[tuple, list[tuple]]:
    """The fewest dims that describe broadcasting C-contiguous ``operands``
    (shapes, right-aligned as NumPy aligns them) to ``shape``: (the collapsed
    shape, each operand's collapsed shape). Dims of size 1 are dropped and
    adjacent dims merged where every operand is broadcast along both or
    along neither, so ``(B, T, C) + (C,)`` is ``(B*T, C) + (1, C)``."""
    rank = len(shape)
    padded = [(1,) * (rank - len(s)) + tuple(s) for s in operands]
    dims: list[list] = []   # [size, which operands are broadcast along it]
    for d, n in enumerate(shape):
        if n == 1:
            continue
        flags = tuple(p[d] == 1 for p in padded)
        if dims and dims[-1][1] == flags:
            dims[-1][0] *= n
        else:
            dims.append([n, flags])
    return (tuple(n for n, _ in dims),
            [tuple(1 if f[i] else n for n, f in dims) for i in range(len(operands))])


def padded2d(shape: tuple) -> tuple:
    """A collapsed shape of at most 2 dims as 2 dims (leading 1s)."""
    return (1,) * (2 - len(shape)) + shape


def reshaped(array: Any, shape: tuple) -> Any:
    """``array.reshape(shape)`` as a view that keeps ``array`` referenced.

    A NumPy view references its base; a Numba device array's view does not,
    and the buffer pool decides that an array is free from its references,
    so a pooled array seen only through such a view could be handed out
    again while the view is still being read.
    """
    view = array.reshape(shape)
    if type(view) is not np.ndarray:
        view._numbagrad_base = array
    return view


def permuted(array: Any, axes: tuple) -> Any:
    """``array.transpose(axes)`` as a strided view on either device (a Numba
    device array's own ``transpose`` takes 2-D arrays only, and copies); the
    device view keeps ``array`` referenced, as ``reshaped``'s does."""
    if isinstance(array, np.ndarray):
        return array.transpose(axes)
    return kernels.get("cuda").as_strided(array, tuple(array.shape[a] for a in axes),
                                          tuple(array.strides[a] for a in axes), 0)


def view2d(array: Any) -> Any:
    shape = array.shape
    return array if len(shape) == 2 else reshaped(array, as2d(shape))


def broadcast_shape(sa: tuple, sb: tuple, op: str) -> tuple:
    """NumPy's broadcast of two shapes, or a clear error."""
    if sa == sb:
        return sa
    n = max(len(sa), len(sb))
    pa, pb = (1,) * (n - len(sa)) + sa, (1,) * (n - len(sb)) + sb
    out = []
    for x, y in zip(pa, pb):
        if x != y and x != 1 and y != 1:
            raise ValueError(f"{op}: shapes {sa} and {sb} cannot be broadcast together")
        out.append(y if x == 1 else x)
    return tuple(out)


def contiguous(t: Tensor) -> Any:
    """``t``'s data, C-contiguous (a pooled copy when it is a strided view)."""
    return contiguous_array(t._kern, t._data)


def contiguous_array(kern: ModuleType, data: Any) -> Any:
    """``data`` (a device array of ``kern``) C-contiguous: itself, or a pooled copy."""
    if kern.is_c_contiguous(data):
        return data
    copy = buffers.take(kern, data.shape, data.dtype)
    # the copy kernel, not unary's identity: unary compiles its whole ladder of
    # codes for each layout and dtype it meets, a copy needs none of it
    copy_strided(kern, data, copy)
    return copy


def copy_strided(kern: ModuleType, view: Any, out: Any, alpha: float = 1.0,
                 beta: float = 0.0) -> None:
    """out = alpha * view + beta * out for a strided (or broadcast: stride 0)
    ``view`` of ``out``'s shape, ``out`` C-contiguous: adjacent dims are merged
    where the view's strides allow, so any rank fits the N-d kernels."""
    if out.size == 0:
        return
    shape: list[int] = []
    strides: list[int] = []
    for n, st in zip(view.shape, view.strides):
        if n == 1:
            continue
        if shape and strides[-1] == st * n:
            shape[-1] *= n
            strides[-1] = st
        else:
            shape.append(int(n))
            strides.append(int(st))
    if not shape:
        shape, strides = [1], [view.dtype.itemsize]
    if isinstance(view, np.ndarray):
        src = view.reshape(shape)      # a view: the merged dims' strides allow it
    else:
        src = kern.as_strided(view, tuple(shape), tuple(strides), 0)
    kernels.call(kern, "expand_nd", out.size, src, reshaped(out, tuple(shape)), alpha, beta)


def broadcast_into(kern: ModuleType, data: Any, shape: tuple, out: Any = None,
                   alpha: float = 1.0, beta: float = 0.0) -> Any:
    """``data`` broadcast to ``shape`` (C-contiguous; into ``out`` with
    ``out = alpha * data + beta * out`` when given, else a pooled array)."""
    if out is None:
        out = buffers.take(kern, shape, data.dtype)
    src = reshaped(contiguous_array(kern, data), (1,) * (len(shape) - len(data.shape))
                   + tuple(data.shape)) if len(data.shape) < len(shape) else data
    if out.size:
        full, (part,) = collapse(shape, src.shape)
        if len(full) == 0:
            full, part = (1,), (1,)
        if kern.is_c_contiguous(src):
            src = reshaped(src, part)
            dst = reshaped(out, full)
        else:
            dst = out
        kernels.call(kern, "expand_nd", out.size, src, dst, alpha, beta)
    return out


def reduce_into(kern: ModuleType, g: Any, dest: Any, scale: float, beta: float) -> None:
    """dest = scale * (g summed to ``dest``'s shape, NumPy broadcasting in
    reverse) + beta * dest, for a C-contiguous ``g`` of any rank."""
    shape = tuple(g.shape)
    full, (part,) = collapse(shape, tuple(dest.shape))
    if len(full) <= 2:
        kernels.call(kern, "sum_to", g.size, reshaped(g, padded2d(full)),
                     reshaped(dest, padded2d(part)), scale, beta)
    else:
        kernels.call(kern, "sum_to_nd", g.size, reshaped(g, full), reshaped(dest, part),
                     scale, beta)


def ones(kern: ModuleType, shape: tuple, dtype: Any) -> Any:
    """A pooled array of ones: the seed gradient of a one-element loss."""
    array = buffers.take(kern, shape, dtype)
    kernels.call(kern, "fill", 0, array, 1.0)
    return array


_OWN = object()


def result(data: Any, kern: ModuleType, inputs: tuple, backward: Any, saved: tuple = (),
           pool: Any = _OWN) -> Tensor:
    """The op's output tensor, recorded on the tape when any input needs a
    gradient. ``data`` is a pooled array, or a view of the pooled ``pool``
    (None: of an array the pool does not own)."""
    if pool is _OWN:
        pool = data
    if tape._state.box[0] > 0:
        for t in inputs:
            if t.requires_grad:
                return output(data, kern, pool, backward, inputs, saved)
    return output(data, kern, pool)


def scalar_of(dtype: Any, value: float) -> Any:
    """``value`` as a scalar of ``dtype``, so float32 kernels stay float32."""
    return dtype.type(value)


def mean_scale(count: int) -> float:
    """1 / count, the scale of a mean: nan over nothing (the kernels' empty
    sum, 0, times nan), as PyTorch and NumPy."""
    return 1.0 / count if count else math.nan


def axis_of(axis: Any, ndim: int, op: str, what: str = "axis") -> int:
    """``axis`` in [-ndim, ndim) as a non-negative int; else NumPy's
    ``AxisError`` (an IndexError, as PyTorch raises, and a ValueError)."""
    try:
        a = operator.index(axis)
    except TypeError:
        raise TypeError(f"{op}: {what} must be an integer, got {axis!r}") from None
    if not -ndim <= a < ndim:
        raise np.exceptions.AxisError(f"{op}: {what} {a} is out of range for a tensor of "
                                      f"{ndim} dims (expected [{-ndim}, {ndim - 1}])")
    return a % ndim


def alias(op: str, value: Any, name: str, alias_value: Any, alias_name: str) -> Any:
    """``alias_value`` (PyTorch's ``dim=``/``keepdim=``, given) in place of
    ``value`` (NumPy's ``axis=``/``keepdims=``), which must be unset (None):
    giving both is a TypeError naming the op."""
    if value is not None:
        raise TypeError(f"{op}: got both {name}={value!r} and {alias_name}={alias_value!r}; "
                        f"{alias_name}= is PyTorch's name for {name}=, give one")
    return alias_value


def axes_of(x: Tensor, axis: Any, op: str) -> tuple[int, ...]:
    """``axis`` (None, an int or a tuple of ints, negative allowed) as the
    sorted non-negative axes of ``x`` it names; None names every axis."""
    ndim = x.ndim
    if axis is None:
        return tuple(range(ndim))
    items = axis if isinstance(axis, tuple) else (axis,)
    if not items:
        raise ValueError(f"{op}: an empty tuple of axes reduces nothing (tensor of "
                         f"{describe(x)})")
    found: set[int] = set()
    for a in items:
        if not isinstance(a, (int, np.integer)) or isinstance(a, (bool, np.bool_)):
            raise TypeError(f"{op}: axis must be None, an int or a tuple of ints, got {axis!r}")
        if not -ndim <= a < ndim:
            raise np.exceptions.AxisError(f"{op}: axis {a} is out of range for a tensor of "
                                          f"{describe(x)}")
        if int(a) % ndim in found:
            raise ValueError(f"{op}: axis {axis!r} names axis {int(a) % ndim} twice")
        found.add(int(a) % ndim)
    return tuple(sorted(found))


def check_reduction(op: str, reduction: Any) -> bool:
    """True for a reduced loss ("mean", "sum"), False for "none"; else an error."""
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"{op}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    return reduction != "none"

"""NumPy functions on tensors (``Tensor.__array_function__``).

A NumPy function that an op answers to (its op-table row's ``numpy=``
names: ``ops.table.FUNCTIONS``) runs that op, recorded on the tape, with
NumPy's arguments adapted to the op's; any other NumPy function given a
tensor raises a TypeError naming the ng alternative (or saying there is
none), so a tensor never leaves the graph silently. ``np.asarray(t)`` and
``np.array(t)`` still give the data; ``np.shape``, ``np.ndim`` and
``np.size`` read the tensor's.
"""
from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import numpy as np

from ..tensor import Tensor
from ._common import axis_of


def _flat(x: Any) -> Any:
    return _op("reshape")(x, -1)


def _concatenate(fn, arrays, axis=0):
    if axis is None:
        return fn([_flat(a) for a in arrays], 0)
    return fn(list(arrays), axis)


def _stack(fn, arrays, axis=0):
    return fn(list(arrays), axis)


def _split(fn, ary, indices_or_sections, axis=0):
    return fn(ary, indices_or_sections, axis)


def _take(fn, a, indices, axis=None):
    if axis is None:
        return fn(_flat(a), indices)
    return fn(a, (slice(None),) * axis_of(axis, np.ndim(a), "numpy.take") + (indices,))


def _take_along_axis(fn, arr, indices, axis=-1):
    """NumPy's take_along_axis broadcasts ``indices`` against ``arr`` along the
    other axes, where torch.gather (ng.gather) reads them as given: broadcast
    a host index array first (a device one must have the full shape)."""
    if axis is None:
        return fn(_flat(arr), 0, indices)
    if isinstance(indices, np.ndarray) and indices.ndim == arr.ndim:
        ax = axis % arr.ndim if -arr.ndim <= axis < arr.ndim else axis
        shape = tuple(n if d == ax else m for d, (n, m) in
                      enumerate(zip(indices.shape, arr.shape)))
        try:
            indices = np.broadcast_to(indices, shape)
        except ValueError:
            raise ValueError(f"numpy.take_along_axis on a numbagrad Tensor: indices of shape "
                             f"{indices.shape} do not broadcast against the tensor's "
                             f"{arr.shape} along the axes other than {axis}") from None
    return fn(arr, axis, indices)


def _reshape(fn, a, shape=None, order="C", *, newshape=None, copy=None):
    if order != "C" or copy is not None:
        raise TypeError("numpy.reshape on a numbagrad Tensor: only order='C' and copy=None "
                        f"(got order={order!r}, copy={copy!r}); use ng.reshape")
    return fn(a, newshape if shape is None else shape)


def _transpose(fn, a, axes=None):
    return fn(a, tuple(range(np.ndim(a)))[::-1] if axes is None else tuple(axes))


def _squeeze(fn, a, axis=None):
    return fn(a, axis)


def _expand_dims(fn, a, axis):
    axes = tuple(axis) if isinstance(axis, (tuple, list)) else (axis,)
    n = np.ndim(a) + len(axes)
    where = sorted(axis_of(x, n, "numpy.expand_dims") for x in axes)
    if len(set(where)) != len(where):
        raise ValueError(f"numpy.expand_dims: repeated axis in {axis!r}")
    for x in where:     # in increasing order, each lands where it is asked
        a = fn(a, x)
    return a


def _broadcast_to(fn, array, shape, subok=False):
    return fn(array, shape)


def _reduction(fn, a, axis=None, dtype=None, out=None, keepdims=False):
    what = f"numpy.{fn.__name__} on a numbagrad Tensor of {a.dtype}"
    if out is not None:
        raise TypeError(f"{what}: out= is not supported (ops return new tensors)")
    if dtype is not None and np.dtype(dtype) != a.dtype:
        raise TypeError(f"{what}: dtype={np.dtype(dtype)} is not supported (ops never "
                        "convert; use x.astype first)")
    return fn(a, axis, keepdims)


def _matmul(fn, x1, x2):
    return fn(x1, x2)


def _where(fn, condition, x=None, y=None):
    if x is None or y is None:
        raise TypeError("numpy.where(condition) with one argument (the indices where it "
                        "holds) has no ng op: use np.nonzero(mask.numpy())")
    return fn(condition, x, y)


def _pad(fn, array, pad_width, mode="constant", constant_values=0.0):
    if mode not in ("constant", "reflect", "edge", "wrap") or np.ndim(constant_values) != 0:
        raise TypeError(f"numpy.pad on a numbagrad Tensor: only the modes 'constant' (with one "
                        f"constant value), 'reflect', 'edge' and 'wrap' (got mode={mode!r}); "
                        f"use ng.pad(x, pad_width, value, mode)")
    return fn(array, pad_width, value=float(constant_values), mode=mode)


def _einsum(fn, subscripts, *operands, out=None, optimize=False):
    if out is not None:
        raise TypeError("numpy.einsum on a numbagrad Tensor: out= is not supported (ops return "
                        "new tensors)")
    return fn(subscripts, *operands)


def _isclose(fn, a, b, rtol=1e-05, atol=1e-08, equal_nan=False):
    return fn(a, b, rtol, atol, equal_nan)


def _flip(fn, m, axis=None):
    return fn(m, tuple(range(np.ndim(m))) if axis is None else axis)


def _band(fn, m, k=0):
    return fn(m, k)


def _roll(fn, a, shift, axis=None):
    return fn(a, shift, axis)


def _repeat(fn, a, repeats, axis=None):
    return fn(a, repeats, axis)


def _tile(fn, A, reps):    # noqa: N803 (NumPy's name)
    return fn(A, reps)


def _diagonal(fn, a, offset=0, axis1=0, axis2=1):
    return fn(a, offset, axis1, axis2)


def _diag(fn, v, k=0):
    return fn(v, k)


def _like_options(name: str, order: str, shape: Any, device: Any) -> None:
    if order not in ("K", "C") or shape is not None or device not in (None, "cpu"):
        raise TypeError(f"numpy.{name} on a numbagrad Tensor: only dtype= (got "
                        f"order={order!r}, shape={shape!r}, device={device!r}); use ng.{name}")


def _like(fn, a, dtype=None, order="K", subok=True, shape=None, *, device=None):
    _like_options(fn.__name__, order, shape, device)
    return fn(a, dtype=dtype)


def _full_like(fn, a, fill_value, dtype=None, order="K", subok=True, shape=None, *,
               device=None):
    _like_options("full_like", order, shape, device)
    return fn(a, fill_value, dtype=dtype)


# NumPy function name -> (the ng op expected to answer it, the adapter that
# calls ``fn`` with NumPy's arguments)
ADAPTERS: dict[str, tuple[str, Callable]] = {
    "concatenate": ("ng.concatenate", _concatenate), "stack": ("ng.stack", _stack),
    "split": ("ng.split", _split), "take": ("indexing, x[key]", _take),
    "take_along_axis": ("ng.gather", _take_along_axis), "reshape": ("ng.reshape", _reshape),
    "transpose": ("ng.permute", _transpose), "squeeze": ("ng.squeeze", _squeeze),
    "expand_dims": ("ng.unsqueeze", _expand_dims),
    "broadcast_to": ("ng.broadcast_to", _broadcast_to), "sum": ("ng.sum", _reduction),
    "mean": ("ng.mean", _reduction), "matmul": ("ng.matmul", _matmul),
    "where": ("ng.where", _where), "pad": ("ng.pad", _pad),
    "isclose": ("ng.isclose", _isclose), "flip": ("ng.flip", _flip),
    "einsum": ("ng.einsum", _einsum),
    "tril": ("ng.tril", _band), "triu": ("ng.triu", _band), "roll": ("ng.roll", _roll),
    "repeat": ("ng.repeat_interleave", _repeat), "tile": ("ng.tile", _tile),
    "diagonal": ("ng.diagonal", _diagonal), "diag": ("ng.diag", _diag),
    "zeros_like": ("ng.zeros_like", _like), "ones_like": ("ng.ones_like", _like),
    "empty_like": ("ng.empty_like", _like), "full_like": ("ng.full_like", _full_like),
}

# NumPy functions with no op: what to use instead
_NONE = "numbagrad has no {} (no ng alternative); t.numpy() gives the data"
HINTS = {
    "dot": "use ng.matmul or @", "inner": "use ng.sum(a * b, axis=-1)",
    "outer": "use a[:, None] * b", "tensordot": "use ng.matmul after a reshape",
"ravel": "use ng.reshape(x, -1)",
    "moveaxis": "use ng.permute", "swapaxes": "use ng.transpose",
    "clip": "use ng.clip(x, lo, hi)",
    "max": "use ng.amax(x, axis)", "amax": "use ng.amax(x, axis)",
    "min": "use ng.amin(x, axis)", "amin": "use ng.amin(x, axis)",
    "argmax": "use ng.argmax(x, axis) (an index array, no gradient)",
    "argmin": "use ng.argmin(x, axis) (an index array, no gradient)",
    "nonzero": "it is not differentiable: np.nonzero(mask.numpy())",
    "var": "use ng.var(x, axis, correction=ddof)", "std": "use ng.std(x, axis, correction=ddof)",
    "cumsum": "use ng.cumsum(x, axis)", "prod": "use ng.prod(x, axis)",
    "cumprod": "use ng.cumprod(x, axis)",
    "hstack": "use ng.concatenate(tensors, axis=1)",
    "vstack": "use ng.concatenate(tensors, axis=0)",
    "copy": "use x * 1.0 (a recorded copy) or t.numpy() (the data)",
    "allclose": "compare the data: np.allclose(t.numpy(), ...)",
    "array_equal": "compare the data: np.array_equal(t.numpy(), ...)",
    "linalg.norm": "use ng.norm(x, p, dim) (vector norms)",
    "astype": "use x.astype(dtype)", "copyto": "tensors are written by ops only",
}
_META = {"shape": lambda a: a.shape, "ndim": lambda a: a.ndim, "size": lambda a: a.size}


def _name(func: Callable) -> str:
    """``func``'s NumPy name ("linalg.norm"), or "" when it is not NumPy's."""
    module = getattr(func, "__module__", "") or ""
    name = getattr(func, "__name__", "")
    if module == "numpy" or getattr(np, name, None) is func:
        return name
    if module.startswith("numpy."):
        sub = module.split(".")[1]
        if getattr(getattr(np, sub, None), name, None) is func:
            return f"{sub}.{name}"
    return ""


def dispatch(func: Callable, args: tuple, kwargs: dict) -> Any:
    """Run NumPy function ``func`` on tensors: the op that answers it, or a
    TypeError naming the alternative (raised before anything runs)."""
    from .table import FUNCTIONS     # (the table imports the ops, which import Tensor)
    name = _name(func)
    if name in _META and len(args) == 1 and not kwargs and isinstance(args[0], Tensor):
        return _META[name](args[0])
    target = ADAPTERS.get(name)
    fn = FUNCTIONS.get(name)
    if target is None or fn is None:
        label = f"numpy.{name}" if name else getattr(func, "__qualname__", repr(func))
        if target is not None:
            alt = f"it runs {target[0]}, which this build does not have yet"
        else:
            alt = HINTS.get(name, "numbagrad has no op for it (no ng alternative); "
                                  "np.asarray(t) or t.numpy() gives the data")
        raise TypeError(f"{label} is not differentiable on a numbagrad Tensor and would "
                        f"leave the graph: {alt}")
    adapter = target[1]
    try:
        inspect.signature(adapter).bind(fn, *args, **kwargs)
    except TypeError as exc:
        shown = str(inspect.signature(adapter)).replace("(fn, ", "(", 1)
        raise TypeError(f"numpy.{name} on a numbagrad Tensor takes {name}{shown}: "
                        f"{exc}") from None
    return adapter(fn, *args, **kwargs)


def _op(name: str) -> Callable:
    from .table import BY_NAME
    return BY_NAME[name].fn

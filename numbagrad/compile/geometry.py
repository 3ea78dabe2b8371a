"""Array geometry (addresses, extents, views) and a call's signature key.

Host and device arrays alike: where an array's bytes lie, whether a layout is
C-contiguous, the view of a root array at an offset, and the key that tells
one signature of a compiled step from another.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import kernels
from ..tensor import Tensor


class _Unsupported(Exception):
    """The recording cannot become an @njit function (the Python replay is used)."""


def _is_array(x: Any) -> bool:
    return isinstance(x, np.ndarray) or type(x).__module__.startswith("numba.cuda")


_address = kernels.address


def _shape(a: Any) -> tuple:
    return tuple(int(n) for n in a.shape)


def _strides(a: Any) -> tuple:
    return tuple(int(s) for s in a.strides)


_extent = kernels.extent


def _c_contiguous(shape: tuple, strides: tuple, itemsize: int) -> bool:
    expect = itemsize
    for n, s in zip(reversed(shape), reversed(strides)):
        if n != 1 and s != expect:
            return False
        expect *= n
    return True


def _c_strides(shape: tuple, itemsize: int) -> tuple:
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


def _owner(a: np.ndarray) -> np.ndarray:
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def _view(root: Any, off: int, shape: tuple, strides: tuple) -> Any:
    """The array at byte offset ``off`` of ``root`` with ``shape``/``strides``
    (host or device arrays; the shapes numbagrad's ops make)."""
    rshape, rstrides = _shape(root), _strides(root)
    if off == 0 and shape == rshape and strides == rstrides:
        return root
    if off == 0 and len(shape) == 2 and shape == rshape[::-1] and strides == rstrides[::-1]:
        return root.T
    item = root.dtype.itemsize
    size = math.prod(shape)
    if not _c_contiguous(rshape, rstrides, item):
        raise _Unsupported(f"a view of a non-contiguous array (shape {rshape})")
    if _c_contiguous(shape, strides, item):
        if off == 0 and size == math.prod(rshape):
            return root.reshape(shape)
        flat = root.reshape(math.prod(rshape))
        return flat[off // item:off // item + size].reshape(shape)
    if len(shape) == 2 and _c_contiguous(shape[::-1], strides[::-1], item):
        flat = root.reshape(math.prod(rshape))
        return flat[off // item:off // item + size].reshape(shape[::-1]).T
    raise _Unsupported(f"a strided view (shape {shape}, strides {strides})")


def _same_values(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if _shape(a) != _shape(b) or a.dtype != b.dtype:
        return False
    ha = a if isinstance(a, np.ndarray) else a.copy_to_host()
    hb = b if isinstance(b, np.ndarray) else b.copy_to_host()
    return bool(np.array_equal(ha, hb, equal_nan=True))


def _describe_args(args: tuple) -> str:
    parts = []
    for a in args:
        if isinstance(a, Tensor):
            parts.append(f"Tensor{a.shape} {a.dtype} {a.device}")
        elif _is_array(a):
            parts.append(f"{type(a).__name__}{_shape(a)} {a.dtype}")
        else:
            parts.append(repr(a))
    return "(" + ", ".join(parts) + ")"


# ---------------------------------------------------------------- signature
def _arg_key(a: Any) -> tuple:
    if isinstance(a, Tensor):
        d = a._data
        return (type(a), d.shape, d.strides, d.dtype, a._kern, a.requires_grad)
    if isinstance(a, np.ndarray) or _is_array(a):
        return (type(a), a.shape, a.strides, a.dtype)
    if a is None or isinstance(a, (bool, int, float, str, np.generic)):
        return (type(a), a)
    raise TypeError(f"ng.compile: an argument of type {type(a).__name__} cannot be part of a "
                    f"compiled step's signature; pass tensors, arrays or Python numbers "
                    f"(reach other objects through fn's closure)")


def _key(args: tuple) -> tuple:
    return tuple([_arg_key(a) for a in args])

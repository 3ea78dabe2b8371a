"""The dtypes a tensor may hold, and PyTorch's type promotion between them.

Float tensors (float32, float64, and the half formats float16 and, with the
optional ``ml_dtypes`` package, bfloat16: ``ops/_half.py``) carry gradients; integer tensors (int8,
int16, int32, int64, uint8) and bool tensors never do. Mixed operands of an
elementwise op meet in ``result_type``, PyTorch's rule rather than NumPy's:
a float beats an integer at the float's own width (int64 with float32 is
float32, where NumPy gives float64); a 0-d tensor or a Python number never
widens a dimensioned tensor of its own category (float32 with a float64 0-d
tensor stays float32); a number of a higher category takes that category's
default (an int tensor plus 2.5 is the default float dtype, ``True`` beside
a bool tensor stays bool, an int beside it is int64). Halves promote as
PyTorch's: float16 or bfloat16 with float32 is float32, float16 with
bfloat16 is float32, either with an integer stays itself.
"""
from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from . import _defaults

FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
FLOAT16 = np.dtype(np.float16)
try:   # an optional extra: numbagrad works without it, bfloat16 tensors then do not exist
    import ml_dtypes as _ml_dtypes
except ImportError:   # pragma: no cover (the test extra installs it)
    _ml_dtypes = None
BFLOAT16 = np.dtype(_ml_dtypes.bfloat16) if _ml_dtypes is not None else None
# the half formats: stored as themselves, computed in float32 (ops/_half.py)
HALVES = (FLOAT16,) if BFLOAT16 is None else (FLOAT16, BFLOAT16)
INTS = tuple(np.dtype(t) for t in (np.uint8, np.int8, np.int16, np.int32, np.int64))
BOOL = np.dtype(np.bool_)
ALL = FLOATS + HALVES + INTS + (BOOL,)
INT64 = np.dtype(np.int64)

_BOOL, _INT, _FLOAT = 0, 1, 2   # categories, lowest first


def category(dtype: np.dtype) -> int:
    return _FLOAT if dtype.kind == "f" or dtype in HALVES else \
        _BOOL if dtype.kind == "b" else _INT


def is_float(dtype: np.dtype) -> bool:
    """Whether ``dtype`` is a float a tensor holds: float32, float64 or a half."""
    return dtype in FLOATS or dtype in HALVES


def tensor_dtype(dtype: Any, who: str) -> np.dtype:
    """``dtype`` as one a tensor may hold, or a TypeError naming ``who``."""
    want = _defaults.parse_dtype(dtype, who)
    if want not in ALL:
        raise TypeError(f"{who}: tensors hold float32, float64, float16, bfloat16, int8, "
                        f"int16, int32, int64, uint8 or bool, not {want}")
    return want


def promote_types(a: Any, b: Any) -> np.dtype:
    """The smallest dtype both ``a`` and ``b`` convert to, as
    ``torch.promote_types``: a float with an integer is that float; a half
    with a wider float is the wider one, float16 with bfloat16 float32."""
    a, b = np.dtype(a), np.dtype(b)
    ca, cb = category(a), category(b)
    if ca != cb and _FLOAT in (ca, cb):
        return a if ca == _FLOAT else b
    if a in HALVES or b in HALVES:
        if a == b:
            return a
        wide = [d for d in (a, b) if d in FLOATS]
        return max(wide, key=lambda d: d.itemsize) if wide else FLOATS[0]
    return np.promote_types(a, b)


def _scalar_dtype(value: Any) -> np.dtype:
    if isinstance(value, (bool, np.bool_)):
        return BOOL
    if isinstance(value, numbers.Integral):
        return INT64
    return _defaults.get_default_dtype()


def _combine(higher: np.dtype | None, lower: np.dtype | None) -> np.dtype | None:
    """PyTorch's ``combine_categories``: ``higher`` (operands of higher
    priority) keeps its dtype unless ``lower`` is of a higher category."""
    if higher is None:
        return lower
    if lower is None or category(higher) == _FLOAT:
        return higher
    if higher == BOOL or category(lower) == _FLOAT:
        return promote_types(higher, lower)
    return higher


def result_type(*operands: Any) -> np.dtype:
    """The dtype an elementwise op on ``operands`` (tensors, arrays, Python
    numbers) computes in, as ``torch.result_type``."""
    groups: list[np.dtype | None] = [None, None, None]   # dimensioned, 0-d, numbers
    for x in operands:
        dtype = getattr(x, "dtype", None)
        if dtype is None:
            which, dtype = 2, _scalar_dtype(x)
        else:
            which, dtype = (1 if len(x.shape) == 0 else 0), np.dtype(dtype)
        seen = groups[which]
        groups[which] = dtype if seen is None else promote_types(seen, dtype)
    return _combine(groups[0], _combine(groups[1], groups[2]))

"""Process-wide defaults a user sets once: the default floating dtype.

``ng.set_default_dtype(np.float32)`` is PyTorch's ``torch.set_default_dtype``:
layers built without ``dtype=`` (``dtype=None``, every ``ng.nn`` layer's
default, read when the layer is built: layers built earlier keep theirs) and
tensors built from Python numbers (lists, floats, ints) take it; NumPy arrays
keep their own float dtype, as ``torch.tensor(np_array)`` does. numbagrad's
default stays float64 (NumPy's) until it is set, where PyTorch's is float32.
The setting is process-wide (every thread sees it), as PyTorch's is.
"""
from __future__ import annotations

from typing import Any

import numpy as np

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
_default = [np.dtype(np.float64)]


def parse_dtype(dtype: Any, who: str) -> np.dtype:
    """``np.dtype(dtype)``, or a TypeError naming ``who``."""
    try:
        return np.dtype(dtype)
    except TypeError:
        raise TypeError(f"{who}: {dtype!r} is not a dtype") from None


def float_dtype(dtype: Any, who: str) -> np.dtype:
    """``dtype`` as float32 or float64 (None: the default), else a TypeError
    that names ``who`` (the function that was given it)."""
    if dtype is None:
        return _default[0]
    want = parse_dtype(dtype, who)
    if want not in _FLOATS:
        raise TypeError(f"{who}: the dtype must be float32 or float64, got {want} (a float "
                        f"is needed here)")
    return want


def set_default_dtype(dtype: Any) -> None:
    """Make ``dtype`` (float32 or float64) the default floating dtype: what
    layers built from now on without ``dtype=`` and tensors from Python
    numbers use. Anything else is a TypeError, and the default is kept."""
    if dtype is None:
        raise TypeError("set_default_dtype: None is not a dtype")
    _default[0] = float_dtype(dtype, "set_default_dtype")


def get_default_dtype() -> np.dtype:
    """The default floating dtype (float64 until ``set_default_dtype``), as a
    ``np.dtype``; what an ``ng.nn`` layer's ``dtype=None`` means when built."""
    return _default[0]

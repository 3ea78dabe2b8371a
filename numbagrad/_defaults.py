"""Process-wide defaults a user sets once: the default floating dtype.

``ng.set_default_dtype(np.float32)`` is PyTorch's ``torch.set_default_dtype``:
layers built without ``dtype=`` and tensors built from Python numbers (lists,
floats, ints) take it; NumPy arrays keep their own float dtype, as
``torch.tensor(np_array)`` does. numbagrad's default stays float64 (NumPy's)
until it is set, where PyTorch's is float32.
"""
from __future__ import annotations

from typing import Any

import numpy as np

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
_default = [np.dtype(np.float64)]


def set_default_dtype(dtype: Any) -> None:
    """Make ``dtype`` (float32 or float64) the default floating dtype."""
    try:
        want = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"set_default_dtype: {dtype!r} is not a dtype") from None
    if want not in _FLOATS:
        raise TypeError(f"set_default_dtype: the default dtype must be float32 or float64, "
                        f"got {want}")
    _default[0] = want


def get_default_dtype() -> np.dtype:
    """The default floating dtype (float64 until ``set_default_dtype``)."""
    return _default[0]

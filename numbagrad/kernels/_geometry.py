"""Where an array's elements lie in memory, on any device.

``address`` and ``extent`` read a NumPy array, a Numba CUDA device array or
the CUDA simulator's stand-in alike, for the code that must tell whether two
arrays overlap (the tensor's and tape's aliasing checks, ``ng.compile``'s
geometry).
"""
from __future__ import annotations

from typing import Any

import numpy as np


def address(array: Any) -> int:
    """The address of ``array``'s first element (a NumPy array, a Numba
    device array or the CUDA simulator's stand-in for one)."""
    if isinstance(array, np.ndarray):
        return array.__array_interface__["data"][0]
    iface = getattr(array, "__cuda_array_interface__", None)
    if iface is None:                      # the simulator's fake device array
        return getattr(array, "_ary", array).__array_interface__["data"][0]
    return iface["data"][0]


def extent(array: Any) -> tuple[int, int]:
    """The bytes [lo, hi) that ``array``'s elements occupy (empty: lo == hi)."""
    lo = hi = address(array)
    for n, s in zip(array.shape, array.strides):
        if n == 0:
            return lo, lo
        if s >= 0:
            hi += (int(n) - 1) * int(s)
        else:
            lo += (int(n) - 1) * int(s)
    return lo, hi + array.dtype.itemsize

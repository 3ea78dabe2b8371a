"""CPU kernels: ``@njit`` functions with destination-passing signatures.

Every kernel writes into an array the caller passes; none allocates a
parameter-sized result. ``kernels/cuda`` exposes the same names with the
same signatures, so the op and optimizer layers never branch on the device.
One module per op family; this one re-exports them with the memory helpers.
"""
from __future__ import annotations

import numpy as np

from .elementwise import (axpby, binary, binary_backward, fill, scaled_add,  # noqa: F401
                          sum_to, unary, unary_backward)
from .losses import cross_entropy, mse, pointwise_loss  # noqa: F401
from .matmul import gemm, linear  # noqa: F401
from .reductions import softmax, softmax_backward  # noqa: F401
from .optim import *  # noqa: F401,F403  (every name in optim.__all__)

name = "cpu"


# --------------------------------------------------------------- memory
def empty(shape: tuple, dtype) -> np.ndarray:
    """An uninitialised C-contiguous host array."""
    return np.empty(shape, dtype)


def from_host(array: np.ndarray) -> np.ndarray:
    """Host data as this device's array: a copy the caller owns."""
    return np.array(array, order="C", copy=True)


def to_host(array: np.ndarray) -> np.ndarray:
    """A host copy of a device array."""
    return np.array(array, copy=True)


def upload(host: np.ndarray, out: np.ndarray) -> None:
    """Copy host data into an existing device array of the same shape."""
    np.copyto(out, host)


def is_device_array(obj) -> bool:
    return isinstance(obj, np.ndarray)


def synchronize() -> None:
    """Nothing to wait for: CPU kernels finish before they return."""


def is_c_contiguous(array) -> bool:
    return array.flags.c_contiguous

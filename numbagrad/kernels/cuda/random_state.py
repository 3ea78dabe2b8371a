"""CUDA kernel that copies the random generator's state array on the device
(see ``kernels.cpu.random_state``)."""
from __future__ import annotations

__all__ = ["copy_state"]   # the kernels this module registers

import numpy as np
from numba import cuda, int64, uint64

from ._core import THREADS, Config, array_type, kernel, launch


@kernel("copy_state", lambda dt: (array_type(uint64, 1), array_type(uint64, 1)),
        dtypes=(int64,))
def _copy_state_source(config: Config, dtype):
    def copy_state_kernel(src, dst):
        k = cuda.grid(1)
        if k < dst.size:
            dst[k] = src[k]

    return copy_state_kernel


def copy_state(src, dst) -> None:
    """See ``kernels.cpu.copy_state``: one block (the state has 3 elements)."""
    launch("copy_state", np.int64, 1, THREADS, src, dst)

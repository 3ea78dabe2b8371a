"""CUDA kernels: ``@cuda.jit`` functions from numba-cuda behind host launchers.

The launchers here have the names and destination-passing signatures of
``kernels/cpu``. Each one issues exactly one kernel launch, counted by
``launch_count()``; every host<->device copy goes through ``from_host``,
``to_host`` or ``upload`` and is counted by ``transfer_count()``.

Launch shapes come from the environment, read once at import:
``NUMBAGRAD_CUDA_TILE`` (GEMM threads per block side, default 16),
``NUMBAGRAD_CUDA_WPT`` (GEMM outputs per thread per side, default 4),
``NUMBAGRAD_CUDA_THREADS`` (threads per block of the 1-D kernels, a power
of two, default 256) and ``NUMBAGRAD_CUDA_BLOCKS`` (grid cap of the 1-D
grid-stride kernels, default 1024). Tests shrink them under the simulator.
"""
from __future__ import annotations

import sys

from ._core import (MAX_BLOCKS, THREADS, TILE, WPT, empty, from_host,  # noqa: F401
                    is_c_contiguous, is_device_array, kernel_sources, launch_count,
                    synchronize, to_host, transfer_count, upload)
from .elementwise import (axpby, binary, binary_backward, fill, scaled_add,  # noqa: F401
                          sum_to, unary, unary_backward)
from .losses import cross_entropy, mse, pointwise_loss
from .matmul import gemm, linear  # noqa: F401
from .optim import *  # noqa: F403  (every name in optim.__all__)
from .reductions import softmax, softmax_backward

name = "cuda"

# The CPU module's threaded twins (see kernels/cpu): the op layer picks
# ``kern.foo_mt if n >= kern.MT_MIN else kern.foo``; on CUDA that is always foo.
MT_MIN = sys.maxsize
axpby_mt, binary_mt, binary_backward_mt, scaled_add_mt, sum_to_mt, unary_mt, \
    unary_backward_mt = axpby, binary, binary_backward, scaled_add, sum_to, unary, unary_backward
cross_entropy_mt, mse_mt, pointwise_loss_mt = cross_entropy, mse, pointwise_loss
softmax_mt, softmax_backward_mt = softmax, softmax_backward

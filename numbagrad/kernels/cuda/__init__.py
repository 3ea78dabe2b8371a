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

from .. import NAMES as _NAMES
from .. import split as _split
from .. import table as _table
from ._core import (MAX_BLOCKS, THREADS, TILE, WPT, empty, from_host,  # noqa: F401
                    is_c_contiguous, is_device_array, kernel_sources, launch_count,
                    synchronize, to_host, transfer_count, upload)
from .elementwise import (axpby, binary, binary_backward, fill, scaled_add,  # noqa: F401
                          sum_to, unary, unary_backward)
from .losses import cross_entropy, mse, pointwise_loss
from .matmul import bgemm, gemm, linear  # noqa: F401
from .indexing import (as_strided, gather, index_add, index_select,  # noqa: F401
                       place_nd, scatter_add)
from .optim import *  # noqa: F403  (every name in optim.__all__)
from .strided import expand_nd, sum_to_nd  # noqa: F401
from .reductions import softmax, softmax_backward
from .masks import astype, compare, where, where_backward  # noqa: F401

name = "cuda"


def entry_point(dispatcher, args: tuple) -> None:
    """None: CUDA launchers are Python functions; ``kernels.call_typed``
    dispatches them as ``call`` does."""
    return None


def signature(dispatcher, args: tuple) -> tuple:
    """Unused (``entry_point`` finds nothing here); the CPU's counterpart."""
    return ()

# No threaded twins: ``kernels.call`` never reaches MT_MIN here.
MT_MIN = MT_MIN_MEMORY = sys.maxsize


def memory_bound(name: str, args: tuple) -> bool:
    """Unused (never threaded); the CPU's counterpart."""
    return False
# Each family's imports under its own heading:
# N-d strided and fallback kernels
from .join import concat  # noqa: F401
from .strided import binary_nd, binary_nd_backward, unary_nd, unary_nd_backward  # noqa: F401
from .reductions import softmax3, softmax3_backward  # noqa: F401
from .losses import cross_entropy3  # noqa: F401
from .indexing import gather_nd, index_add_nd, index_select_nd, scatter_add_nd  # noqa: F401

# activations and reductions
from .reduce_axis import (cumsum, extrema, extrema_backward, logsumexp,  # noqa: F401
                          logsumexp_backward, variance, variance_backward)
from .loss_terms import loss_terms, loss_terms_backward, nll, nll_backward  # noqa: F401
from .bounds import clamp, clamp_backward  # noqa: F401

# randomness, dropout and embedding
from .random import dropout, dropout_backward, embedding_backward  # noqa: F401

# convolution and pooling
from .conv import (adaptive_avg_pool2d, adaptive_avg_pool2d_backward, avg_pool2d,  # noqa: F401
                   avg_pool2d_backward, col2im, im2col, max_pool2d, max_pool2d_backward)

# normalisation and attention
from .norm import (batch_norm, batch_norm_backward, group_norm,  # noqa: F401
                   group_norm_backward)
from .attention import attention, attention_backward  # noqa: F401

KERNELS = _table(globals(), _NAMES)
KERNEL_FNS = _split(KERNELS)

"""CPU kernels: ``@njit`` functions with destination-passing signatures.

Every kernel writes into an array the caller passes; none allocates a
parameter-sized result. ``kernels/cuda`` exposes the same names with the
same signatures, so the op and optimizer layers never branch on the device.
One module per op family; this one re-exports them with the memory helpers.

A kernel ``foo`` that pays for threads on large arrays has a twin
``foo_mt`` (``parallel=True``, same signature, same bits);
``kernels.call(kern, "foo", n, ...)`` runs the twin for a call that touches
n >= ``MT_MIN`` elements (a memory-bound call: ``MT_MIN_MEMORY``; for
the GEMMs n counts multiply-adds, and their twins split from 2^22). Both
come from the environment (see ``_threads``). ``KERNELS`` maps every name of ``kernels.NAMES`` to its
serial and threaded variants; the CUDA module's has the same names.
"""
from __future__ import annotations

import operator

import numpy as np

from ._threads import MT_MIN, MT_MIN_MEMORY, memory_bound  # noqa: F401
from .elementwise import (axpby, axpby_mt, binary, binary_backward,  # noqa: F401
                          binary_backward_mt, binary_mt, fill, scaled_add, scaled_add_mt,
                          sum_to, sum_to_mt, unary, unary_backward, unary_backward_mt,
                          unary_mt)
from .losses import (cross_entropy, cross_entropy_mt, mse, mse_mt,  # noqa: F401
                     pointwise_loss, pointwise_loss_mt)
from .matmul import bgemm, bgemm_mt, gemm, gemm_mt, linear, linear_mt  # noqa: F401
from .indexing import gather, index_add, index_select, place_nd, scatter_add  # noqa: F401
from .strided import expand_nd, sum_to_nd  # noqa: F401
from .reductions import softmax, softmax_backward, softmax_backward_mt, softmax_mt  # noqa: F401
from .masks import astype, compare, where, where_backward  # noqa: F401
from .optim import *  # noqa: F401,F403  (every name in optim.__all__)
from .. import NAMES as _NAMES
from .. import split as _split
from .. import table as _table

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


def entry_point(dispatcher, args: tuple):
    """The compiled specialisation Numba's ``dispatcher`` runs for ``args``
    (its CPython entry point), or None: what ``kernels.call_typed`` calls
    directly. Read from Numba's dispatcher internals (``typeof_pyval``,
    ``overloads``), so any surprise there gives None: the dispatched path."""
    try:
        types = tuple(dispatcher.typeof_pyval(a) for a in args)
        return dispatcher.overloads[types].entry_point
    except Exception:   # noqa: BLE001 (a Numba version without these: dispatch)
        return None


def signature(dispatcher, args: tuple) -> tuple:
    """The Numba types of ``args`` that a call site's key must fix: every
    array's dtype, rank and layout (not whether it is read-only or aligned,
    which only the arrays a kernel writes must be, and those come from the
    pool) and every other argument's type."""
    out = []
    for a in args:
        t = dispatcher.typeof_pyval(a)
        out.append((t.dtype, t.ndim, t.layout) if isinstance(a, np.ndarray) else t)
    return tuple(out)


# (a C-level getter: the ops' fast paths ask it several times per op)
is_c_contiguous = operator.attrgetter("flags.c_contiguous")


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
from .attention import (attention, attention_backward, attention_backward_mt,  # noqa: F401
                        attention_mt)

KERNELS = _table(globals(), _NAMES)
KERNEL_FNS = _split(KERNELS)

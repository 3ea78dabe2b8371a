"""CUDA kernels of randomness, dropout and embedding (see ``kernels.cpu.random``).

The dropout mask comes from the CPU kernels' counter-based hash, computed on
the device: no host round trip per mask. The counter in ``state[1]`` is
advanced by the launch itself: each block's thread 0 takes a ticket
(``state[2]``) once its threads have read the counter, and the last block
to take one advances the counter and resets the ticket, so every thread of
the launch sees the same counter. The embedding gradient runs one thread per
destination element looping over the indices in order (no atomics), as
``index_add`` does, so it adds in the CPU kernel's order.
"""
from __future__ import annotations

# the kernels this module registers
__all__ = ["dropout", "dropout_backward", "embedding_backward", "random_fill"]

import numpy as np
from numba import cuda, float64, int64, uint64

from ..cpu.random import TWO32, generator, sampler
from ._core import THREADS, Config, array_type, grid, kernel, launch

_stream_key, _element_bits = generator(cuda.jit(device=True))
_sample = sampler(cuda.jit(device=True))
_ONE = np.uint64(1)
_ZERO = np.uint64(0)


def _a1(dt):
    return array_type(dt, 1)


@kernel("dropout", lambda dt: (_a1(dt), _a1(dt), _a1(dt), array_type(uint64, 1), float64, dt))
def _dropout_source(config: Config, dtype):
    def dropout_kernel(x, out, mask, state, p, scale):
        key, key2 = _stream_key(state[0], state[1])
        cut = p * TWO32
        zero = dtype(0.0)
        k = cuda.grid(1)
        stride = cuda.gridsize(1)
        while k < out.size:
            m = scale if _element_bits(key, key2, uint64(k)) >= cut else zero
            mask[k] = m
            out[k] = x[k] * m
            k += stride
        cuda.syncthreads()     # every thread of this block has read the counter
        if cuda.threadIdx.x == 0:
            ticket = cuda.atomic.add(state, 2, _ONE)
            if ticket == cuda.gridDim.x - 1:      # the last block: all have read it
                state[1] = state[1] + _ONE
                state[2] = _ZERO

    return dropout_kernel


@kernel("random_fill", lambda dt: (_a1(dt), array_type(uint64, 1), int64, float64, float64))
def _random_fill_source(config: Config, dtype):
    def random_fill_kernel(out, state, kind, a, b):
        key, key2 = _stream_key(state[0], state[1])
        k = cuda.grid(1)
        stride = cuda.gridsize(1)
        while k < out.size:
            out[k] = dtype(_sample(key, key2, uint64(k), kind, a, b))
            k += stride
        cuda.syncthreads()     # as dropout's: the last block advances the counter
        if cuda.threadIdx.x == 0:
            ticket = cuda.atomic.add(state, 2, _ONE)
            if ticket == cuda.gridDim.x - 1:
                state[1] = state[1] + _ONE
                state[2] = _ZERO

    return random_fill_kernel


@kernel("dropout_backward", lambda dt: (_a1(dt), _a1(dt), _a1(dt), float64))
def _dropout_backward_source(config: Config, dtype):
    def dropout_backward_kernel(g, mask, dest, beta):
        k = cuda.grid(1)
        stride = cuda.gridsize(1)
        while k < dest.size:
            v = g[k] * mask[k]
            dest[k] = v if beta == 0.0 else v + beta * dest[k]
            k += stride

    return dropout_backward_kernel


@kernel("embedding_backward", lambda dt: (array_type(dt, 2, "A"), array_type(int64, 1, "A"),
                                          array_type(dt, 2, "A"), float64, int64))
def _embedding_backward_source(config: Config, dtype):
    def embedding_backward_kernel(g, index, dest, beta, padding):
        cols, m = dest.shape[1], g.shape[0]
        k = cuda.grid(1)
        stride = cuda.gridsize(1)
        while k < dest.size:
            r, q = k // cols, k % cols
            acc = dtype(0.0) if beta == 0.0 else beta * dest[r, q]
            for i in range(m):
                j = index[i]
                if j == r and j != padding:
                    acc += g[i, q]
            dest[r, q] = acc
            k += stride

    return embedding_backward_kernel


def dropout(x, out, mask, state, p, scale) -> None:
    """See ``kernels.cpu.dropout``; an empty ``out`` still advances the counter
    (one thread), as the CPU kernel does."""
    launch("dropout", out.dtype, grid(out.size), THREADS, x, out, mask, state, float(p),
           out.dtype.type(scale))


def random_fill(out, state, kind, a, b) -> None:
    """See ``kernels.cpu.random_fill``; an empty ``out`` still advances the
    counter, as the CPU kernel does."""
    launch("random_fill", out.dtype, grid(out.size), THREADS, out, state, int(kind), float(a),
           float(b))


def dropout_backward(g, mask, dest, beta) -> None:
    """See ``kernels.cpu.dropout_backward``."""
    if dest.size:
        launch("dropout_backward", dest.dtype, grid(dest.size), THREADS, g, mask, dest,
               float(beta))


def embedding_backward(g, index, dest, beta, padding) -> None:
    """See ``kernels.cpu.embedding_backward``."""
    if dest.size:
        launch("embedding_backward", dest.dtype, grid(dest.size), THREADS, g, index, dest,
               float(beta), int(padding))

"""CUDA kernels of fused scaled-dot-product attention (see ``kernels.cpu.attention``).

The same row functions as the CPU's, compiled as device functions: one
thread per row of the output in the forward, one per row of dq, dk and dv
in the backward, all in one launch each (every row is written by one thread,
no atomics). The forward advances the dropout counter as ``dropout`` does:
the last block to take a ticket advances it, after every block has read it.
"""
from __future__ import annotations

__all__ = ["attention", "attention_backward"]   # the kernels this module registers

import numpy as np
from numba import cuda, float64, int64, types, uint64

from ..cpu.attention import rows
from ..cpu.random import TWO32
from ._core import THREADS, Config, array_type, grid, kernel, launch
from .random import _element_bits, _stream_key

_forward_row, _dq_row, _dkv_row = rows(cuda.jit(device=True), _stream_key, _element_bits)
_ONE = np.uint64(1)
_ZERO = np.uint64(0)
_B = types.boolean


def _a3(dt):
    return array_type(dt, 3)


def _inputs(dt):
    return (_a3(dt), _a3(dt), _a3(dt), _a3(dt), array_type(int64, 2), _B, float64, float64,
            float64)


@kernel("attention", lambda dt: _inputs(dt) + (array_type(uint64, 1), array_type(uint64, 1),
                                               _a3(dt), array_type(float64, 2),
                                               array_type(dt, 2), int64))
def _attention_source(config: Config, dtype):
    def attention_kernel(q, k, v, mask, maps, causal, scale, p, keep_scale, state, seeds, out,
                         lse, work, block):
        key, key2 = _stream_key(state[0], state[1])
        cut = p * TWO32 if p > 0.0 else -1.0
        t = cuda.grid(1)
        if t == 0:
            seeds[0] = state[0]
            seeds[1] = state[1]
        n = out.shape[0] * out.shape[1]
        while t < n:
            _forward_row(q, k, v, mask, maps, causal, scale, cut, keep_scale, key, key2, out,
                         lse, t)
            t += cuda.gridsize(1)
        if p > 0.0:
            cuda.syncthreads()     # every thread of this block has read the counter
            if cuda.threadIdx.x == 0:
                ticket = cuda.atomic.add(state, 2, _ONE)
                if ticket == cuda.gridDim.x - 1:      # the last block: all have read it
                    state[1] = state[1] + _ONE
                    state[2] = _ZERO

    return attention_kernel


@kernel("attention_backward",
        lambda dt: _inputs(dt) + (array_type(uint64, 1), _a3(dt), array_type(float64, 2),
                                  _a3(dt), _a3(dt), _a3(dt), _a3(dt), float64, float64, float64,
                                  _B, _B, _B, array_type(dt, 2), int64))
def _attention_backward_source(config: Config, dtype):
    def attention_backward_kernel(q, k, v, mask, maps, causal, scale, p, keep_scale, seeds, out,
                                  lse, g, dq, dk, dv, beta_q, beta_k, beta_v, want_q, want_k,
                                  want_v, work, block):
        key, key2 = _stream_key(seeds[0], seeds[1])
        cut = p * TWO32 if p > 0.0 else -1.0
        joint = want_k and want_v
        for b in range(maps.shape[1]):
            if maps[1, b] != maps[2, b]:
                joint = False
        nq = dq.shape[0] * dq.shape[1] if want_q else 0
        nk = dk.shape[0] * dk.shape[1] if want_k else 0
        nv = dv.shape[0] * dv.shape[1] if want_v and not joint else 0
        t = cuda.grid(1)
        while t < nq + nk + nv:
            if t < nq:
                _dq_row(q, k, v, mask, maps, causal, scale, cut, keep_scale, key, key2, out, lse,
                        g, dq, beta_q, t)
            elif t < nq + nk:
                _dkv_row(q, k, v, mask, maps, causal, scale, cut, keep_scale, key, key2, out,
                         lse, g, dk, dv, beta_k, beta_v, True, joint, 1, t - nq)
            else:
                _dkv_row(q, k, v, mask, maps, causal, scale, cut, keep_scale, key, key2, out,
                         lse, g, dk, dv, beta_k, beta_v, False, True, 2, t - nq - nk)
            t += cuda.gridsize(1)

    return attention_backward_kernel


def attention(q, k, v, mask, maps, causal, scale, p, keep_scale, state, seeds, out, lse, work,
              block) -> None:
    """See ``kernels.cpu.attention``: one launch, one thread per output row
    (``work`` and ``block`` unused; an empty output still saves the seeds and
    advances the counter, as the CPU kernel does)."""
    launch("attention", out.dtype, grid(out.shape[0] * out.shape[1]), THREADS, q, k, v, mask,
           maps, bool(causal), float(scale), float(p), float(keep_scale), state, seeds, out, lse,
           work, int(block))


def attention_backward(q, k, v, mask, maps, causal, scale, p, keep_scale, seeds, out, lse, g,
                       dq, dk, dv, beta_q, beta_k, beta_v, want_q, want_k, want_v, work,
                       block) -> None:
    """See ``kernels.cpu.attention_backward``: one launch for every wanted
    gradient, one thread per row of dq, dk or dv (``work``, ``block`` unused)."""
    rows_ = (dq.shape[0] * dq.shape[1] * bool(want_q) + dk.shape[0] * dk.shape[1]
             * bool(want_k) + dv.shape[0] * dv.shape[1] * bool(want_v))
    if rows_:
        launch("attention_backward", q.dtype, grid(rows_), THREADS, q, k, v, mask, maps,
               bool(causal), float(scale), float(p), float(keep_scale), seeds, out, lse, g, dq,
               dk, dv, float(beta_q), float(beta_k), float(beta_v), bool(want_q), bool(want_k),
               bool(want_v), work, int(block))

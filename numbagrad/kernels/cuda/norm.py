"""CUDA normalisation kernels (see ``kernels/cpu/norm.py``): one launch each,
one thread per normalised row or channel (and, in the group norm's
backward, one per weight element), running the CPU kernels' per-row code,
so both devices add in the same order; no atomics.
"""
from __future__ import annotations

# the kernels this module registers
__all__ = ["batch_norm", "batch_norm_backward", "group_norm", "group_norm_backward"]

from numba import cuda, float64, int64, types

from ..cpu.norm import (batch_norm_channel, batch_norm_channel_backward, group_norm_param_backward,
                        group_norm_row, group_norm_row_backward)
from ._core import THREADS, Config, array_type, grid, kernel, launch

_row = cuda.jit(device=True)(group_norm_row)
_row_backward = cuda.jit(device=True)(group_norm_row_backward)
_param_backward = cuda.jit(device=True)(group_norm_param_backward)
_channel = cuda.jit(device=True)(batch_norm_channel)
_channel_backward = cuda.jit(device=True)(batch_norm_channel_backward)
_B = types.boolean


def _a(dt, ndim: int):
    return array_type(dt, ndim, "A")


@kernel("group_norm", lambda dt: (_a(dt, 4), _a(dt, 2), _a(dt, 2), _a(dt, 4), _a(float64, 2),
                                  _a(float64, 2), float64, _B, _B))
def _group_norm_source(config: Config, dtype):
    def group_norm_kernel(x, w, b, out, mean, rstd, eps, has_w, has_b):
        G = x.shape[1]
        k = cuda.grid(1)
        while k < x.shape[0] * G:
            _row(x, w, b, out, mean, rstd, eps, has_w, has_b, k // G, k % G)
            k += cuda.gridsize(1)

    return group_norm_kernel


@kernel("group_norm_backward", lambda dt: (_a(dt, 4), _a(dt, 2), _a(dt, 4), _a(float64, 2),
                                           _a(float64, 2), _a(dt, 4), dt, _B, _a(dt, 2), dt, _B,
                                           _a(dt, 2), dt, _B, _B))
def _group_norm_backward_source(config: Config, dtype):
    def group_norm_backward_kernel(x, w, gout, mean, rstd, dx, beta_x, need_x, dw, beta_w,
                                   need_w, db, beta_b, need_b, has_w):
        # threads [0, rows) write dx rows, the next G * K the weight and bias elements
        G, K = x.shape[1], x.shape[2]
        rows = x.shape[0] * G if need_x else 0
        params = G * K if need_w or need_b else 0
        k = cuda.grid(1)
        while k < rows + params:
            if k < rows:
                _row_backward(x, w, gout, mean, rstd, dx, beta_x, has_w, k // G, k % G)
            else:
                j = k - rows
                _param_backward(x, gout, mean, rstd, dw, beta_w, need_w, db, beta_b, need_b,
                                j // K, j % K)
            k += cuda.gridsize(1)

    return group_norm_backward_kernel


@kernel("batch_norm", lambda dt: (_a(dt, 3), _a(dt, 1), _a(dt, 1), _a(dt, 3), _a(float64, 1),
                                  _a(float64, 1), _a(dt, 1), _a(dt, 1), array_type(int64, 0),
                                  float64, float64, _B, _B, _B, _B, _B))
def _batch_norm_source(config: Config, dtype):
    def batch_norm_kernel(x, w, b, out, mean, rstd, rmean, rvar, count, momentum, eps,
                          training, has_w, has_b, update, count_it):
        k = cuda.grid(1)
        if k == 0 and count_it:     # one thread: no other reads it
            count[()] += 1
        while k < x.shape[1]:
            _channel(x, w, b, out, mean, rstd, rmean, rvar, momentum, eps, training, has_w,
                     has_b, update, k)
            k += cuda.gridsize(1)

    return batch_norm_kernel


@kernel("batch_norm_backward", lambda dt: (_a(dt, 3), _a(dt, 1), _a(dt, 3), _a(float64, 1),
                                           _a(float64, 1), _B, _B, _a(dt, 3), dt, _B,
                                           _a(dt, 1), dt, _B, _a(dt, 1), dt, _B))
def _batch_norm_backward_source(config: Config, dtype):
    def batch_norm_backward_kernel(x, w, gout, mean, rstd, training, has_w, dx, beta_x, need_x,
                                   dw, beta_w, need_w, db, beta_b, need_b):
        k = cuda.grid(1)
        while k < x.shape[1]:
            _channel_backward(x, w, gout, mean, rstd, training, has_w, dx, beta_x, need_x, dw,
                              beta_w, need_w, db, beta_b, need_b, k)
            k += cuda.gridsize(1)

    return batch_norm_backward_kernel


# ------------------------------------------------------------ launchers
def group_norm(x, w, b, out, mean, rstd, eps, has_w, has_b) -> None:
    """See ``kernels.cpu.group_norm``."""
    rows = x.shape[0] * x.shape[1]
    if rows:
        launch("group_norm", x.dtype, grid(rows), THREADS, x, w, b, out, mean, rstd,
               float(eps), bool(has_w), bool(has_b))


def group_norm_backward(x, w, gout, mean, rstd, dx, beta_x, need_x, dw, beta_w, need_w, db,
                        beta_b, need_b, has_w) -> None:
    """See ``kernels.cpu.group_norm_backward``."""
    n = (x.shape[0] * x.shape[1] if need_x else 0) + \
        (x.shape[1] * x.shape[2] if need_w or need_b else 0)
    if n:
        dt = x.dtype.type
        launch("group_norm_backward", x.dtype, grid(n), THREADS, x, w, gout, mean, rstd, dx,
               dt(beta_x), bool(need_x), dw, dt(beta_w), bool(need_w), db, dt(beta_b),
               bool(need_b), bool(has_w))


def batch_norm(x, w, b, out, mean, rstd, rmean, rvar, count, momentum, eps, training, has_w,
               has_b, update, count_it) -> None:
    """See ``kernels.cpu.batch_norm``."""
    launch("batch_norm", x.dtype, grid(max(x.shape[1], 1)), THREADS, x, w, b, out, mean, rstd,
           rmean, rvar, count, float(momentum), float(eps), bool(training), bool(has_w),
           bool(has_b), bool(update), bool(count_it))


def batch_norm_backward(x, w, gout, mean, rstd, training, has_w, dx, beta_x, need_x, dw,
                        beta_w, need_w, db, beta_b, need_b) -> None:
    """See ``kernels.cpu.batch_norm_backward``."""
    if x.shape[1] and (need_x or need_w or need_b):
        dt = x.dtype.type
        launch("batch_norm_backward", x.dtype, grid(x.shape[1]), THREADS, x, w, gout, mean,
               rstd, bool(training), bool(has_w), dx, dt(beta_x), bool(need_x), dw, dt(beta_w),
               bool(need_w), db, dt(beta_b), bool(need_b))

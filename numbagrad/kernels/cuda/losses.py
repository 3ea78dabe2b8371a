"""CUDA loss kernels: each computes the loss and its input gradient in one launch.

Each thread accumulates its share of the loss, a shared-memory tree adds a
block's shares, and the last block to finish adds the block partials: one
launch, no pre-zeroed output, deterministic for a fixed grid.

The cross-entropy kernels range-check every label: one outside [0, C) adds
nan to the loss, leaves its gradient row the softmax and sets the shared
error flag (``_core.index_flag``) instead of reading and writing outside the
row. Host labels were checked before upload; a launcher given the labels'
``source`` (device labels the host never saw) reads the flag back once and
raises ``IndexError`` naming the op, the label, its position and the range.
"""
from __future__ import annotations

# the kernels this module registers
__all__ = ["cross_entropy", "cross_entropy3", "mse", "pointwise_loss"]

import math

import numpy as np
from numba import cuda, float64, int32, int64

from .. import codes
from ..cpu.losses import label_message
from ._core import (THREADS, Config, array_type, block_total, checked_code, flat, grid,
                    index_flag, index_flag_raised, kernel, launch, sums, to_host)

_term = cuda.jit(device=True)(codes.pointwise_loss)
_term_grad = cuda.jit(device=True)(codes.pointwise_loss_grad)


def _scratch_types():
    return array_type(float64, 1), array_type(int32, 1)   # what sums() holds


@kernel("mse", lambda dt: (array_type(dt, 1), array_type(dt, 1), array_type(dt, 0),
                           array_type(dt, 1), float64, *_scratch_types()))
def _mse_source(config: Config, dtype):
    threads = config.threads

    def mse_kernel(pred, target, loss_out, resid, scale, partial, counter):
        cache = cuda.shared.array(threads, float64)
        c = 2.0 * scale
        total = 0.0
        i = cuda.grid(1)
        stride = cuda.gridsize(1)
        while i < pred.size:
            d = pred[i] - target[i]
            resid[i] = c * d
            total += d * d
            i += stride
        last, grand = block_total(cache, total, partial, counter)
        if last:
            loss_out[()] = grand * scale

    return mse_kernel


@kernel("pointwise_loss", lambda dt: (int64, array_type(dt, 1), array_type(dt, 1),
                                      array_type(dt, 0), array_type(dt, 1), float64,
                                      *_scratch_types()))
def _pointwise_source(config: Config, dtype):
    threads = config.threads

    def pointwise_kernel(code, pred, target, loss_out, grad, scale, partial, counter):
        cache = cuda.shared.array(threads, float64)
        total = 0.0
        i = cuda.grid(1)
        stride = cuda.gridsize(1)
        while i < pred.size:
            total += _term(code, pred[i], target[i])
            grad[i] = scale * _term_grad(code, pred[i], target[i])
            i += stride
        last, grand = block_total(cache, total, partial, counter)
        if last:
            loss_out[()] = grand * scale

    return pointwise_kernel


@kernel("cross_entropy", lambda dt: (array_type(dt, 2), array_type(int64, 1), array_type(dt, 0),
                                     array_type(dt, 2), float64, *_scratch_types(),
                                     array_type(int32, 1)))
def _cross_entropy_source(config: Config, dtype):
    threads = config.threads

    def cross_entropy_kernel(logits, labels, loss_out, grad, scale, partial, counter, flag):
        # One thread per row: its max, log-sum-exp, loss term and gradient row.
        cache = cuda.shared.array(threads, float64)
        n, classes = logits.shape
        total = 0.0
        i = cuda.grid(1)
        stride = cuda.gridsize(1)
        while i < n:
            peak = logits[i, 0]
            for c in range(1, classes):
                peak = max(peak, logits[i, c])
            acc = 0.0
            for c in range(classes):
                e = math.exp(logits[i, c] - peak)
                grad[i, c] = e
                acc += e
            label = labels[i]
            inside = 0 <= label < classes
            if inside:
                total += peak + math.log(acc) - logits[i, label]
            else:
                flag[0] = 1
                total += math.nan
            inv = scale / acc
            for c in range(classes):
                grad[i, c] *= inv
            if inside:
                grad[i, label] -= scale
            i += stride
        last, grand = block_total(cache, total, partial, counter)
        if last:
            loss_out[()] = grand * scale

    return cross_entropy_kernel


@kernel("cross_entropy3", lambda dt: (array_type(dt, 3, "A"), array_type(int64, 1),
                                      array_type(dt, 0), array_type(dt, 3), float64,
                                      *_scratch_types(), array_type(int32, 1)))
def _cross_entropy3_source(config: Config, dtype):
    threads = config.threads

    def cross_entropy3_kernel(logits, labels, loss_out, grad, scale, partial, counter, flag):
        # One thread per (sample, position) row r = i * P + q, classes at stride P.
        cache = cuda.shared.array(threads, float64)
        n, classes, positions = logits.shape
        total = 0.0
        r = cuda.grid(1)
        stride = cuda.gridsize(1)
        while r < n * positions:
            i, q = r // positions, r % positions
            peak = logits[i, 0, q]
            for c in range(1, classes):
                peak = max(peak, logits[i, c, q])
            acc = 0.0
            for c in range(classes):
                e = math.exp(logits[i, c, q] - peak)
                grad[i, c, q] = e
                acc += e
            label = labels[r]
            inside = 0 <= label < classes
            if inside:
                total += peak + math.log(acc) - logits[i, label, q]
            else:
                flag[0] = 1
                total += math.nan
            inv = scale / acc
            for c in range(classes):
                grad[i, c, q] *= inv
            if inside:
                grad[i, label, q] -= scale
            r += stride
        last, grand = block_total(cache, total, partial, counter)
        if last:
            loss_out[()] = grand * scale

    return cross_entropy3_kernel


# ------------------------------------------------------------ launchers
def mse(pred, target, loss_out, resid_out, scale) -> None:
    """loss_out[()] = scale * sum((pred - target)**2); resid = 2*scale*(pred - target)."""
    launch("mse", pred.dtype, grid(pred.size), THREADS,
           flat(pred), flat(target), loss_out, flat(resid_out), float(scale), *sums())


def pointwise_loss(code, pred, target, loss_out, grad_out, scale) -> None:
    """See ``kernels.cpu.pointwise_loss``."""
    code = checked_code("pointwise_loss", code, codes.N_POINTWISE)
    launch("pointwise_loss", pred.dtype, grid(pred.size), THREADS, int(code),
           flat(pred), flat(target), loss_out, flat(grad_out), float(scale), *sums())


def _check_labels(source, classes: int, logits: tuple) -> None:
    """Raise IndexError when the kernel flagged a label of the device labels
    ``source`` outside [0, classes) (one 4-byte read; the labels are copied
    only to name the bad one)."""
    if not index_flag_raised():
        return
    host = to_host(source)
    bad = np.flatnonzero((host.reshape(-1) < 0) | (host.reshape(-1) >= classes))
    if bad.size:
        raise IndexError(label_message("cross_entropy", host, int(bad[0]), classes, logits)
                         + " (device labels, checked by the kernel; ignore_index is not "
                         "applied to them)")


def cross_entropy(logits, labels, loss_out, grad_out, scale, source=None) -> None:
    """See ``kernels.cpu.cross_entropy``. With ``source`` (the device labels
    ``labels`` views, unchecked on the host), a label outside [0, C) raises
    IndexError after the launch."""
    launch("cross_entropy", logits.dtype, grid(logits.shape[0]), THREADS,
           logits, labels, loss_out, grad_out, float(scale), *sums(), index_flag())
    if source is not None:
        _check_labels(source, logits.shape[1], tuple(logits.shape))


def cross_entropy3(logits, labels, loss_out, grad_out, scale, source=None) -> None:
    """See ``kernels.cpu.cross_entropy3``: one thread per (sample, position);
    ``source`` (of shape (N, d1, ...)) as ``cross_entropy``'s."""
    launch("cross_entropy3", logits.dtype, grid(logits.shape[0] * logits.shape[2]), THREADS,
           logits, labels, loss_out, grad_out, float(scale), *sums(), index_flag())
    if source is not None:
        n, classes = logits.shape[0], logits.shape[1]
        _check_labels(source, classes, (n, classes, *tuple(source.shape)[1:]))

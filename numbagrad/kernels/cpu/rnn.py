"""CPU kernels of ``nn.LSTM``: one layer and direction over a whole sequence
(``lstm_layer``) and its backward through time (``lstm_layer_backward``).

Each step is a small product (``matmul.gemm_pieces``: OpenBLAS's
small-matrix path) and the gate math in passes over each batch row, which
vectorise: float32 computes in float64 with ``vmath``'s branch-free sigmoid
and tanh (libm's took 3-4x as long, most of the step), float64 with the
``codes`` formulas (libm)."""
from __future__ import annotations

# the kernels this module registers
__all__ = ["lstm_layer", "lstm_layer_backward"]

import numpy as np
from numba import njit, prange

from .. import codes
from ._threads import ONE_THREAD, num_threads
from .matmul import _set_blas_threads, gemm_pieces
from .vmath import sigmoid64, tanh64

def _cell_fns(sigmoid, tanh):
    """The step's forward and backward row passes with the float64 functions
    ``sigmoid``/``tanh`` (one pair compiled per choice, so that a float32
    loop holds no libm call and vectorises)."""
    def cell(xp, rec, has_prev, cprev, h, c, act):
        """One step, in PyTorch's gate order i, f, g, o (column blocks of H):
        act = the gates' activations of xp (+ rec = h_prev @ W_hh^T when
        ``has_prev``), c = f * c_prev + i * g (c_prev = 0 without
        ``has_prev``), h = o * tanh(c); (rows, columns) arrays."""
        n = h.shape[1]
        pre = np.empty(4 * n)
        for i in range(h.shape[0]):
            if has_prev:
                for j in range(4 * n):
                    pre[j] = np.float64(xp[i, j]) + rec[i, j]
            else:
                for j in range(4 * n):
                    pre[j] = xp[i, j]
            for j in range(2 * n):
                act[i, j] = sigmoid(pre[j])
            for j in range(2 * n, 3 * n):
                act[i, j] = tanh(pre[j])
            for j in range(3 * n, 4 * n):
                act[i, j] = sigmoid(pre[j])
            for j in range(n):
                c[i, j] = act[i, j] * act[i, 2 * n + j] + (
                    act[i, n + j] * cprev[i, j] if has_prev else 0.0)
            for j in range(n):
                h[i, j] = act[i, 3 * n + j] * tanh(np.float64(c[i, j]))

    def cell_backward(gh, gc, act, c, cprev, has_prev, dg, dcprev):
        """``cell``'s gradient from gh, gc (those of h and c): the gates'
        pre-activations' into dg, c_prev's (d c * f) into dcprev (written
        either way). In passes of few arrays each, which vectorise (one
        loop over all of them would need more overlap checks than LLVM
        makes)."""
        n = c.shape[1]
        tc, dc = np.empty(n), np.empty(n)
        for i in range(c.shape[0]):
            for j in range(n):
                tc[j] = tanh(np.float64(c[i, j]))
            for j in range(n):
                dc[j] = gc[i, j] + np.float64(gh[i, j]) * act[i, 3 * n + j] * (
                    1.0 - tc[j] * tc[j])
            for j in range(n):
                go = np.float64(act[i, 3 * n + j])
                dg[i, 3 * n + j] = np.float64(gh[i, j]) * tc[j] * go * (1.0 - go)
            for j in range(n):
                gi = np.float64(act[i, j])
                dg[i, j] = dc[j] * act[i, 2 * n + j] * gi * (1.0 - gi)
            for j in range(n):
                gf = np.float64(act[i, n + j])
                dg[i, n + j] = dc[j] * (cprev[i, j] if has_prev else 0.0) * gf * (1.0 - gf)
            for j in range(n):
                gg = np.float64(act[i, 2 * n + j])
                dg[i, 2 * n + j] = dc[j] * act[i, j] * (1.0 - gg * gg)
            for j in range(n):
                dcprev[i, j] = dc[j] * act[i, n + j]
    return (njit(error_model="numpy")(cell), njit(error_model="numpy")(cell_backward))


_sigmoid = njit(error_model="numpy", inline="always")(codes._sigmoid)
_tanh = njit(error_model="numpy", inline="always")(codes._tanh)


@njit(error_model="numpy", inline="always")
def _sigmoid_libm(x):
    return _sigmoid(x, 0.0)


@njit(error_model="numpy", inline="always")
def _tanh_libm(x):
    return _tanh(x, 0.0)


_cell64, _cell_backward64 = _cell_fns(_sigmoid_libm, _tanh_libm)
_cell32, _cell_backward32 = _cell_fns(sigmoid64, tanh64)


@njit(error_model="numpy")
def _transpose(w, wt):
    for r in range(w.shape[0]):
        for q in range(w.shape[1]):
            wt[q, r] = w[r, q]


@njit(error_model="numpy")
def _forward_rows(proj, wt, h0, c0, has_h0, reverse, y, act, rec, r0, r1):
    """``lstm_layer`` for the batch rows [r0, r1): the recurrence never mixes
    rows, so blocks of rows run on threads of their own without meeting."""
    _set_blas_threads(1)
    steps = y.shape[1]
    for s in range(steps):
        t = steps - 1 - s if reverse else s
        tp = t + 1 if reverse else t - 1
        has_prev = s > 0 or has_h0
        part = rec[r0:r1]
        if has_prev:
            gemm_pieces((h0 if s == 0 else y[0, tp])[r0:r1], wt, part, 0.0, False)
        args = (proj[t, r0:r1], part, has_prev, (c0 if s == 0 else y[1, tp])[r0:r1],
                y[0, t, r0:r1], y[1, t, r0:r1], act[t, r0:r1])
        if y.itemsize == 4:
            _cell32(*args)
        else:
            _cell64(*args)


@njit(error_model="numpy")
def _backward_rows(gy, y, act, w_hh, c0, has_h0, reverse, dg, carry, g, r0, r1):
    """``lstm_layer_backward`` for the batch rows [r0, r1)."""
    _set_blas_threads(1)
    steps = y.shape[1]
    for s in range(steps):
        t = s if reverse else steps - 1 - s
        tp = t + 1 if reverse else t - 1
        first = s == steps - 1
        has_prev = not first or has_h0
        for q in range(2):
            for i in range(r0, r1):
                for j in range(g.shape[2]):
                    g[q, i, j] = gy[q, t, i, j] + carry[q, i, j]
        args = (g[0, r0:r1], g[1, r0:r1], act[t, r0:r1], y[1, t, r0:r1],
                (c0 if first else y[1, tp])[r0:r1], has_prev, dg[t, r0:r1], carry[1, r0:r1])
        if y.itemsize == 4:
            _cell_backward32(*args)
        else:
            _cell_backward64(*args)
        if has_prev:
            gemm_pieces(dg[t, r0:r1], w_hh, carry[0, r0:r1], 0.0, True)


@njit(cache=True, error_model="numpy")
def _row_blocks(rows, threads):
    """(blocks, rows per block) of a batch split over ``threads``."""
    parts = max(1, min(threads, rows))
    step = (rows + parts - 1) // parts
    return (rows + step - 1) // step if rows else 0, max(1, step)


@njit(cache=True, error_model="numpy")
def lstm_layer(proj, w_hh, wt, h0, c0, has_h0, reverse, y, act, rec):
    """One LSTM layer in one direction over a whole sequence: for each step t
    (last to first when ``reverse``) the cell of proj[t] (T, N, 4H) and
    rec = h_prev @ W_hh^T, into y[:, t] = [h_t; c_t] (y (2, T, N, H)) and
    act[t] (T, N, 4H). h_prev, c_prev: the previous step's, at the first step
    h0, c0 (N, H) when ``has_h0``, else zeros. wt (H, 4H) and rec (N, 4H) are
    work arrays. The per-step products run on one BLAS thread against the
    transposed copy wt (a product without transposes: OpenBLAS's fast small
    path). All arrays C-contiguous."""
    _transpose(w_hh, wt)
    previous = _set_blas_threads(1)
    _forward_rows(proj, wt, h0, c0, has_h0, reverse, y, act, rec, 0, y.shape[2])
    _set_blas_threads(previous)


@njit(error_model="numpy", inline="always")
def _forward_split(proj, w_hh, wt, h0, c0, has_h0, reverse, y, act, rec):
    # blocks of batch rows over Numba's threads (a prange: over none in the _st twin)
    _transpose(w_hh, wt)
    rows = y.shape[2]
    blocks, step = _row_blocks(rows, num_threads())
    previous = _set_blas_threads(1)
    for q in prange(blocks):
        _forward_rows(proj, wt, h0, c0, has_h0, reverse, y, act, rec, q * step,
                      min(rows, q * step + step))
    _set_blas_threads(previous)


@njit(cache=True, error_model="numpy", parallel=True)
def lstm_layer_mt(proj, w_hh, wt, h0, c0, has_h0, reverse, y, act, rec):
    """``lstm_layer`` with the batch rows split over Numba's threads."""
    _forward_split(proj, w_hh, wt, h0, c0, has_h0, reverse, y, act, rec)


@njit(cache=True, error_model="numpy")
def lstm_layer_st(proj, w_hh, wt, h0, c0, has_h0, reverse, y, act, rec):
    """``lstm_layer_mt``'s blocks on the calling thread alone: its bits."""
    _forward_split(proj, w_hh, wt, h0, c0, has_h0, reverse, y, act, rec)


@njit(cache=True, error_model="numpy")
def lstm_layer_backward(gy, y, act, w_hh, c0, has_h0, reverse, dg, carry, g):
    """``lstm_layer``'s backward through time from gy (2, T, N, H), the
    gradient of y: the gates' gradient of every step into dg (T, N, 4H) (the
    input projection's gradient; the caller forms W_hh's from it in one
    product), and into carry (2, N, H) that of the first step's [h0; c0]
    (when ``has_h0``). g (2, N, H) is a work array. All arrays C-contiguous."""
    carry[:] = 0.0
    previous = _set_blas_threads(1)
    _backward_rows(gy, y, act, w_hh, c0, has_h0, reverse, dg, carry, g, 0, y.shape[2])
    _set_blas_threads(previous)


@njit(error_model="numpy", inline="always")
def _backward_split(gy, y, act, w_hh, c0, has_h0, reverse, dg, carry, g):
    carry[:] = 0.0
    rows = y.shape[2]
    blocks, step = _row_blocks(rows, num_threads())
    previous = _set_blas_threads(1)
    for q in prange(blocks):
        _backward_rows(gy, y, act, w_hh, c0, has_h0, reverse, dg, carry, g, q * step,
                       min(rows, q * step + step))
    _set_blas_threads(previous)


@njit(cache=True, error_model="numpy", parallel=True)
def lstm_layer_backward_mt(gy, y, act, w_hh, c0, has_h0, reverse, dg, carry, g):
    """``lstm_layer_backward`` with the batch rows split over Numba's threads."""
    _backward_split(gy, y, act, w_hh, c0, has_h0, reverse, dg, carry, g)


@njit(cache=True, error_model="numpy")
def lstm_layer_backward_st(gy, y, act, w_hh, c0, has_h0, reverse, dg, carry, g):
    """``lstm_layer_backward_mt``'s blocks on the calling thread alone: its bits."""
    _backward_split(gy, y, act, w_hh, c0, has_h0, reverse, dg, carry, g)


ONE_THREAD.update(lstm_layer=lstm_layer_st, lstm_layer_backward=lstm_layer_backward_st)

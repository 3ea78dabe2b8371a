"""CPU normalisation kernels: group norm (layer norm is one group) and batch norm.

A group norm sees x as (N, G, K, S): statistics per (n, g) over K * S
elements, the affine weight and bias per (g, k), broadcast over S; a layer
norm over D trailing elements is (rows, 1, D, 1). A batch norm sees x as
(N, C, S): statistics per channel c over N * S elements. The per-row and
per-channel work is plain Python below, compiled for the CPU here and for
CUDA in ``kernels/cuda/norm.py``, so both devices add in the same order.
Statistics and sums run in float64 (mean and rstd are saved in float64);
a layer norm's row sums (S == 1) add in eight interleaved partial sums,
element k into partial k % 8 (the tail into the first), combined pairwise:
on the CPU eight independent chains where one float64 sum was one
dependent add an element (768 rows of 128: 170 -> 106 us forward on one
core, 92 -> 63 us on two; the backward's dx, with more work an element,
stayed at about 140 us).
The group norm's threaded twins share blocks of rows among the threads,
each row computed as the serial kernel computes it (the same bits); a layer
norm's weight and bias gradients, blocks of columns, each column's sum in
the rows' order.
"""
from __future__ import annotations

# the kernels this module registers
__all__ = ["batch_norm", "batch_norm_backward", "group_norm", "group_norm_backward"]

import math

import numpy as np
from numba import njit, prange

from ._threads import SPAN, _cast_like, num_threads


def group_norm_row(x, w, b, out, mean, rstd, eps, has_w, has_b, n, g):
    """Normalise row (n, g) of x: mean, rstd = 1 / sqrt(biased var + eps),
    out = (x - mean) * rstd * w + b; saves mean and rstd. S == 1 (a layer
    norm) has loops of its own: an inner loop of one costs more than its
    work. Either way the sums add in the same order."""
    K, S = x.shape[2], x.shape[3]
    m = K * S
    acc = 0.0
    if S == 1:   # eight partial sums: eight independent chains on the CPU
        a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = 0.0
        k8 = K - K % 8
        for k in range(0, k8, 8):
            a0 += x[n, g, k, 0]
            a1 += x[n, g, k + 1, 0]
            a2 += x[n, g, k + 2, 0]
            a3 += x[n, g, k + 3, 0]
            a4 += x[n, g, k + 4, 0]
            a5 += x[n, g, k + 5, 0]
            a6 += x[n, g, k + 6, 0]
            a7 += x[n, g, k + 7, 0]
        for k in range(k8, K):
            a0 += x[n, g, k, 0]
        acc = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))
    else:
        for k in range(K):
            for s in range(S):
                acc += x[n, g, k, s]
    mu = acc / m
    acc = 0.0
    if S == 1:
        a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = 0.0
        k8 = K - K % 8
        for k in range(0, k8, 8):
            d0, d1 = x[n, g, k, 0] - mu, x[n, g, k + 1, 0] - mu
            d2, d3 = x[n, g, k + 2, 0] - mu, x[n, g, k + 3, 0] - mu
            d4, d5 = x[n, g, k + 4, 0] - mu, x[n, g, k + 5, 0] - mu
            d6, d7 = x[n, g, k + 6, 0] - mu, x[n, g, k + 7, 0] - mu
            a0 += d0 * d0
            a1 += d1 * d1
            a2 += d2 * d2
            a3 += d3 * d3
            a4 += d4 * d4
            a5 += d5 * d5
            a6 += d6 * d6
            a7 += d7 * d7
        for k in range(k8, K):
            d = x[n, g, k, 0] - mu
            a0 += d * d
        acc = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))
    else:
        for k in range(K):
            for s in range(S):
                d = x[n, g, k, s] - mu
                acc += d * d
    r = 1.0 / math.sqrt(acc / m + eps)
    mean[n, g] = mu
    rstd[n, g] = r
    for k in range(K):
        scale = r * w[g, k] if has_w else r
        shift = b[g, k] if has_b else 0.0
        if S == 1:
            out[n, g, k, 0] = (x[n, g, k, 0] - mu) * scale + shift
        else:
            for s in range(S):
                out[n, g, k, s] = (x[n, g, k, s] - mu) * scale + shift


def group_norm_row_backward(x, w, gout, mean, rstd, dx, beta, has_w, n, g):
    """dx of row (n, g) = rstd * (gy - mean(gy) - xhat * mean(gy * xhat)),
    gy = gout * w, + beta * dx (beta == 0: dx is never read); S == 1 as in
    ``group_norm_row``."""
    K, S = x.shape[2], x.shape[3]
    m = K * S
    mu, r = mean[n, g], rstd[n, g]
    s1 = 0.0
    s2 = 0.0
    if S == 1:   # eight partial sums of each, as the forward
        a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = 0.0
        b0 = b1 = b2 = b3 = b4 = b5 = b6 = b7 = 0.0
        k8 = K - K % 8
        for k in range(0, k8, 8):
            y0 = gout[n, g, k, 0] * (w[g, k] if has_w else 1.0)
            y1 = gout[n, g, k + 1, 0] * (w[g, k + 1] if has_w else 1.0)
            y2 = gout[n, g, k + 2, 0] * (w[g, k + 2] if has_w else 1.0)
            y3 = gout[n, g, k + 3, 0] * (w[g, k + 3] if has_w else 1.0)
            y4 = gout[n, g, k + 4, 0] * (w[g, k + 4] if has_w else 1.0)
            y5 = gout[n, g, k + 5, 0] * (w[g, k + 5] if has_w else 1.0)
            y6 = gout[n, g, k + 6, 0] * (w[g, k + 6] if has_w else 1.0)
            y7 = gout[n, g, k + 7, 0] * (w[g, k + 7] if has_w else 1.0)
            a0 += y0
            a1 += y1
            a2 += y2
            a3 += y3
            a4 += y4
            a5 += y5
            a6 += y6
            a7 += y7
            b0 += y0 * ((x[n, g, k, 0] - mu) * r)
            b1 += y1 * ((x[n, g, k + 1, 0] - mu) * r)
            b2 += y2 * ((x[n, g, k + 2, 0] - mu) * r)
            b3 += y3 * ((x[n, g, k + 3, 0] - mu) * r)
            b4 += y4 * ((x[n, g, k + 4, 0] - mu) * r)
            b5 += y5 * ((x[n, g, k + 5, 0] - mu) * r)
            b6 += y6 * ((x[n, g, k + 6, 0] - mu) * r)
            b7 += y7 * ((x[n, g, k + 7, 0] - mu) * r)
        for k in range(k8, K):
            gy = gout[n, g, k, 0] * (w[g, k] if has_w else 1.0)
            a0 += gy
            b0 += gy * ((x[n, g, k, 0] - mu) * r)
        s1 = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))
        s2 = ((b0 + b1) + (b2 + b3)) + ((b4 + b5) + (b6 + b7))
    else:
        for k in range(K):
            wk = w[g, k] if has_w else 1.0
            for s in range(S):
                gy = gout[n, g, k, s] * wk
                s1 += gy
                s2 += gy * ((x[n, g, k, s] - mu) * r)
    s1 /= m
    s2 /= m
    for k in range(K):
        wk = w[g, k] if has_w else 1.0
        if S == 1:
            v = r * (gout[n, g, k, 0] * wk - s1 - (x[n, g, k, 0] - mu) * r * s2)
            dx[n, g, k, 0] = v if beta == 0 else v + beta * dx[n, g, k, 0]
        else:
            for s in range(S):
                v = r * (gout[n, g, k, s] * wk - s1 - (x[n, g, k, s] - mu) * r * s2)
                dx[n, g, k, s] = v if beta == 0 else v + beta * dx[n, g, k, s]


def group_norm_param_backward(x, gout, mean, rstd, dw, beta_w, need_w, db, beta_b, need_b,
                              g, k):
    """dw[g, k] = sum of gout * xhat and db[g, k] = sum of gout over n and s
    (each + its beta times what is there); S == 1 as in ``group_norm_row``."""
    N, S = x.shape[0], x.shape[3]
    aw = 0.0
    ab = 0.0
    for n in range(N):
        mu, r = mean[n, g], rstd[n, g]
        if S == 1:
            gv = gout[n, g, k, 0]
            aw += gv * ((x[n, g, k, 0] - mu) * r)
            ab += gv
        else:
            for s in range(S):
                gv = gout[n, g, k, s]
                aw += gv * ((x[n, g, k, s] - mu) * r)
                ab += gv
    if need_w:
        dw[g, k] = aw if beta_w == 0 else aw + beta_w * dw[g, k]
    if need_b:
        db[g, k] = ab if beta_b == 0 else ab + beta_b * db[g, k]


def batch_norm_channel(x, w, b, out, mean, rstd, rmean, rvar, momentum, eps, training,
                       has_w, has_b, update, c):
    """Normalise channel c of x (N, C, S): by the batch's mean and biased
    variance when ``training`` (and, when ``update``, running = (1 -
    momentum) * running + momentum * batch, the variance unbiased), else by
    the running ones; saves the mean and rstd used."""
    N, S = x.shape[0], x.shape[2]
    if training:
        m = N * S
        acc = 0.0
        for n in range(N):
            for s in range(S):
                acc += x[n, c, s]
        mu = acc / m
        acc = 0.0
        for n in range(N):
            for s in range(S):
                d = x[n, c, s] - mu
                acc += d * d
        var = acc / m
        if update:
            rmean[c] = (1.0 - momentum) * rmean[c] + momentum * mu
            rvar[c] = (1.0 - momentum) * rvar[c] + momentum * (acc / (m - 1))
    else:
        mu = 1.0 * rmean[c]
        var = 1.0 * rvar[c]
    r = 1.0 / math.sqrt(var + eps)
    mean[c] = mu
    rstd[c] = r
    scale = r * w[c] if has_w else r
    shift = b[c] if has_b else 0.0
    for n in range(N):
        for s in range(S):
            out[n, c, s] = (x[n, c, s] - mu) * scale + shift


def batch_norm_channel_backward(x, w, gout, mean, rstd, training, has_w, dx, beta_x, need_x,
                                dw, beta_w, need_w, db, beta_b, need_b, c):
    """Channel c's gradients: dx = rstd * w * (g - mean(g) - xhat * mean(g *
    xhat)) in training (the statistics depend on x), rstd * w * g in eval;
    dw[c] = sum of g * xhat, db[c] = sum of g; each + its beta times what is there."""
    N, S = x.shape[0], x.shape[2]
    m = N * S
    mu, r = mean[c], rstd[c]
    s1 = 0.0
    s2 = 0.0
    for n in range(N):
        for s in range(S):
            gv = gout[n, c, s]
            s1 += gv
            s2 += gv * ((x[n, c, s] - mu) * r)
    if need_w:
        dw[c] = s2 if beta_w == 0 else s2 + beta_w * dw[c]
    if need_b:
        db[c] = s1 if beta_b == 0 else s1 + beta_b * db[c]
    if need_x:
        scale = r * w[c] if has_w else r
        if training:
            s1 /= m
            s2 /= m
        for n in range(N):
            for s in range(S):
                gv = gout[n, c, s]
                if training:
                    gv = gv - s1 - (x[n, c, s] - mu) * r * s2
                v = scale * gv
                dx[n, c, s] = v if beta_x == 0 else v + beta_x * dx[n, c, s]


_row = njit(error_model="numpy", inline="always")(group_norm_row)
_row_backward = njit(error_model="numpy", inline="always")(group_norm_row_backward)
_param_backward = njit(error_model="numpy", inline="always")(group_norm_param_backward)
_channel = njit(error_model="numpy", inline="always")(batch_norm_channel)
_channel_backward = njit(error_model="numpy", inline="always")(batch_norm_channel_backward)


@njit(error_model="numpy", inline="always")
def _norm_rows(x, w, b, out, mean, rstd, eps, has_w, has_b, q0, q1):
    # rows q0 <= q < q1 of (N * G); a layer norm's loop of its own, compiled
    # knowing S == 1 (one loop for both took 233 against 106 us, 768 x 128)
    G = x.shape[1]
    if x.shape[3] == 1:
        for q in range(q0, q1):
            _row(x, w, b, out, mean, rstd, eps, has_w, has_b, q // G, q % G)
        return
    for q in range(q0, q1):
        _row(x, w, b, out, mean, rstd, eps, has_w, has_b, q // G, q % G)


@njit(error_model="numpy", inline="always")
def _norm_rows_backward(x, w, gout, mean, rstd, dx, beta, has_w, q0, q1):
    G = x.shape[1]
    for q in range(q0, q1):
        _row_backward(x, w, gout, mean, rstd, dx, beta, has_w, q // G, q % G)


@njit(cache=True, error_model="numpy")
def group_norm(x, w, b, out, mean, rstd, eps, has_w, has_b):
    """out = group-normalised x (N, G, K, S) with weight w and bias b (G, K)
    when ``has_w`` / ``has_b`` (else never read); mean, rstd (N, G) float64."""
    _norm_rows(x, w, b, out, mean, rstd, eps, has_w, has_b, 0, x.shape[0] * x.shape[1])


@njit(error_model="numpy", inline="always")
def _row_block(x):
    """Rows (n, g) a task of the threaded twins takes: about ``SPAN``
    elements, one row at least."""
    return max(1, SPAN // max(x.shape[2] * x.shape[3], 1))


@njit(cache=True, error_model="numpy", parallel=True)
def group_norm_mt(x, w, b, out, mean, rstd, eps, has_w, has_b):
    """``group_norm`` with blocks of rows shared among Numba's threads; every
    row is computed as the serial kernel computes it (the same bits)."""
    rows = x.shape[0] * x.shape[1]
    step = _row_block(x)
    for t in prange((rows + step - 1) // step):
        _norm_rows(x, w, b, out, mean, rstd, eps, has_w, has_b, t * step,
                   min(rows, (t + 1) * step))


@njit(cache=True, error_model="numpy")
def group_norm_backward(x, w, gout, mean, rstd, dx, beta_x, need_x, dw, beta_w, need_w, db,
                        beta_b, need_b, has_w):
    """The gradients of ``group_norm`` that are ``need_``-ed (the others'
    arrays are never touched), each written with its beta."""
    if need_x:
        bx = _cast_like(dx, beta_x)
        _norm_rows_backward(x, w, gout, mean, rstd, dx, bx, has_w, 0, x.shape[0] * x.shape[1])
    _norm_params_backward(x, gout, mean, rstd, dw, beta_w, need_w, db, beta_b, need_b, 1)


@njit(cache=True, error_model="numpy", parallel=True)
def group_norm_backward_mt(x, w, gout, mean, rstd, dx, beta_x, need_x, dw, beta_w, need_w, db,
                           beta_b, need_b, has_w):
    """``group_norm_backward`` with dx's rows shared among Numba's threads
    (each row as the serial kernel computes it); for a layer norm (S == 1),
    dw's and db's columns too, each column's sum over the rows in their
    order, as the serial kernel computes it (the same bits)."""
    G = x.shape[1]
    if need_x:
        bx = _cast_like(dx, beta_x)
        rows = x.shape[0] * G
        step = _row_block(x)
        for t in prange((rows + step - 1) // step):
            _norm_rows_backward(x, w, gout, mean, rstd, dx, bx, has_w, t * step,
                                min(rows, (t + 1) * step))
    parts = max(1, min(num_threads(), x.shape[2] // PARAM_COLUMNS))
    _norm_params_backward(x, gout, mean, rstd, dw, beta_w, need_w, db, beta_b, need_b, parts)


# A layer norm's weight and bias gradients are float64 sums over the rows,
# one per column; the threaded twin gives each thread a block of at least
# this many columns (an inner loop that still vectorises) over every row,
# in the rows' order: 768 rows of 128, 76 -> 47 us on two cores (the whole
# backward 148 -> 116 us).
PARAM_COLUMNS = 32


@njit(error_model="numpy", inline="always")
def _norm_params_backward(x, gout, mean, rstd, dw, beta_w, need_w, db, beta_b, need_b, parts):
    # parts: blocks of a layer norm's columns, one per thread in the threaded twin
    G, K = x.shape[1], x.shape[2]
    if need_w or need_b:
        bw, bb = _cast_like(dw, beta_w), _cast_like(db, beta_b)
        if x.shape[3] == 1:
            step = (K + parts - 1) // parts
            for t in prange(parts):
                _layer_param_backward(x, gout, mean, rstd, dw, bw, need_w, db, bb, need_b,
                                      t * step, min(K, (t + 1) * step))
        else:
            for g in range(G):
                for k in range(K):
                    _param_backward(x, gout, mean, rstd, dw, bw, need_w, db, bb, need_b, g, k)


@njit(error_model="numpy", inline="always")
def _layer_param_backward(x, gout, mean, rstd, dw, beta_w, need_w, db, beta_b, need_b, k0, k1):
    # group_norm_param_backward for S == 1, columns k0 to k1 (exclusive), with
    # the loops swapped: rows outer, every (g, k) its own float64 sum over n in
    # the same order, the inner loop over k independent sums (it vectorises)
    N, G, W = x.shape[0], x.shape[1], k1 - k0
    aw, ab = np.zeros((G, W)), np.zeros((G, W))
    for n in range(N):
        for g in range(G):
            mu, r = mean[n, g], rstd[n, g]
            xr, gr, wr, br = x[n, g, k0:k1, 0], gout[n, g, k0:k1, 0], aw[g], ab[g]
            for k in range(W):
                gv = gr[k]
                wr[k] += gv * ((xr[k] - mu) * r)
                br[k] += gv
    for g in range(G):
        for k in range(W):
            if need_w:
                dw[g, k0 + k] = aw[g, k] if beta_w == 0 else aw[g, k] + beta_w * dw[g, k0 + k]
            if need_b:
                db[g, k0 + k] = ab[g, k] if beta_b == 0 else ab[g, k] + beta_b * db[g, k0 + k]


@njit(cache=True, error_model="numpy")
def batch_norm(x, w, b, out, mean, rstd, rmean, rvar, count, momentum, eps, training, has_w,
               has_b, update, count_it):
    """out = batch-normalised x (N, C, S), see ``batch_norm_channel``; mean,
    rstd (C,) float64; ``count_it``: count[()] += 1 (num_batches_tracked)."""
    if count_it:
        count[()] += 1
    for c in range(x.shape[1]):
        _channel(x, w, b, out, mean, rstd, rmean, rvar, momentum, eps, training, has_w, has_b,
                 update, c)


@njit(cache=True, error_model="numpy")
def batch_norm_backward(x, w, gout, mean, rstd, training, has_w, dx, beta_x, need_x, dw,
                        beta_w, need_w, db, beta_b, need_b):
    """The gradients of ``batch_norm`` that are ``need_``-ed, each with its beta."""
    bx, bw, bb = _cast_like(dx, beta_x), _cast_like(dw, beta_w), _cast_like(db, beta_b)
    for c in range(x.shape[1]):
        _channel_backward(x, w, gout, mean, rstd, training, has_w, dx, bx, need_x, dw, bw,
                          need_w, db, bb, need_b, c)

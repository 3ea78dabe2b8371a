"""CPU normalisation kernels: group norm (layer norm is one group) and batch norm.

A group norm sees x as (N, G, K, S): statistics per (n, g) over K * S
elements, the affine weight and bias per (g, k), broadcast over S; a layer
norm over D trailing elements is (rows, 1, D, 1). A batch norm sees x as
(N, C, S): statistics per channel c over N * S elements. The per-row and
per-channel work is plain Python below, compiled for the CPU here and for
CUDA in ``kernels/cuda/norm.py``, so both devices add in the same order.
Statistics and sums run in float64 (mean and rstd are saved in float64).
The group norm's threaded twins share blocks of rows among the threads,
each row computed as the serial kernel computes it (the same bits).
"""
from __future__ import annotations

# the kernels this module registers
__all__ = ["batch_norm", "batch_norm_backward", "group_norm", "group_norm_backward"]

import math

import numpy as np
from numba import njit, prange

from ._threads import SPAN, _cast_like


def group_norm_row(x, w, b, out, mean, rstd, eps, has_w, has_b, n, g):
    """Normalise row (n, g) of x: mean, rstd = 1 / sqrt(biased var + eps),
    out = (x - mean) * rstd * w + b; saves mean and rstd. S == 1 (a layer
    norm) has loops of its own: an inner loop of one costs more than its
    work. Either way the sums add in the same order."""
    K, S = x.shape[2], x.shape[3]
    m = K * S
    acc = 0.0
    if S == 1:
        for k in range(K):
            acc += x[n, g, k, 0]
    else:
        for k in range(K):
            for s in range(S):
                acc += x[n, g, k, s]
    mu = acc / m
    acc = 0.0
    if S == 1:
        for k in range(K):
            d = x[n, g, k, 0] - mu
            acc += d * d
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
    for k in range(K):
        wk = w[g, k] if has_w else 1.0
        if S == 1:
            gy = gout[n, g, k, 0] * wk
            s1 += gy
            s2 += gy * ((x[n, g, k, 0] - mu) * r)
        else:
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


# CPU only: with S == 1 (a layer norm) four rows run side by side, each with
# group_norm_row's own expressions in its own order (the same bits, the CUDA
# kernels' too): one row's float64 sums are a chain of dependent adds, which
# four independent chains overlap (768 rows of 128: 310 -> 150 us). The
# backward's dx has two sums a row already; four rows there were slower.
@njit(error_model="numpy", inline="always")
def _rows4(x, w, b, out, mean, rstd, eps, has_w, has_b, q):
    G, K = x.shape[1], x.shape[2]
    n0, g0, n1, g1 = q // G, q % G, (q + 1) // G, (q + 1) % G
    n2, g2, n3, g3 = (q + 2) // G, (q + 2) % G, (q + 3) // G, (q + 3) % G
    x0, x1, x2, x3 = x[n0, g0, :, 0], x[n1, g1, :, 0], x[n2, g2, :, 0], x[n3, g3, :, 0]
    a0 = a1 = a2 = a3 = 0.0
    for k in range(K):
        a0 += x0[k]
        a1 += x1[k]
        a2 += x2[k]
        a3 += x3[k]
    m0, m1, m2, m3 = a0 / K, a1 / K, a2 / K, a3 / K
    a0 = a1 = a2 = a3 = 0.0
    for k in range(K):
        d0, d1, d2, d3 = x0[k] - m0, x1[k] - m1, x2[k] - m2, x3[k] - m3
        a0 += d0 * d0
        a1 += d1 * d1
        a2 += d2 * d2
        a3 += d3 * d3
    r0, r1 = 1.0 / math.sqrt(a0 / K + eps), 1.0 / math.sqrt(a1 / K + eps)
    r2, r3 = 1.0 / math.sqrt(a2 / K + eps), 1.0 / math.sqrt(a3 / K + eps)
    mean[n0, g0], mean[n1, g1], mean[n2, g2], mean[n3, g3] = m0, m1, m2, m3
    rstd[n0, g0], rstd[n1, g1], rstd[n2, g2], rstd[n3, g3] = r0, r1, r2, r3
    _affine_row(x0, w, b, out[n0, g0, :, 0], m0, r0, has_w, has_b, g0)
    _affine_row(x1, w, b, out[n1, g1, :, 0], m1, r1, has_w, has_b, g1)
    _affine_row(x2, w, b, out[n2, g2, :, 0], m2, r2, has_w, has_b, g2)
    _affine_row(x3, w, b, out[n3, g3, :, 0], m3, r3, has_w, has_b, g3)


@njit(error_model="numpy", inline="always")
def _affine_row(xr, w, b, o, mu, r, has_w, has_b, g):
    for k in range(o.size):
        scale = r * w[g, k] if has_w else r
        shift = b[g, k] if has_b else 0.0
        o[k] = (xr[k] - mu) * scale + shift


@njit(error_model="numpy", inline="always")
def _norm_rows(x, w, b, out, mean, rstd, eps, has_w, has_b, q0, q1):
    # rows q0 <= q < q1 of (N * G): four at a time for a layer norm
    G = x.shape[1]
    q = q0
    if x.shape[3] == 1:
        while q + 4 <= q1:
            _rows4(x, w, b, out, mean, rstd, eps, has_w, has_b, q)
            q += 4
    while q < q1:
        _row(x, w, b, out, mean, rstd, eps, has_w, has_b, q // G, q % G)
        q += 1


@njit(cache=True, error_model="numpy")
def group_norm(x, w, b, out, mean, rstd, eps, has_w, has_b):
    """out = group-normalised x (N, G, K, S) with weight w and bias b (G, K)
    when ``has_w`` / ``has_b`` (else never read); mean, rstd (N, G) float64."""
    _norm_rows(x, w, b, out, mean, rstd, eps, has_w, has_b, 0, x.shape[0] * x.shape[1])


@njit(error_model="numpy", inline="always")
def _row_block(x):
    """Rows (n, g) a task of the threaded twins takes: a multiple of four
    (``_rows4``) holding about ``SPAN`` elements."""
    per = x.shape[2] * x.shape[3]
    return max(4, (SPAN // max(per, 1) + 3) // 4 * 4)


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
    N, G = x.shape[0], x.shape[1]
    if need_x:
        bx = _cast_like(dx, beta_x)
        for n in range(N):
            for g in range(G):
                _row_backward(x, w, gout, mean, rstd, dx, bx, has_w, n, g)
    _norm_params_backward(x, gout, mean, rstd, dw, beta_w, need_w, db, beta_b, need_b)


@njit(cache=True, error_model="numpy", parallel=True)
def group_norm_backward_mt(x, w, gout, mean, rstd, dx, beta_x, need_x, dw, beta_w, need_w, db,
                           beta_b, need_b, has_w):
    """``group_norm_backward`` with dx's rows shared among Numba's threads
    (each row as the serial kernel computes it); dw and db, sums over the
    rows in their order, as the serial kernel computes them."""
    G = x.shape[1]
    if need_x:
        bx = _cast_like(dx, beta_x)
        rows = x.shape[0] * G
        step = _row_block(x)
        for t in prange((rows + step - 1) // step):
            for q in range(t * step, min(rows, (t + 1) * step)):
                _row_backward(x, w, gout, mean, rstd, dx, bx, has_w, q // G, q % G)
    _norm_params_backward(x, gout, mean, rstd, dw, beta_w, need_w, db, beta_b, need_b)


@njit(error_model="numpy", inline="always")
def _norm_params_backward(x, gout, mean, rstd, dw, beta_w, need_w, db, beta_b, need_b):
    G, K = x.shape[1], x.shape[2]
    if need_w or need_b:
        bw, bb = _cast_like(dw, beta_w), _cast_like(db, beta_b)
        if x.shape[3] == 1:
            _layer_param_backward(x, gout, mean, rstd, dw, bw, need_w, db, bb, need_b)
        else:
            for g in range(G):
                for k in range(K):
                    _param_backward(x, gout, mean, rstd, dw, bw, need_w, db, bb, need_b, g, k)


@njit(error_model="numpy", inline="always")
def _layer_param_backward(x, gout, mean, rstd, dw, beta_w, need_w, db, beta_b, need_b):
    # group_norm_param_backward for S == 1 with the loops swapped: rows outer,
    # every (g, k) its own float64 sum over n in the same order, the inner
    # loop over k independent sums (it vectorises)
    N, G, K = x.shape[0], x.shape[1], x.shape[2]
    aw, ab = np.zeros((G, K)), np.zeros((G, K))
    for n in range(N):
        for g in range(G):
            mu, r = mean[n, g], rstd[n, g]
            xr, gr, wr, br = x[n, g, :, 0], gout[n, g, :, 0], aw[g], ab[g]
            for k in range(K):
                gv = gr[k]
                wr[k] += gv * ((xr[k] - mu) * r)
                br[k] += gv
    for g in range(G):
        for k in range(K):
            if need_w:
                dw[g, k] = aw[g, k] if beta_w == 0 else aw[g, k] + beta_w * dw[g, k]
            if need_b:
                db[g, k] = ab[g, k] if beta_b == 0 else ab[g, k] + beta_b * db[g, k]


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

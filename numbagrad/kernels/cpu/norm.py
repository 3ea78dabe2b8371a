"""CPU normalisation kernels: group norm (layer norm is one group) and batch norm.

A group norm sees x as (N, G, K, S): statistics per (n, g) over K * S
elements, the affine weight and bias per (g, k), broadcast over S; a layer
norm over D trailing elements is (rows, 1, D, 1). A batch norm sees x as
(N, C, S): statistics per channel c over N * S elements. The per-row and
per-channel work is plain Python below, compiled for the CPU here and for
CUDA in ``kernels/cuda/norm.py``, so both devices add in the same order.
Statistics and sums run in float64 (mean and rstd are saved in float64).
"""
from __future__ import annotations

import math

from numba import njit

from ._threads import _cast_like


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


@njit(cache=True, error_model="numpy")
def group_norm(x, w, b, out, mean, rstd, eps, has_w, has_b):
    """out = group-normalised x (N, G, K, S) with weight w and bias b (G, K)
    when ``has_w`` / ``has_b`` (else never read); mean, rstd (N, G) float64."""
    N, G = x.shape[0], x.shape[1]
    for n in range(N):
        for g in range(G):
            _row(x, w, b, out, mean, rstd, eps, has_w, has_b, n, g)


@njit(cache=True, error_model="numpy")
def group_norm_backward(x, w, gout, mean, rstd, dx, beta_x, need_x, dw, beta_w, need_w, db,
                        beta_b, need_b, has_w):
    """The gradients of ``group_norm`` that are ``need_``-ed (the others'
    arrays are never touched), each written with its beta."""
    N, G, K = x.shape[0], x.shape[1], x.shape[2]
    if need_x:
        bx = _cast_like(dx, beta_x)
        for n in range(N):
            for g in range(G):
                _row_backward(x, w, gout, mean, rstd, dx, bx, has_w, n, g)
    if need_w or need_b:
        bw, bb = _cast_like(dw, beta_w), _cast_like(db, beta_b)
        for g in range(G):
            for k in range(K):
                _param_backward(x, gout, mean, rstd, dw, bw, need_w, db, bb, need_b, g, k)


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

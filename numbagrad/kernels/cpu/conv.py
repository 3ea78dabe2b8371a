"""CPU convolution and pooling kernels over NCHW arrays.

A convolution is ``im2col`` (every input patch as a column) followed by the
GEMM kernels; its input gradient is a GEMM into columns and ``col2im``,
which adds each input element's columns back up. The gradients scatter-add
into a float64 scratch in increasing (kernel offset or window) order, then
write dest once; the CUDA kernels gather per element in that same order, so
both devices add in the same order. Sums run in float64.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ._threads import _cast_like


@njit(cache=True, error_model="numpy")
def im2col(x, cols, sh, sw, ph, pw, dh, dw):
    """cols[c, i, j, n, oh, ow] = x[n, c, oh*sh - ph + i*dh, ow*sw - pw + j*dw],
    0 outside x (zero padding). x (N, C, H, W) and cols (C, KH, KW, N, OH, OW)
    C-contiguous; the kernel and output sizes come from cols' shape."""
    C, KH, KW, N, OH, OW = cols.shape
    H, W = x.shape[2], x.shape[3]
    for c in range(C):
        for i in range(KH):
            for j in range(KW):
                for n in range(N):
                    for oh in range(OH):
                        h = oh * sh - ph + i * dh
                        row = cols[c, i, j, n, oh]
                        if h < 0 or h >= H:
                            for ow in range(OW):
                                row[ow] = 0.0
                            continue
                        for ow in range(OW):
                            w = ow * sw - pw + j * dw
                            row[ow] = x[n, c, h, w] if 0 <= w < W else 0.0


@njit(error_model="numpy", inline="always")
def _store(acc, dest, b):
    """dest = acc + b * dest (b == 0: dest is never read), acc float64 of dest's shape."""
    N, C, H, W = dest.shape
    for n in range(N):
        for c in range(C):
            for h in range(H):
                for w in range(W):
                    dest[n, c, h, w] = acc[n, c, h, w] if b == 0 else \
                        acc[n, c, h, w] + b * dest[n, c, h, w]


@njit(cache=True, error_model="numpy")
def col2im(cols, dest, sh, sw, ph, pw, dh, dw, beta):
    """dest = (every column entry im2col read from an element, added up) +
    beta * dest: the gradient of ``im2col``; beta == 0 never reads dest."""
    b = _cast_like(dest, beta)
    C, KH, KW, N, OH, OW = cols.shape
    H, W = dest.shape[2], dest.shape[3]
    acc = np.zeros(dest.shape, np.float64)
    for c in range(C):
        for i in range(KH):
            for j in range(KW):
                for n in range(N):
                    for oh in range(OH):
                        h = oh * sh - ph + i * dh
                        if h < 0 or h >= H:
                            continue
                        row, plane = cols[c, i, j, n, oh], acc[n, c, h]
                        for ow in range(OW):
                            w = ow * sw - pw + j * dw
                            if 0 <= w < W:
                                plane[w] += row[ow]
    _store(acc, dest, b)


@njit(cache=True, error_model="numpy")
def max_pool2d(x, out, idx, kh, kw, sh, sw, ph, pw, dh, dw):
    """out = the max of each window (padding never wins), idx = its position
    h * W + w in the plane: the first max in row-major window order, as
    PyTorch's CPU kernel (a nan counts as the max). x (N, C, H, W), out and
    idx (N, C, OH, OW)."""
    N, C, OH, OW = out.shape
    H, W = x.shape[2], x.shape[3]
    for n in range(N):
        for c in range(C):
            for oh in range(OH):
                for ow in range(OW):
                    h0, w0 = oh * sh - ph, ow * sw - pw
                    while h0 < 0:
                        h0 += dh
                    while w0 < 0:
                        w0 += dw
                    best = -np.inf
                    at = h0 * W + w0
                    for i in range(kh):
                        h = oh * sh - ph + i * dh
                        if h < 0 or h >= H:
                            continue
                        for j in range(kw):
                            w = ow * sw - pw + j * dw
                            if w < 0 or w >= W:
                                continue
                            v = x[n, c, h, w]
                            if v > best or v != v:
                                best = v
                                at = h * W + w
                    out[n, c, oh, ow] = best
                    idx[n, c, oh, ow] = at


@njit(cache=True, error_model="numpy")
def max_pool2d_backward(g, idx, dest, kh, kw, sh, sw, ph, pw, dh, dw, beta):
    """dest = (g of every window whose max is the element, added up) + beta * dest."""
    b = _cast_like(dest, beta)
    N, C, OH, OW = g.shape
    W = dest.shape[3]
    acc = np.zeros(dest.shape, np.float64)
    for n in range(N):
        for c in range(C):
            for oh in range(OH):
                for ow in range(OW):
                    at = idx[n, c, oh, ow]
                    acc[n, c, at // W, at % W] += g[n, c, oh, ow]
    _store(acc, dest, b)


def pool_divisor(oh, ow, H, W, kh, kw, sh, sw, ph, pw, include_pad):
    """PyTorch's avg_pool2d divisor of window (oh, ow), and the window clipped
    to the input: (divisor, h0, w0, h1, w1). Plain Python, compiled for
    either device."""
    h0, w0 = oh * sh - ph, ow * sw - pw
    h1, w1 = min(h0 + kh, H + ph), min(w0 + kw, W + pw)
    size = (h1 - h0) * (w1 - w0)
    h0, w0, h1, w1 = max(h0, 0), max(w0, 0), min(h1, H), min(w1, W)
    return (size if include_pad else (h1 - h0) * (w1 - w0)), h0, w0, h1, w1


_divisor = njit(error_model="numpy", inline="always")(pool_divisor)


@njit(cache=True, error_model="numpy")
def avg_pool2d(x, out, kh, kw, sh, sw, ph, pw, include_pad):
    """out = the mean of each window, padding counted as zeros when
    ``include_pad`` (PyTorch's count_include_pad)."""
    N, C, OH, OW = out.shape
    H, W = x.shape[2], x.shape[3]
    for n in range(N):
        for c in range(C):
            for oh in range(OH):
                for ow in range(OW):
                    div, h0, w0, h1, w1 = _divisor(oh, ow, H, W, kh, kw, sh, sw, ph, pw,
                                                   include_pad)
                    acc = 0.0
                    for h in range(h0, h1):
                        for w in range(w0, w1):
                            acc += x[n, c, h, w]
                    out[n, c, oh, ow] = acc / div


@njit(cache=True, error_model="numpy")
def avg_pool2d_backward(g, dest, kh, kw, sh, sw, ph, pw, include_pad, beta):
    """dest = (g / divisor of every window holding the element, added up) + beta * dest."""
    b = _cast_like(dest, beta)
    N, C, OH, OW = g.shape
    H, W = dest.shape[2], dest.shape[3]
    acc = np.zeros(dest.shape, np.float64)
    for n in range(N):
        for c in range(C):
            for oh in range(OH):
                for ow in range(OW):
                    div, h0, w0, h1, w1 = _divisor(oh, ow, H, W, kh, kw, sh, sw, ph, pw,
                                                   include_pad)
                    for h in range(h0, h1):
                        for w in range(w0, w1):
                            acc[n, c, h, w] += g[n, c, oh, ow] / div
    _store(acc, dest, b)


@njit(cache=True, error_model="numpy")
def adaptive_avg_pool2d(x, out):
    """out[oh, ow] = the mean of rows floor(oh*H/OH) to ceil((oh+1)*H/OH)
    (exclusive) and likewise columns, PyTorch's adaptive windows."""
    N, C, OH, OW = out.shape
    H, W = x.shape[2], x.shape[3]
    for n in range(N):
        for c in range(C):
            for oh in range(OH):
                h0, h1 = (oh * H) // OH, ((oh + 1) * H + OH - 1) // OH
                for ow in range(OW):
                    w0, w1 = (ow * W) // OW, ((ow + 1) * W + OW - 1) // OW
                    acc = 0.0
                    for h in range(h0, h1):
                        for w in range(w0, w1):
                            acc += x[n, c, h, w]
                    out[n, c, oh, ow] = acc / ((h1 - h0) * (w1 - w0))


@njit(cache=True, error_model="numpy")
def adaptive_avg_pool2d_backward(g, dest, beta):
    """dest = (g / window size of every adaptive window holding the element,
    added up) + beta * dest."""
    b = _cast_like(dest, beta)
    N, C, OH, OW = g.shape
    H, W = dest.shape[2], dest.shape[3]
    acc = np.zeros(dest.shape, np.float64)
    for n in range(N):
        for c in range(C):
            for oh in range(OH):
                h0, h1 = (oh * H) // OH, ((oh + 1) * H + OH - 1) // OH
                for ow in range(OW):
                    w0, w1 = (ow * W) // OW, ((ow + 1) * W + OW - 1) // OW
                    for h in range(h0, h1):
                        for w in range(w0, w1):
                            acc[n, c, h, w] += g[n, c, oh, ow] / ((h1 - h0) * (w1 - w0))
    _store(acc, dest, b)

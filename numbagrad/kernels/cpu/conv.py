"""CPU convolution and pooling kernels over NCHW arrays.

A convolution is ``im2col`` (every input patch as a row of "columns")
followed by the GEMM kernels; its input gradient is a GEMM into columns and
``col2im``, which adds each input element's entries back up. The gradients scatter-add
into a float64 scratch in increasing (kernel offset or window) order, then
write dest once; the CUDA kernels gather per element in that same order, so
both devices add in the same order. Sums run in float64.
"""
from __future__ import annotations

# the kernels this module registers
__all__ = ["adaptive_avg_pool2d", "adaptive_avg_pool2d_backward", "avg_pool2d",
           "avg_pool2d_backward", "col2im", "im2col", "max_pool2d", "max_pool2d_backward",
           "max_unpool2d", "max_unpool2d_backward"]

import numpy as np
from numba import njit, uint64

from ._threads import _cast_like


@njit(error_model="numpy", inline="always")
def _offsets(OH, OW, H, W, top, left, sh, sw):
    """Where each output position (oh, ow) reads in a plane, h * W + w with
    h = oh*sh + top and w = ow*sw + left, or -1 in the padding."""
    at = np.empty(OH * OW, np.int64)
    for oh in range(OH):
        h = oh * sh + top
        for ow in range(OW):
            w = ow * sw + left
            at[oh * OW + ow] = h * W + w if (0 <= h < H and 0 <= w < W) else -1
    return at


@njit(error_model="numpy", inline="always")
def _patch_offsets(OH, OW, H, W, KH, KW, sh, sw, ph, pw, dh, dw):
    """at[q * KH*KW + i*KW + j]: where output position q's patch element (i, j)
    reads in a plane (``_offsets``), -1 in the padding."""
    T = KH * KW
    at = np.empty((OH * OW, T), np.int64)
    for i in range(KH):
        for j in range(KW):
            at[:, i * KW + j] = _offsets(OH, OW, H, W, i * dh - ph, j * dw - pw, sh, sw)
    return at.reshape(OH * OW * T)


# Indices below are cast to uint64 (all are >= 0): with signed ones every
# access carries NumPy's negative-index wraparound, which costs 3-4x here.
@njit(cache=True, error_model="numpy")
def im2col(x, cols, sh, sw, ph, pw, dh, dw):
    """cols[g, n, oh, ow, c, i, j] = x[n, g*C/G + c, oh*sh - ph + i*dh,
    ow*sw - pw + j*dw], 0 outside x (zero padding): every patch a row. x
    (N, C, H, W) and cols (G, N, OH, OW, C/G, KH, KW) C-contiguous; the
    groups, kernel and output sizes come from cols' shape. One output
    position's read offsets (a row of C/G*KH*KW) serve every image."""
    G, N, OH, OW, CG, KH, KW = cols.shape
    C, H, W = x.shape[1], x.shape[2], x.shape[3]
    xf, cf = x.reshape(x.size), cols.reshape(cols.size)
    P, HW, T = OH * OW, H * W, KH * KW
    CT = CG * T
    at = _patch_offsets(OH, OW, H, W, KH, KW, sh, sw, ph, pw, dh, dw)
    zero = cols.dtype.type(0)
    row = np.empty(CT, np.int64)
    for g in range(G):
        for q in range(P):
            for c in range(CG):
                for t in range(T):
                    k = at[q * T + t]
                    row[c * T + t] = (g * CG + c) * HW + k if k >= 0 else -1
            for n in range(N):
                o = ((g * N + n) * P + q) * CT
                image = n * C * HW
                for u in range(CT):
                    k = row[u]
                    cf[uint64(o + u)] = xf[uint64(image + k)] if k >= 0 else zero


@njit(error_model="numpy", inline="always")
def _store(acc, dest, b):
    """dest = acc + b * dest (b == 0: dest is never read), acc the float64
    sums of dest's elements in C order."""
    flat = dest.reshape(dest.size)
    if b == 0:
        for e in range(flat.size):
            flat[uint64(e)] = acc[uint64(e)]
    else:
        for e in range(flat.size):
            flat[uint64(e)] = acc[uint64(e)] + b * flat[uint64(e)]


@njit(cache=True, error_model="numpy")
def col2im(cols, dest, sh, sw, ph, pw, dh, dw, beta):
    """dest = (every column entry im2col read from an element, added up) +
    beta * dest: the gradient of ``im2col``; beta == 0 never reads dest.
    Each element's entries are added in increasing kernel offset (i, j)."""
    b = _cast_like(dest, beta)
    G, N, OH, OW, CG, KH, KW = cols.shape
    C, H, W = dest.shape[1], dest.shape[2], dest.shape[3]
    cf = cols.reshape(cols.size)
    P, HW, T = OH * OW, H * W, KH * KW
    acc = np.zeros(dest.size, np.float64)
    for i in range(KH):
        for j in range(KW):
            at = _offsets(OH, OW, H, W, i * dh - ph, j * dw - pw, sh, sw)
            o = i * KW + j
            for g in range(G):
                for n in range(N):
                    for q in range(P):
                        k = at[q]
                        if k < 0:
                            o += CG * T
                            continue
                        for c in range(CG):
                            acc[uint64((n * C + g * CG + c) * HW + k)] += cf[uint64(o)]
                            o += T
    _store(acc, dest, b)


@njit(error_model="numpy", inline="always")
def _pick(v, k, best, at):
    """(best, at) after window element v at k: a larger v or a nan takes over."""
    if v > best or v != v:
        return v, k
    return best, at


@njit(cache=True, error_model="numpy")
def max_pool2d(x, out, idx, kh, kw, sh, sw, ph, pw, dh, dw):
    """out = the max of each window (padding never wins), idx = its position
    h * W + w in the plane: the first max in row-major window order, as
    PyTorch's CPU kernel (a nan counts as the max). x (N, C, H, W), out and
    idx (N, C, OH, OW). The common 2x2 window inside x is unrolled
    (same order, same result): short inner loops cost 2x here."""
    N, C, OH, OW = out.shape
    H, W = x.shape[2], x.shape[3]
    xf, of, jf = x.reshape(x.size), out.reshape(out.size), idx.reshape(idx.size)
    P, HW, T = OH * OW, H * W, kh * kw
    neg = xf.dtype.type(-np.inf)
    if kh == 2 and kw == 2 and ph == 0 and pw == 0 and (OH - 1) * sh + dh < H \
            and (OW - 1) * sw + dw < W:    # (ceil_mode's last windows can run past the edge)
        o = 0
        for p in range(N * C):
            base = p * HW
            for oh in range(OH):
                for ow in range(OW):
                    k = oh * sh * W + ow * sw
                    best, at = _pick(xf[uint64(base + k)], k, neg, k)
                    best, at = _pick(xf[uint64(base + k + dw)], k + dw, best, at)
                    k += dh * W
                    best, at = _pick(xf[uint64(base + k)], k, best, at)
                    best, at = _pick(xf[uint64(base + k + dw)], k + dw, best, at)
                    of[uint64(o)] = best
                    jf[uint64(o)] = at
                    o += 1
        return
    # window[q * T + t]: the t-th position (row-major) of window q, -1 in the padding
    window = _patch_offsets(OH, OW, H, W, kh, kw, sh, sw, ph, pw, dh, dw)
    first = np.empty(P, np.int64)   # idx of a window whose max is never set: its first
    for q in range(P):              # in-bounds row and column, as PyTorch
        oh, ow = q // OW, q % OW
        h0, w0 = oh * sh - ph, ow * sw - pw
        h0 += ((dh - 1 - h0) // dh) * dh if h0 < 0 else 0
        w0 += ((dw - 1 - w0) // dw) * dw if w0 < 0 else 0
        first[q] = h0 * W + w0
    o = 0
    for p in range(N * C):
        base = p * HW
        for q in range(P):
            best, at = neg, first[uint64(q)]
            for t in range(q * T, q * T + T):
                k = window[uint64(t)]
                if k >= 0:
                    best, at = _pick(xf[uint64(base + k)], k, best, at)
            of[uint64(o)] = best
            jf[uint64(o)] = at
            o += 1


@njit(cache=True, error_model="numpy")
def max_pool2d_backward(g, idx, dest, kh, kw, sh, sw, ph, pw, dh, dw, beta):
    """dest = (g of every window whose max is the element, added up) + beta * dest.
    Windows that cannot overlap (each element in at most one) write dest in
    place, with the same float64 arithmetic as the scratch sums."""
    b = _cast_like(dest, beta)
    N, C, OH, OW = g.shape
    HW = dest.shape[2] * dest.shape[3]
    gf, jf, df = g.reshape(g.size), idx.reshape(idx.size), dest.reshape(dest.size)
    P = OH * OW
    if (kh - 1) * dh < sh and (kw - 1) * dw < sw:
        if b == 0:
            for e in range(df.size):
                df[uint64(e)] = 0.0
        else:
            for e in range(df.size):
                df[uint64(e)] = 0.0 + b * df[uint64(e)]
        o = 0
        for p in range(N * C):
            for q in range(P):
                e = uint64(p * HW + jf[uint64(o)])
                df[e] = (0.0 + gf[uint64(o)]) + df[e]
                o += 1
        return
    acc = np.zeros(dest.size, np.float64)
    o = 0
    for p in range(N * C):
        for q in range(P):
            acc[uint64(p * HW + jf[uint64(o)])] += gf[uint64(o)]
            o += 1
    _store(acc, dest, b)


def pool_divisor(oh, ow, H, W, kh, kw, sh, sw, ph, pw, include_pad, divisor):
    """PyTorch's avg_pool2d divisor of window (oh, ow), and the window clipped
    to the input: (divisor, h0, w0, h1, w1). ``divisor`` > 0 overrides it;
    else with ``include_pad`` it counts the padding, but not a ceil_mode
    window's part past the padded edge. Plain Python, compiled for either
    device."""
    h0, w0 = oh * sh - ph, ow * sw - pw
    h1, w1 = min(h0 + kh, H + ph), min(w0 + kw, W + pw)
    size = (h1 - h0) * (w1 - w0)
    h0, w0, h1, w1 = max(h0, 0), max(w0, 0), min(h1, H), min(w1, W)
    if divisor > 0:
        size = divisor
    elif not include_pad:
        size = (h1 - h0) * (w1 - w0)
    return size, h0, w0, h1, w1


def adaptive_window(o, out_size, in_size):
    """[lo, hi): the input rows (or columns) of adaptive window o, floor(o*H/OH)
    to ceil((o+1)*H/OH), PyTorch's. Plain Python, compiled for either device."""
    return (o * in_size) // out_size, ((o + 1) * in_size + out_size - 1) // out_size


_divisor = njit(error_model="numpy", inline="always")(pool_divisor)
_adaptive = njit(error_model="numpy", inline="always")(adaptive_window)


@njit(cache=True, error_model="numpy")
def avg_pool2d(x, out, kh, kw, sh, sw, ph, pw, include_pad, divisor):
    """out = the mean of each window, padding counted as zeros when
    ``include_pad`` (PyTorch's count_include_pad); the sum over ``divisor``
    when it is > 0 (PyTorch's divisor_override)."""
    N, C, OH, OW = out.shape
    H, W = x.shape[2], x.shape[3]
    for n in range(N):
        for c in range(C):
            for oh in range(OH):
                for ow in range(OW):
                    div, h0, w0, h1, w1 = _divisor(oh, ow, H, W, kh, kw, sh, sw, ph, pw,
                                                   include_pad, divisor)
                    acc = 0.0
                    for h in range(h0, h1):
                        for w in range(w0, w1):
                            acc += x[n, c, h, w]
                    out[n, c, oh, ow] = acc / div


@njit(cache=True, error_model="numpy")
def avg_pool2d_backward(g, dest, kh, kw, sh, sw, ph, pw, include_pad, divisor, beta):
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
                                                   include_pad, divisor)
                    for h in range(h0, h1):
                        for w in range(w0, w1):
                            acc[n, c, h, w] += g[n, c, oh, ow] / div
    _store(acc.reshape(acc.size), dest, b)


@njit(cache=True, error_model="numpy")
def adaptive_avg_pool2d(x, out):
    """out[oh, ow] = the mean of rows floor(oh*H/OH) to ceil((oh+1)*H/OH)
    (exclusive) and likewise columns, PyTorch's adaptive windows."""
    N, C, OH, OW = out.shape
    H, W = x.shape[2], x.shape[3]
    for n in range(N):
        for c in range(C):
            for oh in range(OH):
                h0, h1 = _adaptive(oh, OH, H)
                for ow in range(OW):
                    w0, w1 = _adaptive(ow, OW, W)
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
                h0, h1 = _adaptive(oh, OH, H)
                for ow in range(OW):
                    w0, w1 = _adaptive(ow, OW, W)
                    for h in range(h0, h1):
                        for w in range(w0, w1):
                            acc[n, c, h, w] += g[n, c, oh, ow] / ((h1 - h0) * (w1 - w0))
    _store(acc.reshape(acc.size), dest, b)


@njit(cache=True, error_model="numpy")
def max_unpool2d(x, idx, out):
    """out[p, idx[p, i]] = x[p, i] in each plane p of (N*C, OH*OW), 0 elsewhere:
    a repeated index keeps the last value, as PyTorch's CPU kernel; one
    outside the plane (checked before the call) is skipped."""
    M = out.shape[1]
    of = out.reshape(out.size)
    for e in range(of.size):
        of[uint64(e)] = 0.0
    for p in range(x.shape[0]):
        for i in range(x.shape[1]):
            r = idx[p, i]
            if 0 <= r < M:
                out[p, r] = x[p, i]


@njit(cache=True, error_model="numpy")
def max_unpool2d_backward(g, idx, dest, beta):
    """dest[p, i] = g[p, idx[p, i]] + beta * dest[p, i]: the gradient of
    ``max_unpool2d`` (every input, a repeated index's too, reads its cell)."""
    b = _cast_like(dest, beta)
    M = g.shape[1]
    for p in range(dest.shape[0]):
        for i in range(dest.shape[1]):
            r = idx[p, i]
            v = g[p, r] if 0 <= r < M else g.dtype.type(0)
            dest[p, i] = v if b == 0 else v + b * dest[p, i]

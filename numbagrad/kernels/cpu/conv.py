"""CPU convolution and pooling kernels over NCHW arrays.

A convolution is ``im2col`` (every input patch as a row of "columns")
followed by the GEMM kernels; its input gradient is a GEMM into columns and
``col2im`` (or ``col2im_cl``, for columns laid out channels last), which
adds each input element's entries back up. The gradients scatter-add
into a float64 scratch in increasing (kernel offset or window) order, then
write dest once; the CUDA kernels gather per element in that same order, so
both devices add in the same order. Sums run in float64. A convolution
with few taps (a CNN's first layer) runs without columns: the direct
kernels at the end of this module.

``im2col``, ``col2im``, the max pools and their gradient have threaded
twins (``foo_mt``) that give each thread a block of images (or planes):
every element is computed as the serial kernel computes it, in the same
order, so the twins give the same bits whatever the thread count. The one
exception is ``conv_relu_max_pool2d_nhwc`` (im2col, the GEMM and the NHWC
pool in one call), whose twin's GEMM is one BLAS call per block: like a
split GEMM's, its bits follow the thread count, and its one-thread twin
(``_st``, for the thread governor) runs the same blocks.
"""
from __future__ import annotations

# the kernels this module registers
__all__ = ["adaptive_avg_pool2d", "adaptive_avg_pool2d_backward", "avg_pool2d",
           "avg_pool2d_backward", "col2im", "col2im_cl", "conv2d_direct", "conv2d_direct_input",
           "conv2d_direct_weight", "conv_relu_max_pool2d_nhwc", "im2col", "max_pool2d",
           "max_pool2d_backward", "max_pool2d_backward_nhwc", "max_unpool2d",
           "max_unpool2d_backward", "relu_max_pool2d", "relu_max_pool2d_nhwc"]

import math

import numpy as np
from numba import njit, prange, uint64

from ._threads import ONE_THREAD, _cast_like, num_threads
from .matmul import _gemm_split, _set_blas_threads, gemm


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
    _im2col_images(x, cols, sh, sw, ph, pw, dh, dw, 0, x.shape[0])


@njit(cache=True, error_model="numpy", parallel=True)
def im2col_mt(x, cols, sh, sw, ph, pw, dh, dw):
    """``im2col`` with a block of images per thread (the same copies)."""
    N = x.shape[0]
    parts = max(1, min(N, num_threads()))
    for t in prange(parts):
        _im2col_images(x, cols, sh, sw, ph, pw, dh, dw, t * N // parts, (t + 1) * N // parts)


# Indices below are cast to uint64 (all are >= 0): with signed ones every
# access carries NumPy's negative-index wraparound, which costs 3-4x here.
@njit(cache=True, error_model="numpy")
def _im2col_images(x, cols, sh, sw, ph, pw, dh, dw, n0, n1):
    """``im2col``'s rows of images n0 to n1 (exclusive)."""
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
            for n in range(n0, n1):
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
    Each element's entries are added in increasing kernel offset (i, j), in
    float64."""
    _col2im_images(cols, dest, sh, sw, ph, pw, dh, dw, beta, 0, dest.shape[0])


@njit(cache=True, error_model="numpy", parallel=True)
def col2im_mt(cols, dest, sh, sw, ph, pw, dh, dw, beta):
    """``col2im`` with a block of images per thread: an image's elements get
    the same entries in the same order."""
    N = dest.shape[0]
    parts = max(1, min(N, num_threads()))
    for t in prange(parts):
        _col2im_images(cols, dest, sh, sw, ph, pw, dh, dw, beta, t * N // parts,
                       (t + 1) * N // parts)


@njit(cache=True, error_model="numpy")
def _col2im_images(cols, dest, sh, sw, ph, pw, dh, dw, beta, n0, n1):
    """``col2im`` of images n0 to n1 (exclusive), image by image: an image's
    float64 sums (a scratch that stays in the cache) get one kernel offset
    (i, j) after another, then are stored. (Offsets outermost, over every
    image, measured 1.6x slower here; reading the columns in order, output
    positions backwards, gives the same order but was slower again.)"""
    b = _cast_like(dest, beta)
    G, N, OH, OW, CG, KH, KW = cols.shape
    C, H, W = dest.shape[1], dest.shape[2], dest.shape[3]
    cf = cols.reshape(cols.size)
    P, HW, T = OH * OW, H * W, KH * KW
    ats = np.empty((T, P), np.int64)
    for i in range(KH):
        for j in range(KW):
            ats[i * KW + j] = _offsets(OH, OW, H, W, i * dh - ph, j * dw - pw, sh, sw)
    acc = np.empty(C * HW, np.float64)
    df = dest.reshape(dest.size)
    for n in range(n0, n1):
        acc[:] = 0.0
        for g in range(G):
            for t in range(T):
                at = ats[t]
                o = ((g * N + n) * P * CG) * T + t
                for q in range(P):
                    k = at[q]
                    if k < 0:
                        o += CG * T
                        continue
                    a = uint64(g * CG * HW + k)
                    for c in range(CG):
                        acc[a] += cf[uint64(o)]
                        a += uint64(HW)
                        o += T
        _store(acc, df[n * C * HW:(n + 1) * C * HW], b)


@njit(cache=True, error_model="numpy")
def col2im_cl(cols, dest, sh, sw, ph, pw, dh, dw, beta):
    """``col2im`` of channels-last columns, cols (G, N, OH, OW, KH, KW, C/G):
    the same sums, added in the same order (increasing kernel offset (i,
    j), in float64), so the same bits for the same entries. An entry's
    channels are adjacent, so each (position, offset) adds one contiguous
    run, which vectorises: 1.4-5x faster than ``col2im`` from 8 channels a
    group here (the convolution's input gradient takes it from there)."""
    _col2im_cl_images(cols, dest, sh, sw, ph, pw, dh, dw, beta, 0, dest.shape[0])


@njit(cache=True, error_model="numpy", parallel=True)
def col2im_cl_mt(cols, dest, sh, sw, ph, pw, dh, dw, beta):
    """``col2im_cl`` with a block of images per thread."""
    N = dest.shape[0]
    parts = max(1, min(N, num_threads()))
    for t in prange(parts):
        _col2im_cl_images(cols, dest, sh, sw, ph, pw, dh, dw, beta, t * N // parts,
                          (t + 1) * N // parts)


@njit(cache=True, error_model="numpy")
def _col2im_cl_images(cols, dest, sh, sw, ph, pw, dh, dw, beta, n0, n1):
    """``col2im_cl`` of images n0 to n1 (exclusive), an image's group at a
    time: its sums in a zero-padded channels-last float64 scratch (an entry
    that lands in the padding is dropped there, as ``col2im`` skips it),
    then written into dest's NCHW planes."""
    b = _cast_like(dest, beta)
    G, N, OH, OW, KH, KW, CG = cols.shape
    C, H, W = dest.shape[1], dest.shape[2], dest.shape[3]
    # the padded extent every entry falls in: (OH-1)*sh + (KH-1)*dh < H + 2*ph
    HP, WP = max(H + 2 * ph, (OH - 1) * sh + (KH - 1) * dh + 1), \
        max(W + 2 * pw, (OW - 1) * sw + (KW - 1) * dw + 1)
    cf, df = cols.reshape(cols.size), dest.reshape(dest.size)
    acc = np.empty(HP * WP * CG, np.float64)
    R = KH * KW * CG            # one output position's entries
    for n in range(n0, n1):
        for g in range(G):
            acc[:] = 0.0
            base = (g * N + n) * OH * OW * R
            for i in range(KH):
                for j in range(KW):
                    for oh in range(OH):
                        o = uint64(base + oh * OW * R + (i * KW + j) * CG)
                        a = uint64(((oh * sh + i * dh) * WP + j * dw) * CG)
                        for ow in range(OW):
                            for c in range(CG):
                                acc[a + uint64(c)] += cf[o + uint64(c)]
                            o += uint64(R)
                            a += uint64(sw * CG)
            for c in range(CG):
                e = uint64(((n * C + g * CG + c) * H) * W)
                for h in range(H):
                    a = uint64(((h + ph) * WP + pw) * CG + c)
                    for w in range(W):
                        total = acc[a]
                        df[e] = total if b == 0 else total + b * df[e]
                        e += uint64(1)
                        a += uint64(CG)


@njit(error_model="numpy", inline="always")
def _takes(v, best):
    """Whether window element v takes over from ``best``: larger, or a nan.
    Without a branch, so that the loops over pairs and channels vectorise."""
    return (v > best) | (v != v)


@njit(error_model="numpy", inline="always")
def _pick(v, k, best, at):
    """(best, at) after window element v at k: a larger v or a nan takes over."""
    if _takes(v, best):
        return v, k
    return best, at


@njit(error_model="numpy", inline="always")
def _tiles_2x2(kh, kw, sh, sw, ph, pw, dh, dw, H, W, OH, OW):
    """Whether the windows are 2x2 of stride 2 tiling the H x W planes
    (MaxPool2d(2) on even sizes): the pools' vectorised paths."""
    return kh == 2 and kw == 2 and sh == 2 and sw == 2 and dh == 1 and dw == 1 and ph == 0 \
        and pw == 0 and H == 2 * OH and W == 2 * OW


POOL_PAIRS = 2048   # _max_pool_2x2's pairs per pass: its scratch stays in the L1 cache


@njit(error_model="numpy", inline="always")
def _max_pool_2x2(xf, of, jf, OH, OW, W, relu, lo, hi):
    """The 2x2 windows of stride 2 tiling the planes (flat xf, of, jf), a
    few planes at a time: each row's pairs first, in one long loop that
    vectorises (a window's column pair is adjacent), then the two rows'
    pair maxima. The same picks as the row-major scan: (a, b) then (c, d),
    the later pair taking over only when larger or nan, is the scan's first
    max (and its last nan). Planes lo to hi (exclusive)."""
    HW = 2 * OH * W
    step = max(1, POOL_PAIRS // (HW // 2))   # planes per pass
    pm = np.empty(step * HW // 2, xf.dtype)
    pk = np.empty(step * HW // 2, np.int64)
    zero = xf.dtype.type(0)
    for p0 in range(lo, hi, step):
        p1 = min(hi, p0 + step)
        x0 = p0 * HW
        for t in range((p1 - p0) * HW // 2):
            a, b = xf[uint64(x0 + 2 * t)], xf[uint64(x0 + 2 * t + 1)]
            take = _takes(b, a)
            pm[uint64(t)] = b if take else a
            pk[uint64(t)] = 1 if take else 0
        for r in range((p1 - p0) * OH):    # output row: x's rows 2r and 2r + 1 of the pass
            s = uint64(2 * r * OW)
            top = (r % OH) * 2 * W         # its top row in its plane
            for ow in range(OW):
                a, b = pm[s + uint64(ow)], pm[s + uint64(OW + ow)]
                take = _takes(b, a)
                best = b if take else a
                at = top + 2 * ow + (W + pk[s + uint64(OW + ow)] if take else pk[s + uint64(ow)])
                if relu:
                    cut = best <= zero
                    best, at = (zero if cut else best), (-1 if cut else at)
                o = uint64((p0 * OH + r) * OW + ow)
                of[o] = best
                jf[o] = at


@njit(error_model="numpy", inline="always")
def _windows(OH, OW, H, W, kh, kw, sh, sw, ph, pw, dh, dw):
    """(window, first): window[q * T + t] the t-th position (row-major) of
    window q in a plane, -1 in the padding; first[q] the idx of a window
    whose max is never set, its first in-bounds row and column (PyTorch's)."""
    window = _patch_offsets(OH, OW, H, W, kh, kw, sh, sw, ph, pw, dh, dw)
    first = np.empty(OH * OW, np.int64)
    for q in range(OH * OW):
        oh, ow = q // OW, q % OW
        h0, w0 = oh * sh - ph, ow * sw - pw
        h0 += ((dh - 1 - h0) // dh) * dh if h0 < 0 else 0
        w0 += ((dw - 1 - w0) // dw) * dw if w0 < 0 else 0
        first[q] = h0 * W + w0
    return window, first


@njit(cache=True, error_model="numpy")
def _max_pool(x, out, idx, kh, kw, sh, sw, ph, pw, dh, dw, relu, lo, hi):
    """``max_pool2d``'s body over planes (n, c) lo to hi (exclusive); with
    ``relu`` the max of relu(x) (see ``relu_max_pool2d``)."""
    N, C, OH, OW = out.shape
    H, W = x.shape[2], x.shape[3]
    xf, of, jf = x.reshape(x.size), out.reshape(out.size), idx.reshape(idx.size)
    P, HW, T = OH * OW, H * W, kh * kw
    neg = xf.dtype.type(-np.inf)
    zero = xf.dtype.type(0)
    if _tiles_2x2(kh, kw, sh, sw, ph, pw, dh, dw, H, W, OH, OW):
        _max_pool_2x2(xf, of, jf, OH, OW, W, relu, lo, hi)
        return
    if kh == 2 and kw == 2 and ph == 0 and pw == 0 and (OH - 1) * sh + dh < H \
            and (OW - 1) * sw + dw < W:    # (ceil_mode's last windows can run past the edge)
        o = lo * P
        for p in range(lo, hi):
            base = p * HW
            for oh in range(OH):
                for ow in range(OW):
                    k = oh * sh * W + ow * sw
                    best, at = _pick(xf[uint64(base + k)], k, neg, k)
                    best, at = _pick(xf[uint64(base + k + dw)], k + dw, best, at)
                    k += dh * W
                    best, at = _pick(xf[uint64(base + k)], k, best, at)
                    best, at = _pick(xf[uint64(base + k + dw)], k + dw, best, at)
                    if relu and best <= zero:
                        best, at = zero, -1
                    of[uint64(o)] = best
                    jf[uint64(o)] = at
                    o += 1
        return
    window, first = _windows(OH, OW, H, W, kh, kw, sh, sw, ph, pw, dh, dw)
    o = lo * P
    for p in range(lo, hi):
        base = p * HW
        for q in range(P):
            best, at = neg, first[uint64(q)]
            for t in range(q * T, q * T + T):
                k = window[uint64(t)]
                if k >= 0:
                    best, at = _pick(xf[uint64(base + k)], k, best, at)
            if relu and best <= zero:
                best, at = zero, -1
            of[uint64(o)] = best
            jf[uint64(o)] = at
            o += 1


@njit(cache=True, error_model="numpy")
def max_pool2d(x, out, idx, kh, kw, sh, sw, ph, pw, dh, dw):
    """out = the max of each window (padding never wins), idx = its position
    h * W + w in the plane: the first max in row-major window order, as
    PyTorch's CPU kernel (a nan counts as the max). x (N, C, H, W), out and
    idx (N, C, OH, OW). 2x2 windows of stride 2 tiling x (MaxPool2d(2) on
    even sizes) take a vectorised path (2-2.5x faster here); other 2x2 windows
    inside x are unrolled (both: same order, same result): short inner
    loops cost 2x here."""
    _max_pool(x, out, idx, kh, kw, sh, sw, ph, pw, dh, dw, False, 0, out.shape[0] * out.shape[1])


@njit(cache=True, error_model="numpy", parallel=True)
def max_pool2d_mt(x, out, idx, kh, kw, sh, sw, ph, pw, dh, dw):
    """``max_pool2d`` with a block of planes per thread."""
    _max_pool_mt(x, out, idx, kh, kw, sh, sw, ph, pw, dh, dw, False)


@njit(cache=True, error_model="numpy")
def relu_max_pool2d(x, out, idx, kh, kw, sh, sw, ph, pw, dh, dw):
    """``max_pool2d`` of relu(x) in one pass: out = max(window max, 0) (a nan
    stays nan), and idx = -1 where that is 0, whose gradient relu stops
    (PyTorch's relu passes none where its output is <= 0, so neither does
    the chain relu -> max_pool2d there); elsewhere idx is ``max_pool2d``'s,
    which is relu(x)'s first max too. ``max_pool2d_backward`` skips idx -1."""
    _max_pool(x, out, idx, kh, kw, sh, sw, ph, pw, dh, dw, True, 0, out.shape[0] * out.shape[1])


@njit(cache=True, error_model="numpy", parallel=True)
def relu_max_pool2d_mt(x, out, idx, kh, kw, sh, sw, ph, pw, dh, dw):
    """``relu_max_pool2d`` with a block of planes per thread."""
    _max_pool_mt(x, out, idx, kh, kw, sh, sw, ph, pw, dh, dw, True)


@njit(error_model="numpy", inline="always")
def _max_pool_mt(x, out, idx, kh, kw, sh, sw, ph, pw, dh, dw, relu):
    planes = out.shape[0] * out.shape[1]
    parts = max(1, min(planes, num_threads()))
    for t in prange(parts):
        _max_pool(x, out, idx, kh, kw, sh, sw, ph, pw, dh, dw, relu, t * planes // parts,
                  (t + 1) * planes // parts)


@njit(cache=True, error_model="numpy")
def max_pool2d_backward(g, idx, dest, kh, kw, sh, sw, ph, pw, dh, dw, beta):
    """dest = (g of every window whose max is the element, added up) + beta * dest;
    a window of idx -1 (``relu_max_pool2d``'s cut ones) adds nothing. Windows
    that cannot overlap (each element in at most one) write dest in place,
    with the same float64 arithmetic as the scratch sums."""
    _max_pool_backward(g, idx, dest, kh, kw, sh, sw, dh, dw, beta, 0, g.shape[0] * g.shape[1],
                       False)


@njit(cache=True, error_model="numpy", parallel=True)
def max_pool2d_backward_mt(g, idx, dest, kh, kw, sh, sw, ph, pw, dh, dw, beta):
    """``max_pool2d_backward`` with a block of planes per thread (a plane's
    windows add into that plane only)."""
    _max_pool_backward_mt(g, idx, dest, kh, kw, sh, sw, dh, dw, beta, False)


@njit(error_model="numpy", inline="always")
def _max_pool_backward_mt(g, idx, dest, kh, kw, sh, sw, dh, dw, beta, nhwc):
    planes = g.shape[0] * g.shape[1]
    parts = max(1, min(planes, num_threads()))
    for t in prange(parts):
        _max_pool_backward(g, idx, dest, kh, kw, sh, sw, dh, dw, beta, t * planes // parts,
                           (t + 1) * planes // parts, nhwc)


@njit(cache=True, error_model="numpy")
def _max_pool_backward(g, idx, dest, kh, kw, sh, sw, dh, dw, beta, lo, hi, nhwc):
    """``max_pool2d_backward`` of planes (n, c) lo to hi (exclusive); with
    ``nhwc`` into an (N, H, W, C) dest (``max_pool2d_backward_nhwc``). Each
    element's windows add in increasing order."""
    b = _cast_like(dest, beta)
    N, C, OH, OW = g.shape
    HW = dest.size // max(N * C, 1)
    gf, jf, df = g.reshape(g.size), idx.reshape(idx.size), dest.reshape(dest.size)
    P = OH * OW
    step = C if nhwc else 1            # plane p's element j: first + j * step
    overlap = _overlap(kh, kw, sh, sw, dh, dw)
    acc = np.zeros((hi - lo) * HW if overlap else 0, np.float64)
    for p in range(lo, hi):
        first = (p - p % C) * HW + p % C if nhwc else p * HW
        if not overlap:                # each element in one window at most: in place
            for j in range(HW):
                _clear_at(df, uint64(first + j * step), b)
        for q in range(P):
            o = uint64(p * P + q)
            j = jf[o]
            if j < 0:
                continue
            if overlap:
                acc[uint64((p - lo) * HW + j)] += gf[o]
            else:
                _add_at(df, uint64(first + j * step), gf[o])
        if overlap:
            for j in range(HW):
                e = uint64(first + j * step)
                total = acc[uint64((p - lo) * HW + j)]
                df[e] = total if b == 0 else total + b * df[e]


# ------------------------------------------------ the max pools of NHWC input
# A convolution's GEMM writes (N*OH*OW, C_out): an NHWC image. The fused
# conv2d -> relu -> max_pool2d (ops/conv_pool.py) pools it as it is, into
# NCHW, instead of reordering it into NCHW first; its gradient goes back
# into the GEMM's layout. Same picks, same sums as the NCHW kernels.
@njit(cache=True, error_model="numpy")
def relu_max_pool2d_nhwc(x, bias, has_bias, out, idx, kh, kw, sh, sw, ph, pw, dh, dw):
    """``relu_max_pool2d`` of x (N, H, W, C) plus ``bias`` (C,) when
    ``has_bias``, both C-contiguous: out and idx (N, C, OH, OW) as
    ``relu_max_pool2d`` gives them for the NCHW transpose of x + bias (idx:
    h * W + w in the plane). Each element is x + bias rounded to the dtype
    (a convolution's output plus its bias) before it is compared. Each
    window's channels are one vectorised loop."""
    _pool_nhwc_images(x, _bias_row(bias, has_bias, x), out, idx, kh, kw, sh, sw, ph, pw, dh,
                      dw, 0, x.shape[0])


@njit(cache=True, error_model="numpy", parallel=True)
def relu_max_pool2d_nhwc_mt(x, bias, has_bias, out, idx, kh, kw, sh, sw, ph, pw, dh, dw):
    """``relu_max_pool2d_nhwc`` with a block of images per thread."""
    N = x.shape[0]
    parts = max(1, min(N, num_threads()))
    row = _bias_row(bias, has_bias, x)
    for t in prange(parts):
        _pool_nhwc_images(x, row, out, idx, kh, kw, sh, sw, ph, pw, dh, dw, t * N // parts,
                          (t + 1) * N // parts)


@njit(error_model="numpy", inline="always")
def _bias_row(bias, has_bias, x):
    """The C values added to each of x's channels: ``bias``, or zeros (x + 0 is
    x but for -0.0, which relu cuts as it cuts 0.0)."""
    C = x.shape[3]
    row = np.zeros(C, x.dtype)
    if has_bias:
        for c in range(C):
            row[c] = bias[c]
    return row


@njit(cache=True, error_model="numpy")
def _pool_nhwc_images(x, bias, out, idx, kh, kw, sh, sw, ph, pw, dh, dw, n0, n1):
    N, H, W, C = x.shape
    OH, OW = out.shape[2], out.shape[3]
    if _tiles_2x2(kh, kw, sh, sw, ph, pw, dh, dw, H, W, OH, OW):
        _pool_nhwc_2x2(x, bias, out, idx, n0, n1)
        return
    P, T = OH * OW, kh * kw
    xf, of, jf = x.reshape(x.size), out.reshape(out.size), idx.reshape(idx.size)
    window, first = _windows(OH, OW, H, W, kh, kw, sh, sw, ph, pw, dh, dw)
    best = np.empty(C, x.dtype)
    at = np.empty(C, np.int64)
    neg, zero = x.dtype.type(-np.inf), x.dtype.type(0)
    for n in range(n0, n1):
        for q in range(P):
            f = first[q]
            for c in range(C):
                best[c] = neg
                at[c] = f
            for t in range(q * T, q * T + T):
                k = window[t]
                if k >= 0:
                    _pick_channels(xf, bias, uint64((n * H * W + k) * C), k, best, at)
            o = uint64(n * C * P + q)
            for c in range(C):
                v, a = best[c], at[c]
                if v <= zero:   # (a nan stays)
                    v, a = zero, -1
                of[o + uint64(c * P)] = v
                jf[o + uint64(c * P)] = a


@njit(error_model="numpy", inline="always")
def _pool_nhwc_2x2(x, bias, out, idx, n0, n1):
    """``_pool_nhwc_images`` of 2x2 windows of stride 2 tiling x (MaxPool2d(2)
    on even sizes): an image's windows first into an (OH*OW, C) scratch, each
    window's channels one vectorised loop that picks as ``_max_pool_2x2`` does
    ((a, b), then (c, d), then the larger pair), then the scratch transposed
    into out and idx: writing NCHW from inside the channel loop kept it
    scalar (2.5-3x slower here)."""
    N, H, W, C = x.shape
    OH, OW = out.shape[2], out.shape[3]
    P = OH * OW
    xf, of, jf = x.reshape(x.size), out.reshape(out.size), idx.reshape(idx.size)
    zero = x.dtype.type(0)
    bv = np.empty(P * C, x.dtype)
    bk = np.empty(P * C, np.int64)
    for n in range(n0, n1):
        for oh in range(OH):
            for ow in range(OW):
                k0 = 2 * oh * W + 2 * ow          # the window's top left in the plane
                ba = uint64((n * H * W + k0) * C)
                bb, bc = ba + uint64(C), ba + uint64(W * C)
                bd = bc + uint64(C)
                s = uint64((oh * OW + ow) * C)
                for c in range(C):
                    u, z = uint64(c), bias[c]
                    a, b, e, d = xf[ba + u] + z, xf[bb + u] + z, xf[bc + u] + z, xf[bd + u] + z
                    t1 = _takes(b, a)
                    m1, k1 = (b, k0 + 1) if t1 else (a, k0)
                    t2 = _takes(d, e)
                    m2, k2 = (d, k0 + W + 1) if t2 else (e, k0 + W)
                    t = _takes(m2, m1)
                    best, at = (m2, k2) if t else (m1, k1)
                    cut = best <= zero            # relu (a nan stays)
                    bv[s + u] = zero if cut else best
                    bk[s + u] = -1 if cut else at
        o = uint64(n * C * P)
        for c in range(C):
            for q in range(P):
                of[o + uint64(c * P + q)] = bv[uint64(q * C + c)]
                jf[o + uint64(c * P + q)] = bk[uint64(q * C + c)]


@njit(error_model="numpy", inline="always")
def _pick_channels(xf, bias, base, k, best, at):
    """``_pick`` of every channel's element at plane position k (xf[base:]),
    its bias added."""
    for c in range(best.size):
        v = xf[base + uint64(c)] + bias[c]
        b = best[c]
        take = _takes(v, b)
        best[c] = v if take else b
        at[c] = k if take else at[c]


# ------------------------------- a convolution, its ReLU and its max pool in one call
# ``conv_relu_max_pool2d_nhwc``: im2col, the GEMM and the NHWC pool above,
# for a convolution of one group (ops/conv_pool.py). The threaded twin gives
# each thread a block of images and runs the three on it one after the
# other: its columns, its rows of the product (one BLAS call) and its
# windows, so each block stays in its core's cache, one parallel region
# instead of three, and the product is split even where it is too small
# for ``bgemm_mt`` to split (a CNN's first layer, 4096x9 @ 9x16).
@njit(cache=True, error_model="numpy")
def conv_relu_max_pool2d_nhwc(x, cols, w3, prod, bias, has_bias, out, idx, sh, sw, ph, pw, dh,
                              dw, kh, kw, psh, psw, pph, ppw, pdh, pdw):
    """``im2col(x, cols, sh, sw, ph, pw, dh, dw)``, then prod[0] = cols (as
    (N*OH*OW, K)) @ w3[0]^T, then ``relu_max_pool2d_nhwc`` of prod's rows (an
    (N, OH, OW, C_out) image) plus ``bias`` into out and idx, with the pool's
    window (kh, kw, psh, psw, pph, ppw, pdh, pdw): the three kernels' calls,
    so their bits. One group: cols (1, N, OH, OW, C, KH, KW), w3 (1, C_out,
    K), prod (1, N*OH*OW, C_out)."""
    im2col(x, cols, sh, sw, ph, pw, dh, dw)
    c2, p2, p4 = _conv_pool_views(cols, prod)
    gemm(c2, w3[0], p2, 0, 1, 1.0, 0.0)
    relu_max_pool2d_nhwc(p4, bias, has_bias, out, idx, kh, kw, psh, psw, pph, ppw, pdh, pdw)


@njit(cache=True, error_model="numpy", parallel=True)
def conv_relu_max_pool2d_nhwc_mt(x, cols, w3, prod, bias, has_bias, out, idx, sh, sw, ph, pw,
                                 dh, dw, kh, kw, psh, psw, pph, ppw, pdh, pdw):
    """``conv_relu_max_pool2d_nhwc`` with a block of images per thread (fewer
    images than threads: the three in turn, the product split as
    ``gemm_mt`` splits it). The product's blocks are other BLAS calls than
    one whole call, so its last bits can differ from the serial kernel's (as
    a split GEMM's do); ``_st`` runs the same blocks on one thread."""
    _conv_pool_blocks(x, cols, w3, prod, bias, has_bias, out, idx, sh, sw, ph, pw, dh, dw, kh,
                      kw, psh, psw, pph, ppw, pdh, pdw)


@njit(cache=True, error_model="numpy")
def conv_relu_max_pool2d_nhwc_st(x, cols, w3, prod, bias, has_bias, out, idx, sh, sw, ph, pw,
                                 dh, dw, kh, kw, psh, psw, pph, ppw, pdh, pdw):
    """``conv_relu_max_pool2d_nhwc_mt``'s blocks on the calling thread: its bits."""
    _conv_pool_blocks(x, cols, w3, prod, bias, has_bias, out, idx, sh, sw, ph, pw, dh, dw, kh,
                      kw, psh, psw, pph, ppw, pdh, pdw)


@njit(error_model="numpy", inline="always")
def _conv_pool_views(cols, prod):
    """cols as the GEMM's (N*OH*OW, K) rows; prod[0] as (N*OH*OW, C_out) and
    as the NHWC image (N, OH, OW, C_out)."""
    N, OH, OW = cols.shape[1], cols.shape[2], cols.shape[3]
    L, K, C = N * OH * OW, cols.shape[4] * cols.shape[5] * cols.shape[6], prod.shape[2]
    return cols.reshape((L, K)), prod.reshape((L, C)), prod.reshape((N, OH, OW, C))


@njit(error_model="numpy", inline="always")
def _conv_pool_blocks(x, cols, w3, prod, bias, has_bias, out, idx, sh, sw, ph, pw, dh, dw, kh,
                      kw, psh, psw, pph, ppw, pdh, pdw):
    N = x.shape[0]
    P = cols.shape[2] * cols.shape[3]
    c2, p2, p4 = _conv_pool_views(cols, prod)
    row = _bias_row(bias, has_bias, p4)
    threads = num_threads()
    parts = min(N, threads)
    if parts < max(threads, 2):
        _im2col_images(x, cols, sh, sw, ph, pw, dh, dw, 0, N)
        _gemm_split(c2, w3[0], p2, 0, 1, 1.0, 0.0)
        _pool_nhwc_images(p4, row, out, idx, kh, kw, psh, psw, pph, ppw, pdh, pdw, 0, N)
        return
    previous = _set_blas_threads(1)   # the blocks' GEMMs then leave the count alone
    for t in prange(parts):
        n0, n1 = t * N // parts, (t + 1) * N // parts
        _im2col_images(x, cols, sh, sw, ph, pw, dh, dw, n0, n1)
        gemm(c2[n0 * P:n1 * P], w3[0], p2[n0 * P:n1 * P], 0, 1, 1.0, 0.0)
        _pool_nhwc_images(p4, row, out, idx, kh, kw, psh, psw, pph, ppw, pdh, pdw, n0, n1)
    _set_blas_threads(previous)


ONE_THREAD.update(conv_relu_max_pool2d_nhwc=conv_relu_max_pool2d_nhwc_st)


@njit(cache=True, error_model="numpy")
def max_pool2d_backward_nhwc(g, idx, dest, kh, kw, sh, sw, ph, pw, dh, dw, beta):
    """``max_pool2d_backward`` into an NHWC dest (N, H, W, C): the gradient of
    ``relu_max_pool2d_nhwc``; g and idx (N, C, OH, OW). Windows that cannot
    overlap go image by image (``_pool_backward_nhwc_images``)."""
    if _overlap(kh, kw, sh, sw, dh, dw):
        _max_pool_backward(g, idx, dest, kh, kw, sh, sw, dh, dw, beta, 0,
                           g.shape[0] * g.shape[1], True)
    else:
        _pool_backward_nhwc_images(g, idx, dest, beta, 0, g.shape[0])


@njit(cache=True, error_model="numpy", parallel=True)
def max_pool2d_backward_nhwc_mt(g, idx, dest, kh, kw, sh, sw, ph, pw, dh, dw, beta):
    """``max_pool2d_backward_nhwc`` with a block of images (or, for windows
    that overlap, of planes) per thread."""
    if _overlap(kh, kw, sh, sw, dh, dw):
        _max_pool_backward_mt(g, idx, dest, kh, kw, sh, sw, dh, dw, beta, True)
        return
    N = g.shape[0]
    parts = max(1, min(N, num_threads()))
    for t in prange(parts):
        _pool_backward_nhwc_images(g, idx, dest, beta, t * N // parts, (t + 1) * N // parts)


@njit(error_model="numpy", inline="always")
def _clear_at(df, e, b):
    """The in-place gradient's start at element e: 0, or 0.0 + b * df[e]
    (the float64 arithmetic of the scratch sums; b == 0 never reads df)."""
    df[e] = 0.0 if b == 0 else 0.0 + b * df[e]


@njit(error_model="numpy", inline="always")
def _add_at(df, e, g):
    """A window's gradient g added at its max, element e, in float64."""
    df[e] = (0.0 + g) + df[e]


@njit(error_model="numpy", inline="always")
def _overlap(kh, kw, sh, sw, dh, dw):
    """Whether an element can sit in two windows."""
    return (kh - 1) * dh >= sh or (kw - 1) * dw >= sw


@njit(cache=True, error_model="numpy")
def _pool_backward_nhwc_images(g, idx, dest, beta, n0, n1):
    """``_max_pool_backward``'s in-place path (windows that cannot overlap)
    for images n0 to n1 (exclusive) of an NHWC dest: each image's dest is
    one contiguous block, cleared (or scaled) in one loop, then each window's
    gradient added at its max: the same expressions, so the same bits, as
    the plane-by-plane path, whose strided clearing cost 2-3x here."""
    b = _cast_like(dest, beta)
    N, C, OH, OW = g.shape
    HWC = dest.size // max(N, 1)
    P = OH * OW
    gf, jf, df = g.reshape(g.size), idx.reshape(idx.size), dest.reshape(dest.size)
    for n in range(n0, n1):
        base = n * HWC
        for e in range(base, base + HWC):
            _clear_at(df, uint64(e), b)
        for c in range(C):
            o = uint64((n * C + c) * P)
            for q in range(P):
                j = jf[o]
                if j >= 0:
                    _add_at(df, uint64(base + j * C + c), gf[o])
                o += uint64(1)


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


# ------------------------------------------------------------ direct convolution
# A convolution of one group at stride 1 with few taps per output (C_in * KH *
# KW small: a CNN's first layer) computed without columns. Each channel of
# the batch is laid out as one zero-padded strip: image n's padded plane
# (HP x WP, x at row ph, column pw) at n * HP * WP. Output (n, oh, ow) is
# strip position m = n*HP*WP + oh*WP + ow and its tap (i, j) reads the
# strip at m + i*dh*WP + j*dw, so a tap is a long loop over strip positions
# that vectorises with no reordering (each element its own sum, in the same
# order at any vector width); ``_taps`` adds four taps per pass, one load
# and store of the sums per four products. The positions past each plane's
# outputs (its padding rows and columns, and the strip's end, up to a
# multiple of ``DIRECT_LANES``) are computed too and dropped, or, in the
# gradients, never added (a 0 gradient times an inf would make a nan). The
# loops run over ``DIRECT_BLOCK`` positions at a time, every tap of a block
# before the next, so that the strips' blocks stay in the L1 cache.
DIRECT_LANES = 16
DIRECT_BLOCK = 64 * DIRECT_LANES


@njit(error_model="numpy", inline="always")
def _direct_geometry(N, KH, KW, OH, OW, dh, dw):
    """(HP, WP, M, E): the padded plane (what the outputs read), the strip
    positions the taps run over (N planes, up to a multiple of
    ``DIRECT_LANES``) and the last tap's offset (a strip is M + E long)."""
    HP, WP = OH + (KH - 1) * dh, OW + (KW - 1) * dw
    M = -(-(N * HP * WP) // DIRECT_LANES) * DIRECT_LANES
    return HP, WP, M, (KH - 1) * dh * WP + (KW - 1) * dw


@njit(error_model="numpy", inline="always")
def _strips(x, HP, WP, ph, pw, length):
    """x (N, C, H, W) as one flat array of C zero-padded strips of ``length``
    (see above)."""
    N, C, H, W = x.shape
    xs = np.zeros(C * length, x.dtype)
    h0, h1 = max(0, -ph), min(H, HP - ph)
    w0, w1 = max(0, -pw), min(W, WP - pw)
    for c in range(C):
        for n in range(N):
            for h in range(h0, h1):
                at = c * length + n * HP * WP + (h + ph) * WP + pw
                for w in range(w0, w1):
                    xs[uint64(at + w)] = x[n, c, h, w]
    return xs


@njit(error_model="numpy", inline="always")
def _taps(a, m0, m1, src, offs, wts):
    """a[m] += wts[t] * src[offs[t] + m] for m in [m0, m1), over the taps t
    in order (each a[m] one sum in that order), four taps a pass."""
    T = offs.size
    t = 0
    while t + 4 <= T:
        w0, w1, w2, w3 = wts[t], wts[t + 1], wts[t + 2], wts[t + 3]
        e0, e1, e2, e3 = offs[t], offs[t + 1], offs[t + 2], offs[t + 3]
        for m in range(m0, m1):
            v = a[uint64(m)] + w0 * src[uint64(e0 + m)]
            v = v + w1 * src[uint64(e1 + m)]
            v = v + w2 * src[uint64(e2 + m)]
            a[uint64(m)] = v + w3 * src[uint64(e3 + m)]
        t += 4
    while t < T:
        wv, e = wts[t], offs[t]
        for m in range(m0, m1):
            a[uint64(m)] += wv * src[uint64(e + m)]
        t += 1


@njit(cache=True, error_model="numpy")
def conv2d_direct(x, weight, bias, out, ph, pw, dh, dw, has_bias):
    """out = conv2d(x, weight) (+ bias when ``has_bias``; else bias is not
    read), one group, stride 1, zero padding ph, pw: out[n, o, oh, ow] =
    bias[o] + the sum over (c, i, j) in that order of weight[o, c, i, j] *
    x[n, c, oh - ph + i*dh, ow - pw + j*dw], in x's dtype (as the GEMM's).
    x (N, C, H, W), weight (O, C, KH, KW), out (N, O, OH, OW), C-contiguous.
    A block is a few whole images, whose outputs are copied out after it."""
    N, C = x.shape[0], x.shape[1]
    O, KH, KW = weight.shape[0], weight.shape[2], weight.shape[3]
    OH, OW = out.shape[2], out.shape[3]
    HP, WP, M, E = _direct_geometry(N, KH, KW, OH, OW, dh, dw)
    PP = HP * WP
    xs = _strips(x, HP, WP, ph, pw, M + E)
    offs = np.empty(C * KH * KW, np.int64)   # tap (c, i, j)'s start in xs
    for c in range(C):
        for i in range(KH):
            for j in range(KW):
                offs[(c * KH + i) * KW + j] = c * (M + E) + i * dh * WP + j * dw
    wf = weight.reshape(O, C * KH * KW)
    per = max(1, DIRECT_BLOCK // PP)   # images per block
    acc = np.empty((O, per * PP), x.dtype)
    zero = x.dtype.type(0)
    for n0 in range(0, N, per):
        n1 = min(N, n0 + per)
        src = xs[n0 * PP:]
        for o in range(O):
            a = acc[o]
            b = bias[o] if has_bias else zero
            for m in range((n1 - n0) * PP):
                a[uint64(m)] = b
            _taps(a, 0, (n1 - n0) * PP, src, offs, wf[o])
        for n in range(n0, n1):
            for o in range(O):
                for oh in range(OH):
                    at = (n - n0) * PP + oh * WP
                    for ow in range(OW):
                        out[n, o, oh, ow] = acc[o, uint64(at + ow)]


@njit(error_model="numpy", inline="always")
def _output_strips(g, HP, WP, M, E):
    """g (N, O, OH, OW) as O strips of E + M: runs[o, E + m] = g[n, o, oh,
    ow] at its output position m, 0 elsewhere."""
    N, O, OH, OW = g.shape
    runs = np.zeros((O, E + M), g.dtype)
    for n in range(N):
        for o in range(O):
            for oh in range(OH):
                at = E + n * HP * WP + oh * WP
                for ow in range(OW):
                    runs[o, uint64(at + ow)] = g[n, o, oh, ow]
    return runs


@njit(error_model="numpy", inline="always")
def _output_mask(N, HP, WP, OH, OW, length):
    """keep[m]: whether strip position m < length is an output's."""
    keep = np.zeros(length, np.bool_)
    for n in range(N):
        for oh in range(OH):
            for ow in range(OW):
                m = n * HP * WP + oh * WP + ow
                if m < length:
                    keep[m] = True
    return keep


@njit(cache=True, error_model="numpy")
def conv2d_direct_input(g, weight, dest, ph, pw, dh, dw, beta):
    """dest = (the gradient of ``conv2d_direct`` with respect to x, for output
    gradient g) + beta * dest; beta == 0 never reads dest. Element (n, c, h,
    w) gathers weight[o, c, i, j] * g[n, o, h + ph - i*dh, w + pw - j*dw]
    over (o, i, j) in that order, in g's dtype (an element no output reads
    gets 0). A non-finite weight takes a slower path that multiplies no
    padding (inf * 0 would be a nan PyTorch does not make)."""
    b = _cast_like(dest, beta)
    N, C, H, W = dest.shape
    O, KH, KW = weight.shape[0], weight.shape[2], weight.shape[3]
    OH, OW = g.shape[2], g.shape[3]
    HP, WP, M, E = _direct_geometry(N, KH, KW, OH, OW, dh, dw)
    runs = _output_strips(g, HP, WP, M, E)
    rf = runs.reshape(runs.size)
    T = KH * KW
    offs = np.empty((O, T), np.int64)   # x position p, tap (i, j) of o: runs at offs + p
    for o in range(O):
        for i in range(KH):
            for j in range(KW):
                offs[o, i * KW + j] = o * (E + M) + E - i * dh * WP - j * dw
    finite = True
    for v in weight.reshape(weight.size):
        finite = finite and math.isfinite(v)
    keep = _output_mask(N, HP, WP, OH, OW, 0 if finite else M)
    wt = np.empty((C, O, T), weight.dtype)   # the taps of (c, o), in (i, j) order
    for c in range(C):
        for o in range(O):
            for t in range(T):
                wt[c, o, t] = weight[o, c, t // KW, t % KW]
    dxs = np.empty(M, g.dtype)
    zero = g.dtype.type(0)
    h0, h1 = max(0, -ph), min(H, HP - ph)
    w0, w1 = max(0, -pw), min(W, WP - pw)
    for c in range(C):
        for p0 in range(0, M, DIRECT_BLOCK):
            p1 = min(M, p0 + DIRECT_BLOCK)
            for p in range(p0, p1):
                dxs[uint64(p)] = zero
            for o in range(O):
                if finite:
                    _taps(dxs, p0, p1, rf, offs[o], wt[c, o])
                    continue
                for t in range(T):
                    wv, e = wt[c, o, t], offs[o, t]
                    for p in range(p0, p1):
                        m = e + p - o * (E + M) - E   # the output position tap t reads p from
                        if 0 <= m < M and keep[m]:
                            dxs[uint64(p)] += wv * rf[uint64(e + p)]
        for n in range(N):
            for h in range(H):
                for w in range(W):
                    v = zero
                    if h0 <= h < h1 and w0 <= w < w1:
                        v = dxs[uint64(n * HP * WP + (h + ph) * WP + w + pw)]
                    dest[n, c, h, w] = v if b == 0 else v + b * dest[n, c, h, w]


@njit(cache=True, error_model="numpy")
def conv2d_direct_weight(g, x, dest, bias_dest, ph, pw, dh, dw, beta, bias_beta, has_bias):
    """dest = (the gradient of ``conv2d_direct`` with respect to its weight,
    for output gradient g) + beta * dest, and, when ``has_bias``, bias_dest =
    (g summed over N, OH, OW) + bias_beta * bias_dest (else it is not read);
    beta == 0 never reads dest. Per block of whole images, tap (c, i, j)'s
    gradients of every output channel are one matrix-vector product (BLAS
    gemv, as the GEMM path's sums): the block's output strips of g (O, the
    block's positions) times the strip of x that tap reads, and the bias's
    those strips times ones; the blocks' products are added in order in
    float64. An x with an inf or nan takes a slower path that multiplies no
    padding (inf * 0 would be a nan PyTorch does not make)."""
    b = _cast_like(dest, beta)
    bb = _cast_like(dest, bias_beta)
    N, C = x.shape[0], x.shape[1]
    O, KH, KW = dest.shape[0], dest.shape[2], dest.shape[3]
    OH, OW = g.shape[2], g.shape[3]
    HP, WP, M, E = _direct_geometry(N, KH, KW, OH, OW, dh, dw)
    PP, T = HP * WP, C * KH * KW
    xs = _strips(x, HP, WP, ph, pw, M + E)
    finite = True
    for v in xs:
        finite = finite and math.isfinite(v)
    per = max(1, DIRECT_BLOCK // PP)   # images per block
    runs = np.empty(O * per * PP, g.dtype)
    keep = _output_mask(per, HP, WP, OH, OW, 0 if finite else per * PP)
    ones = np.ones(per * PP, g.dtype)
    acc = np.zeros((T + 1, O), np.float64)   # the taps' sums, then the bias's
    for n0 in range(0, N, per):
        n1 = min(N, n0 + per)
        L = (n1 - n0) * PP
        block = runs[:O * L].reshape(O, L)   # g's strips, 0 past the outputs
        block[:] = 0
        for n in range(n0, n1):
            for o in range(O):
                for oh in range(OH):
                    at = (n - n0) * PP + oh * WP
                    for ow in range(OW):
                        block[o, uint64(at + ow)] = g[n, o, oh, ow]
        if has_bias:
            col = np.dot(block, ones[:L])
            for o in range(O):
                acc[T, o] += col[o]
        for c in range(C):
            for i in range(KH):
                for j in range(KW):
                    t = (c * KH + i) * KW + j
                    e = c * (M + E) + n0 * PP + i * dh * WP + j * dw
                    if finite:
                        col = np.dot(block, xs[e:e + L])
                        for o in range(O):
                            acc[t, o] += col[o]
                        continue
                    for o in range(O):
                        for m in range(L):
                            if keep[m]:
                                acc[t, o] += block[o, m] * xs[e + m]
    for o in range(O):
        for t in range(T):
            c, i, j = t // (KH * KW), (t // KW) % KH, t % KW
            v = acc[t, o]
            dest[o, c, i, j] = v if b == 0 else v + b * dest[o, c, i, j]
        if has_bias:
            bias_dest[o] = acc[T, o] if bb == 0 else acc[T, o] + bb * bias_dest[o]

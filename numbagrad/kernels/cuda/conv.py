"""CUDA convolution and pooling kernels (see ``kernels/cpu/conv.py``): one
launch each, one thread per written element in a grid-stride loop; the
gradients gather over the columns or windows of an element in the order the
CPU kernels add them (no atomics), summing in float64 as they do.
"""
from __future__ import annotations

# the kernels this module registers
__all__ = ["adaptive_avg_pool2d", "adaptive_avg_pool2d_backward", "avg_pool2d",
           "avg_pool2d_backward", "col2im", "col2im_cl", "conv2d_direct", "conv2d_direct_input",
           "conv2d_direct_weight", "conv_relu_max_pool2d_nhwc", "im2col", "max_pool2d",
           "max_pool2d_backward", "max_pool2d_backward_nhwc", "max_unpool2d",
           "max_unpool2d_backward", "relu_max_pool2d", "relu_max_pool2d_nhwc"]

import math

from numba import cuda, int64, types

from ..cpu.conv import adaptive_window, pool_divisor
from ._core import THREADS, Config, array_type, grid, kernel, launch
from .matmul import bgemm

_divisor = cuda.jit(device=True)(pool_divisor)
_adaptive = cuda.jit(device=True)(adaptive_window)


@cuda.jit(device=True)
def _nchw(k, C, H, W):
    """(n, c, h, w) of flat index k into a C-contiguous (N, C, H, W) array."""
    return k // (W * H * C), (k // (W * H)) % C, (k // W) % H, k % W


@cuda.jit(device=True)
def _put(dest, i, j, k, m, acc, beta):
    """dest[i, j, k, m] = acc + beta * dest[i, j, k, m] (n, c, h, w in NCHW,
    n, h, w, c in NHWC); beta == 0 never reads it."""
    if beta == 0.0:
        dest[i, j, k, m] = acc
    else:
        dest[i, j, k, m] = acc + beta * dest[i, j, k, m]
_I = int64
_B = types.boolean


def _a(dt, ndim: int):
    return array_type(dt, ndim)


@kernel("im2col", lambda dt: (_a(dt, 4), _a(dt, 7), _I, _I, _I, _I, _I, _I))
def _im2col_source(config: Config, dtype):
    def im2col_kernel(x, cols, sh, sw, ph, pw, dh, dw):
        G, N, OH, OW, CG, KH, KW = cols.shape
        H, W = x.shape[2], x.shape[3]
        k = cuda.grid(1)
        while k < cols.size:
            r = k
            j = r % KW
            r //= KW
            i = r % KH
            r //= KH
            c = r % CG
            r //= CG
            ow = r % OW
            r //= OW
            oh = r % OH
            r //= OH
            n = r % N
            g = r // N
            h = oh * sh - ph + i * dh
            w = ow * sw - pw + j * dw
            v = 0.0
            if 0 <= h < H and 0 <= w < W:
                v = x[n, g * CG + c, h, w]
            cols[g, n, oh, ow, c, i, j] = v
            k += cuda.gridsize(1)

    return im2col_kernel


def _col2im_kernel_source(cl: bool):
    """The col2im kernel; with ``cl``, col2im_cl's (cols (G, N, OH, OW, KH, KW,
    C/G)): each element gathers its entries in the CPU's order."""
    def col2im_kernel(cols, dest, sh, sw, ph, pw, dh, dw, beta):
        if cl:
            G, N, OH, OW, KH, KW, CG = cols.shape
        else:
            G, N, OH, OW, CG, KH, KW = cols.shape
        C, H, W = dest.shape[1], dest.shape[2], dest.shape[3]
        k = cuda.grid(1)
        while k < dest.size:
            n, c, h, w = _nchw(k, C, H, W)
            g, cg = c // CG, c % CG
            acc = 0.0
            for i in range(KH):
                t = h + ph - i * dh
                if t >= 0 and t % sh == 0 and t // sh < OH:
                    for j in range(KW):
                        u = w + pw - j * dw
                        if u >= 0 and u % sw == 0 and u // sw < OW:
                            if cl:
                                acc += cols[g, n, t // sh, u // sw, i, j, cg]
                            else:
                                acc += cols[g, n, t // sh, u // sw, cg, i, j]
            _put(dest, n, c, h, w, acc, beta)
            k += cuda.gridsize(1)

    return col2im_kernel


_COL2IM_SIGNATURE = lambda dt: (_a(dt, 7), _a(dt, 4), _I, _I, _I, _I, _I, _I, dt)  # noqa: E731


@kernel("col2im", _COL2IM_SIGNATURE)
def _col2im_source(config: Config, dtype):
    return _col2im_kernel_source(False)


@kernel("col2im_cl", _COL2IM_SIGNATURE)
def _col2im_cl_source(config: Config, dtype):
    return _col2im_kernel_source(True)


def _max_pool_source(relu: bool, nhwc: bool = False):
    """The max_pool2d kernel; with ``relu`` relu_max_pool2d's (see the CPU's);
    with ``nhwc`` too, relu_max_pool2d_nhwc's (x (N, H, W, C), plus ``bias``
    (C,) when ``has_bias``, each element rounded to the dtype before it is
    compared)."""
    @cuda.jit(device=True)
    def pool_at(x, bias, has_bias, out, idx, k, kh, kw, sh, sw, ph, pw, dh, dw):
        N, C, OH, OW = out.shape
        H, W = (x.shape[1], x.shape[2]) if nhwc else (x.shape[2], x.shape[3])
        n, c, oh, ow = _nchw(k, C, OH, OW)
        h0 = oh * sh - ph
        w0 = ow * sw - pw
        while h0 < 0:
            h0 += dh
        while w0 < 0:
            w0 += dw
        best = -math.inf
        at = h0 * W + w0
        for i in range(kh):
            h = oh * sh - ph + i * dh
            if 0 <= h < H:
                for j in range(kw):
                    w = ow * sw - pw + j * dw
                    if 0 <= w < W:
                        if nhwc:
                            v = x[n, h, w, c] + bias[c] if has_bias else x[n, h, w, c]
                        else:
                            v = x[n, c, h, w]
                        if v > best or v != v:
                            best = v
                            at = h * W + w
        if relu and best <= 0:
            best = 0.0
            at = -1
        out[n, c, oh, ow] = best
        idx[n, c, oh, ow] = at

    def max_pool2d_nhwc_kernel(x, bias, has_bias, out, idx, kh, kw, sh, sw, ph, pw, dh, dw):
        k = cuda.grid(1)
        while k < out.size:
            pool_at(x, bias, has_bias, out, idx, k, kh, kw, sh, sw, ph, pw, dh, dw)
            k += cuda.gridsize(1)

    def max_pool2d_kernel(x, out, idx, kh, kw, sh, sw, ph, pw, dh, dw):
        k = cuda.grid(1)
        while k < out.size:   # (out's first row stands in for the bias it has not)
            pool_at(x, out[0, 0, 0], False, out, idx, k, kh, kw, sh, sw, ph, pw, dh, dw)
            k += cuda.gridsize(1)

    return max_pool2d_nhwc_kernel if nhwc else max_pool2d_kernel


_POOL_SIGNATURE = lambda dt: (_a(dt, 4), _a(dt, 4), array_type(int64, 4),  # noqa: E731
                              _I, _I, _I, _I, _I, _I, _I, _I)


@kernel("max_pool2d", _POOL_SIGNATURE)
def _max_pool2d_source(config: Config, dtype):
    return _max_pool_source(False)


@kernel("relu_max_pool2d", _POOL_SIGNATURE)
def _relu_max_pool2d_source(config: Config, dtype):
    return _max_pool_source(True)


def _max_pool_backward_source(nhwc: bool):
    """The max_pool2d_backward kernel; with ``nhwc``, into an (N, H, W, C) dest."""
    def max_pool2d_backward_kernel(g, idx, dest, kh, kw, sh, sw, ph, pw, dh, dw, beta):
        N, C, OH, OW = g.shape
        H, W = (dest.shape[1], dest.shape[2]) if nhwc else (dest.shape[2], dest.shape[3])
        k = cuda.grid(1)
        while k < dest.size:
            if nhwc:
                n, h, w, c = _nchw(k, H, W, C)
            else:
                n, c, h, w = _nchw(k, C, H, W)
            acc = 0.0
            for i in range(kh - 1, -1, -1):   # windows in increasing order
                t = h + ph - i * dh
                if t >= 0 and t % sh == 0 and t // sh < OH:
                    for j in range(kw - 1, -1, -1):
                        u = w + pw - j * dw
                        if u >= 0 and u % sw == 0 and u // sw < OW:
                            if idx[n, c, t // sh, u // sw] == h * W + w:
                                acc += g[n, c, t // sh, u // sw]
            if nhwc:
                _put(dest, n, h, w, c, acc, beta)
            else:
                _put(dest, n, c, h, w, acc, beta)
            k += cuda.gridsize(1)

    return max_pool2d_backward_kernel


_POOL_BACKWARD_SIGNATURE = lambda dt: (_a(dt, 4), array_type(int64, 4), _a(dt, 4),  # noqa: E731
                                       _I, _I, _I, _I, _I, _I, _I, _I, dt)


@kernel("max_pool2d_backward", _POOL_BACKWARD_SIGNATURE)
def _max_pool2d_backward_source(config: Config, dtype):
    return _max_pool_backward_source(False)


@kernel("relu_max_pool2d_nhwc", lambda dt: (_a(dt, 4), _a(dt, 1), _I, _a(dt, 4),
                                            array_type(int64, 4), _I, _I, _I, _I, _I, _I, _I,
                                            _I))
def _relu_max_pool2d_nhwc_source(config: Config, dtype):
    return _max_pool_source(True, nhwc=True)


@kernel("max_pool2d_backward_nhwc", _POOL_BACKWARD_SIGNATURE)
def _max_pool2d_backward_nhwc_source(config: Config, dtype):
    return _max_pool_backward_source(True)


@kernel("avg_pool2d", lambda dt: (_a(dt, 4), _a(dt, 4), _I, _I, _I, _I, _I, _I, _B, _I))
def _avg_pool2d_source(config: Config, dtype):
    def avg_pool2d_kernel(x, out, kh, kw, sh, sw, ph, pw, include_pad, divisor):
        N, C, OH, OW = out.shape
        H, W = x.shape[2], x.shape[3]
        k = cuda.grid(1)
        while k < out.size:
            n, c, oh, ow = _nchw(k, C, OH, OW)
            div, h0, w0, h1, w1 = _divisor(oh, ow, H, W, kh, kw, sh, sw, ph, pw, include_pad,
                                           divisor)
            acc = 0.0
            for h in range(h0, h1):
                for w in range(w0, w1):
                    acc += x[n, c, h, w]
            out[n, c, oh, ow] = acc / div
            k += cuda.gridsize(1)

    return avg_pool2d_kernel


@kernel("avg_pool2d_backward", lambda dt: (_a(dt, 4), _a(dt, 4), _I, _I, _I, _I, _I, _I, _B,
                                           _I, dt))
def _avg_pool2d_backward_source(config: Config, dtype):
    def avg_pool2d_backward_kernel(g, dest, kh, kw, sh, sw, ph, pw, include_pad, divisor,
                                   beta):
        N, C, OH, OW = g.shape
        H, W = dest.shape[2], dest.shape[3]
        k = cuda.grid(1)
        while k < dest.size:
            n, c, h, w = _nchw(k, C, H, W)
            acc = 0.0
            for i in range(kh - 1, -1, -1):   # windows in increasing order
                t = h + ph - i
                if t >= 0 and t % sh == 0 and t // sh < OH:
                    for j in range(kw - 1, -1, -1):
                        u = w + pw - j
                        if u >= 0 and u % sw == 0 and u // sw < OW:
                            div = _divisor(t // sh, u // sw, H, W, kh, kw, sh, sw, ph, pw,
                                           include_pad, divisor)[0]
                            acc += g[n, c, t // sh, u // sw] / div
            _put(dest, n, c, h, w, acc, beta)
            k += cuda.gridsize(1)

    return avg_pool2d_backward_kernel


@kernel("adaptive_avg_pool2d", lambda dt: (_a(dt, 4), _a(dt, 4)))
def _adaptive_avg_pool2d_source(config: Config, dtype):
    def adaptive_avg_pool2d_kernel(x, out):
        N, C, OH, OW = out.shape
        H, W = x.shape[2], x.shape[3]
        k = cuda.grid(1)
        while k < out.size:
            n, c, oh, ow = _nchw(k, C, OH, OW)
            h0, h1 = _adaptive(oh, OH, H)
            w0, w1 = _adaptive(ow, OW, W)
            acc = 0.0
            for h in range(h0, h1):
                for w in range(w0, w1):
                    acc += x[n, c, h, w]
            out[n, c, oh, ow] = acc / ((h1 - h0) * (w1 - w0))
            k += cuda.gridsize(1)

    return adaptive_avg_pool2d_kernel


@kernel("adaptive_avg_pool2d_backward", lambda dt: (_a(dt, 4), _a(dt, 4), dt))
def _adaptive_avg_pool2d_backward_source(config: Config, dtype):
    def adaptive_avg_pool2d_backward_kernel(g, dest, beta):
        N, C, OH, OW = g.shape
        H, W = dest.shape[2], dest.shape[3]
        k = cuda.grid(1)
        while k < dest.size:
            n, c, h, w = _nchw(k, C, H, W)
            acc = 0.0
            first, last = _adaptive(h, H, OH)   # the windows that can hold row h
            for oh in range(first, last):
                h0, h1 = _adaptive(oh, OH, H)
                if h0 <= h < h1:
                    left, right = _adaptive(w, W, OW)
                    for ow in range(left, right):
                        w0, w1 = _adaptive(ow, OW, W)
                        if w0 <= w < w1:
                            acc += g[n, c, oh, ow] / ((h1 - h0) * (w1 - w0))
            _put(dest, n, c, h, w, acc, beta)
            k += cuda.gridsize(1)

    return adaptive_avg_pool2d_backward_kernel


@kernel("max_unpool2d_zero", lambda dt: (_a(dt, 2),))
def _max_unpool2d_zero_source(config: Config, dtype):
    def max_unpool2d_zero_kernel(out):
        M = out.shape[1]
        k = cuda.grid(1)
        while k < out.size:
            out[k // M, k % M] = 0.0
            k += cuda.gridsize(1)

    return max_unpool2d_zero_kernel


@kernel("max_unpool2d", lambda dt: (_a(dt, 2), array_type(int64, 2), _a(dt, 2)))
def _max_unpool2d_source(config: Config, dtype):
    def max_unpool2d_kernel(x, idx, out):
        L, M = x.shape[1], out.shape[1]
        k = cuda.grid(1)
        while k < x.size:
            p, i = k // L, k % L
            r = idx[p, i]
            if 0 <= r < M:
                out[p, r] = x[p, i]
            k += cuda.gridsize(1)

    return max_unpool2d_kernel


@kernel("max_unpool2d_backward", lambda dt: (_a(dt, 2), array_type(int64, 2), _a(dt, 2), dt))
def _max_unpool2d_backward_source(config: Config, dtype):
    def max_unpool2d_backward_kernel(g, idx, dest, beta):
        L, M = dest.shape[1], g.shape[1]
        k = cuda.grid(1)
        while k < dest.size:
            p, i = k // L, k % L
            r = idx[p, i]
            v = g[p, r] if 0 <= r < M else 0.0
            if beta == 0.0:
                dest[p, i] = v
            else:
                dest[p, i] = v + beta * dest[p, i]
            k += cuda.gridsize(1)

    return max_unpool2d_backward_kernel


# ------------------------------------------------------------ direct convolution
# (the CPU's conv2d_direct*: one group, stride 1; here one thread per written
# element, summing in float64 in the CPU kernels' order of taps)
@kernel("conv2d_direct", lambda dt: (_a(dt, 4), _a(dt, 4), _a(dt, 1), _a(dt, 4), _I, _I, _I,
                                     _I, _B))
def _conv2d_direct_source(config: Config, dtype):
    def conv2d_direct_kernel(x, weight, bias, out, ph, pw, dh, dw, has_bias):
        O, OH, OW = out.shape[1], out.shape[2], out.shape[3]
        C, H, W = x.shape[1], x.shape[2], x.shape[3]
        KH, KW = weight.shape[2], weight.shape[3]
        k = cuda.grid(1)
        while k < out.size:
            n, o, oh, ow = _nchw(k, O, OH, OW)
            acc = 0.0
            if has_bias:
                acc += bias[o]
            for c in range(C):
                for i in range(KH):
                    h = oh - ph + i * dh
                    for j in range(KW):
                        w = ow - pw + j * dw
                        if 0 <= h < H and 0 <= w < W:
                            acc += weight[o, c, i, j] * x[n, c, h, w]
            out[n, o, oh, ow] = acc
            k += cuda.gridsize(1)

    return conv2d_direct_kernel


@kernel("conv2d_direct_input", lambda dt: (_a(dt, 4), _a(dt, 4), _a(dt, 4), _I, _I, _I, _I,
                                           dt))
def _conv2d_direct_input_source(config: Config, dtype):
    def conv2d_direct_input_kernel(g, weight, dest, ph, pw, dh, dw, beta):
        C, H, W = dest.shape[1], dest.shape[2], dest.shape[3]
        O, OH, OW = g.shape[1], g.shape[2], g.shape[3]
        KH, KW = weight.shape[2], weight.shape[3]
        k = cuda.grid(1)
        while k < dest.size:
            n, c, h, w = _nchw(k, C, H, W)
            acc = 0.0
            for o in range(O):
                for i in range(KH):
                    oh = h + ph - i * dh
                    for j in range(KW):
                        ow = w + pw - j * dw
                        if 0 <= oh < OH and 0 <= ow < OW:
                            acc += weight[o, c, i, j] * g[n, o, oh, ow]
            _put(dest, n, c, h, w, acc, beta)
            k += cuda.gridsize(1)

    return conv2d_direct_input_kernel


@kernel("conv2d_direct_weight", lambda dt: (_a(dt, 4), _a(dt, 4), _a(dt, 4), _I, _I, _I, _I,
                                            dt))
def _conv2d_direct_weight_source(config: Config, dtype):
    def conv2d_direct_weight_kernel(g, x, dest, ph, pw, dh, dw, beta):
        C, KH, KW = dest.shape[1], dest.shape[2], dest.shape[3]
        N, OH, OW = g.shape[0], g.shape[2], g.shape[3]
        H, W = x.shape[2], x.shape[3]
        k = cuda.grid(1)
        while k < dest.size:
            o, c, i, j = _nchw(k, C, KH, KW)
            acc = 0.0
            for n in range(N):
                for oh in range(OH):
                    h = oh - ph + i * dh
                    if 0 <= h < H:
                        for ow in range(OW):
                            w = ow - pw + j * dw
                            if 0 <= w < W:
                                acc += g[n, o, oh, ow] * x[n, c, h, w]
            _put(dest, o, c, i, j, acc, beta)
            k += cuda.gridsize(1)

    return conv2d_direct_weight_kernel


@kernel("conv2d_direct_bias", lambda dt: (_a(dt, 4), _a(dt, 1), dt))
def _conv2d_direct_bias_source(config: Config, dtype):
    def conv2d_direct_bias_kernel(g, dest, beta):
        N, O, OH, OW = g.shape
        o = cuda.grid(1)
        while o < O:
            acc = 0.0
            for n in range(N):
                for oh in range(OH):
                    for ow in range(OW):
                        acc += g[n, o, oh, ow]
            if beta == 0.0:
                dest[o] = acc
            else:
                dest[o] = acc + beta * dest[o]
            o += cuda.gridsize(1)

    return conv2d_direct_bias_kernel


# ------------------------------------------------------------ launchers
def _run(name: str, size: int, out, *args) -> None:
    if size:
        launch(name, out.dtype, grid(size), THREADS, *args)


def im2col(x, cols, sh, sw, ph, pw, dh, dw) -> None:
    """See ``kernels.cpu.im2col``."""
    _run("im2col", cols.size, cols, x, cols, int(sh), int(sw), int(ph), int(pw), int(dh),
         int(dw))


def col2im(cols, dest, sh, sw, ph, pw, dh, dw, beta) -> None:
    """See ``kernels.cpu.col2im``."""
    _run("col2im", dest.size, dest, cols, dest, int(sh), int(sw), int(ph), int(pw), int(dh),
         int(dw), dest.dtype.type(beta))


def col2im_cl(cols, dest, sh, sw, ph, pw, dh, dw, beta) -> None:
    """See ``kernels.cpu.col2im_cl``."""
    _run("col2im_cl", dest.size, dest, cols, dest, int(sh), int(sw), int(ph), int(pw), int(dh),
         int(dw), dest.dtype.type(beta))


def max_pool2d(x, out, idx, kh, kw, sh, sw, ph, pw, dh, dw) -> None:
    """See ``kernels.cpu.max_pool2d``."""
    _run("max_pool2d", out.size, out, x, out, idx, int(kh), int(kw), int(sh), int(sw), int(ph),
         int(pw), int(dh), int(dw))


def relu_max_pool2d(x, out, idx, kh, kw, sh, sw, ph, pw, dh, dw) -> None:
    """See ``kernels.cpu.relu_max_pool2d``."""
    _run("relu_max_pool2d", out.size, out, x, out, idx, int(kh), int(kw), int(sh), int(sw),
         int(ph), int(pw), int(dh), int(dw))


def conv2d_direct(x, weight, bias, out, ph, pw, dh, dw, has_bias) -> None:
    """See ``kernels.cpu.conv2d_direct``."""
    _run("conv2d_direct", out.size, out, x, weight, bias, out, int(ph), int(pw), int(dh),
         int(dw), bool(has_bias))


def conv2d_direct_input(g, weight, dest, ph, pw, dh, dw, beta) -> None:
    """See ``kernels.cpu.conv2d_direct_input``."""
    _run("conv2d_direct_input", dest.size, dest, g, weight, dest, int(ph), int(pw), int(dh),
         int(dw), dest.dtype.type(beta))


def conv2d_direct_weight(g, x, dest, bias_dest, ph, pw, dh, dw, beta, bias_beta,
                         has_bias) -> None:
    """See ``kernels.cpu.conv2d_direct_weight``: a second launch for the bias."""
    _run("conv2d_direct_weight", dest.size, dest, g, x, dest, int(ph), int(pw), int(dh),
         int(dw), dest.dtype.type(beta))
    if has_bias:
        _run("conv2d_direct_bias", bias_dest.size, bias_dest, g, bias_dest,
             bias_dest.dtype.type(bias_beta))


def relu_max_pool2d_nhwc(x, bias, has_bias, out, idx, kh, kw, sh, sw, ph, pw, dh,
                         dw) -> None:
    """See ``kernels.cpu.relu_max_pool2d_nhwc``."""
    _run("relu_max_pool2d_nhwc", out.size, out, x, bias, int(has_bias), out, idx, int(kh),
         int(kw), int(sh), int(sw), int(ph), int(pw), int(dh), int(dw))


def conv_relu_max_pool2d_nhwc(x, cols, w3, prod, bias, has_bias, out, idx, sh, sw, ph, pw, dh,
                              dw, kh, kw, psh, psw, pph, ppw, pdh, pdw) -> None:
    """See ``kernels.cpu.conv_relu_max_pool2d_nhwc``: its three kernels, one
    launch each (a launch already spans every image)."""
    _, n, oh, ow = cols.shape[:4]
    length = n * oh * ow
    im2col(x, cols, sh, sw, ph, pw, dh, dw)
    bgemm(cols.reshape((1, length, cols.size // max(length, 1))), w3, prod, 0, 1, 1.0, 0.0, 1,
          1, 1, 1)
    relu_max_pool2d_nhwc(prod.reshape((n, oh, ow, prod.shape[2])), bias, has_bias, out, idx, kh,
                         kw, psh, psw, pph, ppw, pdh, pdw)


def max_pool2d_backward_nhwc(g, idx, dest, kh, kw, sh, sw, ph, pw, dh, dw, beta) -> None:
    """See ``kernels.cpu.max_pool2d_backward_nhwc``."""
    _run("max_pool2d_backward_nhwc", dest.size, dest, g, idx, dest, int(kh), int(kw), int(sh),
         int(sw), int(ph), int(pw), int(dh), int(dw), dest.dtype.type(beta))


def max_pool2d_backward(g, idx, dest, kh, kw, sh, sw, ph, pw, dh, dw, beta) -> None:
    """See ``kernels.cpu.max_pool2d_backward``."""
    _run("max_pool2d_backward", dest.size, dest, g, idx, dest, int(kh), int(kw), int(sh),
         int(sw), int(ph), int(pw), int(dh), int(dw), dest.dtype.type(beta))


def avg_pool2d(x, out, kh, kw, sh, sw, ph, pw, include_pad, divisor) -> None:
    """See ``kernels.cpu.avg_pool2d``."""
    _run("avg_pool2d", out.size, out, x, out, int(kh), int(kw), int(sh), int(sw), int(ph),
         int(pw), bool(include_pad), int(divisor))


def avg_pool2d_backward(g, dest, kh, kw, sh, sw, ph, pw, include_pad, divisor, beta) -> None:
    """See ``kernels.cpu.avg_pool2d_backward``."""
    _run("avg_pool2d_backward", dest.size, dest, g, dest, int(kh), int(kw), int(sh), int(sw),
         int(ph), int(pw), bool(include_pad), int(divisor), dest.dtype.type(beta))


def adaptive_avg_pool2d(x, out) -> None:
    """See ``kernels.cpu.adaptive_avg_pool2d``."""
    _run("adaptive_avg_pool2d", out.size, out, x, out)


def adaptive_avg_pool2d_backward(g, dest, beta) -> None:
    """See ``kernels.cpu.adaptive_avg_pool2d_backward``."""
    _run("adaptive_avg_pool2d_backward", dest.size, dest, g, dest, dest.dtype.type(beta))


def max_unpool2d(x, idx, out) -> None:
    """See ``kernels.cpu.max_unpool2d``: two launches, zeros then the scatter
    (a repeated index keeps one of its values, which max_pool2d's indices
    make equal)."""
    _run("max_unpool2d_zero", out.size, out, out)
    _run("max_unpool2d", x.size, out, x, idx, out)


def max_unpool2d_backward(g, idx, dest, beta) -> None:
    """See ``kernels.cpu.max_unpool2d_backward``."""
    _run("max_unpool2d_backward", dest.size, dest, g, idx, dest, dest.dtype.type(beta))

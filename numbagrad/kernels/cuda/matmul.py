"""CUDA matrix products: a tiled shared-memory GEMM."""
from __future__ import annotations

__all__ = ["bgemm", "gemm", "linear"]   # the kernels this module registers

from numba import cuda, int64, types

from .. import codes
from ._core import TILE, WPT, Config, array_type, empty, kernel, launch
from .elementwise import _unary


def _tiles(config: Config, dtype):
    """The device function both GEMM kernels share: adds this thread's
    wpt x wpt block of op(a) @ op(b), tile by tile through shared memory,
    into ``acc`` (a block of bm x bm outputs at row0, col0)."""
    tile, wpt = config.tile, config.wpt
    bm = tile * wpt

    def tiles(a, b, trans_a, trans_b, m, n, row0, col0, acc):
        sa = cuda.shared.array((bm, tile), dtype)    # sa[row, k]
        sb = cuda.shared.array((tile, bm), dtype)    # sb[k, col]
        ra = cuda.local.array(wpt, dtype)
        rb = cuda.local.array(wpt, dtype)
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        kdim = a.shape[0] if trans_a else a.shape[1]
        for k0 in range(0, kdim, tile):
            # Loads walk the contiguous axis of each operand with threadIdx.x.
            for i in range(wpt):
                if trans_a:      # a is (k, m)
                    r = row0 + tx + i * tile
                    kk = k0 + ty
                    sa[tx + i * tile, ty] = a[kk, r] if r < m and kk < kdim else 0.0
                else:            # a is (m, k)
                    r = row0 + ty + i * tile
                    kk = k0 + tx
                    sa[ty + i * tile, tx] = a[r, kk] if r < m and kk < kdim else 0.0
            for j in range(wpt):
                if trans_b:      # b is (n, k)
                    c = col0 + ty + j * tile
                    kk = k0 + tx
                    sb[tx, ty + j * tile] = b[c, kk] if c < n and kk < kdim else 0.0
                else:            # b is (k, n)
                    c = col0 + tx + j * tile
                    kk = k0 + ty
                    sb[ty, tx + j * tile] = b[kk, c] if c < n and kk < kdim else 0.0
            cuda.syncthreads()
            for kk in range(tile):
                for i in range(wpt):
                    ra[i] = sa[ty + i * tile, kk]
                for j in range(wpt):
                    rb[j] = sb[kk, tx + j * tile]
                for i in range(wpt):
                    for j in range(wpt):
                        acc[i, j] += ra[i] * rb[j]
            cuda.syncthreads()

    return cuda.jit(device=True)(tiles)


@kernel("gemm", lambda dt: (array_type(dt, 2), array_type(dt, 2), array_type(dt, 2),
                            types.boolean, types.boolean, dt, dt,
                            array_type(dt, 1), types.boolean, int64, dt))
def _gemm_source(config: Config, dtype):
    tile, wpt = config.tile, config.wpt
    bm = tile * wpt
    tiles = _tiles(config, dtype)

    def gemm_kernel(a, b, out, trans_a, trans_b, alpha, beta, bias, has_bias, code, p):
        # out = f(alpha * op(a) @ op(b) + beta * out (+ bias[col] when has_bias)),
        # f the unary ``code`` (IDENT: none) with parameter p
        acc = cuda.local.array((wpt, wpt), dtype)
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        row0 = cuda.blockIdx.y * bm
        col0 = cuda.blockIdx.x * bm
        m, n = out.shape
        for i in range(wpt):
            for j in range(wpt):
                acc[i, j] = 0.0
        tiles(a, b, trans_a, trans_b, m, n, row0, col0, acc)
        for i in range(wpt):
            r = row0 + ty + i * tile
            for j in range(wpt):
                c = col0 + tx + j * tile
                if r < m and c < n:
                    v = alpha * acc[i, j]
                    if beta != 0.0:
                        v += beta * out[r, c]
                    if has_bias:
                        v += bias[c]
                    out[r, c] = v if code == codes.IDENT else _unary(code, v, p)

    return gemm_kernel


@kernel("bgemm", lambda dt: (array_type(dt, 3), array_type(dt, 3), array_type(dt, 3),
                             types.boolean, types.boolean, dt, dt, int64, int64, int64, int64))
def _bgemm_source(config: Config, dtype):
    tile, wpt = config.tile, config.wpt
    bm = tile * wpt
    tiles = _tiles(config, dtype)

    def bgemm_kernel(a, b, out, trans_a, trans_b, alpha, beta, a_div, b_div, out_div, count):
        # out[j] = alpha * sum of op(a[.]) @ op(b[.]) over the products o of
        # slice j (see kernels.cpu.bgemm) + beta * out[j]; blockIdx.z is j
        acc = cuda.local.array((wpt, wpt), dtype)
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        row0 = cuda.blockIdx.y * bm
        col0 = cuda.blockIdx.x * bm
        nout, m, n = out.shape
        span = out_div * nout
        rounds = count // span
        for jz in range(cuda.blockIdx.z, nout, cuda.gridDim.z):
            for i in range(wpt):
                for j in range(wpt):
                    acc[i, j] = 0.0
            for q in range(rounds):
                for r in range(out_div):
                    o = q * span + jz * out_div + r
                    tiles(a[(o // a_div) % a.shape[0]], b[(o // b_div) % b.shape[0]], trans_a,
                          trans_b, m, n, row0, col0, acc)
            for i in range(wpt):
                rr = row0 + ty + i * tile
                for j in range(wpt):
                    c = col0 + tx + j * tile
                    if rr < m and c < n:
                        v = alpha * acc[i, j]
                        if beta != 0.0:
                            v += beta * out[jz, rr, c]
                        out[jz, rr, c] = v

    return bgemm_kernel


# ------------------------------------------------------------ launchers
_no_bias: dict = {}   # dtype -> a one-element array passed when there is no bias


def _launch_gemm(a, b, out, trans_a, trans_b, alpha, beta, bias, code=codes.IDENT,
                 p=0.0) -> None:
    m, n = out.shape
    if m == 0 or n == 0:
        return
    has_bias = bias is not None
    if not has_bias:
        bias = _no_bias.get(out.dtype)
        if bias is None:
            bias = _no_bias[out.dtype] = empty((1,), out.dtype)
    block = TILE * WPT
    dt = out.dtype.type
    launch("gemm", out.dtype, (-(-n // block), -(-m // block)), (TILE, TILE),
           a, b, out, bool(trans_a), bool(trans_b), dt(alpha), dt(beta), bias, has_bias,
           int(code), dt(p))


def gemm(a, b, out, trans_a, trans_b, alpha, beta) -> None:
    """out = alpha * op(a) @ op(b) + beta * out (tiled, shared memory)."""
    _launch_gemm(a, b, out, trans_a, trans_b, alpha, beta, None)


def linear(x, w, bias, out, has_bias, code, p) -> None:
    """out = f(x @ w.T + bias): one GEMM launch, the bias and the activation
    ``code`` (see ``kernels.cpu.linear``) applied in its epilogue. Any code
    outside ``codes.EPILOGUE`` raises on the host, before the launch."""
    if code not in codes.EPILOGUE:
        raise ValueError(f"linear: unknown epilogue code {code} (known: "
                         f"{sorted(codes.EPILOGUE)})")
    _launch_gemm(x, w, out, False, True, 1.0, 0.0, bias if has_bias else None, code, p)


def bgemm(a, b, out, trans_a, trans_b, alpha, beta, a_div, b_div, out_div, count) -> None:
    """Batched GEMM (see ``kernels.cpu.bgemm``): one launch, the grid's z
    spanning the output slices (striding past CUDA's 65535 limit), each
    block adding up its slice's products in increasing order."""
    nout, m, n = out.shape
    if nout == 0 or m == 0 or n == 0:
        return
    block = TILE * WPT
    dt = out.dtype.type
    launch("bgemm", out.dtype, (-(-n // block), -(-m // block), min(nout, 65535)), (TILE, TILE),
           a, b, out, bool(trans_a), bool(trans_b), dt(alpha), dt(beta), int(a_div),
           int(b_div), int(out_div), int(count))

"""CPU matrix products: SciPy's BLAS for large ones, a plain loop for tiny ones.

The BLAS (``scipy.linalg.cython_blas``) is registered as an external LLVM
symbol so that the compiled kernels still cache.
"""
from __future__ import annotations

__all__ = ["bgemm", "gemm", "linear"]   # the kernels this module registers

import ctypes

import llvmlite.binding as ll
import numpy as np
import numba
from numba import cfunc, njit, prange, types
from numba.core.extending import get_cython_function_address

from ... import _cache
from .. import dispatch, codes
from . import vmath
from ._threads import ONE_THREAD, num_threads

for _routine in ("sgemm", "dgemm"):
    ll.add_symbol(f"numbagrad_{_routine}",
                  get_cython_function_address("scipy.linalg.cython_blas", _routine))
_GEMM_SIG = types.void(*([types.voidptr] * 13))
_sgemm = types.ExternalFunction("numbagrad_sgemm", _GEMM_SIG)
_dgemm = types.ExternalFunction("numbagrad_dgemm", _GEMM_SIG)


def _no_thread_control(n):
    return 0


def _blas_thread_control() -> tuple[int, bool]:
    """The address of OpenBLAS's ``openblas_set_num_threads_local`` (0.3.27+)
    in the library SciPy's BLAS calls, or of a no-op when that BLAS has none
    (MKL, Accelerate, an older OpenBLAS); and whether it is the real one. It
    is checked at import: set to 1, the previous count put back."""
    try:
        import scipy.linalg.cython_blas as cython_blas
        fn = ctypes.CDLL(cython_blas.__file__).openblas_set_num_threads_local
        fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_int]
        previous = fn(1)
        if previous < 1 or fn(previous) != 1:
            raise OSError("unexpected openblas_set_num_threads_local")
        return ctypes.cast(fn, ctypes.c_void_p).value, True
    except (AttributeError, OSError, ImportError):
        return cfunc(types.int32(types.int32))(_no_thread_control).address, False


_thread_control, BLAS_THREAD_CONTROL = _blas_thread_control()
ll.add_symbol("numbagrad_blas_threads", _thread_control)
_set_blas_threads = types.ExternalFunction("numbagrad_blas_threads",
                                           types.int32(types.int32))
# numbagrad never runs OpenBLAS's own threads: every BLAS call runs on the
# calling thread alone (the count set to 1 and put back), and a product of
# at least _SPLIT_MIN multiply-adds called through a threaded twin
# (gemm_mt, linear_mt, bgemm_mt: ``kernels.call`` picks them when the ops
# pass the multiply-adds as the size) is split into blocks, one per Numba
# thread. So one thread pool, Numba's, runs every threaded kernel of a step,
# and its workers may spin between kernels (OpenMP's default) without
# taking a core from anyone: with OpenBLAS's threads in the GEMMs too, each
# pool's idle threads spun on the core the other's next call needed (a
# 768x512x128 GEMM then a threaded GELU took 1.3 ms on two cores, against
# 0.9 ms for the two alone; with spinning workers, a compiled CNN step took
# 8.4 ms instead of 0.6). The compiled GPT step went from 37-41 ms to 24-28
# ms. OpenBLAS's pthreads build keeps the count in a process global; the
# kernels hold the GIL, so no other numbagrad call interleaves (another
# library's GEMM running at that moment in another thread would at worst
# run on one thread).
_SPLIT_MIN = 1 << 22
# A block's rows (or columns) are a multiple of this. OpenBLAS picks its
# kernels by size, so a block's edge elements can differ from one whole
# call's in the last bits (float64 here, and float32 for a column split):
# a large product's bits depend on the thread count, as they did on
# OpenBLAS's own threads (tests/test_blas_threads.py checks the tolerance).
_ALIGN = 16

# Below this many multiply-adds a plain loop beats the BLAS call overhead.
_BLAS_MIN_WORK = 4096

# One product whose inner dimension is at least _INNER_RATIO times its
# output's longer side (a weight gradient over a batch: dW = G^T @ X) is
# split along the inner dimension instead, from _INNER_MIN multiply-adds:
# each thread one BLAS call over its run of at least _INNER_DEPTH of k
# (thread 0's into out with beta, the others' into scratch), then the
# partial products added into out in order. Each thread packs its share of
# both operands, where a split of the output has every thread pack all of
# the one it does not split: 2 threads here, a 32x144 product over k=1024
# 85 -> 75 us, 16x9 over k=4096 (which no output split reaches) 14.7 ->
# 9.4 us, 32x32 over k=8192 196 -> 156 us; at a ratio of 2 it lost (373 ->
# 380 us at 256x256 over 512). The sum's order is another than one call's
# (and depends on the thread count, as the output splits' edges do).
_INNER_RATIO = 3
_INNER_MIN = 1 << 19
_INNER_DEPTH = 256

_N, _T = 78, 84  # ord("N"), ord("T"): Fortran BLAS transpose flags

_unary = vmath.unary   # (float32: the records' fast forms)
_inline = njit(error_model="numpy", inline="always")


@njit(cache=True, error_model="numpy")
def _blas(a, b, out, trans_a, trans_b, alpha, beta, lda, ldb, ldc):
    """One BLAS call, on the BLAS's current thread count: out = alpha * op(a) @
    op(b) + beta * out for 2-D views whose rows are lda, ldb and ldc elements
    apart (unit steps along the rows)."""
    # Row-major out = op(a) @ op(b) is column-major out^T = op(b)^T @ op(a)^T,
    # so b goes first and the roles of m and n swap.
    m, n = out.shape
    k = a.shape[0] if trans_a else a.shape[1]
    ints = np.empty(6, np.int32)
    ints[0] = n
    ints[1] = m
    ints[2] = k
    ints[3] = ldb
    ints[4] = lda
    ints[5] = ldc
    flags = np.empty(2, np.uint8)
    flags[0] = _T if trans_b else _N
    flags[1] = _T if trans_a else _N
    scalars = np.empty(2, out.dtype)
    scalars[0] = alpha
    scalars[1] = beta
    args = (flags[0:].ctypes, flags[1:].ctypes, ints[0:].ctypes, ints[1:].ctypes,
            ints[2:].ctypes, scalars[0:].ctypes, b.ctypes, ints[3:].ctypes,
            a.ctypes, ints[4:].ctypes, scalars[1:].ctypes, out.ctypes,
            ints[5:].ctypes)
    if out.itemsize == 8:
        _dgemm(*args)
    else:
        _sgemm(*args)


@njit(cache=True, error_model="numpy")
def _blas_gemm(a, b, out, trans_a, trans_b, alpha, beta):
    """``_blas`` of C-contiguous matrices on one BLAS thread. Inside a parallel
    kernel (whose caller set the count to 1 first) nothing is put back, so
    two workers cannot restore each other's count mid-call."""
    previous = _set_blas_threads(1)
    _blas(a, b, out, trans_a, trans_b, alpha, beta, a.shape[1], b.shape[1], out.shape[1])
    if previous != 1:
        _set_blas_threads(previous)


# OpenBLAS's small-matrix kernels (SkylakeX and some others) take a product
# of at most 1e6 multiply-adds without packing, at about twice the speed of
# its packed path for a few rows: a recurrent layer's per-step products.
_SMALL_WORK = 1_000_000


@njit(cache=True, error_model="numpy")
def gemm_pieces(a, b, out, beta, split_k):
    """out = a @ b + beta * out (no transposes; rows of C-contiguous 2-D
    arrays) as BLAS products of at most ``_SMALL_WORK`` multiply-adds each:
    column blocks of ``out`` or, with ``split_k``, blocks of the inner
    dimension added in turn (another summation order than one product's).
    On the caller's BLAS thread count; not a registered kernel."""
    m, n = out.shape
    k = a.shape[1]
    if m == 0 or n == 0:
        return
    if split_k:
        step = max(1, _SMALL_WORK // max(1, m * n))
        pieces = (k + step - 1) // step
        step = (k + pieces - 1) // pieces
        for p0 in range(0, k, step):
            p1 = min(k, p0 + step)
            _blas(a[:, p0:p1], b[p0:p1], out, False, False, 1.0,
                  beta if p0 == 0 else 1.0, a.shape[1], b.shape[1], out.shape[1])
        return
    step = max(1, _SMALL_WORK // max(1, m * k))
    pieces = (n + step - 1) // step
    step = (n + pieces - 1) // pieces
    for j0 in range(0, n, step):
        j1 = min(n, j0 + step)
        _blas(a, b[:, j0:j1], out[:, j0:j1], False, False, 1.0, beta, a.shape[1],
              b.shape[1], out.shape[1])


@njit(cache=True, error_model="numpy")
def gemm(a, b, out, trans_a, trans_b, alpha, beta):
    """out = alpha * op(a) @ op(b) + beta * out, op = transpose when flagged.

    With beta == 0 ``out`` is never read, so it may hold garbage (or NaN).
    All three arrays are 2-D and C-contiguous. One thread.
    """
    m, n = out.shape
    k = a.shape[0] if trans_a else a.shape[1]
    if k == 0 or m * n * k >= _BLAS_MIN_WORK:
        if m > 0 and n > 0:
            if k == 0:
                for i in range(m):
                    for j in range(n):
                        out[i, j] = beta * out[i, j] if beta != 0.0 else 0.0
            else:
                _blas_gemm(a, b, out, trans_a, trans_b, alpha, beta)
        return
    for i in range(m):
        for j in range(n):
            acc = 0.0
            for p in range(k):
                x = a[p, i] if trans_a else a[i, p]
                y = b[j, p] if trans_b else b[p, j]
                acc += x * y
            if beta == 0.0:
                out[i, j] = alpha * acc
            else:
                out[i, j] = alpha * acc + beta * out[i, j]


@njit(error_model="numpy", inline="always")
def _epilogue(code, out, bias, has_bias, p):
    rows, cols = out.shape
    if has_bias:
        for i in range(rows):
            for j in range(cols):
                out[i, j] = _unary(code, out[i, j] + bias[j], p)
    else:
        for i in range(rows):
            for j in range(cols):
                out[i, j] = _unary(code, out[i, j], p)


_EPILOGUE = tuple(sorted(codes.EPILOGUE))
# one loop per code, the code a constant in each (see elementwise.py): the
# codes are codes.EPILOGUE's, and any other raises (``linear`` checks first,
# so nothing is written then)
_apply_epilogue = _cache.jit_generated(dispatch.ladder(
    "_apply_epilogue", "out, bias, has_bias, p", sorted(codes.EPILOGUE - {codes.IDENT}),
    "_epilogue({code}, out, bias, has_bias, p)", {"_epilogue": _epilogue},
    "linear: unknown epilogue code", origin=__name__), error_model="numpy")


@njit(error_model="numpy", inline="always")
def _check_epilogue(code):
    for c in _EPILOGUE:
        if code == c:
            return
    raise ValueError("linear: unknown epilogue code")


@njit(cache=True, error_model="numpy")
def linear(x, w, bias, out, has_bias, code, p):
    """out = f(x @ w.T + bias), PyTorch's F.linear then the activation ``code``
    (a unary code of ``codes.EPILOGUE``, IDENT for none, with parameter
    ``p``). Without an activation the bias is
    broadcast into ``out`` and one GEMM adds the product with beta=1; with
    one, the GEMM writes ``out`` and a single epilogue pass adds the bias and
    applies the activation. Any other code raises before anything is written."""
    _check_epilogue(code)
    _linear_block(x, w, bias, out, has_bias, code, p, False, out.shape[1])


@njit(cache=True, error_model="numpy")
def _linear_block(x, w, bias, out, has_bias, code, p, direct, ldc):
    # ``direct``: a block of linear_mt (rows of x and out, or rows of w and
    # columns of out, ldc apart), its product one BLAS call on this thread
    beta = 0.0
    if code == codes.IDENT and has_bias:
        for i in range(out.shape[0]):
            for j in range(out.shape[1]):
                out[i, j] = bias[j]
        beta = 1.0
    if direct:
        _blas(x, w, out, False, True, 1.0, beta, x.shape[1], w.shape[1], ldc)
    else:
        gemm(x, w, out, False, True, 1.0, beta)
    if code != codes.IDENT:
        _apply_epilogue(code, out, bias, has_bias, p)


# ------------------------------------------------------------ threaded twins
@njit(cache=True, error_model="numpy")
def _blocks(m, n, k, threads):
    """(blocks, elements per block, by rows?) of a product split over
    ``threads``: 1 block (serial) below _SPLIT_MIN multiply-adds. The larger
    of m and n is split, so the operand every block packs whole is the smaller."""
    by_rows = m >= n
    span = m if by_rows else n
    parts = min(threads, span // _ALIGN)
    if np.int64(m) * n * k < _SPLIT_MIN or parts < 2:
        return 1, span, by_rows
    step = ((span + parts - 1) // parts + _ALIGN - 1) // _ALIGN * _ALIGN
    return (span + step - 1) // step, step, by_rows


@_inline
def product_block(a, b, out, trans_a, trans_b, alpha, beta, i0, i1, by_rows):
    """Rows (``by_rows``) or columns [i0, i1) of a product: one BLAS call on
    this thread (a block of ``gemm_mt``; ``compile.fusion``'s folded loops
    call it too)."""
    lda, ldb, ldc = a.shape[1], b.shape[1], out.shape[1]
    if by_rows and trans_a:
        _blas(a[:, i0:i1], b, out[i0:i1], trans_a, trans_b, alpha, beta, lda, ldb, ldc)
    elif by_rows:
        _blas(a[i0:i1], b, out[i0:i1], trans_a, trans_b, alpha, beta, lda, ldb, ldc)
    elif trans_b:
        _blas(a, b[i0:i1], out[:, i0:i1], trans_a, trans_b, alpha, beta, lda, ldb, ldc)
    else:
        _blas(a, b[:, i0:i1], out[:, i0:i1], trans_a, trans_b, alpha, beta, lda, ldb, ldc)


@_inline
def _split_product(a, b, out, trans_a, trans_b, alpha, beta, parts, step, by_rows):
    # the blocks of a product over Numba's threads, each one BLAS call on one thread
    span = out.shape[0] if by_rows else out.shape[1]
    previous = _set_blas_threads(1)
    for q in prange(parts):
        i0 = q * step
        product_block(a, b, out, trans_a, trans_b, alpha, beta, i0, min(span, i0 + step),
                      by_rows)
    _set_blas_threads(previous)


@_inline
def _gemm_split(a, b, out, trans_a, trans_b, alpha, beta):
    m, n = out.shape
    k = a.shape[0] if trans_a else a.shape[1]
    parts, step, by_rows = _blocks(m, n, k, num_threads())
    if parts == 1:
        gemm(a, b, out, trans_a, trans_b, alpha, beta)
    else:
        _split_product(a, b, out, trans_a, trans_b, alpha, beta, parts, step, by_rows)


@njit(cache=True, error_model="numpy", parallel=True)
def gemm_mt(a, b, out, trans_a, trans_b, alpha, beta):
    """``gemm``, a product of at least _SPLIT_MIN multiply-adds split over Numba's threads."""
    _gemm_split(a, b, out, trans_a, trans_b, alpha, beta)


@njit(cache=True, error_model="numpy")
def gemm_st(a, b, out, trans_a, trans_b, alpha, beta):
    """``gemm_mt``'s blocks on the calling thread alone: its bits, no threads
    (what the thread governor runs while the cores are busy)."""
    _gemm_split(a, b, out, trans_a, trans_b, alpha, beta)


@_inline
def _linear_split(x, w, bias, out, has_bias, code, p):
    m, n = out.shape
    parts, step, by_rows = _blocks(m, n, x.shape[1], num_threads())
    if parts == 1:
        linear(x, w, bias, out, has_bias, code, p)
        return
    _check_epilogue(code)
    previous = _set_blas_threads(1)
    for q in prange(parts):
        i0 = q * step
        linear_block(x, w, bias, out, has_bias, code, p, i0, min(m if by_rows else n,
                                                                 i0 + step), by_rows)
    _set_blas_threads(previous)


@_inline
def linear_block(x, w, bias, out, has_bias, code, p, i0, i1, by_rows):
    """Rows (``by_rows``) or columns [i0, i1) of ``linear``: its product one
    BLAS call on this thread, then the block's bias and activation (a block
    of ``linear_mt``; ``compile.fusion``'s folded loops call it too)."""
    ldc = out.shape[1]
    if by_rows:
        _linear_block(x[i0:i1], w, bias, out[i0:i1], has_bias, code, p, True, ldc)
    else:
        _linear_block(x, w[i0:i1], bias[i0:i1], out[:, i0:i1], has_bias, code, p, True, ldc)


@njit(cache=True, error_model="numpy", parallel=True)
def linear_mt(x, w, bias, out, has_bias, code, p):
    """``linear``, a product of at least _SPLIT_MIN multiply-adds split over
    Numba's threads (each block adds its bias and applies its activation)."""
    _linear_split(x, w, bias, out, has_bias, code, p)


@njit(cache=True, error_model="numpy")
def linear_st(x, w, bias, out, has_bias, code, p):
    """``linear_mt``'s blocks on the calling thread alone (see ``gemm_st``)."""
    _linear_split(x, w, bias, out, has_bias, code, p)


@njit(cache=True, error_model="numpy")
def bgemm(a, b, out, trans_a, trans_b, alpha, beta, a_div, b_div, out_div, count):
    """Batched GEMM over ``count`` products, each 3-D array a stack of slices:
    product o reads slice (o // a_div) % len(a) of ``a`` (likewise ``b``) and
    adds into slice j = (o // out_div) % len(out) of ``out``:

        out[j] = alpha * sum(op(a[.]) @ op(b[.]) over the products of j) + beta * out[j].

    A forward maps product o to out[o] (out_div 1); the gradient of an operand
    broadcast over batch dims maps several products to one slice. Products
    are added in increasing o, so the result does not depend on threads. All
    three arrays are C-contiguous.
    """
    for j in range(out.shape[0]):
        _bgemm_slice(a, b, out, trans_a, trans_b, alpha, beta, a_div, b_div, out_div, count, j)


@njit(cache=True, error_model="numpy", parallel=True)
def bgemm_mt(a, b, out, trans_a, trans_b, alpha, beta, a_div, b_div, out_div, count):
    """``bgemm`` over Numba's threads from _SPLIT_MIN multiply-adds in all: one
    product split as ``gemm_mt`` does (or, long and thin, along its inner
    dimension: ``_INNER_RATIO``), several shared out slice by slice."""
    _bgemm_split(a, b, out, trans_a, trans_b, alpha, beta, a_div, b_div, out_div, count)


@njit(cache=True, error_model="numpy")
def bgemm_st(a, b, out, trans_a, trans_b, alpha, beta, a_div, b_div, out_div, count):
    """``bgemm_mt``'s blocks on the calling thread alone (see ``gemm_st``)."""
    _bgemm_split(a, b, out, trans_a, trans_b, alpha, beta, a_div, b_div, out_div, count)


@njit(cache=True, error_model="numpy")
def _inner_blocks(m, n, k, threads):
    """(runs, their length) of a product split along its inner dimension
    (``_INNER_RATIO``): 1 run (no such split) unless the product is long and
    thin enough; a run's length is a multiple of _ALIGN."""
    runs = min(threads, k // _INNER_DEPTH)
    if runs < 2 or k < _INNER_RATIO * max(m, n) or np.int64(m) * n * k < _INNER_MIN:
        return 1, k
    step = ((k + runs - 1) // runs + _ALIGN - 1) // _ALIGN * _ALIGN
    return (k + step - 1) // step, step


@_inline
def _split_inner(a, b, out, trans_a, trans_b, alpha, beta, runs, step):
    # out = (alpha * op(a) @ op(b) over the first run + beta * out) + the other
    # runs' alpha * products, added in order after the threads' BLAS calls
    m, n = out.shape
    k = a.shape[0] if trans_a else a.shape[1]
    lda, ldb = a.shape[1], b.shape[1]
    part = np.empty((runs - 1, m, n), out.dtype)
    previous = _set_blas_threads(1)
    for q in prange(runs):
        p0 = q * step
        p1 = min(k, p0 + step)
        ak = a[p0:p1] if trans_a else a[:, p0:p1]
        bk = b[:, p0:p1] if trans_b else b[p0:p1]
        if q == 0:
            _blas(ak, bk, out, trans_a, trans_b, alpha, beta, lda, ldb, n)
        else:
            _blas(ak, bk, part[q - 1], trans_a, trans_b, alpha, 0.0, lda, ldb, n)
    _set_blas_threads(previous)
    for q in range(runs - 1):
        p = part[q]
        for i in range(m):
            for j in range(n):
                out[i, j] += p[i, j]


@_inline
def _bgemm_split(a, b, out, trans_a, trans_b, alpha, beta, a_div, b_div, out_div, count):
    nout, m, n = out.shape
    k = a.shape[1] if trans_a else a.shape[2]
    if nout == 1 and count == 1 and out_div == 1:   # one product: out[0] = op(a[0]) @ op(b[0])
        runs, length = _inner_blocks(m, n, k, num_threads())
        if runs > 1:
            _split_inner(a[0], b[0], out[0], trans_a, trans_b, alpha, beta, runs, length)
            return
        parts, step, by_rows = _blocks(m, n, k, num_threads())
        if parts > 1:
            _split_product(a[0], b[0], out[0], trans_a, trans_b, alpha, beta, parts, step,
                           by_rows)
            return
    elif nout > 1 and np.int64(m) * n * k * count >= _SPLIT_MIN and num_threads() > 1:
        previous = _set_blas_threads(1)
        for j in prange(nout):
            _bgemm_slice(a, b, out, trans_a, trans_b, alpha, beta, a_div, b_div, out_div,
                         count, j)
        _set_blas_threads(previous)
        return
    bgemm(a, b, out, trans_a, trans_b, alpha, beta, a_div, b_div, out_div, count)


@_inline
def _bgemm_slice(a, b, out, trans_a, trans_b, alpha, beta, a_div, b_div, out_div, count, j):
    # out[j]: its products in increasing o (gemm: one BLAS thread each)
    span = out_div * out.shape[0]
    rounds = count // span if span > 0 else 0
    dest = out[j]
    first = True
    for q in range(rounds):
        for r in range(out_div):
            o = q * span + j * out_div + r
            gemm(a[(o // a_div) % a.shape[0]], b[(o // b_div) % b.shape[0]], dest,
                 trans_a, trans_b, alpha, beta if first else 1.0)
            first = False
    if first:   # no product reaches this slice: out[j] = beta * out[j]
        for i in range(dest.shape[0]):
            for c in range(dest.shape[1]):
                dest[i, c] = beta * dest[i, c] if beta != 0.0 else 0.0


# what the thread governor runs while the cores are busy (kernels/cpu/_threads.py)
ONE_THREAD.update(gemm=gemm_st, linear=linear_st, bgemm=bgemm_st)
# The one-thread twins read the threading layer's thread count (num_threads),
# whose symbol only a launched layer provides; loaded from Numba's cache
# (nothing typed, nothing launched) the first call would crash. Launch it now.
numba.get_num_threads()

"""CPU matrix products: SciPy's BLAS for large ones, a plain loop for tiny ones.

The BLAS (``scipy.linalg.cython_blas``) is registered as an external LLVM
symbol so that the compiled kernels still cache.
"""
from __future__ import annotations

import ctypes

import llvmlite.binding as ll
import numpy as np
from numba import cfunc, njit, types
from numba.core.extending import get_cython_function_address

from .. import scalar

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
# Below this many multiply-adds a GEMM runs on one BLAS thread: OpenBLAS
# threads from ~0.26M, and on two cores a 32x1024x144 product (a CNN's
# weight gradient) took 1.1-1.9 ms on two threads against 0.3-0.5 ms on one
# while Numba's workers woke for every memory-bound kernel between GEMMs.
# Since those run serially (_threads.MT_MIN_MEMORY) two threads win from
# ~4M: the compiled CNN step 0.61-0.65 ms with 2**24 against 0.51-0.57 ms
# with 2**22 (and 0.54-0.64 with 2**19), the GPT step no slower with its
# 768x128x128 products (12.6M) on two threads (alone: 75 us against 126).
# OpenBLAS's pthreads build keeps the count in a process global; the kernels
# hold the GIL, so no other numbagrad call interleaves, and the count is put
# back before the kernel returns (another library's GEMM running at that
# moment in another thread would at worst run on one thread).
_BLAS_THREADS_MIN = 1 << 22

# Below this many multiply-adds a plain loop beats the BLAS call overhead.
_BLAS_MIN_WORK = 4096

_N, _T = 78, 84  # ord("N"), ord("T"): Fortran BLAS transpose flags

_unary = njit(scalar.unary)


@njit(cache=True, error_model="numpy")
def _blas_gemm(a, b, out, trans_a, trans_b, alpha, beta):
    # Row-major out = op(a) @ op(b) is column-major out^T = op(b)^T @ op(a)^T,
    # so b goes first and the roles of m and n swap.
    m, n = out.shape
    k = a.shape[0] if trans_a else a.shape[1]
    ints = np.empty(6, np.int32)
    ints[0] = n
    ints[1] = m
    ints[2] = k
    ints[3] = b.shape[1]
    ints[4] = a.shape[1]
    ints[5] = n
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
    single = np.int64(m) * n * k < _BLAS_THREADS_MIN
    if single:
        previous = _set_blas_threads(1)
    if out.itemsize == 8:
        _dgemm(*args)
    else:
        _sgemm(*args)
    if single:
        _set_blas_threads(previous)


@njit(cache=True, error_model="numpy")
def gemm(a, b, out, trans_a, trans_b, alpha, beta):
    """out = alpha * op(a) @ op(b) + beta * out, op = transpose when flagged.

    With beta == 0 ``out`` is never read, so it may hold garbage (or NaN).
    All three arrays are 2-D and C-contiguous.
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


@njit(cache=True, error_model="numpy")
def linear(x, w, bias, out, has_bias, code, p):
    """out = f(x @ w.T + bias), PyTorch's F.linear then the activation ``code``
    (a unary code of ``kernels.scalar``: IDENT, RELU, LEAKY_RELU, TANH or
    SIGMOID, with parameter ``p``). Without an activation the bias is
    broadcast into ``out`` and one GEMM adds the product with beta=1; with
    one, the GEMM writes ``out`` and a single epilogue pass adds the bias and
    applies the activation."""
    if code == scalar.IDENT:
        if has_bias:
            for i in range(out.shape[0]):
                for j in range(out.shape[1]):
                    out[i, j] = bias[j]
        gemm(x, w, out, False, True, 1.0, 1.0 if has_bias else 0.0)
        return
    gemm(x, w, out, False, True, 1.0, 0.0)
    # one loop per code, the code a constant in each (see elementwise.py)
    if code == scalar.RELU:
        _epilogue(scalar.RELU, out, bias, has_bias, p)
    elif code == scalar.LEAKY_RELU:
        _epilogue(scalar.LEAKY_RELU, out, bias, has_bias, p)
    elif code == scalar.TANH:
        _epilogue(scalar.TANH, out, bias, has_bias, p)
    else:
        _epilogue(scalar.SIGMOID, out, bias, has_bias, p)


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
    nout = out.shape[0]
    span = out_div * nout
    rounds = count // span if span > 0 else 0
    for j in range(nout):
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

"""CPU kernels: ``@njit`` functions with destination-passing signatures.

Every kernel writes into an array the caller passes; none allocates a
parameter-sized result. ``kernels/cuda.py`` exposes the same names with the
same signatures, so the op and optimizer layers never branch on the device.

Large products go to the BLAS that SciPy ships (``scipy.linalg.cython_blas``),
registered as an external LLVM symbol so that the compiled kernels still cache.
"""
from __future__ import annotations

import math

import llvmlite.binding as ll
import numpy as np
from numba import njit, types
from numba.core.extending import get_cython_function_address

name = "cpu"

for _routine in ("sgemm", "dgemm"):
    ll.add_symbol(f"numbagrad_{_routine}",
                  get_cython_function_address("scipy.linalg.cython_blas", _routine))
_GEMM_SIG = types.void(*([types.voidptr] * 13))
_sgemm = types.ExternalFunction("numbagrad_sgemm", _GEMM_SIG)
_dgemm = types.ExternalFunction("numbagrad_dgemm", _GEMM_SIG)

# Below this many multiply-adds a plain loop beats the BLAS call overhead.
_BLAS_MIN_WORK = 4096

_N, _T = 78, 84  # ord("N"), ord("T"): Fortran BLAS transpose flags


# --------------------------------------------------------------- memory
def empty(shape: tuple, dtype) -> np.ndarray:
    """An uninitialised C-contiguous host array."""
    return np.empty(shape, dtype)


def from_host(array: np.ndarray) -> np.ndarray:
    """Host data as this device's array: a copy the caller owns."""
    return np.array(array, order="C", copy=True)


def to_host(array: np.ndarray) -> np.ndarray:
    """A host copy of a device array."""
    return np.array(array, copy=True)


def upload(host: np.ndarray, out: np.ndarray) -> None:
    """Copy host data into an existing device array of the same shape."""
    np.copyto(out, host)


def is_device_array(obj) -> bool:
    return isinstance(obj, np.ndarray)


# --------------------------------------------------------------- kernels
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
    if out.itemsize == 8:
        _dgemm(*args)
    else:
        _sgemm(*args)


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


# reassoc lets LLVM vectorize the sum (lanes of partial sums): ~3x faster.
@njit(cache=True, error_model="numpy", fastmath={"reassoc"})
def mse(pred, target, loss_out, resid_out, scale):
    """One pass: loss_out[()] = scale * sum((pred - target)**2) and
    resid_out = 2 * scale * (pred - target), the loss's gradient w.r.t. pred.
    """
    p = pred.ravel()
    t = target.ravel()
    r = resid_out.ravel()
    c = 2.0 * scale
    total = 0.0
    for i in range(p.size):
        d = p[i] - t[i]
        r[i] = c * d
        total += d * d
    loss_out[()] = total * scale


@njit(cache=True, error_model="numpy")
def fill(out, value):
    """out[...] = value."""
    o = out.ravel()
    for i in range(o.size):
        o[i] = value


@njit(cache=True, error_model="numpy")
def axpby(alpha, x, beta, y):
    """y = alpha * x + beta * y; with beta == 0 ``y`` is never read."""
    xs = x.ravel()
    ys = y.ravel()
    if beta == 0.0:
        for i in range(ys.size):
            ys[i] = alpha * xs[i]
    else:
        for i in range(ys.size):
            ys[i] = alpha * xs[i] + beta * ys[i]


# The optimizer kernels loop over each param's slice of the flat buffers:
# indexing from 0 over a slice (rather than from seg[s]) lets LLVM prove the
# indices non-negative and vectorize the loop, about 4x faster for Adam.
@njit(cache=True, error_model="numpy")
def sgd_update(w, g, v, seg, live, lr, momentum, scale):
    """Fused SGD over an optimizer's flat buffers, as ``torch.optim.SGD``.

    Segment s (``seg[s]:seg[s+1]``) is one param; it is skipped unless
    ``live[s]``. The gradient is ``scale * g`` (scale folds in the 1/k
    averaging) and ``g`` is zeroed in the same pass, ready for the next
    window. ``v`` (the momentum buffer) is unused when momentum == 0.
    """
    for s in range(seg.size - 1):
        if not live[s]:
            continue
        lo, hi = seg[s], seg[s + 1]
        ws, gs = w[lo:hi], g[lo:hi]
        if momentum != 0.0:
            vs = v[lo:hi]
            for i in range(ws.size):
                vi = momentum * vs[i] + scale * gs[i]
                vs[i] = vi
                ws[i] = ws[i] - lr * vi
                gs[i] = 0.0
        else:
            for i in range(ws.size):
                ws[i] = ws[i] - lr * (scale * gs[i])
                gs[i] = 0.0


@njit(cache=True, error_model="numpy")
def adam_update(w, g, m, v, seg, live, steps_in, steps_out,
                lr, beta1, beta2, eps, scale):
    """Fused Adam over an optimizer's flat buffers, as ``torch.optim.Adam``.

    Each segment keeps its own step count (read from ``steps_in``, written
    to ``steps_out``) so a param skipped in a window keeps its bias
    correction, exactly as PyTorch's per-param ``step``. ``g`` is zeroed.
    """
    for s in range(seg.size - 1):
        if not live[s]:
            steps_out[s] = steps_in[s]
            continue
        t = steps_in[s] + 1
        steps_out[s] = t
        step_size = lr / (1.0 - beta1 ** t)
        bc2_sqrt = math.sqrt(1.0 - beta2 ** t)
        lo, hi = seg[s], seg[s + 1]
        ws, gs, ms, vs = w[lo:hi], g[lo:hi], m[lo:hi], v[lo:hi]
        for i in range(ws.size):
            gi = scale * gs[i]
            mi = ms[i] + (1.0 - beta1) * (gi - ms[i])
            vi = vs[i] * beta2 + (1.0 - beta2) * gi * gi
            ms[i] = mi
            vs[i] = vi
            ws[i] = ws[i] - step_size * (mi / (math.sqrt(vi) / bc2_sqrt + eps))
            gs[i] = 0.0

"""CUDA elementwise kernels: grid-stride loops over flat or 2-D operands.

2-D kernels broadcast an input along a dimension where it has size 1, and
sum a broadcast operand's gradient with one thread per destination element
(the same order as the CPU kernels, so the devices agree).
"""
from __future__ import annotations

# the kernels this module registers
__all__ = ["axpby", "binary", "binary_backward", "fill", "scaled_add", "sum_to", "unary",
           "unary_backward"]

from numba import cuda, float64, int32, int64, types

from .. import bodies, codes
from ._core import (THREADS, Config, array_type, block_total, checked_code, flat, grid, kernel,
                    launch, sums)

# the records' dispatchers, compiled for the device (codes.dispatchers)
_DEVICE = codes.dispatchers(cuda.jit(device=True))
_unary, _unary_grad = _DEVICE["unary"], _DEVICE["unary_grad"]
_binary = _DEVICE["binary"]
_binary_grad_a, _binary_grad_b = _DEVICE["binary_grad_a"], _DEVICE["binary_grad_b"]
_reduced_grad = cuda.jit(device=True)(bodies.reduced_grad(_binary_grad_a, _binary_grad_b))


def _a2(dt):
    return array_type(dt, 2, "A")


@kernel("fill", lambda dt: (array_type(dt, 1), float64))
def _fill_source(config: Config, dtype):
    def fill_kernel(out, value):
        i = cuda.grid(1)
        stride = cuda.gridsize(1)
        while i < out.size:
            out[i] = value
            i += stride

    return fill_kernel


@kernel("axpby", lambda dt: (float64, array_type(dt, 1), float64, array_type(dt, 1)))
def _axpby_source(config: Config, dtype):
    def axpby_kernel(alpha, x, beta, y):
        i = cuda.grid(1)
        stride = cuda.gridsize(1)
        while i < y.size:
            if beta == 0.0:
                y[i] = alpha * x[i]
            else:
                y[i] = alpha * x[i] + beta * y[i]
            i += stride

    return axpby_kernel


@kernel("scaled_add", lambda dt: (array_type(dt, 0), array_type(dt, 1), float64,
                                  array_type(dt, 1)))
def _scaled_add_source(config: Config, dtype):
    def scaled_add_kernel(g, x, beta, y):
        alpha = g[()]
        i = cuda.grid(1)
        stride = cuda.gridsize(1)
        while i < y.size:
            y[i] = alpha * x[i] if beta == 0.0 else alpha * x[i] + beta * y[i]
            i += stride

    return scaled_add_kernel


@kernel("unary", lambda dt: (int64, _a2(dt), _a2(dt), dt, dt, dt))
def _unary_source(config: Config, dtype):
    def unary_kernel(code, x, out, p, alpha, beta):
        rows, cols = out.shape
        bx0, bx1 = x.shape[0] == 1, x.shape[1] == 1
        k = cuda.grid(1)
        stride = cuda.gridsize(1)
        while k < rows * cols:
            i, j = k // cols, k % cols
            y = alpha * _unary(code, x[0 if bx0 else i, 0 if bx1 else j], p)
            out[i, j] = y if beta == 0.0 else y + beta * out[i, j]
            k += stride

    return unary_kernel


@kernel("unary_backward", lambda dt: (int64, _a2(dt), _a2(dt), _a2(dt), _a2(dt), float64, dt))
def _unary_backward_source(config: Config, dtype):
    def unary_backward_kernel(code, x, y, gout, dest, beta, p):
        rows, cols = dest.shape
        k = cuda.grid(1)
        stride = cuda.gridsize(1)
        while k < rows * cols:
            i, j = k // cols, k % cols
            g = gout[i, j] * _unary_grad(code, x[i, j], y[i, j], p)
            dest[i, j] = g if beta == 0.0 else g + beta * dest[i, j]
            k += stride

    return unary_backward_kernel


@kernel("binary", lambda dt: (int64, _a2(dt), _a2(dt), _a2(dt)))
def _binary_source(config: Config, dtype):
    def binary_kernel(code, a, b, out):
        rows, cols = out.shape
        ba0, ba1 = a.shape[0] == 1, a.shape[1] == 1
        bb0, bb1 = b.shape[0] == 1, b.shape[1] == 1
        k = cuda.grid(1)
        stride = cuda.gridsize(1)
        while k < rows * cols:
            i, j = k // cols, k % cols
            out[i, j] = _binary(code, a[0 if ba0 else i, 0 if ba1 else j],
                                b[0 if bb0 else i, 0 if bb1 else j])
            k += stride

    return binary_kernel


@kernel("binary_backward", lambda dt: (int64, _a2(dt), _a2(dt), _a2(dt), _a2(dt), float64,
                                       types.boolean, _a2(dt), float64, types.boolean))
def _binary_backward_source(config: Config, dtype):
    def binary_backward_kernel(code, a, b, gout, da, beta_a, need_a, db, beta_b, need_b):
        # Threads [0, na) write da, the next nb threads db: one launch for both.
        na = da.size if need_a else 0
        nb = db.size if need_b else 0
        k = cuda.grid(1)
        stride = cuda.gridsize(1)
        while k < na + nb:
            if k < na:
                i, j = k // da.shape[1], k % da.shape[1]
                g = _reduced_grad(code, 0, a, b, gout, i, j)
                da[i, j] = g if beta_a == 0.0 else g + beta_a * da[i, j]
            else:
                m = k - na
                i, j = m // db.shape[1], m % db.shape[1]
                g = _reduced_grad(code, 1, a, b, gout, i, j)
                db[i, j] = g if beta_b == 0.0 else g + beta_b * db[i, j]
            k += stride

    return binary_backward_kernel


@kernel("sum_all", lambda dt: (_a2(dt), _a2(dt), dt, dt, array_type(float64, 1),
                               array_type(int32, 1)))
def _sum_all_source(config: Config, dtype):
    threads = config.threads

    def sum_all_kernel(x, out, scale, beta, partial, counter):
        # sum_to into a single element: every thread adds a grid-stride share.
        cache = cuda.shared.array(threads, float64)
        cols = x.shape[1]
        total = 0.0
        k = cuda.grid(1)
        stride = cuda.gridsize(1)
        while k < x.size:
            total += x[k // cols, k % cols]
            k += stride
        last, grand = block_total(cache, total, partial, counter)
        if last:
            out[0, 0] = scale * grand if beta == 0.0 else scale * grand + beta * out[0, 0]

    return sum_all_kernel


@kernel("sum_to", lambda dt: (_a2(dt), _a2(dt), dt, dt))
def _sum_to_source(config: Config, dtype):
    def sum_to_kernel(x, out, scale, beta):
        rows, cols = x.shape
        b0, b1 = out.shape[0] == 1, out.shape[1] == 1
        k = cuda.grid(1)
        stride = cuda.gridsize(1)
        while k < out.size:
            i, j = k // out.shape[1], k % out.shape[1]
            if b0 and not b1 and rows == 0:   # a sum over no rows is 0 (a mean's nan)
                out[0, j] = scale * 0 if beta == 0.0 else beta * out[0, j] + scale * 0
            elif b0 and not b1:   # column sums in the CPU kernel's order
                acc = scale * x[0, j] if beta == 0.0 else beta * out[0, j] + scale * x[0, j]
                for r in range(1, rows):
                    acc += scale * x[r, j]
                out[0, j] = acc
            else:
                total = 0.0   # float64, as the CPU kernel and sum_all add
                for r in range(0 if b0 else i, rows if b0 else i + 1):
                    for c in range(0 if b1 else j, cols if b1 else j + 1):
                        total += x[r, c]
                out[i, j] = scale * total if beta == 0.0 else scale * total + beta * out[i, j]
            k += stride

    return sum_to_kernel


# ------------------------------------------------------------ launchers
def fill(out, value) -> None:
    """out[...] = value."""
    if out.size:
        value = float(value) if out.dtype.kind == "f" else out.dtype.type(value)   # ints exact
        launch("fill", out.dtype, grid(out.size), THREADS, flat(out), value)


def axpby(alpha, x, beta, y) -> None:
    """y = alpha * x + beta * y; with beta == 0 ``y`` is never read."""
    if y.size:
        launch("axpby", y.dtype, grid(y.size), THREADS,
               float(alpha), flat(x), float(beta), flat(y))


def scaled_add(g, x, beta, y) -> None:
    """y = g[()] * x + beta * y for a 0-d device array ``g``."""
    if y.size:
        launch("scaled_add", y.dtype, grid(y.size), THREADS, g, flat(x), float(beta), flat(y))


def unary(code, x, out, p, alpha, beta) -> None:
    """See ``kernels.cpu.unary``."""
    code = checked_code("unary", code, codes.N_UNARY)
    if out.size:
        dt = out.dtype.type
        launch("unary", out.dtype, grid(out.size), THREADS, int(code), x, out, dt(p), dt(alpha),
               dt(beta))


def unary_backward(code, x, y, gout, dest, beta, p) -> None:
    """See ``kernels.cpu.unary_backward``."""
    code = checked_code("unary_backward", code, codes.N_UNARY)
    if dest.size:
        launch("unary_backward", dest.dtype, grid(dest.size), THREADS, int(code), x, y, gout,
               dest, float(beta), dest.dtype.type(p))


def binary(code, a, b, out) -> None:
    """See ``kernels.cpu.binary``."""
    code = checked_code("binary", code, codes.N_BINARY)
    if out.size:
        launch("binary", out.dtype, grid(out.size), THREADS, int(code), a, b, out)


def binary_backward(code, a, b, gout, da, beta_a, need_a, db, beta_b, need_b) -> None:
    """See ``kernels.cpu.binary_backward``."""
    code = checked_code("binary_backward", code, codes.N_BINARY)
    n = (da.size if need_a else 0) + (db.size if need_b else 0)
    if n:
        launch("binary_backward", gout.dtype, grid(n), THREADS, int(code), a, b, gout, da,
               float(beta_a), bool(need_a), db, float(beta_b), bool(need_b))


def sum_to(x, out, scale, beta) -> None:
    """See ``kernels.cpu.sum_to``; a full sum is a block reduction."""
    dt = out.dtype.type
    if out.size == 1 and x.size > 1:
        launch("sum_all", out.dtype, grid(x.size), THREADS, x, out, dt(scale), dt(beta), *sums())
    elif out.size:
        launch("sum_to", out.dtype, grid(out.size), THREADS, x, out, dt(scale), dt(beta))

"""CUDA kernels of issue 17's losses (see ``kernels.cpu.loss_terms``): one
launch each. A reduced pointwise loss adds its terms with ``block_total``; a
reduced nll runs in one block (its sum and count added by a shared-memory
tree), deterministic either way."""
from __future__ import annotations

# the kernels this module registers
__all__ = ["loss_terms", "loss_terms_backward", "nll", "nll_backward"]

from numba import cuda, float64, int32, int64, types

from .. import codes
from ._core import (THREADS, Config, array_type, block_total, checked_code, grid, kernel,
                    launch, sums)

_term = cuda.jit(device=True)(codes.loss_term)
_term_grad = cuda.jit(device=True)(codes.loss_term_grad)
_term_grad_target = cuda.jit(device=True)(codes.loss_term_grad_target)


def _a(dt, ndim=1):
    return array_type(dt, ndim, "A")


@kernel("loss_terms", lambda dt: (int64, _a(dt), _a(dt), _a(dt), dt))
def _loss_terms_source(config: Config, dtype):
    def loss_terms_kernel(code, x, t, out, p):
        i = cuda.grid(1)
        while i < x.size:
            out[i] = _term(code, x[i], t[i], p)
            i += cuda.gridsize(1)
    return loss_terms_kernel


@kernel("loss_terms_sum", lambda dt: (int64, _a(dt), _a(dt), _a(dt), float64, dt,
                                      array_type(float64, 1), array_type(int32, 1)))
def _loss_terms_sum_source(config: Config, dtype):
    threads = config.threads

    def loss_terms_sum_kernel(code, x, t, out, scale, p, partial, counter):
        cache = cuda.shared.array(threads, float64)
        total = 0.0
        i = cuda.grid(1)
        while i < x.size:
            total += _term(code, x[i], t[i], p)
            i += cuda.gridsize(1)
        last, grand = block_total(cache, total, partial, counter)
        if last:
            out[0] = scale * grand
    return loss_terms_sum_kernel


@kernel("loss_terms_backward", lambda dt: (int64, _a(dt), _a(dt), _a(dt), _a(dt), float64, dt,
                                           float64, types.boolean))
def _loss_terms_backward_source(config: Config, dtype):
    def loss_terms_backward_kernel(code, x, t, gout, dest, scale, p, beta, target):
        one = gout.size == 1
        i = cuda.grid(1)
        while i < x.size:
            g = scale * (gout[0] if one else gout[i])
            if target:
                d = g * _term_grad_target(code, x[i], t[i], p)
            else:
                d = g * _term_grad(code, x[i], t[i], p)
            dest[i] = d if beta == 0.0 else d + beta * dest[i]
            i += cuda.gridsize(1)
    return loss_terms_backward_kernel


@kernel("nll", lambda dt: (_a(dt, 2), _a(int64), _a(dt), _a(dt), types.boolean, types.boolean,
                           int64))
def _nll_source(config: Config, dtype):
    threads = config.threads

    def nll_kernel(x, labels, out, count, reduce, mean, ignore):
        n, c = x.shape
        if not reduce:
            i = cuda.grid(1)
            while i < n:
                k = labels[i]
                out[i] = -x[i, k] if k != ignore and k >= 0 and k < c else 0.0
                i += cuda.gridsize(1)
            return
        sums = cuda.shared.array(threads, float64)    # one block
        kept = cuda.shared.array(threads, float64)
        tid = cuda.threadIdx.x
        s = 0.0
        m = 0.0
        i = tid
        while i < n:
            k = labels[i]
            if k != ignore and k >= 0 and k < c:
                s -= x[i, k]
                m += 1.0
            i += cuda.blockDim.x
        sums[tid] = s
        kept[tid] = m
        cuda.syncthreads()
        half = cuda.blockDim.x // 2
        while half > 0:
            if tid < half:
                sums[tid] += sums[tid + half]
                kept[tid] += kept[tid + half]
            cuda.syncthreads()
            half //= 2
        if tid == 0:
            count[0] = kept[0]
            out[0] = sums[0] / kept[0] if mean else sums[0]
    return nll_kernel


@kernel("nll_backward", lambda dt: (_a(int64), _a(dt), _a(dt), _a(dt, 2), types.boolean,
                                    types.boolean, int64, float64))
def _nll_backward_source(config: Config, dtype):
    def nll_backward_kernel(labels, gout, count, dest, reduce, mean, ignore, beta):
        n, c = dest.shape
        q = cuda.grid(1)
        while q < n * c:
            i, j = q // c, q % c
            g = gout[0] if reduce else gout[i]
            if reduce and mean:
                g = g / count[0]
            k = labels[i]
            d = -g if j == k and k != ignore else 0.0
            dest[i, j] = d if beta == 0.0 else d + beta * dest[i, j]
            q += cuda.gridsize(1)
    return nll_backward_kernel


# ------------------------------------------------------------ launchers
def loss_terms(code, x, t, out, reduce, scale, p) -> None:
    """See ``kernels.cpu.loss_terms``."""
    code = checked_code("loss_terms", code, codes.N_LOSS)
    dt = out.dtype.type
    if reduce:
        launch("loss_terms_sum", out.dtype, grid(x.size), THREADS, code, x, t, out, float(scale),
               dt(p), *sums())
    elif x.size:
        launch("loss_terms", out.dtype, grid(x.size), THREADS, code, x, t, out, dt(p))


def loss_terms_backward(code, x, t, gout, dest, scale, p, beta, target) -> None:
    """See ``kernels.cpu.loss_terms_backward``."""
    code = checked_code("loss_terms_backward", code, codes.N_LOSS)
    if x.size:
        launch("loss_terms_backward", dest.dtype, grid(x.size), THREADS, code, x, t, gout, dest,
               float(scale), dest.dtype.type(p), float(beta), bool(target))


def nll(x, labels, out, count, reduce, mean, ignore) -> None:
    """See ``kernels.cpu.nll``; reduced, one block."""
    n = x.shape[0]
    if reduce:
        launch("nll", x.dtype, 1, THREADS, x, labels, out, count, True, bool(mean), int(ignore))
    elif n:
        launch("nll", x.dtype, grid(n), THREADS, x, labels, out, count, False, bool(mean),
               int(ignore))


def nll_backward(labels, gout, count, dest, reduce, mean, ignore, beta) -> None:
    """See ``kernels.cpu.nll_backward``."""
    if dest.size:
        launch("nll_backward", dest.dtype, grid(dest.size), THREADS, labels, gout, count, dest,
               bool(reduce), bool(mean), int(ignore), float(beta))

"""CUDA optimizer kernels: one fused launch over an optimizer's flat buffers.

Per-element scalars enter as the buffers' dtype (float32 kernels compute in
float32); Adam's per-param bias corrections are worked out in float64 and
rounded once, as PyTorch does with its Python scalars.
"""
from __future__ import annotations

__all__ = ["adam_update", "sgd_update", "sumsq"]

import math

import numpy as np
from numba import cuda, float64, int32, int64, uint8

from .. import bodies
from ._core import THREADS, Config, array_type, block_total, grid, kernel, launch, sums

_adam_element = cuda.jit(device=True)(bodies.adam_element)


# The optimizer kernels walk the params (segments) in order, each with its
# own grid-stride loop, so per-param constants are computed once per thread
# and no element needs to search for its segment.
@kernel("sgd_update", lambda dt: (array_type(dt, 1), array_type(dt, 1), array_type(dt, 1),
                                  array_type(int64, 1), array_type(uint8, 1),
                                  dt, dt, dt, dt))
def _sgd_source(config: Config, dtype):
    def sgd_kernel(w, g, v, seg, live, lr, momentum, scale, weight_decay):
        start = cuda.grid(1)
        stride = cuda.gridsize(1)
        for s in range(seg.size - 1):
            if not live[s]:
                continue
            i = seg[s] + start
            while i < seg[s + 1]:
                gi = scale * g[i]
                if weight_decay != 0:
                    gi = gi + weight_decay * w[i]
                if momentum != 0:
                    vi = momentum * v[i] + gi
                    v[i] = vi
                    w[i] = w[i] - lr * vi
                else:
                    w[i] = w[i] - lr * gi
                g[i] = 0
                i += stride

    return sgd_kernel


@kernel("adam_update", lambda dt: (array_type(dt, 1), array_type(dt, 1), array_type(dt, 1),
                                   array_type(dt, 1), array_type(int64, 1),
                                   array_type(uint8, 1), array_type(int64, 1),
                                   array_type(int64, 1), float64, float64, float64,
                                   dt, dt, dt, dt, dt, dt))
def _adam_source(config: Config, dtype):
    def adam_kernel(w, g, m, v, seg, live, steps_in, steps_out, lr, beta1, beta2,
                    one_m_b1, beta2_t, one_m_b2, eps, scale, decay):
        start = cuda.grid(1)
        stride = cuda.gridsize(1)
        for s in range(seg.size - 1):
            t = steps_in[s] + (1 if live[s] else 0)
            if start == 0:
                steps_out[s] = t
            if not live[s]:
                continue
            step_size = dtype(lr / (1.0 - beta1 ** t))
            bc2_sqrt = dtype(math.sqrt(1.0 - beta2 ** t))
            i = seg[s] + start
            while i < seg[s + 1]:
                w[i], m[i], v[i] = _adam_element(w[i], g[i], m[i], v[i], step_size, bc2_sqrt,
                                                 one_m_b1, beta2_t, one_m_b2, eps, scale, decay)
                g[i] = 0
                i += stride

    return adam_kernel


@kernel("sumsq", lambda dt: (array_type(dt, 1), array_type(float64, 1),
                             array_type(float64, 1), array_type(int32, 1)))
def _sumsq_source(config: Config, dtype):
    threads = config.threads

    def sumsq_kernel(x, out, partial, counter):
        # Grid-stride sums in float64, then one block reduction.
        cache = cuda.shared.array(threads, float64)
        total = 0.0
        i = cuda.grid(1)
        stride = cuda.gridsize(1)
        while i < x.size:
            xi = float64(x[i])
            total += xi * xi
            i += stride
        last, grand = block_total(cache, total, partial, counter)
        if last:
            out[0] = grand

    return sumsq_kernel


# ------------------------------------------------------------ launchers
def sgd_update(w, g, v, seg, live, lr, momentum, scale, weight_decay=0.0) -> None:
    """Fused SGD over flat buffers; see ``kernels.cpu.sgd_update``."""
    if w.size:
        dt = np.dtype(w.dtype).type
        launch("sgd_update", w.dtype, grid(w.size), THREADS,
               w, g, v, seg, live, dt(lr), dt(momentum), dt(scale), dt(weight_decay))


def adam_update(w, g, m, v, seg, live, steps_in, steps_out,
                lr, beta1, beta2, eps, scale, weight_decay=0.0) -> None:
    """Fused Adam/AdamW over flat buffers; see ``kernels.cpu.adam_update``."""
    dt = np.dtype(w.dtype).type
    launch("adam_update", w.dtype, grid(w.size), THREADS,
           w, g, m, v, seg, live, steps_in, steps_out, float(lr), float(beta1), float(beta2),
           dt(1.0 - beta1), dt(beta2), dt(1.0 - beta2), dt(eps), dt(scale),
           dt(1.0 - lr * weight_decay))


def sumsq(x, out) -> None:
    """``out[0] = sum(x**2)`` in float64; see ``kernels.cpu.sumsq``."""
    launch("sumsq", x.dtype, grid(x.size), THREADS, x, out, *sums())

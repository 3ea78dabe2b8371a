"""CUDA optimizer kernels: one fused launch over an optimizer's flat buffers."""
from __future__ import annotations

__all__ = ["sgd_update", "adam_update"]

import math

from numba import cuda, float64, int64, uint8

from ._core import THREADS, Config, array_type, grid, kernel, launch


# The optimizer kernels walk the params (segments) in order, each with its
# own grid-stride loop, so per-param constants are computed once per thread
# and no element needs to search for its segment.
@kernel("sgd_update", lambda dt: (array_type(dt, 1), array_type(dt, 1), array_type(dt, 1),
                                  array_type(int64, 1), array_type(uint8, 1),
                                  float64, float64, float64))
def _sgd_source(config: Config, dtype):
    def sgd_kernel(w, g, v, seg, live, lr, momentum, scale):
        start = cuda.grid(1)
        stride = cuda.gridsize(1)
        for s in range(seg.size - 1):
            if not live[s]:
                continue
            i = seg[s] + start
            while i < seg[s + 1]:
                gi = scale * g[i]
                if momentum != 0.0:
                    v[i] = momentum * v[i] + gi
                    w[i] = w[i] - lr * v[i]
                else:
                    w[i] = w[i] - lr * gi
                g[i] = 0.0
                i += stride

    return sgd_kernel


@kernel("adam_update", lambda dt: (array_type(dt, 1), array_type(dt, 1), array_type(dt, 1),
                                   array_type(dt, 1), array_type(int64, 1),
                                   array_type(uint8, 1), array_type(int64, 1),
                                   array_type(int64, 1), float64, float64, float64,
                                   float64, float64))
def _adam_source(config: Config, dtype):
    def adam_kernel(w, g, m, v, seg, live, steps_in, steps_out,
                    lr, beta1, beta2, eps, scale):
        start = cuda.grid(1)
        stride = cuda.gridsize(1)
        for s in range(seg.size - 1):
            t = steps_in[s] + (1 if live[s] else 0)
            if start == 0:
                steps_out[s] = t
            if not live[s]:
                continue
            step_size = lr / (1.0 - beta1 ** t)
            bc2_sqrt = math.sqrt(1.0 - beta2 ** t)
            i = seg[s] + start
            while i < seg[s + 1]:
                gi = scale * g[i]
                m[i] = m[i] + (1.0 - beta1) * (gi - m[i])
                v[i] = v[i] * beta2 + (1.0 - beta2) * gi * gi
                w[i] = w[i] - step_size * (m[i] / (math.sqrt(v[i]) / bc2_sqrt + eps))
                g[i] = 0.0
                i += stride

    return adam_kernel


# ------------------------------------------------------------ launchers
def sgd_update(w, g, v, seg, live, lr, momentum, scale) -> None:
    """Fused SGD over flat buffers; see ``kernels.cpu.sgd_update``."""
    if w.size:
        launch("sgd_update", w.dtype, grid(w.size), THREADS,
               w, g, v, seg, live, float(lr), float(momentum), float(scale))


def adam_update(w, g, m, v, seg, live, steps_in, steps_out,
                lr, beta1, beta2, eps, scale) -> None:
    """Fused Adam over flat buffers; see ``kernels.cpu.adam_update``."""
    launch("adam_update", w.dtype, grid(w.size), THREADS,
           w, g, m, v, seg, live, steps_in, steps_out,
           float(lr), float(beta1), float(beta2), float(eps), float(scale))

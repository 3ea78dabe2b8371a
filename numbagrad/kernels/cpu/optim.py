"""CPU optimizer kernels: one fused pass over an optimizer's flat buffers.

Each kernel has a serial and a multi-threaded (``prange``) variant with the
same arithmetic, so both give the same bits. Below the CPU kernels' one
threshold, ``kernels.cpu.MT_MIN`` (``NUMBAGRAD_PARALLEL_MIN``, see
``_threads``), the serial one always runs (waking the threads costs more
than it saves). Above it ``_Dispatch`` runs whichever variant was faster
when last timed: threads only help while cores are free.

Hyper-parameters arrive as Python floats and are rounded once to the
buffers' dtype before the element loop, so float32 buffers are updated in
float32 arithmetic throughout. Adam's per-param bias corrections are worked
out in float64 and then rounded, as PyTorch does with its Python scalars.
"""
from __future__ import annotations

__all__ = ["adam_update", "sgd_update", "sumsq"]

import math
import time

import numba
import numpy as np
from numba import njit, prange

# The package, partly initialised while it imports this module: _threaded
# reads its MT_MIN at call time, the threshold the op layer reads too.
from .. import cpu as _package
from .. import bodies
# CHUNK: elements per parallel task; also the unit of sumsq's fixed order.
# (boundary.py imports _cast_like from here.)
from ._threads import ALLOWED, CHUNK, _cast_like

# Measured on the project's 2-core machine with scripts/time_threads.py
# --optim (2 threads): the threaded Adam and SGD win from 2**15 elements
# (two chunks) in both dtypes, sumsq from 2**16; at 2**14 and below every
# threaded variant loses (by 10-300% on a quiet machine). 2**16, the op
# kernels' threshold too, is where all of them win.
RETRY = 50   # calls between re-timings of the variant not in use


def _threaded(n: int) -> bool:
    """Whether an ``n``-element update may run threaded (then timed): never
    while the thread governor has the threads off (busy cores), where the
    re-timing of the threaded variant every ``RETRY`` calls would cost one
    update run many times slower."""
    return ALLOWED[0] != 0 and n >= _package.MT_MIN and numba.get_num_threads() > 1


class _Dispatch:
    """Runs the serial or the threaded variant of one kernel.

    Below the threshold (or with one thread) always the serial one. Above
    it, each variant is timed on its second call (the first may compile) and
    then the one with the lower time per element runs, the other being
    re-timed every ``RETRY`` calls. On a machine whose cores other processes
    keep busy a threaded call waits for a core: measured here under load,
    15x slower than the serial one, which this falls back to.
    """

    def __init__(self, serial, threaded) -> None:
        self.variants = (serial, threaded)
        self.cost: list[float | None] = [None, None]   # seconds per element, last timed
        self.seen = [0, 0]
        self.calls = 0
        self.clock = time.perf_counter

    def __call__(self, n: int, *args) -> None:
        if not _threaded(n):
            self.variants[0](*args)
            return
        untimed = [i for i in (1, 0) if self.cost[i] is None]
        if untimed:
            which = untimed[0]
        else:
            self.calls += 1
            best = 0 if self.cost[0] <= self.cost[1] else 1
            which = 1 - best if self.calls % RETRY == 0 else best
        start = self.clock()
        self.variants[which](*args)
        seconds = self.clock() - start
        self.seen[which] += 1
        if self.seen[which] > 1:
            self.cost[which] = seconds / n


# ----------------------------------------------------------------- SGD
# The spans index from 0 over one param's slices (rather than from seg[s])
# so that LLVM can prove the indices non-negative and vectorize the loop.
@njit(cache=True, error_model="numpy")
def _sgd_span(ws, gs, vs, lr, momentum, scale, weight_decay):
    if momentum != 0:
        if weight_decay != 0:
            for i in range(ws.size):
                vi = momentum * vs[i] + (scale * gs[i] + weight_decay * ws[i])
                vs[i] = vi
                ws[i] = ws[i] - lr * vi
                gs[i] = 0.0
        else:
            for i in range(ws.size):
                vi = momentum * vs[i] + scale * gs[i]
                vs[i] = vi
                ws[i] = ws[i] - lr * vi
                gs[i] = 0.0
    elif weight_decay != 0:
        for i in range(ws.size):
            ws[i] = ws[i] - lr * (scale * gs[i] + weight_decay * ws[i])
            gs[i] = 0.0
    else:
        for i in range(ws.size):
            ws[i] = ws[i] - lr * (scale * gs[i])
            gs[i] = 0.0


@njit(cache=True, error_model="numpy")
def _sgd_serial(w, g, v, seg, live, lr, momentum, scale, weight_decay):
    for s in range(seg.size - 1):
        if live[s]:
            lo, hi = seg[s], seg[s + 1]
            _sgd_span(w[lo:hi], g[lo:hi], v[lo:hi], lr, momentum, scale, weight_decay)


@njit(cache=True, error_model="numpy", parallel=True)
def _sgd_parallel(w, g, v, seg, live, lr, momentum, scale, weight_decay):
    nseg = seg.size - 1
    n = seg[nseg]
    for c in prange((n + CHUNK - 1) // CHUNK):
        lo = c * CHUNK
        hi = min(lo + CHUNK, n)
        s = np.searchsorted(seg, lo, side="right") - 1
        while s < nseg and seg[s] < hi:
            a, b = max(lo, seg[s]), min(hi, seg[s + 1])
            if live[s] and a < b:
                _sgd_span(w[a:b], g[a:b], v[a:b], lr, momentum, scale, weight_decay)
            s += 1


def sgd_update(w, g, v, seg, live, lr, momentum, scale, weight_decay=0.0) -> None:
    """Fused SGD over an optimizer's flat buffers, as ``torch.optim.SGD``.

    Segment s (``seg[s]:seg[s+1]``) is one param; it is skipped unless
    ``live[s]``. The gradient is ``scale * g`` (scale folds in the window's
    averaging and any clipping) plus ``weight_decay * w`` (coupled, as
    PyTorch's), and ``g`` is zeroed in the same pass, ready for the next
    window. ``v`` (the momentum buffer) is unused when momentum == 0.
    """
    dt = w.dtype.type
    _sgd(w.size, w, g, v, seg, live, dt(lr), dt(momentum), dt(scale), dt(weight_decay))


# ---------------------------------------------------------------- Adam
_adam_element = njit(error_model="numpy", inline="always")(bodies.adam_element)


@njit(cache=True, error_model="numpy")
def _adam_span(ws, gs, ms, vs, step_size, bc2_sqrt, one_m_b1, beta2, one_m_b2, eps, scale,
               decay):
    for i in range(ws.size):
        ws[i], ms[i], vs[i] = _adam_element(ws[i], gs[i], ms[i], vs[i], step_size, bc2_sqrt,
                                            one_m_b1, beta2, one_m_b2, eps, scale, decay)
        gs[i] = 0.0


@njit(cache=True, error_model="numpy")
def _adam_segment(w, g, m, v, lo, hi, t, lr, beta1, beta2, one_m_b1, beta2_t, one_m_b2,
                  eps, scale, decay):
    step_size = _cast_like(w, lr / (1.0 - beta1 ** t))
    bc2_sqrt = _cast_like(w, math.sqrt(1.0 - beta2 ** t))
    _adam_span(w[lo:hi], g[lo:hi], m[lo:hi], v[lo:hi], step_size, bc2_sqrt, one_m_b1,
               beta2_t, one_m_b2, eps, scale, decay)


@njit(cache=True, error_model="numpy")
def _adam_serial(w, g, m, v, seg, live, steps_in, steps_out, lr, beta1, beta2,
                 one_m_b1, beta2_t, one_m_b2, eps, scale, decay):
    for s in range(seg.size - 1):
        if not live[s]:
            steps_out[s] = steps_in[s]
            continue
        t = steps_in[s] + 1
        steps_out[s] = t
        _adam_segment(w, g, m, v, seg[s], seg[s + 1], t, lr, beta1, beta2, one_m_b1, beta2_t,
                      one_m_b2, eps, scale, decay)


@njit(cache=True, error_model="numpy", parallel=True)
def _adam_parallel(w, g, m, v, seg, live, steps_in, steps_out, lr, beta1, beta2,
                   one_m_b1, beta2_t, one_m_b2, eps, scale, decay):
    nseg = seg.size - 1
    n = seg[nseg]
    for c in prange((n + CHUNK - 1) // CHUNK):
        lo = c * CHUNK
        hi = min(lo + CHUNK, n)
        s = np.searchsorted(seg, lo, side="right") - 1
        while s < nseg and seg[s] < hi:
            a, b = max(lo, seg[s]), min(hi, seg[s + 1])
            if live[s] and a < b:
                _adam_segment(w, g, m, v, a, b, steps_in[s] + 1, lr, beta1, beta2, one_m_b1,
                              beta2_t, one_m_b2, eps, scale, decay)
            s += 1
    for s in range(nseg):
        steps_out[s] = steps_in[s] + 1 if live[s] else steps_in[s]


def adam_update(w, g, m, v, seg, live, steps_in, steps_out,
                lr, beta1, beta2, eps, scale, weight_decay=0.0) -> None:
    """Fused Adam/AdamW over an optimizer's flat buffers, as ``torch.optim.AdamW``.

    Each segment keeps its own step count (read from ``steps_in``, written
    to ``steps_out``) so a param skipped in a window keeps its bias
    correction, exactly as PyTorch's per-param ``step``. ``weight_decay`` is
    decoupled (``w *= 1 - lr * weight_decay`` first); 0 gives plain Adam.
    ``g`` is zeroed.
    """
    dt = w.dtype.type
    _adam(w.size, w, g, m, v, seg, live, steps_in, steps_out, float(lr), float(beta1),
          float(beta2), dt(1.0 - beta1), dt(beta2), dt(1.0 - beta2), dt(eps), dt(scale),
          dt(1.0 - lr * weight_decay))


# -------------------------------------------------------------- sumsq
# reassoc lets LLVM vectorize the sum; it still keeps NaN and infinity
# (no "nnan"/"ninf"), and one compiled chunk loop serves both variants.
@njit(cache=True, error_model="numpy", fastmath={"reassoc"})
def _sumsq_chunk(x, lo, hi):
    xs = x[lo:hi]
    total = 0.0
    for i in range(xs.size):
        a = np.float64(xs[i])   # (numba types float(float32) as float32)
        total += a * a
    return total


@njit(cache=True, error_model="numpy")
def _sumsq_serial(x, out):
    n = x.size
    total = 0.0
    for c in range((n + CHUNK - 1) // CHUNK):
        total += _sumsq_chunk(x, c * CHUNK, min(c * CHUNK + CHUNK, n))
    out[0] = total


@njit(cache=True, error_model="numpy", parallel=True)
def _sumsq_parallel(x, out):
    n = x.size
    chunks = (n + CHUNK - 1) // CHUNK
    partial = np.empty(chunks)
    for c in prange(chunks):
        partial[c] = _sumsq_chunk(x, c * CHUNK, min(c * CHUNK + CHUNK, n))
    total = 0.0
    for c in range(chunks):
        total += partial[c]
    out[0] = total


def sumsq(x, out) -> None:
    """``out[0] = sum(x**2)`` over a flat buffer, accumulated in float64.

    The optimizers' one extra pass at a window boundary: the gradient norm
    for clipping, and non-finite if (and only if, short of an overflow
    past 1e154) some element is NaN or infinite. ``out`` is a float64 array
    of one element. The summation order is fixed (chunk by chunk), so both
    variants give the same bits.
    """
    _sumsq(x.size, x, out)


_sgd = _Dispatch(_sgd_serial, _sgd_parallel)
_adam = _Dispatch(_adam_serial, _adam_parallel)
_sumsq = _Dispatch(_sumsq_serial, _sumsq_parallel)


"""A window boundary as one @njit call, for the steps ``ng.compile`` generates.

``Window.close`` (Python) checks the window's total, clips it and hands it
to the update rule. These kernels do the same in compiled code, so a
compiled micro-step can include its optimizer update: the same kernels
(``_sumsq_serial``, ``_adam_serial``, ``_sgd_serial``) on the same
arguments, and the norm, clip and scalar roundings in the same float64
operations, hence the same bits. CPU only (on CUDA ``ng.compile`` replays
from Python and calls ``opt.step()``); used below the optimizer kernels'
threading threshold, where the Python around an update costs more than
the update itself.

``ctl`` is a float64 array the caller fills before the call and reads
after it (indices below); the kernel runs when ``ctl[CLOSING]`` is 1 and
sets it back to 0. When the total is non-finite and the window
checks for that, nothing is changed and ``ctl[STATUS]`` stays 0: the
caller then runs ``opt.step()``, which finds the culprits and raises or
skips exactly as in eager mode.
"""
from __future__ import annotations

import math

from numba import njit

from .optim import _adam_serial, _cast_like, _sgd_serial, _sumsq_serial

# ctl indices: set by the caller (CLIP_EPS: what clipping adds to the norm) ...
CLOSING, LR, SCALE, MAX_NORM, CLIP_EPS, CHECK, PARITY, H0, H1, H2, H3 = range(11)
# ... and written here
NORM, STATUS = 11, 12
SIZE = 13


@njit(cache=True, error_model="numpy")
def _scale(g_body, sq, ctl):
    """The window's scale after clipping, or -1.0 if the update must not run here."""
    ctl[CLOSING] = 0.0
    scale = ctl[SCALE]
    max_norm = ctl[MAX_NORM]
    ctl[NORM] = math.nan
    ctl[STATUS] = 0.0
    if max_norm < 0 and ctl[CHECK] == 0:
        return scale
    _sumsq_serial(g_body, sq)
    total = sq[0]
    norm = scale * math.sqrt(total) if total >= 0 else math.nan
    ctl[NORM] = norm
    if not math.isfinite(norm) and ctl[CHECK] != 0:
        return -1.0
    if max_norm >= 0:
        coef = max_norm / (norm + ctl[CLIP_EPS])
        if not coef >= 1.0:
            scale *= coef
    return scale


@njit(cache=True, error_model="numpy")
def adam_close(w, g, g_body, m, v, seg, live, steps_a, steps_b, sq, ctl):
    """Adam/AdamW at a window boundary (``adam_update``'s arguments, from ``ctl``):
    H0..H3 are beta1, beta2, eps, weight_decay; PARITY 1 swaps the step counts."""
    scale = _scale(g_body, sq, ctl)
    if scale < 0:
        return
    lr, beta1, beta2, eps, wd = ctl[LR], ctl[H0], ctl[H1], ctl[H2], ctl[H3]
    s_in, s_out = (steps_a, steps_b) if ctl[PARITY] == 0 else (steps_b, steps_a)
    _adam_serial(w, g, m, v, seg, live, s_in, s_out, lr, beta1, beta2,
                 _cast_like(w, 1.0 - beta1), _cast_like(w, beta2), _cast_like(w, 1.0 - beta2),
                 _cast_like(w, eps), _cast_like(w, scale), _cast_like(w, 1.0 - lr * wd))
    ctl[STATUS] = 1.0


@njit(cache=True, error_model="numpy")
def sgd_close(w, g, g_body, v, seg, live, sq, ctl):
    """SGD at a window boundary (``sgd_update``'s arguments, from ``ctl``): H0 is
    the momentum, H1 the weight decay; ``v`` is ``g`` itself without momentum."""
    scale = _scale(g_body, sq, ctl)
    if scale < 0:
        return
    _sgd_serial(w, g, v, seg, live, _cast_like(w, ctl[LR]), _cast_like(w, ctl[H0]),
                _cast_like(w, scale), _cast_like(w, ctl[H1]))
    ctl[STATUS] = 1.0

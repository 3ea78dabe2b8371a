"""A window boundary as one @njit call, and the scalar rule every boundary follows.

``clip_scale`` decides a window's scale, norm and whether it may be
applied, for ``Window.close`` (Python calls it directly) and for the
boundary kernels here alike: one function, hence the same bits. The
kernels (``adam_close``, ``sgd_close``) close a window in one call, with
the same element kernels (``_sumsq_serial``, ``_adam_serial``,
``_sgd_serial``) on the same arguments as the Python loop; ``Window.close``
runs them for one CPU group below the optimizer kernels' threading
threshold (where the Python around an update costs more than the update
itself), and ``ng.compile`` calls them inside its compiled step.

``ctl`` is a float64 array the caller fills before the call and reads
after it (indices below); the kernel runs when ``ctl[CLOSING]`` is 1 and
sets it back to 0. When the total is non-finite and the window
checks for that, nothing is changed and ``ctl[STATUS]`` stays 0: the
caller then takes ``Window.close``'s Python path, which finds the
culprits and raises or skips.
"""
from __future__ import annotations

import math

from numba import njit

from .optim import _adam_serial, _cast_like, _sgd_serial, _sumsq_serial

# added to the norm before dividing, as torch.nn.utils.clip_grad_norm_
CLIP_EPS = 1e-6

# ctl indices: set by the caller (PARITY and after: the rule's) ...
CLOSING, LR, SCALE, MAX_NORM, CHECK, PARITY, H0, H1, H2, H3 = range(10)
# ... and written here
NORM, STATUS = 10, 11
SIZE = 12


@njit(cache=True, error_model="numpy")
def clip_scale(scale, total, max_norm, check):
    """(scale after clipping, pre-clip norm, ok) of a window whose total, times
    ``scale``, has sum of squares ``total``. ``max_norm < 0``: no clipping;
    ``ok`` is False when ``check`` is set and the norm is not finite. With
    neither, the norm is not needed (``total`` is not read): -1.0."""
    if max_norm < 0 and not check:
        return scale, -1.0, True
    norm = scale * math.sqrt(total) if total >= 0 else math.nan
    ok = math.isfinite(norm) or not check
    if max_norm >= 0:
        coef = max_norm / (norm + CLIP_EPS)
        if not coef >= 1.0:   # NaN too, as torch: a NaN norm makes NaN grads
            scale *= coef
    return scale, norm, ok


@njit(cache=True, error_model="numpy")
def _scale(g_body, sq, ctl):
    """``clip_scale`` from ``ctl`` (summing ``g_body`` only when it is needed): the
    scale, or -1.0 if the update must not run here."""
    ctl[CLOSING] = 0.0
    ctl[STATUS] = 0.0
    max_norm, check = ctl[MAX_NORM], ctl[CHECK] != 0
    total = 0.0
    if max_norm >= 0 or check:
        _sumsq_serial(g_body, sq)
        total = sq[0]
    scale, norm, ok = clip_scale(ctl[SCALE], total, max_norm, check)
    ctl[NORM] = norm
    return scale if ok else -1.0


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

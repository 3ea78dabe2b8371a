"""CPU kernels of issue 17's losses: per-element terms (``codes.loss_term``:
L1, smooth L1, Huber, binary cross-entropy) with a parameter, and the
negative log-likelihood of integer targets; each either per element (the
"none" reduction) or summed in float64 and scaled, and its backward."""
from __future__ import annotations

# the kernels this module registers
__all__ = ["loss_terms", "loss_terms_backward", "nll", "nll_backward"]

from numba import njit

from .. import codes

_term = njit(codes.loss_term)
_term_grad = njit(codes.loss_term_grad)
_term_grad_target = njit(codes.loss_term_grad_target)


@njit(cache=True, error_model="numpy")
def loss_terms(code, x, t, out, reduce, scale, p):
    """Flat x, t: out[i] = term(x[i], t[i]), or (``reduce``) out[0] = scale *
    their sum, added in order."""
    if reduce:
        total = 0.0
        for i in range(x.size):
            total += _term(code, x[i], t[i], p)
        out[0] = scale * total
    else:
        for i in range(x.size):
            out[i] = _term(code, x[i], t[i], p)


@njit(cache=True, error_model="numpy")
def loss_terms_backward(code, x, t, gout, dest, scale, p, beta, target):
    """dest = scale * g * term'(x, t) + beta * dest, g = gout[i] (or gout[0]
    for a one-element gout: a reduced loss's gradient); the derivative is
    d/dx, or d/dt when ``target``."""
    one = gout.size == 1
    for i in range(x.size):
        g = scale * (gout[0] if one else gout[i])
        if target:
            d = g * _term_grad_target(code, x[i], t[i], p)
        else:
            d = g * _term_grad(code, x[i], t[i], p)
        dest[i] = d if beta == 0 else d + beta * dest[i]


@njit(cache=True, error_model="numpy")
def nll(x, labels, out, count, reduce, mean, ignore):
    """x (N, C), labels (N,): out[i] = -x[i, labels[i]] (0 where the label is
    ``ignore``), or (``reduce``) out[0] = their sum, divided by the count of
    labels not ignored when ``mean``; count[0] = that count."""
    n, c = x.shape
    total = 0.0
    kept = 0
    for i in range(n):
        k = labels[i]
        v = 0.0
        if k != ignore and 0 <= k < c:
            v = -x[i, k]
            kept += 1
        if reduce:
            total += v
        else:
            out[i] = v
    count[0] = kept
    if reduce:
        out[0] = total / kept if mean else total


@njit(cache=True, error_model="numpy")
def nll_backward(labels, gout, count, dest, reduce, mean, ignore, beta):
    """dest[i, labels[i]] = -g (g = gout[i], or gout[0] / count[0] for a mean),
    0 elsewhere and where the label is ``ignore``; + beta * dest."""
    n, c = dest.shape
    for i in range(n):
        g = gout[0] if reduce else gout[i]
        if reduce and mean:
            g = g / count[0]
        k = labels[i]
        for j in range(c):
            d = -g if j == k and k != ignore else 0.0
            dest[i, j] = d if beta == 0 else d + beta * dest[i, j]

"""CPU loss kernels: each computes the loss and its input gradient in one pass."""
from __future__ import annotations

import math

from numba import njit

from .. import scalar

_term = njit(scalar.pointwise_loss)
_term_grad = njit(scalar.pointwise_loss_grad)


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
def pointwise_loss(code, pred, target, loss_out, grad_out, scale):
    """loss_out[()] = scale * sum(term(pred, target)); grad_out = scale *
    d term / d pred. ``code`` is a loss code of ``kernels.scalar`` (``BCE_LOGITS``)."""
    p = pred.ravel()
    t = target.ravel()
    g = grad_out.ravel()
    total = 0.0
    for i in range(p.size):
        total += _term(code, p[i], t[i])
        g[i] = scale * _term_grad(code, p[i], t[i])
    loss_out[()] = total * scale


@njit(cache=True, error_model="numpy")
def cross_entropy(logits, labels, loss_out, grad_out, scale):
    """Softmax cross-entropy of (n, C) logits against class indices, stable:
    loss_out[()] = scale * sum_i (logsumexp(x_i) - x_i[label_i]) and
    grad_out = scale * (softmax(x) - onehot(label)). Labels were checked."""
    n, classes = logits.shape
    total = 0.0
    for i in range(n):
        row = logits[i]
        peak = row[0]
        for c in range(1, classes):
            if row[c] > peak:
                peak = row[c]
        acc = 0.0
        for c in range(classes):
            e = math.exp(row[c] - peak)
            grad_out[i, c] = e
            acc += e
        label = labels[i]
        total += peak + math.log(acc) - row[label]
        inv = scale / acc
        for c in range(classes):
            grad_out[i, c] *= inv
        grad_out[i, label] -= scale
    loss_out[()] = total * scale


@njit(cache=True)
def first_bad_label(labels, classes):
    """Index of the first label outside [0, classes), or -1 (a host check)."""
    for i in range(labels.size):
        if labels[i] < 0 or labels[i] >= classes:
            return i
    return -1

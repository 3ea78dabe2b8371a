"""CPU loss kernels: each computes the loss and its input gradient in one pass.

The loss is a float64 sum taken span by span: ``SPAN`` elements (for
cross-entropy, whole rows of about that many elements) into a partial sum,
then the partials in order. The ``_mt`` twins (``parallel=True``) compute
the spans on threads and add the partials in the same order, so both give
the same bits whatever the thread count. The reduction's scale is rounded
to the arrays' dtype for the per-element gradient, so float32 stays float32.
"""
from __future__ import annotations

# the kernels this module registers
__all__ = ["cross_entropy", "cross_entropy3", "mse", "pointwise_loss"]

import math

import numpy as np
from numba import njit, prange

from .. import codes
from ._threads import SPAN, _cast_like

_term = njit(codes.pointwise_loss)
_term_grad = njit(codes.pointwise_loss_grad)


@njit(inline="always")
def _spans(n):
    return (n + SPAN - 1) // SPAN


# ------------------------------------------------------------------ MSE
# reassoc lets LLVM vectorize the sum (lanes of partial sums): ~3x faster.
# The sum's loop only reads: a loop that also wrote the residual got a
# runtime alias check, whose scalar fallback (taken when the residual starts
# just after pred, as in ng.compile's arena) adds in another order.
@njit(cache=True, error_model="numpy", fastmath={"reassoc"})
def _sq_diff_sum(ps, ts):
    total = 0.0
    for i in range(ps.size):
        d = ps[i] - ts[i]
        total += d * d
    return total


@njit(cache=True, error_model="numpy")
def _mse_span(p, t, r, c, lo, hi):
    ps, ts, rs = p[lo:hi], t[lo:hi], r[lo:hi]
    for i in range(ps.size):
        rs[i] = c * (ps[i] - ts[i])
    return _sq_diff_sum(ps, ts)


@njit(cache=True, error_model="numpy")
def mse(pred, target, loss_out, resid_out, scale):
    """One pass: loss_out[()] = scale * sum((pred - target)**2) and
    resid_out = 2 * scale * (pred - target), the loss's gradient w.r.t. pred.
    """
    p, t, r = pred.ravel(), target.ravel(), resid_out.ravel()
    c = _cast_like(resid_out, 2.0 * scale)
    n = p.size
    total = 0.0
    for s in range(_spans(n)):
        total += _mse_span(p, t, r, c, s * SPAN, min(s * SPAN + SPAN, n))
    loss_out[()] = total * scale


@njit(cache=True, error_model="numpy", parallel=True)
def mse_mt(pred, target, loss_out, resid_out, scale):
    """``mse`` on threads, a span per task, the same bits."""
    p, t, r = pred.ravel(), target.ravel(), resid_out.ravel()
    c = _cast_like(resid_out, 2.0 * scale)
    n = p.size
    spans = _spans(n)
    partial = np.empty(spans)
    for s in prange(spans):
        partial[s] = _mse_span(p, t, r, c, s * SPAN, min(s * SPAN + SPAN, n))
    total = 0.0
    for s in range(spans):
        total += partial[s]
    loss_out[()] = total * scale


# ------------------------------------------------------- pointwise losses
@njit(cache=True, error_model="numpy")
def _pointwise_span(code, p, t, g, s, lo, hi):
    total = 0.0
    for i in range(lo, hi):
        total += _term(code, p[i], t[i])
        g[i] = s * _term_grad(code, p[i], t[i])
    return total


@njit(cache=True, error_model="numpy")
def pointwise_loss(code, pred, target, loss_out, grad_out, scale):
    """loss_out[()] = scale * sum(term(pred, target)); grad_out = scale *
    d term / d pred. ``code`` is a loss code of ``kernels.codes`` (``BCE_LOGITS``)."""
    p, t, g = pred.ravel(), target.ravel(), grad_out.ravel()
    s = _cast_like(grad_out, scale)
    n = p.size
    total = 0.0
    for k in range(_spans(n)):
        total += _pointwise_span(code, p, t, g, s, k * SPAN, min(k * SPAN + SPAN, n))
    loss_out[()] = total * scale


@njit(cache=True, error_model="numpy", parallel=True)
def pointwise_loss_mt(code, pred, target, loss_out, grad_out, scale):
    """``pointwise_loss`` on threads, a span per task, the same bits."""
    p, t, g = pred.ravel(), target.ravel(), grad_out.ravel()
    s = _cast_like(grad_out, scale)
    n = p.size
    spans = _spans(n)
    partial = np.empty(spans)
    for k in prange(spans):
        partial[k] = _pointwise_span(code, p, t, g, s, k * SPAN, min(k * SPAN + SPAN, n))
    total = 0.0
    for k in range(spans):
        total += partial[k]
    loss_out[()] = total * scale


# ---------------------------------------------------------- cross-entropy
@njit(cache=True, error_model="numpy")
def _cross_entropy_rows(logits, labels, grad_out, scale, r0, r1):
    """Rows r0..r1-1: their gradient, and the float64 sum of their losses."""
    classes = logits.shape[1]
    s = _cast_like(grad_out, scale)
    total = 0.0
    for i in range(r0, r1):
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
        inv = _cast_like(grad_out, scale / acc)
        for c in range(classes):
            grad_out[i, c] *= inv
        grad_out[i, label] -= s
    return total


@njit(error_model="numpy", inline="always")
def _row_spans(n, classes):
    """(rows per span, spans): whole rows, about SPAN elements a span."""
    rows = max(1, SPAN // max(classes, 1))
    return rows, (n + rows - 1) // rows


@njit(cache=True, error_model="numpy")
def cross_entropy(logits, labels, loss_out, grad_out, scale):
    """Softmax cross-entropy of (n, C) logits against class indices, stable:
    loss_out[()] = scale * sum_i (logsumexp(x_i) - x_i[label_i]) and
    grad_out = scale * (softmax(x) - onehot(label)). Labels were checked."""
    n, classes = logits.shape
    rows, spans = _row_spans(n, classes)
    total = 0.0
    for k in range(spans):
        total += _cross_entropy_rows(logits, labels, grad_out, scale, k * rows,
                                     min(k * rows + rows, n))
    loss_out[()] = total * scale


@njit(cache=True, error_model="numpy", parallel=True)
def cross_entropy_mt(logits, labels, loss_out, grad_out, scale):
    """``cross_entropy`` on threads, a span of rows per task, the same bits."""
    n, classes = logits.shape
    rows, spans = _row_spans(n, classes)
    partial = np.empty(spans)
    for k in prange(spans):
        partial[k] = _cross_entropy_rows(logits, labels, grad_out, scale, k * rows,
                                         min(k * rows + rows, n))
    total = 0.0
    for k in range(spans):
        total += partial[k]
    loss_out[()] = total * scale


@njit(cache=True)
def first_bad_label(labels, classes):
    """Index of the first label outside [0, classes), or -1 (a host check)."""
    for i in range(labels.size):
        if labels[i] < 0 or labels[i] >= classes:
            return i
    return -1


def label_message(op: str, labels: np.ndarray, bad: int, classes: int, logits: tuple) -> str:
    """The wording of host ``labels``' flat element ``bad`` lying outside
    [0, classes), for logits of shape ``logits`` (the host check and the CUDA
    kernels' error flag alike)."""
    where = ", ".join(str(int(i)) for i in np.unravel_index(bad, labels.shape))
    return (f"{op}: target[{where}] is class {labels.reshape(-1)[bad]}, outside "
            f"[0, {classes}) for logits of shape {logits}")


@njit(cache=True, error_model="numpy")
def cross_entropy3(logits, labels, loss_out, grad_out, scale):
    """``cross_entropy`` for logits (n, C, P) read in place (class stride P:
    PyTorch's (N, C, d1, ...) with the positions merged) against labels
    (n * P,) in (sample, position) order; ``grad_out`` (n, C, P) C-contiguous.
    The loss adds the rows' terms in that order, in float64."""
    n, classes, positions = logits.shape
    s = _cast_like(grad_out, scale)
    total = 0.0
    for i in range(n):
        x, g = logits[i], grad_out[i]
        for q in range(positions):
            peak = x[0, q]
            for c in range(1, classes):
                if x[c, q] > peak:
                    peak = x[c, q]
            acc = 0.0
            for c in range(classes):
                e = math.exp(x[c, q] - peak)
                g[c, q] = e
                acc += e
            label = labels[i * positions + q]
            total += peak + math.log(acc) - x[label, q]
            inv = _cast_like(grad_out, scale / acc)
            for c in range(classes):
                g[c, q] *= inv
            g[label, q] -= s
    loss_out[()] = total * scale

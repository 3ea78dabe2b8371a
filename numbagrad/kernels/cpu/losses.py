"""CPU loss kernels: each computes the loss and its input gradient in one pass."""
from __future__ import annotations

from numba import njit


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

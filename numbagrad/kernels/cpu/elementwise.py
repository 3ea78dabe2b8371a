"""CPU elementwise kernels over 2-D operands, with NumPy broadcasting.

The op layer hands every operand over as a 2-D view (a vector is one row, a
scalar a 1x1); an input whose dimension is 1 where the output's is not is
broadcast along it. Gradients of broadcast inputs are summed over those
dimensions in the same loop, each destination element in one pass (the same
order as the CUDA kernels, so the devices agree).
"""
from __future__ import annotations

from numba import njit

from .. import scalar

_unary = njit(scalar.unary)
_unary_grad = njit(scalar.unary_grad)
_binary = njit(scalar.binary)
_binary_grad_a = njit(scalar.binary_grad_a)
_binary_grad_b = njit(scalar.binary_grad_b)


@njit(cache=True, error_model="numpy")
def fill(out, value):
    """out[...] = value."""
    o = out.ravel()
    for i in range(o.size):
        o[i] = value


@njit(cache=True, error_model="numpy")
def axpby(alpha, x, beta, y):
    """y = alpha * x + beta * y; with beta == 0 ``y`` is never read."""
    xs = x.ravel()
    ys = y.ravel()
    if beta == 0.0:
        for i in range(ys.size):
            ys[i] = alpha * xs[i]
    else:
        for i in range(ys.size):
            ys[i] = alpha * xs[i] + beta * ys[i]


@njit(cache=True, error_model="numpy")
def scaled_add(g, x, beta, y):
    """y = g[()] * x + beta * y for a 0-d ``g`` on the device (a loss's
    upstream gradient), flat ``x`` and ``y``; beta == 0 never reads ``y``."""
    alpha = g[()]
    xs = x.ravel()
    ys = y.ravel()
    for i in range(ys.size):
        ys[i] = alpha * xs[i] if beta == 0.0 else alpha * xs[i] + beta * ys[i]


# A kernel takes the op's code at run time, but each loop below is inlined
# with the code as a constant, so LLVM folds the per-element dispatch away and
# vectorises (a run-time code in the loop costs ~5x).
@njit(error_model="numpy", inline="always")
def _unary_loop(code, x, out, p, alpha, beta):
    rows, cols = out.shape
    if x.shape == out.shape and alpha == 1 and beta == 0:
        for i in range(rows):
            for j in range(cols):
                out[i, j] = _unary(code, x[i, j], p)
        return
    bx0, bx1 = x.shape[0] == 1, x.shape[1] == 1
    for i in range(rows):
        ix = 0 if bx0 else i
        for j in range(cols):
            y = alpha * _unary(code, x[ix, 0 if bx1 else j], p)
            out[i, j] = y if beta == 0 else y + beta * out[i, j]


@njit(cache=True, error_model="numpy")
def unary(code, x, out, p, alpha, beta):
    """out = alpha * f(x) + beta * out, with ``x`` broadcast to ``out``."""
    if code == scalar.IDENT:
        _unary_loop(scalar.IDENT, x, out, p, alpha, beta)
    elif code == scalar.NEG:
        _unary_loop(scalar.NEG, x, out, p, alpha, beta)
    elif code == scalar.RELU:
        _unary_loop(scalar.RELU, x, out, p, alpha, beta)
    elif code == scalar.LEAKY_RELU:
        _unary_loop(scalar.LEAKY_RELU, x, out, p, alpha, beta)
    elif code == scalar.TANH:
        _unary_loop(scalar.TANH, x, out, p, alpha, beta)
    elif code == scalar.SIGMOID:
        _unary_loop(scalar.SIGMOID, x, out, p, alpha, beta)
    elif code == scalar.EXP:
        _unary_loop(scalar.EXP, x, out, p, alpha, beta)
    elif code == scalar.LOG:
        _unary_loop(scalar.LOG, x, out, p, alpha, beta)
    elif code == scalar.SQRT:
        _unary_loop(scalar.SQRT, x, out, p, alpha, beta)
    elif code == scalar.POW:
        _unary_loop(scalar.POW, x, out, p, alpha, beta)
    elif code == scalar.ADD_S:
        _unary_loop(scalar.ADD_S, x, out, p, alpha, beta)
    elif code == scalar.MUL_S:
        _unary_loop(scalar.MUL_S, x, out, p, alpha, beta)
    elif code == scalar.RSUB_S:
        _unary_loop(scalar.RSUB_S, x, out, p, alpha, beta)
    elif code == scalar.DIV_S:
        _unary_loop(scalar.DIV_S, x, out, p, alpha, beta)
    elif code == scalar.RDIV_S:
        _unary_loop(scalar.RDIV_S, x, out, p, alpha, beta)


@njit(error_model="numpy", inline="always")
def _unary_backward_loop(code, x, y, gout, dest, beta, p):
    rows, cols = dest.shape
    for i in range(rows):
        for j in range(cols):
            g = gout[i, j] * _unary_grad(code, x[i, j], y[i, j], p)
            dest[i, j] = g if beta == 0 else g + beta * dest[i, j]


@njit(cache=True, error_model="numpy")
def unary_backward(code, x, y, gout, dest, beta, p):
    """dest = gout * f'(x) + beta * dest (all the same 2-D shape)."""
    if code == scalar.IDENT:
        _unary_backward_loop(scalar.IDENT, x, y, gout, dest, beta, p)
    elif code == scalar.NEG:
        _unary_backward_loop(scalar.NEG, x, y, gout, dest, beta, p)
    elif code == scalar.RELU:
        _unary_backward_loop(scalar.RELU, x, y, gout, dest, beta, p)
    elif code == scalar.LEAKY_RELU:
        _unary_backward_loop(scalar.LEAKY_RELU, x, y, gout, dest, beta, p)
    elif code == scalar.TANH:
        _unary_backward_loop(scalar.TANH, x, y, gout, dest, beta, p)
    elif code == scalar.SIGMOID:
        _unary_backward_loop(scalar.SIGMOID, x, y, gout, dest, beta, p)
    elif code == scalar.EXP:
        _unary_backward_loop(scalar.EXP, x, y, gout, dest, beta, p)
    elif code == scalar.LOG:
        _unary_backward_loop(scalar.LOG, x, y, gout, dest, beta, p)
    elif code == scalar.SQRT:
        _unary_backward_loop(scalar.SQRT, x, y, gout, dest, beta, p)
    elif code == scalar.POW:
        _unary_backward_loop(scalar.POW, x, y, gout, dest, beta, p)
    elif code == scalar.ADD_S:
        _unary_backward_loop(scalar.ADD_S, x, y, gout, dest, beta, p)
    elif code == scalar.MUL_S:
        _unary_backward_loop(scalar.MUL_S, x, y, gout, dest, beta, p)
    elif code == scalar.RSUB_S:
        _unary_backward_loop(scalar.RSUB_S, x, y, gout, dest, beta, p)
    elif code == scalar.DIV_S:
        _unary_backward_loop(scalar.DIV_S, x, y, gout, dest, beta, p)
    elif code == scalar.RDIV_S:
        _unary_backward_loop(scalar.RDIV_S, x, y, gout, dest, beta, p)


@njit(error_model="numpy", inline="always")
def _binary_loop(code, a, b, out):
    rows, cols = out.shape
    if a.shape == out.shape and b.shape == out.shape:
        for i in range(rows):
            for j in range(cols):
                out[i, j] = _binary(code, a[i, j], b[i, j])
        return
    ba0, ba1 = a.shape[0] == 1, a.shape[1] == 1
    bb0, bb1 = b.shape[0] == 1, b.shape[1] == 1
    for i in range(rows):
        ia = 0 if ba0 else i
        ib = 0 if bb0 else i
        for j in range(cols):
            out[i, j] = _binary(code, a[ia, 0 if ba1 else j], b[ib, 0 if bb1 else j])


@njit(cache=True, error_model="numpy")
def binary(code, a, b, out):
    """out = a op b, ``a`` and ``b`` broadcast to ``out``."""
    if code == scalar.ADD:
        _binary_loop(scalar.ADD, a, b, out)
    elif code == scalar.SUB:
        _binary_loop(scalar.SUB, a, b, out)
    elif code == scalar.MUL:
        _binary_loop(scalar.MUL, a, b, out)
    elif code == scalar.DIV:
        _binary_loop(scalar.DIV, a, b, out)


@njit(error_model="numpy", inline="always")
def _reduced_grad(code, which, a, b, gout, i, j):
    # Sum of gout * d(out)/d(operand) over the output elements that read
    # the operand's element (i, j).
    src = a if which == 0 else b
    rows, cols = gout.shape
    r0, r1 = (0, rows) if src.shape[0] == 1 else (i, i + 1)
    c0, c1 = (0, cols) if src.shape[1] == 1 else (j, j + 1)
    ba0, ba1 = a.shape[0] == 1, a.shape[1] == 1
    bb0, bb1 = b.shape[0] == 1, b.shape[1] == 1
    total = gout[0, 0] * 0
    for r in range(r0, r1):
        for c in range(c0, c1):
            av = a[0 if ba0 else r, 0 if ba1 else c]
            bv = b[0 if bb0 else r, 0 if bb1 else c]
            d = _binary_grad_a(code, av, bv) if which == 0 else _binary_grad_b(code, av, bv)
            total += gout[r, c] * d
    return total


@njit(error_model="numpy", inline="always")
def _binary_backward_loop(code, a, b, gout, da, beta_a, need_a, db, beta_b, need_b):
    if need_a:
        for i in range(da.shape[0]):
            for j in range(da.shape[1]):
                g = _reduced_grad(code, 0, a, b, gout, i, j)
                da[i, j] = g if beta_a == 0.0 else g + beta_a * da[i, j]
    if need_b:
        for i in range(db.shape[0]):
            for j in range(db.shape[1]):
                g = _reduced_grad(code, 1, a, b, gout, i, j)
                db[i, j] = g if beta_b == 0.0 else g + beta_b * db[i, j]


@njit(cache=True, error_model="numpy")
def binary_backward(code, a, b, gout, da, beta_a, need_a, db, beta_b, need_b):
    """da = sum(gout * d/da) + beta_a * da, db likewise, each summed over the
    dimensions its operand was broadcast along. ``da``/``db`` have their
    operand's 2-D shape and are written only when ``need_a``/``need_b``."""
    if code == scalar.ADD:
        _binary_backward_loop(scalar.ADD, a, b, gout, da, beta_a, need_a, db, beta_b, need_b)
    elif code == scalar.SUB:
        _binary_backward_loop(scalar.SUB, a, b, gout, da, beta_a, need_a, db, beta_b, need_b)
    elif code == scalar.MUL:
        _binary_backward_loop(scalar.MUL, a, b, gout, da, beta_a, need_a, db, beta_b, need_b)
    elif code == scalar.DIV:
        _binary_backward_loop(scalar.DIV, a, b, gout, da, beta_a, need_a, db, beta_b, need_b)


@njit(cache=True, error_model="numpy")
def sum_to(x, out, scale, beta):
    """out = scale * (x summed over the dimensions where ``out`` has size 1)
    + beta * out. Reductions' forward, and a bias's gradient."""
    rows, cols = x.shape
    b0, b1 = out.shape[0] == 1, out.shape[1] == 1
    if b0 and not b1:
        # Column sums (a bias gradient): walk x row by row, so the inner loop
        # is contiguous and vectorises, adding into out as it goes.
        for j in range(cols):
            out[0, j] = scale * x[0, j] if beta == 0.0 else beta * out[0, j] + scale * x[0, j]
        for r in range(1, rows):
            for j in range(cols):
                out[0, j] += scale * x[r, j]
        return
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):
            total = 0.0   # float64, as the CUDA block reduction adds
            for r in range(0 if b0 else i, rows if b0 else i + 1):
                for c in range(0 if b1 else j, cols if b1 else j + 1):
                    total += x[r, c]
            out[i, j] = scale * total if beta == 0.0 else scale * total + beta * out[i, j]

"""CPU elementwise kernels over 2-D operands, with NumPy broadcasting.

The op layer hands every operand over as a 2-D view (a vector is one row, a
scalar a 1x1); an input whose dimension is 1 where the output's is not is
broadcast along it. Gradients of broadcast inputs are summed over those
dimensions in the same loop, each destination element in one pass (the same
order as the CUDA kernels, so the devices agree).

The kernels that pay for threads on large arrays have a ``_mt`` twin
(``parallel=True``, same signature, same bits): it splits the destination
into blocks of about ``SPAN`` elements and computes each with the serial
kernel's per-element expression; every destination element is still
written once, by one thread, from the same operands. Python-float scalars
are rounded to the arrays' dtype first, so float32 work stays float32.
"""
from __future__ import annotations

# the kernels this module registers
__all__ = ["axpby", "binary", "binary_backward", "fill", "scaled_add", "sum_to", "unary",
           "unary_backward"]

from collections.abc import Callable

import numpy as np
from numba import njit, prange
from numba.extending import overload

from ... import _cache
from .. import dispatch, bodies, codes
from ._threads import SPAN, _cast_like
# codes.unary/unary_grad, with vectorisable forms for float32 (vmath's docstring)
from .vmath import EXACT
from .vmath import unary as _unary
from .vmath import unary_grad as _unary_grad

_binary = EXACT["binary"]
_binary_grad_a = EXACT["binary_grad_a"]
_binary_grad_b = EXACT["binary_grad_b"]
_reduced_grad = njit(error_model="numpy", inline="always")(
    bodies.reduced_grad(_binary_grad_a, _binary_grad_b))


@njit(cache=True, error_model="numpy")
def fill(out, value):
    """out[...] = value."""
    o = out.ravel()
    for i in range(o.size):
        o[i] = value


@njit(cache=True, error_model="numpy")
def axpby(alpha, x, beta, y):
    """y = alpha * x + beta * y; with beta == 0 ``y`` is never read."""
    _axpby_span(_cast_like(y, alpha), x.ravel(), _cast_like(y, beta), y.ravel(), 0, y.size)


# The spans and blocks are separate (not inlined) functions: a loop inlined
# into a prange body does not vectorise (measured 3-7x slower).
@njit(cache=True, error_model="numpy")
def _axpby_span(a, x, b, y, lo, hi):
    # Loops index slices from 0, so LLVM can prove the indices non-negative
    # (no wraparound select) and vectorise them.
    xs, ys = x[lo:hi], y[lo:hi]
    if b == 0:
        for i in range(ys.size):
            ys[i] = a * xs[i]
    else:
        for i in range(ys.size):
            ys[i] = a * xs[i] + b * ys[i]


@njit(cache=True, error_model="numpy", parallel=True)
def axpby_mt(alpha, x, beta, y):
    """``axpby`` on threads, ``SPAN`` elements a task."""
    a, b = _cast_like(y, alpha), _cast_like(y, beta)
    xs, ys = x.ravel(), y.ravel()
    n = ys.size
    for t in prange((n + SPAN - 1) // SPAN):
        _axpby_span(a, xs, b, ys, t * SPAN, min(t * SPAN + SPAN, n))


@njit(cache=True, error_model="numpy")
def scaled_add(g, x, beta, y):
    """y = g[()] * x + beta * y for a 0-d ``g`` on the device (a loss's
    upstream gradient), flat ``x`` and ``y``; beta == 0 never reads ``y``."""
    _scaled_span(g[()], x.ravel(), _cast_like(y, beta), y.ravel(), 0, y.size)


@njit(cache=True, error_model="numpy")
def _scaled_span(a, x, b, y, lo, hi):
    xs, ys = x[lo:hi], y[lo:hi]
    for i in range(ys.size):
        ys[i] = a * xs[i] if b == 0 else a * xs[i] + b * ys[i]


@njit(cache=True, error_model="numpy", parallel=True)
def scaled_add_mt(g, x, beta, y):
    """``scaled_add`` on threads, ``SPAN`` elements a task."""
    a, b = g[()], _cast_like(y, beta)
    xs, ys = x.ravel(), y.ravel()
    n = ys.size
    for t in prange((n + SPAN - 1) // SPAN):
        _scaled_span(a, xs, b, ys, t * SPAN, min(t * SPAN + SPAN, n))


def _one_layout(arrays):
    """``arrays`` (a tuple of 2-D arrays) as the blocks take them: unchanged
    when all are C-contiguous, else each as a read-only "A" (any strides)
    view, the type the N-d kernels' broadcast views have (jitted code only)."""
    return arrays


@overload(_one_layout, inline="always")
def _one_layout_impl(arrays):
    # A block's ladder compiles its ~25 loops once per operand type (~20 s):
    # so transposed ("F") and sliced ("A") operands, here and in the N-d
    # kernels, share one.
    if all(a.layout == "C" for a in arrays):
        return lambda arrays: arrays
    scope: dict = {"np": np}
    views = "".join(f"np.broadcast_to(arrays[{i}], arrays[{i}].shape), "
                    for i in range(len(arrays)))
    exec(f"def impl(arrays):\n    return ({views})\n", scope)
    return scope["impl"]


@njit(error_model="numpy", inline="always")
def _grid(rows, cols):
    """Blocks of about SPAN elements over a (rows, cols) destination: (rows
    per block, columns per block, blocks down, blocks across)."""
    if rows == 0 or cols == 0:
        return 1, 1, 0, 0
    cb = min(cols, SPAN)
    rb = max(1, SPAN // cb)
    return rb, cb, (rows + rb - 1) // rb, (cols + cb - 1) // cb


# A kernel takes the op's code at run time, but each loop below is inlined
# with the code as a constant, so LLVM folds the per-element dispatch away and
# vectorises (a run-time code in the loop costs ~5x): the ladders from code to
# loop (``_unary_block``, ...) are generated from the records, one branch per
# code, and an unknown code raises (``dispatch.ladder``). Each loop covers the
# block [r0, r1) x [c0, c1) of the destination: all of it for the serial
# kernel, one block per task for its _mt twin.
@njit(error_model="numpy", inline="always")
def _unary_loop(code, x, out, p, alpha, beta, r0, r1, c0, c1):
    # Row by row through 1-D views whose loops start at 0, so LLVM can prove
    # the indices non-negative (no wraparound select) and vectorise.
    if x.shape == out.shape and alpha == 1 and beta == 0:
        for i in range(r0, r1):
            o, xr = out[i, c0:c1], x[i, c0:c1]
            for j in range(o.size):
                o[j] = _unary(code, xr[j], p)
        return
    bx0, bx1 = x.shape[0] == 1, x.shape[1] == 1
    for i in range(r0, r1):
        ix = 0 if bx0 else i
        o, xr = out[i, c0:c1], x[ix, 0:1] if bx1 else x[ix, c0:c1]
        for j in range(o.size):
            y = alpha * _unary(code, xr[0 if bx1 else j], p)
            o[j] = y if beta == 0 else y + beta * o[j]


def _ladder(name: str, loop: Callable, params: str, count: int, shared: Callable,
            shared_codes: frozenset, lead: str = "") -> Callable:
    """``name(code, <params>)``: ``loop(<code>, <lead><params>)`` with the code a
    constant, one branch per record (``dispatch.ladder``), except the
    records without a loop of their own (``shared_codes``), which
    ``shared(code, <lead><params>)`` runs; it raises for any other code.
    Cached on disk where Numba can (``_cache.jit_generated``)."""
    own = [c for c in range(count) if c not in shared_codes]
    return _cache.jit_generated(dispatch.ladder(
        name, params, own, f"_loop({{code}}, {lead}{params})", {"_loop": loop, "_shared": shared},
        f"{name.strip('_')}: unknown op code", otherwise=f"_shared(code, {lead}{params})",
        origin=__name__), error_model="numpy")


def _member(name: str, members: frozenset) -> Callable:
    """``name(code)``: whether ``code`` is one of ``members`` (a ladder)."""
    return njit(error_model="numpy", inline="always")(dispatch.ladder(
        name, "", sorted(members), "return True", {}, "", otherwise="return False"))


# Whether a code runs in its family's shared loop.
_in_shared_loop = _member("_in_shared_loop", codes.SHARED_LOOP)
_in_shared_binary_loop = _member("_in_shared_binary_loop", codes.SHARED_BINARY_LOOP)


@njit(error_model="numpy", inline="always")
def _known(code, count):
    # the threaded twins check first: a raise inside a prange task reaches
    # Python as a SystemError, not as the ladder's ValueError
    if not 0 <= code < count:
        raise ValueError("unknown op code")


# The one loop of the codes without a loop of their own: the code stays a
# run-time value (never inlined into a ladder, so it is compiled once).
@njit(cache=True, error_model="numpy")
def _unary_shared(code, x, out, p, alpha, beta, r0, r1, c0, c1):
    if not _in_shared_loop(code):
        raise ValueError("unary_block: unknown op code")
    _unary_loop(code, x, out, p, alpha, beta, r0, r1, c0, c1)


_BLOCK = "r0, r1, c0, c1"
_unary_block = _ladder("_unary_block", _unary_loop, f"x, out, p, alpha, beta, {_BLOCK}",
                       codes.N_UNARY, _unary_shared, codes.SHARED_LOOP)


@njit(cache=True, error_model="numpy")
def unary(code, x, out, p, alpha, beta):
    """out = alpha * f(x) + beta * out, with ``x`` broadcast to ``out``."""
    (x,) = _one_layout((x,))
    pc, ac, bc = _cast_like(out, p), _cast_like(out, alpha), _cast_like(out, beta)
    rows, cols = out.shape
    rb, cb, nr, nc = _grid(rows, cols)
    for t in range(nr * nc):
        r0, c0 = (t // nc) * rb, (t % nc) * cb
        _unary_block(code, x, out, pc, ac, bc, r0, min(r0 + rb, rows), c0, min(c0 + cb, cols))


@njit(cache=True, error_model="numpy", parallel=True)
def unary_mt(code, x, out, p, alpha, beta):
    """``unary`` on threads: the same blocks, shared among them."""
    _known(code, codes.N_UNARY)
    (x,) = _one_layout((x,))
    pc, ac, bc = _cast_like(out, p), _cast_like(out, alpha), _cast_like(out, beta)
    rows, cols = out.shape
    rb, cb, nr, nc = _grid(rows, cols)
    for t in prange(nr * nc):
        r0, c0 = (t // nc) * rb, (t % nc) * cb
        _unary_block(code, x, out, pc, ac, bc, r0, min(r0 + rb, rows), c0, min(c0 + cb, cols))


@njit(error_model="numpy", inline="always")
def _unary_backward_loop(code, x, y, gout, dest, beta, p, r0, r1, c0, c1):
    for i in range(r0, r1):
        d, xr, yr, gr = dest[i, c0:c1], x[i, c0:c1], y[i, c0:c1], gout[i, c0:c1]
        for j in range(d.size):
            g = gr[j] * _unary_grad(code, xr[j], yr[j], p)
            d[j] = g if beta == 0 else g + beta * d[j]


@njit(cache=True, error_model="numpy")
def _unary_backward_shared(code, x, y, gout, dest, beta, p, r0, r1, c0, c1):
    if not _in_shared_loop(code):
        raise ValueError("unary_backward_block: unknown op code")
    _unary_backward_loop(code, x, y, gout, dest, beta, p, r0, r1, c0, c1)


_unary_backward_block = _ladder("_unary_backward_block", _unary_backward_loop,
                                f"x, y, gout, dest, beta, p, {_BLOCK}", codes.N_UNARY,
                                _unary_backward_shared, codes.SHARED_LOOP)


@njit(cache=True, error_model="numpy")
def unary_backward(code, x, y, gout, dest, beta, p):
    """dest = gout * f'(x) + beta * dest (all the same 2-D shape)."""
    (x,) = _one_layout((x,))
    bc, pc = _cast_like(dest, beta), _cast_like(dest, p)
    rows, cols = dest.shape
    rb, cb, nr, nc = _grid(rows, cols)
    for t in range(nr * nc):
        r0, c0 = (t // nc) * rb, (t % nc) * cb
        _unary_backward_block(code, x, y, gout, dest, bc, pc, r0, min(r0 + rb, rows), c0,
                              min(c0 + cb, cols))


@njit(cache=True, error_model="numpy", parallel=True)
def unary_backward_mt(code, x, y, gout, dest, beta, p):
    """``unary_backward`` on threads: the same blocks, shared among them."""
    _known(code, codes.N_UNARY)
    (x,) = _one_layout((x,))
    bc, pc = _cast_like(dest, beta), _cast_like(dest, p)
    rows, cols = dest.shape
    rb, cb, nr, nc = _grid(rows, cols)
    for t in prange(nr * nc):
        r0, c0 = (t // nc) * rb, (t % nc) * cb
        _unary_backward_block(code, x, y, gout, dest, bc, pc, r0, min(r0 + rb, rows), c0,
                              min(c0 + cb, cols))


@njit(error_model="numpy", inline="always")
def _binary_loop(code, a, b, out, r0, r1, c0, c1):
    if a.shape == out.shape and b.shape == out.shape:
        for i in range(r0, r1):
            o, ar, br = out[i, c0:c1], a[i, c0:c1], b[i, c0:c1]
            for j in range(o.size):
                o[j] = _binary(code, ar[j], br[j])
        return
    ba0, ba1 = a.shape[0] == 1, a.shape[1] == 1
    bb0, bb1 = b.shape[0] == 1, b.shape[1] == 1
    for i in range(r0, r1):
        ia = 0 if ba0 else i
        ib = 0 if bb0 else i
        o = out[i, c0:c1]
        ar = a[ia, 0:1] if ba1 else a[ia, c0:c1]
        br = b[ib, 0:1] if bb1 else b[ib, c0:c1]
        for j in range(o.size):
            o[j] = _binary(code, ar[0 if ba1 else j], br[0 if bb1 else j])


@njit(cache=True, error_model="numpy")
def _binary_shared(code, a, b, out, r0, r1, c0, c1):
    if not _in_shared_binary_loop(code):
        raise ValueError("binary_block: unknown op code")
    _binary_loop(code, a, b, out, r0, r1, c0, c1)


_binary_block = _ladder("_binary_block", _binary_loop, f"a, b, out, {_BLOCK}", codes.N_BINARY,
                        _binary_shared, codes.SHARED_BINARY_LOOP)


@njit(cache=True, error_model="numpy")
def binary(code, a, b, out):
    """out = a op b, ``a`` and ``b`` broadcast to ``out``."""
    a, b = _one_layout((a, b))
    rows, cols = out.shape
    rb, cb, nr, nc = _grid(rows, cols)
    for t in range(nr * nc):
        r0, c0 = (t // nc) * rb, (t % nc) * cb
        _binary_block(code, a, b, out, r0, min(r0 + rb, rows), c0, min(c0 + cb, cols))


@njit(cache=True, error_model="numpy", parallel=True)
def binary_mt(code, a, b, out):
    """``binary`` on threads: the same blocks, shared among them."""
    _known(code, codes.N_BINARY)
    a, b = _one_layout((a, b))
    rows, cols = out.shape
    rb, cb, nr, nc = _grid(rows, cols)
    for t in prange(nr * nc):
        r0, c0 = (t // nc) * rb, (t % nc) * cb
        _binary_block(code, a, b, out, r0, min(r0 + rb, rows), c0, min(c0 + cb, cols))


@njit(error_model="numpy", inline="always")
def _binary_backward_loop(code, which, a, b, gout, d, beta, r0, r1, c0, c1):
    src, opp = (a, b) if which == 0 else (b, a)
    if src.shape == gout.shape:
        # Nothing to sum for this operand: row by row through 1-D views, which
        # vectorise, with _reduced_grad's one-term expression (0.0 + g * d).
        bo0, bo1 = opp.shape[0] == 1, opp.shape[1] == 1
        for i in range(r0, r1):
            dr, gr, own = d[i, c0:c1], gout[i, c0:c1], src[i, c0:c1]
            io = 0 if bo0 else i
            other = opp[io, 0:1] if bo1 else opp[io, c0:c1]
            for j in range(dr.size):
                ov = other[0 if bo1 else j]
                dv = _binary_grad_a(code, own[j], ov) if which == 0 else \
                    _binary_grad_b(code, ov, own[j])
                g = 0.0 + gr[j] * dv
                dr[j] = g if beta == 0 else g + beta * dr[j]
        return
    for i in range(r0, r1):
        for j in range(c0, c1):
            g = _reduced_grad(code, which, a, b, gout, i, j)
            d[i, j] = g if beta == 0 else g + beta * d[i, j]


@njit(cache=True, error_model="numpy")
def _binary_backward_shared(code, which, a, b, gout, d, beta, r0, r1, c0, c1):
    if not _in_shared_binary_loop(code):
        raise ValueError("binary_backward_block: unknown op code")
    if which == 0:     # (a constant operand order, as in the ladders' loops)
        _binary_backward_loop(code, 0, a, b, gout, d, beta, r0, r1, c0, c1)
    else:
        _binary_backward_loop(code, 1, a, b, gout, d, beta, r0, r1, c0, c1)


# a's gradient over one block of d, and b's
_grad_a_block = _ladder("_grad_a_block", _binary_backward_loop,
                        f"a, b, gout, d, beta, {_BLOCK}", codes.N_BINARY,
                        _binary_backward_shared, codes.SHARED_BINARY_LOOP, lead="0, ")
_grad_b_block = _ladder("_grad_b_block", _binary_backward_loop,
                        f"a, b, gout, d, beta, {_BLOCK}", codes.N_BINARY,
                        _binary_backward_shared, codes.SHARED_BINARY_LOOP, lead="1, ")


@njit(error_model="numpy", inline="always")
def _binary_backward_task(code, a, b, gout, da, ba, db, bb, t, tasks_a, grid_a, grid_b):
    # Task t: a block of da (t < tasks_a), else a block of db.
    if t < tasks_a:
        rb, cb, _, nc = grid_a
        r0, c0 = (t // nc) * rb, (t % nc) * cb
        _grad_a_block(code, a, b, gout, da, ba, r0, min(r0 + rb, da.shape[0]), c0,
                      min(c0 + cb, da.shape[1]))
    else:
        u = t - tasks_a
        rb, cb, _, nc = grid_b
        r0, c0 = (u // nc) * rb, (u % nc) * cb
        _grad_b_block(code, a, b, gout, db, bb, r0, min(r0 + rb, db.shape[0]), c0,
                      min(c0 + cb, db.shape[1]))


@njit(cache=True, error_model="numpy")
def binary_backward(code, a, b, gout, da, beta_a, need_a, db, beta_b, need_b):
    """da = sum(gout * d/da) + beta_a * da, db likewise, each summed over the
    dimensions its operand was broadcast along. ``da``/``db`` have their
    operand's 2-D shape and are written only when ``need_a``/``need_b``.

    The tasks: the blocks of ``da``, then those of ``db``; each destination
    element is one independent sum (a 1x1 destination, a sum over
    everything, is one task)."""
    a, b = _one_layout((a, b))
    ba, bb = _cast_like(da, beta_a), _cast_like(db, beta_b)
    grid_a, grid_b = _grid(da.shape[0], da.shape[1]), _grid(db.shape[0], db.shape[1])
    tasks_a = grid_a[2] * grid_a[3] if need_a else 0
    tasks_b = grid_b[2] * grid_b[3] if need_b else 0
    for t in range(tasks_a + tasks_b):
        _binary_backward_task(code, a, b, gout, da, ba, db, bb, t, tasks_a, grid_a, grid_b)


@njit(cache=True, error_model="numpy", parallel=True)
def binary_backward_mt(code, a, b, gout, da, beta_a, need_a, db, beta_b, need_b):
    """``binary_backward`` on threads: the same tasks, shared among them."""
    _known(code, codes.N_BINARY)
    a, b = _one_layout((a, b))
    ba, bb = _cast_like(da, beta_a), _cast_like(db, beta_b)
    grid_a, grid_b = _grid(da.shape[0], da.shape[1]), _grid(db.shape[0], db.shape[1])
    tasks_a = grid_a[2] * grid_a[3] if need_a else 0
    tasks_b = grid_b[2] * grid_b[3] if need_b else 0
    for t in prange(tasks_a + tasks_b):
        _binary_backward_task(code, a, b, gout, da, ba, db, bb, t, tasks_a, grid_a, grid_b)


# ---------------------------------------------------------------- sum_to
@njit(cache=True, error_model="numpy")
def _column_sums(x, out, scale, beta, c0, c1):
    # Column sums (a bias gradient) of columns [c0, c1): walk x row by row,
    # so the inner loop is contiguous and vectorises, adding into a scratch
    # row as it goes (it cannot alias x, out could: 9.7 -> 7.5 us over
    # 4096x16), then into out; four rows per pass over the scratch (the same
    # adds in the same order, a quarter of its loads and stores: 14.7 -> 9.2
    # us over 4096x16).
    o = out[0, c0:c1]
    if x.shape[0] == 0:   # a sum over no rows is 0 (scale * 0: a mean's is nan)
        for j in range(o.size):
            o[j] = scale * 0 if beta == 0 else beta * o[j] + scale * 0
        return
    x0 = x[0, c0:c1]
    s = np.empty(o.size, o.dtype)
    for j in range(o.size):
        s[j] = scale * x0[j] if beta == 0 else beta * o[j] + scale * x0[j]
    r, rows = 1, x.shape[0]
    while r + 4 <= rows:
        xa, xb, xc, xd = x[r, c0:c1], x[r + 1, c0:c1], x[r + 2, c0:c1], x[r + 3, c0:c1]
        for j in range(s.size):
            s[j] = (((s[j] + scale * xa[j]) + scale * xb[j]) + scale * xc[j]) + scale * xd[j]
        r += 4
    for r in range(r, rows):
        xr = x[r, c0:c1]
        for j in range(s.size):
            s[j] += scale * xr[j]
    for j in range(o.size):
        o[j] = s[j]


@njit(cache=True, error_model="numpy")
def _span_sum(x, lo, hi):
    """float64 sum of x's elements lo..hi-1 in row-major order, one by one."""
    cols = x.shape[1]
    r = lo // cols
    c = lo - r * cols
    total = 0.0
    k = lo
    while k < hi:
        end = min(cols, c + hi - k)
        for cc in range(c, end):
            total += x[r, cc]
        k += end - c
        r += 1
        c = 0
    return total


@njit(cache=True, error_model="numpy")
def _slice_sums(x, out, scale, beta, i0, i1, j0, j1):
    # out[i, j] for a block of out, each an independent float64 sum (as the
    # CUDA block reduction adds) over the slice of x it reduces.
    rows, cols = x.shape
    b0, b1 = out.shape[0] == 1, out.shape[1] == 1
    for i in range(i0, i1):
        for j in range(j0, j1):
            total = 0.0
            for r in range(0 if b0 else i, rows if b0 else i + 1):
                for c in range(0 if b1 else j, cols if b1 else j + 1):
                    total += x[r, c]
            out[i, j] = scale * total if beta == 0 else scale * total + beta * out[i, j]


@njit(cache=True, error_model="numpy")
def sum_to(x, out, scale, beta):
    """out = scale * (x summed over the dimensions where ``out`` has size 1)
    + beta * out. Reductions' forward, and a bias's gradient.

    A sum over every element (a 1x1 ``out``) adds spans of ``SPAN``
    elements, in order, into float64 partial sums and then adds those
    partials in order: the same order ``sum_to_mt`` follows."""
    s, b = _cast_like(out, scale), _cast_like(out, beta)
    rows, cols = x.shape
    b0, b1 = out.shape[0] == 1, out.shape[1] == 1
    if b0 and not b1:
        _column_sums(x, out, s, b, cols * 0, cols)   # int64 0 (not a literal): the twins share
                                                      # one compiled _column_sums
    elif b0 and b1 and rows * cols > 0:
        n = rows * cols
        total = 0.0
        for t in range((n + SPAN - 1) // SPAN):
            total += _span_sum(x, t * SPAN, min(t * SPAN + SPAN, n))
        out[0, 0] = s * total if b == 0 else s * total + b * out[0, 0]
    else:
        _slice_sums(x, out, s, b, 0, out.shape[0], 0, out.shape[1])


@njit(cache=True, error_model="numpy", parallel=True)
def sum_to_mt(x, out, scale, beta):
    """``sum_to`` on threads, one kind of task per call: spans (a full sum,
    in ``sum_to``'s fixed order) or blocks of ``out`` (row sums, or none);
    column sums run serially. Each gives the serial bits."""
    s, b = _cast_like(out, scale), _cast_like(out, beta)
    rows, cols = x.shape
    orows, ocols = out.shape
    b0, b1 = orows == 1, ocols == 1
    n = rows * cols
    # Column sums run serially, on this thread: split into blocks of columns
    # (any split gives the same bits) they measured 1.2-2.6x slower than
    # serial up to 2**17 elements, the serial row-by-row loop running at
    # memory speed, and a parallel region of one task cost ~2 us more.
    if b0 and not b1:
        _column_sums(x, out, s, b, cols * 0, cols)
        return
    rb, cb, nr, nc = _grid(orows, ocols)
    if b0 and b1 and n > 0:
        kind, tasks = 1, (n + SPAN - 1) // SPAN
    else:
        kind, tasks = 2, nr * nc
    partial = np.empty(tasks if kind == 1 else 0)
    for t in prange(tasks):
        if kind == 1:
            partial[t] = _span_sum(x, t * SPAN, min(t * SPAN + SPAN, n))
        else:
            r0, c0 = (t // nc) * rb, (t % nc) * cb
            _slice_sums(x, out, s, b, r0, min(r0 + rb, orows), c0, min(c0 + cb, ocols))
    if kind == 1:
        total = 0.0
        for t in range(tasks):
            total += partial[t]
        out[0, 0] = s * total if b == 0 else s * total + b * out[0, 0]

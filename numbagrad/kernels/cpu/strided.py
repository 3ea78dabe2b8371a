"""CPU kernels over N-d strided arrays: the broadcast/strided copy and the
reduction that is its gradient. Any rank (Numba compiles one version per
rank; the elementwise ops pad ranks 3 to 6 to 6, so one serves them);
inputs are read through their strides, so transposed, permuted, sliced and
broadcast (size-1) operands need no copy.

The ops use the 2-D kernels of ``elementwise`` whenever an operation
collapses to two dims (most do) and these for the rest: ``binary_nd``,
``unary_nd`` and their backwards read every operand through its strides and
broadcast, so an N-d elementwise op is one kernel forward and one backward.
Only ``expand_nd`` has a threaded twin (it is also the copy that reorders
layouts: a convolution's output into NCHW, attention's heads): its blocks
along the first dim go to the threads, each element copied as the serial
kernel copies it. (The other N-d kernels are the rare fallback; the 2-D
kernels, which most ops reach, have theirs.)
"""
from __future__ import annotations

# the kernels this module registers
__all__ = ["binary_nd", "binary_nd_backward", "expand_nd", "sum_to_nd", "unary_nd",
           "unary_nd_backward"]

import numpy as np
from numba import njit, prange

from ._threads import SPAN, _cast_like
from .elementwise import (_binary_block, _binary_grad_a, _binary_grad_b, _unary_backward_block,
                          _unary_block)


@njit(cache=True, error_model="numpy")
def expand_nd(x, out, alpha, beta):
    """out = alpha * x + beta * out, ``x`` of ``out``'s rank with each dim equal
    to out's or 1 (broadcast along it), any strides; ``out`` C-contiguous,
    rank >= 1 (the ops view a 0-d array as one element). With beta == 0
    ``out`` is never read."""
    a, b = _cast_like(out, alpha), _cast_like(out, beta)
    if out.size == 0:
        return
    xb = np.broadcast_to(x, out.shape)
    if out.ndim == 1:
        for j in range(out.size):
            out[j] = a * xb[j] if b == 0 else a * xb[j] + b * out[j]
        return
    # one 2-D block per index of the leading dims: a view per row costs more
    # than the copy when rows are short
    for idx in np.ndindex(out.shape[:-2]):
        _expand_block(xb[idx], out[idx], a, b)


@njit(cache=True, error_model="numpy", parallel=True)
def expand_nd_mt(x, out, alpha, beta):
    """``expand_nd`` with the first dim's indices (of a rank >= 3 ``out``;
    else blocks of about ``SPAN`` elements of its rows) shared among the
    threads."""
    a, b = _cast_like(out, alpha), _cast_like(out, beta)
    if out.size == 0:
        return
    if out.ndim == 1:
        expand_nd(x, out, alpha, beta)
        return
    xb = np.broadcast_to(x, out.shape)
    if out.ndim == 2:
        rows = out.shape[0]
        step = max(1, SPAN // max(out.shape[1], 1))
        for t in prange((rows + step - 1) // step):
            lo, hi = t * step, min(rows, (t + 1) * step)
            _expand_block(xb[lo:hi], out[lo:hi], a, b)
        return
    for i in prange(out.shape[0]):
        xi, oi = xb[i], out[i]
        for idx in np.ndindex(oi.shape[:-2]):
            _expand_block(xi[idx], oi[idx], a, b)


@njit(error_model="numpy", inline="always")
def _expand_block(v, o, a, b):
    """o = a * v + b * o over one 2-D block (b == 0: o is never read). A
    row broadcast down the block (a bias filling a GEMM's output) is
    computed once and copied: contiguous copies, where reading it through
    its zero stride does not vectorise (18 -> 8 us over 4096x16)."""
    rows, cols = o.shape
    if b == 0 and rows > 1 and v.strides[0] == 0:
        for j in range(cols):
            o[0, j] = a * v[0, j]
        first = o[0]
        for r in range(1, rows):
            row = o[r]
            for j in range(cols):
                row[j] = first[j]
        return
    if b == 0:
        for r in range(rows):
            for j in range(cols):
                o[r, j] = a * v[r, j]
    else:
        for r in range(rows):
            for j in range(cols):
                o[r, j] = a * v[r, j] + b * o[r, j]


@njit(cache=True, error_model="numpy")
def sum_to_nd(g, dest, scale, beta):
    """dest = scale * (g summed over every dim where ``dest`` has size 1 and
    ``g`` does not) + beta * dest; ``g`` and ``dest`` of one rank >= 1, g any
    strides, dest C-contiguous. Each sum runs in float64 over g's elements in
    C order (the CUDA kernel's order); an empty sum is 0."""
    s, b = _cast_like(dest, scale), _cast_like(dest, beta)
    acc = np.zeros(dest.size, np.float64)
    shape = dest.shape
    last = shape[-1]
    for idx in np.ndindex(g.shape[:-1]):
        k = 0
        for d in range(g.ndim - 1):
            k = k * shape[d] + (0 if shape[d] == 1 else idx[d])
        k *= last
        row = g[idx]
        if last == 1:
            total = acc[k]
            for j in range(row.size):
                total += row[j]
            acc[k] = total
        else:
            for j in range(row.size):
                acc[k + j] += row[j]
    flat = dest.reshape(-1)
    for k in range(flat.size):
        total = s * acc[k]
        flat[k] = total if b == 0 else total + b * flat[k]


# ------------------------------------------------------------ N-d elementwise
# The op layer merges adjacent dims first, so these see the few dims (>= 3)
# that did not merge into the 2-D kernels' two. Each 2-D slice of the output
# runs the 2-D kernels' own blocks (their loops, inlined per op code), read
# through broadcast views: a broadcast dim is stride 0 there, so the blocks
# take their equal-shape branch.
@njit(cache=True, error_model="numpy")
def binary_nd(code, a, b, out):
    """out = a op b for ``a``, ``b`` of ``out``'s rank (>= 2), each dim equal to
    out's or 1 (broadcast), any strides; ``out`` C-contiguous."""
    if out.size == 0:
        return
    ab, bb = np.broadcast_to(a, out.shape), np.broadcast_to(b, out.shape)
    rows, cols = out.shape[-2], out.shape[-1]
    for idx in np.ndindex(out.shape[:-2]):
        _binary_block(code, ab[idx], bb[idx], out[idx], 0, rows, 0, cols)


@njit(cache=True, error_model="numpy")
def unary_nd(code, x, out, p, alpha, beta):
    """out = alpha * f(x) + beta * out for ``x`` of ``out``'s rank (>= 2), dims
    equal to out's or 1, any strides; ``out`` C-contiguous."""
    if out.size == 0:
        return
    pc, ac, bc = _cast_like(out, p), _cast_like(out, alpha), _cast_like(out, beta)
    xb = np.broadcast_to(x, out.shape)
    rows, cols = out.shape[-2], out.shape[-1]
    for idx in np.ndindex(out.shape[:-2]):
        _unary_block(code, xb[idx], out[idx], pc, ac, bc, 0, rows, 0, cols)


@njit(cache=True, error_model="numpy")
def unary_nd_backward(code, x, y, gout, dest, beta, p):
    """dest = gout * f'(x) + beta * dest, all of one shape (rank >= 2); ``x``
    any strides, the others C-contiguous."""
    if dest.size == 0:
        return
    bc, pc = _cast_like(dest, beta), _cast_like(dest, p)
    xb = np.broadcast_to(x, dest.shape)   # (the 2-D kernel's type for a strided x)
    rows, cols = dest.shape[-2], dest.shape[-1]
    for idx in np.ndindex(dest.shape[:-2]):
        _unary_backward_block(code, xb[idx], y[idx], gout[idx], dest[idx], bc, pc, 0, rows, 0,
                              cols)


@njit(cache=True, error_model="numpy")
def _offset(idx, shape):
    """The C-order offset, in an array of ``shape``, of the row that row
    ``idx`` (an index of every dim but the last) of a broadcast reads."""
    k = 0
    for d in range(len(idx)):
        k = k * shape[d] + (0 if shape[d] == 1 else idx[d])
    return k * shape[-1]


@njit(cache=True, error_model="numpy")
def binary_nd_backward(code, a, b, gout, da, beta_a, need_a, db, beta_b, need_b):
    """da = (gout * d/da summed over the dims ``a`` is broadcast along) +
    beta_a * da, db likewise, written only when ``need_a``/``need_b``: a, b
    as ``binary_nd`` reads them, ``gout`` the output's shape, ``da``/``db``
    C-contiguous of a's/b's shape. Each sum runs in float64 over gout's
    elements in C order, as the CUDA kernel and ``sum_to_nd`` add."""
    shape = gout.shape
    ab, bb = np.broadcast_to(a, shape), np.broadcast_to(b, shape)
    acc_a = np.zeros(da.size if need_a else 0, np.float64)
    acc_b = np.zeros(db.size if need_b else 0, np.float64)
    if gout.size:
        for idx in np.ndindex(shape[:-1]):
            ar, br, gr = ab[idx], bb[idx], gout[idx]
            if need_a:
                _add_grad(code, 0, ar, br, gr, acc_a, _offset(idx, da.shape), da.shape[-1] == 1)
            if need_b:
                _add_grad(code, 1, ar, br, gr, acc_b, _offset(idx, db.shape), db.shape[-1] == 1)
    if need_a:
        _finish(acc_a, da.reshape(-1), _cast_like(da, beta_a))
    if need_b:
        _finish(acc_b, db.reshape(-1), _cast_like(db, beta_b))


@njit(error_model="numpy", inline="always")
def _add_grad(code, which, ar, br, gr, acc, k, reduced):
    # One row of gout's contribution to a gradient (its row k of acc; one
    # element when the operand is broadcast along the last dim).
    if reduced:
        total = acc[k]
        for j in range(gr.size):
            total += gr[j] * (_binary_grad_a(code, ar[j], br[j]) if which == 0
                              else _binary_grad_b(code, ar[j], br[j]))
        acc[k] = total
    else:
        for j in range(gr.size):
            acc[k + j] += gr[j] * (_binary_grad_a(code, ar[j], br[j]) if which == 0
                                   else _binary_grad_b(code, ar[j], br[j]))


@njit(error_model="numpy", inline="always")
def _finish(acc, flat, beta):
    for k in range(flat.size):
        flat[k] = acc[k] if beta == 0 else acc[k] + beta * flat[k]

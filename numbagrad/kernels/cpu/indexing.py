"""CPU indexing kernels: placing an array on a lattice of another (slicing's
gradient, ``pad``, ``concatenate``), and selecting along one axis by integer
indices (``x[idx]``, ``gather``) with their scatter-add gradients.

The index kernels see 3-D (pre, axis, post) views of any strides; the
scatter-adds run serially in index order, the order of the CUDA kernels'
per-destination loops, so both devices give the same bits. An index outside
the axis (the ops check host indices first, and ``ng.compile``'s replays
check them again before any kernel: ``first_invalid``) reads as nan and adds
nothing. ``index_error`` is the one wording of a bad index, for the
host check and for the CUDA kernels' error flag alike.
"""
from __future__ import annotations

# the kernels this module registers
__all__ = ["gather", "gather_nd", "index_add", "index_add_nd", "index_select", "index_select_nd",
           "place_nd", "scatter_add", "scatter_add_nd"]

import numpy as np
from numba import njit

from ._threads import _cast_like

# what kernels.call may run (the rest are host helpers)


@njit(cache=True, error_model="numpy")
def first_out_of_range(index, low, high):
    """Position of the first value of the flat ``index`` outside [low, high), or -1."""
    for i in range(index.size):
        if index[i] < low or index[i] >= high:
            return i
    return -1


@njit(cache=True, error_model="numpy")
def first_invalid(index, low, high, exclude, allow):
    """Whether any value of ``index`` (any shape and layout) is invalid: outside
    [low, high) or equal to ``exclude``, unless it equals ``allow`` (pass
    ``exclude=high`` and ``allow=low`` for a plain range). A replay's check."""
    for v in index.flat:
        if (v < low or v >= high or v == exclude) and v != allow:
            return True
    return False


def index_error(op: str, index: np.ndarray, bad: int, low: int, high: int, axis: int,
                note: str = "") -> IndexError:
    """The IndexError for the flat element ``bad`` of host ``index`` lying
    outside [low, high) on ``axis`` (of size ``high``): the op, the value, its
    position and the valid range, then ``note``."""
    where = tuple(int(i) for i in np.unravel_index(bad, index.shape))
    return IndexError(f"{op}: index {index.reshape(-1)[bad]} is out of range for axis {axis} "
                      f"of size {high} (at position {where}); valid indices lie in "
                      f"[{low}, {high}){note}")


@njit(error_model="numpy", inline="always")
def _on_axis(c, start, step, count):
    """Whether index ``c`` of an axis is start + step * j for some 0 <= j < count."""
    off, s = c - start, step
    if s < 0:
        off, s = -off, -s
    return not (off < 0 or off % s != 0 or off // s >= count)


@njit(cache=True, error_model="numpy")
def place_nd(x, out, start, step, fill, beta, whole):
    """out[start + step * j] = x[j] + beta * out[...] for every index j of
    ``x`` (``out`` C-contiguous, of x's rank; ``start``/``step`` int64 per dim,
    a step may be negative). ``whole``: every other element of ``out`` becomes
    fill + beta * out, else it is left as it is. beta == 0 never reads out."""
    f, b = _cast_like(out, fill), _cast_like(out, beta)
    if out.ndim == 0:
        out[()] = x[()] if b == 0 else x[()] + b * out[()]
        return
    flat = out.reshape(-1)
    shape = out.shape
    if whole and flat.size:
        # on[o_d + i]: whether index i of dim d is on the lattice; a row of
        # the last dim is on it where every leading index is and its own is
        ends = np.cumsum(np.array(shape))
        on = np.empty(ends[-1], np.bool_)
        for d in range(out.ndim):
            for i in range(shape[d]):
                on[ends[d] - shape[d] + i] = _on_axis(i, start[d], step[d], x.shape[d])
        last, lo = shape[-1], ends[-1] - shape[-1]
        full_last = True     # every index of the last dim on the lattice
        for j in range(last):
            if not on[lo + j]:
                full_last = False
        row = 0
        for idx in np.ndindex(shape[:-1]):
            whole_row = False
            for d in range(out.ndim - 1):
                if not on[ends[d] - shape[d] + idx[d]]:
                    whole_row = True
            if whole_row:    # (a loop of its own: it vectorises)
                for j in range(last):
                    flat[row + j] = f if b == 0 else f + b * flat[row + j]
            elif not full_last:
                for j in range(last):
                    if not on[lo + j]:
                        flat[row + j] = f if b == 0 else f + b * flat[row + j]
            row += last
    if x.ndim == 1:
        _place_row(x, flat, start[0], step[0], b)
        return
    for idx in np.ndindex(x.shape[:-1]):   # a row of the last dim at a time
        k = 0
        for d in range(x.ndim - 1):
            k = k * shape[d] + start[d] + step[d] * idx[d]
        _place_row(x[idx], flat, k * shape[-1] + start[-1], step[-1], b)


@njit(error_model="numpy", inline="always")
def _place_row(row, flat, k, step, b):
    """flat[k + step * j] = row[j] + b * flat[...] (b == 0 never reads flat)."""
    if b == 0:
        for j in range(row.size):
            flat[k + step * j] = row[j]
    else:
        for j in range(row.size):
            flat[k + step * j] = row[j] + b * flat[k + step * j]


@njit(error_model="numpy", inline="always")
def _wrapped(r, n):
    """Index ``r`` into an axis of ``n`` with NumPy's negative indices, or -1 outside."""
    if r < 0:
        r += n
    return r if 0 <= r < n else -1


@njit(cache=True, error_model="numpy")
def index_select(x, index, out):
    """out[p, i, q] = x[p, index[i], q]: NumPy's ``x[..., index, ...]`` on one
    axis (negative indices count from the end)."""
    n = x.shape[1]
    for p in range(out.shape[0]):
        for i in range(out.shape[1]):
            r = _wrapped(index[i], n)
            for q in range(out.shape[2]):
                if r >= 0:     # (two statements: one expression would make an integer x float)
                    out[p, i, q] = x[p, r, q]
                else:
                    out[p, i, q] = np.nan


@njit(cache=True, error_model="numpy")
def index_add(g, index, dest, beta):
    """dest = beta * dest + (g[p, i, q] added into dest[p, index[i], q]), the
    gradient of ``index_select``: repeated indices accumulate, in order of i."""
    b = _cast_like(dest, beta)
    _scale(dest, b)
    n = dest.shape[1]
    for p in range(g.shape[0]):
        for i in range(g.shape[1]):
            r = _wrapped(index[i], n)
            if r >= 0:
                for q in range(g.shape[2]):
                    dest[p, r, q] += g[p, i, q]


@njit(error_model="numpy", inline="always")
def _scale(dest, b):
    for p in range(dest.shape[0]):
        for r in range(dest.shape[1]):
            for q in range(dest.shape[2]):
                dest[p, r, q] = 0.0 if b == 0 else b * dest[p, r, q]


@njit(cache=True, error_model="numpy")
def gather(x, index, out):
    """out[p, i, q] = x[p, index[p, i, q], q]: ``torch.gather`` on the middle axis."""
    n = x.shape[1]
    for p in range(out.shape[0]):
        for i in range(out.shape[1]):
            for q in range(out.shape[2]):
                r = index[p, i, q]
                if 0 <= r < n:
                    out[p, i, q] = x[p, r, q]
                else:
                    out[p, i, q] = np.nan


@njit(cache=True, error_model="numpy")
def scatter_add(g, index, dest, beta):
    """dest = beta * dest + (g[p, i, q] added into dest[p, index[p, i, q], q]),
    the gradient of ``gather``; repeated indices accumulate in order of i."""
    b = _cast_like(dest, beta)
    _scale(dest, b)
    n = dest.shape[1]
    for p in range(g.shape[0]):
        for i in range(g.shape[1]):
            for q in range(g.shape[2]):
                r = index[p, i, q]
                if 0 <= r < n:
                    dest[p, r, q] += g[p, i, q]


# ------------------------------------------- N-d forms (an array beside other keys)
@njit(cache=True, error_model="numpy")
def index_select_nd(x, index, out):
    """out[..., i] = x[..., index[i]] for ``x`` and ``out`` of one rank (>= 2),
    the indexed axis last (permuted views: any strides): ``x[key]`` for a view
    whose dims do not merge into (pre, axis, post)."""
    n = x.shape[-1]
    for idx in np.ndindex(out.shape[:-1]):
        xr, o = x[idx], out[idx]
        for i in range(o.size):
            r = _wrapped(index[i], n)
            if r >= 0:
                o[i] = xr[r]
            else:
                o[i] = np.nan


@njit(cache=True, error_model="numpy")
def index_add_nd(g, index, dest, start, step, axis, beta):
    """dest = beta * dest + g added at dest[start + step * j] with dest's
    ``axis`` at index[j[axis]]: the gradient of ``x[key]`` for a key with an
    array (on ``axis``) and integers or slices (the lattice ``start``/``step``
    per dim, 0 and 1 on ``axis``). ``g`` has dest's rank, any strides;
    ``dest`` C-contiguous. Repeated indices add up in order, as ``index_add``."""
    b = _cast_like(dest, beta)
    flat = dest.reshape(-1)
    for k in range(flat.size):
        flat[k] = 0.0 if b == 0 else b * flat[k]
    shape = dest.shape
    n = shape[axis]
    for idx in np.ndindex(g.shape):
        r = _wrapped(index[idx[axis]], n)
        if r < 0:
            continue
        k = 0
        for d in range(dest.ndim):
            k = k * shape[d] + (r if d == axis else start[d] + step[d] * idx[d])
        flat[k] += g[idx]


@njit(cache=True, error_model="numpy")
def gather_nd(x, index, out):
    """out[..., i] = x[..., index[..., i]] (``torch.gather`` with the axis
    last: permuted views, any strides, one rank >= 2; ``index`` and ``out``
    at most x's size off the axis), for a view that does not merge into
    (pre, axis, post)."""
    n = x.shape[-1]
    for idx in np.ndindex(out.shape[:-1]):
        xr, ir, o = x[idx], index[idx], out[idx]
        for i in range(o.size):
            r = ir[i]
            if 0 <= r < n:
                o[i] = xr[r]
            else:
                o[i] = np.nan


@njit(cache=True, error_model="numpy")
def scatter_add_nd(g, index, dest, beta):
    """dest = beta * dest + (g[..., i] added into dest[..., index[..., i]]), the
    gradient of ``gather_nd``, into the whole of ``dest`` (the axis last; ``g``
    and ``index`` may be smaller off it: the rest of dest gets no gradient).
    Repeated indices add up in order of i."""
    b = _cast_like(dest, beta)
    for idx in np.ndindex(dest.shape[:-1]):
        d = dest[idx]
        for j in range(d.size):
            d[j] = 0.0 if b == 0 else b * d[j]
    n = dest.shape[-1]
    for idx in np.ndindex(g.shape[:-1]):
        d, gr, ir = dest[idx], g[idx], index[idx]
        for i in range(gr.size):
            r = ir[i]
            if 0 <= r < n:
                d[r] += gr[i]

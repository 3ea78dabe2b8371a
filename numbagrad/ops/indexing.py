"""Indexing: ``x[key]`` (NumPy's basic indexing, and integer arrays as its
advanced indexing) and ``torch.gather``.

Basic indexing (integers, slices of any step, ``None``, ``Ellipsis``) is a
view (see ``ops/shape.py``: on CUDA a copy when the result is strided); its
gradient is written by one ``place_nd`` into the whole destination. An
integer array selects with ``index_select`` and its gradient scatter-adds
(``index_add``), so repeated indices accumulate: ``E[idx]`` is an embedding
lookup. Host indices are range-checked before anything runs (and a
compiled step, ``ng.compile``, checks the ones it is given later before any
kernel); a CUDA device array of indices is checked by the selecting kernel
itself, which sets an error flag that the op reads back once (a 4-byte copy)
and raises the same IndexError, so neither path reads or writes outside x.

Several integer arrays in one key (``x[i, j]``, ``x[:, i, j]``, ``x[i, :, j]``)
are broadcast together and placed as NumPy places them (first when a slice or
None separates them); the indexed dims are moved together and merged, so the
key becomes one array of flat indices on one dim (below) and the result's
dims are moved into place: a composition of differentiable ops.

One launch per forward and per gradient. An array index on a view whose
dims do not merge into (pre, axis, post) reads the view in place
(``index_select_nd``, the axis moved last in a view), and an array index
combined with other indexing (``x[0, idx]``, ``x[::2, idx]``) writes its
gradient into the whole destination in one ``index_add_nd``; a ``gather``
whose index is smaller than ``x`` off its axis reads and writes its corner
of ``x`` in place (``gather_nd``, ``scatter_add_nd``).
"""
from __future__ import annotations

import operator
from typing import Any

import numpy as np

from .. import buffers, kernels
from ..kernels.cpu.indexing import first_out_of_range, index_error
from ..tape import Node, _Backward
from ..tensor import Tensor
from ._common import (IndexDtypeError, alias, axis_of, copy_strided, describe, index_data,
                      kept_copy, ones, operand, permuted, reshaped, result)
from .shape import _view, _viewed, reshape
from .shape import permute as _permute


# ------------------------------------------------------------ helpers
def _collapse(shape: tuple, strides: tuple) -> int | None:
    """The stride of ``shape``'s dims merged into one, or None when they do not merge."""
    dims = [(n, s) for n, s in zip(shape, strides) if n != 1]
    for (_, s0), (n1, s1) in zip(dims, dims[1:]):
        if s0 != s1 * n1:
            return None
    return dims[-1][1] if dims else 0


def _merges(data: Any, a: int) -> bool:
    """Whether ``data``'s dims before ``a`` and those after it each merge into one."""
    shape, strides = tuple(data.shape), tuple(data.strides)
    return _collapse(shape[:a], strides[:a]) is not None and \
        _collapse(shape[a + 1:], strides[a + 1:]) is not None


def _moved(array: Any, a: int, b: int) -> Any:
    """A view of ``array`` with dim ``a`` moved to position ``b`` (the others in order)."""
    axes = [d for d in range(len(array.shape)) if d != a]
    axes.insert(b, a)
    return permuted(array, tuple(axes))


def _grouped(kern: Any, data: Any, a: int) -> Any:
    """``data`` as (prod(shape[:a]), shape[a], prod(shape[a+1:])): a view when
    its strides allow, else a C-contiguous copy (one ``expand_nd``)."""
    shape, strides = tuple(data.shape), tuple(data.strides)
    three = (int(np.prod(shape[:a])), shape[a], int(np.prod(shape[a + 1:])))
    pre, post = _collapse(shape[:a], strides[:a]), _collapse(shape[a + 1:], strides[a + 1:])
    if pre is None or post is None or 0 in shape:
        if 0 not in shape and not kern.is_c_contiguous(data):
            copy = buffers.take(kern, shape, data.dtype)
            copy_strided(kern, data, copy)
            data = copy
        return reshaped(data, three)
    if kern.name == "cpu":
        return data.reshape(three)   # the strides merge, so NumPy makes a view
    return kern.as_strided(data, three, (pre, strides[a], post), 0)


def _indices(kern: Any, index: Any, op: str, low: int, high: int, axis: int) -> tuple:
    """Integer indices as an int64 array on ``kern``'s device, keeping their
    shape, and the extra arguments of the selecting kernel's launch: none for
    host indices (checked here to lie in [low, high) first), (source, op,
    axis, low) for a CUDA device array, which that kernel checks itself."""
    index = index_data(index)
    if isinstance(index, Tensor):
        raise IndexDtypeError(f"{op}: indices must be integers (a NumPy integer array), got a "
                              f"{index.dtype} Tensor")
    if kern.name != "cpu" and kern.is_device_array(index):
        if index.dtype.kind not in "iu":
            raise IndexDtypeError(f"{op}: device indices must be a C-contiguous integer "
                                  f"array, got {index.dtype}")
        if not kern.is_c_contiguous(index):
            raise TypeError(f"{op}: device indices must be a C-contiguous integer array, "
                            f"got {index.dtype}")
        return index, (index, op, axis, low)
    host = np.asarray(index if not isinstance(index, list) or index else np.zeros(0, np.int64))
    if host.dtype.kind not in "iu" or host.dtype == np.bool_:
        raise IndexDtypeError(f"{op}: indices must be integers, got dtype {host.dtype}")
    bad = first_out_of_range(host.reshape(-1), low, high)
    if bad >= 0:
        raise index_error(op, host, bad, low, high, axis)
    checked = host if host.dtype == np.int64 and (kern.name != "cpu" or host.flags.c_contiguous) \
        else _as_int64(host)
    if kernels._observer is not None:
        _note_checked(checked, low, high)
    if kern.name == "cpu":     # (the backward reads them again: kept_copy)
        return kept_copy(checked, host), ()
    out = buffers.take(kern, host.shape, np.int64)
    kernels.call(kern, "upload", 0, checked, out)
    return out, ()


def _note_checked(host: np.ndarray, low: int, high: int, exclude: int | None = None,
                  allow: int | None = None) -> None:
    """Tell ``ng.compile``'s recorder (when one listens) that the op checked
    the host integers ``host``: each lies in [low, high) and is not
    ``exclude``, or is ``allow``. A replay reads a new argument's values
    without running the op, so it repeats the check before any kernel and
    runs a call that fails it eagerly (which raises the op's own error)."""
    note = getattr(kernels._observer, "checked", None)
    if note is not None:
        note(host, low, high, exclude, allow)


def _note_unreplayable(why: str, sources: tuple | None = None) -> None:
    """Tell ``ng.compile``'s recorder (when one listens) that the op used this
    call's host integers in a way no replay repeats (``why``): the step runs
    eagerly for this signature; with ``sources`` (the host arrays the op
    read), only when one of them is (or is a host copy of) an argument's
    data, since arrays ``fn`` makes itself are constants of the recording."""
    note = getattr(kernels._observer, "unreplayable", None)
    if note is not None:
        note(why, sources)


@kernels.host_copy
def _as_int64(host: np.ndarray) -> np.ndarray:
    """A C-contiguous int64 copy of host indices (``ng.compile`` records which
    argument such a copy came from)."""
    return np.ascontiguousarray(host, np.int64)


# ------------------------------------------------------------ x[key]
def _is_index_array(kern: Any, item: Any) -> bool:
    return isinstance(item, (list, np.ndarray)) or (kern.name != "cpu"
                                                    and kern.is_device_array(item))


def _parse(x: Tensor, key: Any) -> tuple:
    """(basic key, lattice (start, step, counts) per dim of x, the array's
    (x dim, dim in the basic view) or None, and whether its dims go first)."""
    key = key if isinstance(key, tuple) else (key,)
    if sum(item is Ellipsis for item in key) > 1:
        raise IndexError("x[key]: at most one Ellipsis (...) per key")
    for item in key:
        if isinstance(item, np.ndarray) and item.dtype == np.bool_:
            raise IndexDtypeError("x[key]: bool keys are not supported here: use integers, "
                                  "slices, None, ..., integer arrays, or a boolean mask alone "
                                  "(x[mask])")
        if isinstance(item, (bool, np.bool_, Tensor, float)):
            raise TypeError(f"x[key]: {type(item).__name__} keys are not supported here: use "
                            "integers, slices, None, ..., one integer array, or a boolean "
                            "mask alone (x[mask])")
    used = sum(item is not None and item is not Ellipsis for item in key)
    if used > x.ndim:
        raise IndexError(f"x[key]: too many indices ({used}) for a tensor of {describe(x)}")
    at = next((i for i, item in enumerate(key) if item is Ellipsis), len(key))
    full = key[:at] + (slice(None),) * (x.ndim - used) + key[at + 1:]
    basic, start, step, counts, advanced, array = [], [], [], [], [], None
    d = v = 0   # the dim of x and of the basic view
    for pos, item in enumerate(full):
        if item is None:
            basic.append(None)
            v += 1
            continue
        n = x.shape[d]
        if _is_index_array(x._kern, item):
            if array is not None:
                raise IndexError("x[key]: several integer arrays go through _several")
            array = (d, v, item)
            advanced.append(pos)
            item = slice(None)
        if isinstance(item, slice):
            first, stop, stride = item.indices(n)
            basic.append(item)
            start.append(first)
            step.append(stride)
            counts.append(len(range(first, stop, stride)))
            v += 1
        else:
            try:
                i = operator.index(item)
            except TypeError:
                raise TypeError(f"x[key]: cannot index with {item!r}") from None
            if not -n <= i < n:
                raise IndexError(f"x[key]: index {i} is out of range for axis {d} of size {n}")
            basic.append(i)
            start.append(i % n)
            step.append(1)
            counts.append(1)
            advanced.append(pos)
        d += 1
    first_dims = array is not None and advanced[-1] - advanced[0] != len(advanced) - 1
    lattice = (np.array(start, np.int64), np.array(step, np.int64), tuple(counts))
    return tuple(basic) + (Ellipsis,), lattice, array, first_dims


def _as_mask(key: Any) -> np.ndarray | None:
    """A boolean mask key (a bool NumPy array or tensor, or a list of bools)
    as a host array; None for any other key."""
    if isinstance(key, Tensor):
        return key.numpy() if key.dtype == np.bool_ else None
    if isinstance(key, np.ndarray):
        return key if key.dtype == np.bool_ else None
    if isinstance(key, list) and key:
        try:
            array = np.asarray(key)
        except (ValueError, TypeError):   # ragged, or not numbers: not a mask
            return None
        return array if array.dtype == np.bool_ else None
    return None


def _masked(x: Tensor, mask: np.ndarray, source: Any = None) -> Tensor:
    """``x[mask]``: the elements (or sub-arrays) where ``mask``, which covers
    x's leading dims, is True, in row-major order, as NumPy and PyTorch;
    differentiable (the gradient goes back to the selected places). A mask
    on "cuda" is read on the host first (one synchronisation, as PyTorch's)."""
    k = mask.ndim
    if k == 0 or mask.shape != x.shape[:k]:
        raise IndexError(f"x[mask]: a boolean mask of shape {mask.shape} does not match the "
                         f"leading dims of a tensor of {describe(x)}")
    flat = np.flatnonzero(mask)
    _note_unreplayable("x[mask] turns the mask into positions on the host",
                       (mask,) + (source if isinstance(source, tuple) else (source,)))
    rows = reshape(x, (int(np.prod(x.shape[:k], dtype=np.int64)),) + x.shape[k:])
    return getitem(rows, flat)


def getitem(x: Any, key: Any) -> Tensor:
    """``x[key]`` with NumPy's rules: integers, slices of any step, ``None``,
    ``...``, and integer arrays (NumPy integer arrays of any shape, lists,
    the int64 indices ``argmax``/``topk`` return, or on "cuda" Numba device
    arrays) as NumPy's advanced indexing: indices in [-n, n) for an axis of
    n, negative ones counting from the end, on the host and on the device
    alike (PyTorch's rule too); any other raises IndexError (a device array's
    once its kernel has run), float or bool arrays IndexDtypeError. Several
    arrays (``x[i, j]``, ``x[:, i, j]``, ``x[i, :, j]``) broadcast together,
    their dims placed as NumPy places them: where the first was when they
    are adjacent, else first (an int beside them counts as an array, as in
    NumPy, where PyTorch indexes with it first). Without an array it is a
    view (on CUDA a copy when strided); with arrays a new array, whose
    gradient adds repeated indices up, as ``nn.Embedding``'s does."""
    x = operand(x, "x[key]", ints=True)
    given = key
    key = tuple(map(index_data, key)) if isinstance(key, tuple) else index_data(key)
    mask = _as_mask(key)
    if mask is not None:
        return _masked(x, mask, given)
    if sum(_is_index_array(x._kern, item) for item in
           (key if isinstance(key, tuple) else (key,))) > 1:
        return _several(x, key)
    basic, lattice, array, first_dims = _parse(x, key)
    if array is None:
        return _viewed(x, lambda a: a[basic], _basic_backward, (lattice,))
    kern = x._kern
    d, v, index = array
    n = x.shape[d]
    index, check = _indices(kern, index, "x[key]", -n, n, d)
    view = _view(kern, x._data, lambda a: a[basic])
    vshape = tuple(view.shape)
    rest = vshape[:v] + vshape[v + 1:]
    shape = tuple(index.shape) + rest if first_dims else \
        vshape[:v] + tuple(index.shape) + vshape[v + 1:]
    out = buffers.take(kern, shape, x.dtype)
    m = int(np.prod(index.shape))
    flat = reshaped(index, (m,))
    if _merges(view, v) or 0 in vshape:
        kernels.call(kern, "index_select", out.size, _grouped(kern, view, v), flat,
                     _out3(kern, out, vshape, v, m, first_dims), *check)
    else:    # read the view in place, the indexed axis moved last in both
        last = len(vshape) - 1
        outv = _moved(reshaped(out, (m,) + rest), 0, last) if first_dims else \
            _moved(reshaped(out, vshape[:v] + (m,) + vshape[v + 1:]), v, last)
        kernels.call(kern, "index_select_nd", out.size, _moved(view, v, last), flat, outv,
                     *check)
    whole = view.shape == x.shape and all(b == slice(None) for b in basic[:-1])
    return result(out, kern, (x,), _select_backward,
                  (flat, shape, vshape, v, first_dims, None if whole else lattice, d))


def _host_index(kern: Any, item: Any, n: int, d: int) -> np.ndarray:
    """An integer key item (an int, list, NumPy or device array) as host int64
    indices in [0, n), each checked to lie in [-n, n) for dim ``d``."""
    if isinstance(item, (int, np.integer)):
        host = np.asarray(item)
    elif kern.name != "cpu" and kern.is_device_array(item):
        host = kernels.to_host(kern, item)
    else:
        host = np.asarray(item if not isinstance(item, list) or item else np.zeros(0, np.int64))
    if host.dtype.kind not in "iu" or host.dtype == np.bool_:
        raise IndexDtypeError(f"x[key]: index arrays must be integers, got dtype {host.dtype}")
    bad = first_out_of_range(np.ascontiguousarray(host).reshape(-1), -n, n)
    if bad >= 0:
        raise index_error("x[key]", host, bad, -n, n, d)
    return host.astype(np.int64) % max(n, 1)


def _several(x: Tensor, key: Any) -> Tensor:
    """``x[key]`` for a key with several integer arrays (ints among them
    count as 0-d arrays): NumPy's advanced indexing. The arrays broadcast
    together; their dims go where the first array was when they are
    adjacent in the key, else first. Every array is checked before anything
    runs; CUDA device arrays are read on the host for it (one copy each)."""
    key = key if isinstance(key, tuple) else (key,)
    if sum(item is Ellipsis for item in key) > 1:
        raise IndexError("x[key]: at most one Ellipsis (...) per key")
    used = sum(item is not None and item is not Ellipsis for item in key)
    if used > x.ndim:
        raise IndexError(f"x[key]: too many indices ({used}) for a tensor of {describe(x)}")
    at = next((i for i, item in enumerate(key) if item is Ellipsis), len(key))
    full = key[:at] + (slice(None),) * (x.ndim - used) + key[at + 1:]
    kern = x._kern
    arrays, others, places = [], [], []
    d = 0
    for pos, item in enumerate(full):
        if item is None or isinstance(item, slice):
            others.append(item)
            d += item is not None
            continue
        if isinstance(item, (bool, np.bool_)) or (isinstance(item, np.ndarray)
                                                  and item.dtype == np.bool_):
            raise IndexDtypeError("x[key]: boolean arrays cannot be combined with other "
                                  "integer arrays here; use a boolean mask alone (x[mask])")
        if not (_is_index_array(kern, item) or isinstance(item, (int, np.integer))):
            if isinstance(item, (Tensor, float)):
                raise IndexDtypeError(f"x[key]: index arrays must be integer arrays, got "
                                      f"{type(item).__name__}")
            raise TypeError(f"x[key]: cannot index with {item!r}")
        arrays.append((d, _host_index(kern, item, x.shape[d], d)))
        places.append(pos)
        d += 1
    try:
        shape = np.broadcast_shapes(*(h.shape for _, h in arrays))
    except ValueError:
        raise IndexError("x[key]: shape mismatch: the index arrays' shapes "
                         f"{[h.shape for _, h in arrays]} cannot be broadcast together") from None
    dims = [dd for dd, _ in arrays]
    rest = [dd for dd in range(x.ndim) if dd not in dims]
    flat = np.zeros(shape, np.int64)
    for dd, h in arrays:
        flat = flat * x.shape[dd] + h
    _note_unreplayable("x[key] with several index arrays combines them on the host",
                       tuple(item for item in full if _is_index_array(kern, item)))
    order = tuple(dims + rest)
    moved = x if order == tuple(range(x.ndim)) else _permute(x, *order)
    merged = reshape(moved, (int(np.prod([x.shape[dd] for dd in dims])),)
                     + tuple(x.shape[dd] for dd in rest))
    y = getitem(merged, (flat,) + tuple(others))
    if places[-1] - places[0] != len(places) - 1:
        return y     # separated: the index dims stay first, as NumPy's
    before = sum(1 for item in full[:places[0]] if item is None or isinstance(item, slice))
    k = len(shape)
    if before == 0 or k == 0:
        return y
    perm = tuple(range(k, k + before)) + tuple(range(k)) + tuple(range(k + before, y.ndim))
    return _permute(y, *perm)


def _out3(kern: Any, out: Any, vshape: tuple, v: int, m: int, first_dims: bool) -> Any:
    """The (pre, m, post) view of a C-contiguous selection ``out``; when the
    index dims come first, ``out`` is laid out (m, pre, post)."""
    pre, post = int(np.prod(vshape[:v])), int(np.prod(vshape[v + 1:]))
    if not first_dims:
        return reshaped(out, (pre, m, post))
    if kern.name == "cpu":
        return out.reshape(m, pre, post).transpose(1, 0, 2)
    size = out.dtype.itemsize
    return kern.as_strided(out, (pre, m, post), (post * size, pre * post * size, size), 0)


def _basic_backward(ctx: _Backward, node: Node, gout: Any) -> None:
    (x,) = node.inputs
    ((start, step, counts),) = node.saved
    kern = x._kern
    if gout is None:
        gout = ones(kern, counts, x._data.dtype)
    dest, beta = ctx.dest(x)
    # adding (beta 1) leaves the elements off the slice as they are: only the
    # first gradient into dest (beta 0) passes over the whole of it, so the
    # slices of an RNN's input projection cost O(T), not O(T^2)
    kernels.call(kern, "place_nd", dest.size, reshaped(gout, counts), dest, start, step, 0.0,
                 beta, beta == 0.0)


def _select_backward(ctx: _Backward, node: Node, gout: Any) -> None:
    (x,) = node.inputs
    flat, shape, vshape, v, first_dims, lattice, d = node.saved
    kern, dtype = x._kern, x._data.dtype
    if gout is None:
        gout = ones(kern, shape, dtype)
    dest, beta = ctx.dest(x)
    m = flat.shape[0]
    if lattice is None:   # the array indexed x itself: scatter straight into dest
        g3 = _out3(kern, gout, vshape, v, m, first_dims)
        kernels.call(kern, "index_add", dest.size, g3, flat, reshaped(dest, _three(vshape, v)),
                     beta)
        return
    # gout laid out over x's dims (the lattice's counts, m on the array's
    # dim d), added into the whole of dest at once
    start, step, counts = lattice
    if first_dims:
        g = _moved(reshaped(gout, (m,) + counts[:d] + counts[d + 1:]), 0, d)
    else:
        g = reshaped(gout, counts[:d] + (m,) + counts[d + 1:])
    kernels.call(kern, "index_add_nd", dest.size, g, flat, dest, start, step, d, beta)


def _three(shape: tuple, a: int) -> tuple:
    return (int(np.prod(shape[:a])), shape[a], int(np.prod(shape[a + 1:])))


# ------------------------------------------------------------ gather
def gather(x: Any, axis: int | None = None, index: Any = None, *, dim: int | None = None
           ) -> Tensor:
    """``torch.gather(x, axis, index)``: out[i][j][k] = x[i][index[i][j][k]][k]
    for axis 1 (likewise for any axis; Q(s, a) in RL). ``index`` holds
    integers in [0, x.shape[axis]) (a NumPy array, or on "cuda" a Numba device
    array), has x's rank and at most x's size along every other axis. Any
    other index, a negative one too (as ``torch.gather``), raises IndexError:
    host indices before anything runs, a device array's once its kernel has
    run (which reads nothing outside x). The gradient adds repeated indices up.
    ``dim=`` is PyTorch's name for ``axis``."""
    if dim is not None:
        axis = alias("gather", axis, "axis", dim, "dim")
    if axis is None or index is None:
        raise TypeError("gather(x, axis, index): both axis (or dim=) and index are needed")
    return _gather(x, axis, index, "gather")


def _gather(x: Any, axis: int, index: Any, op: str) -> Tensor:
    """``gather``, its errors naming ``op`` (``cross_entropy`` composes it)."""
    x = operand(x, op, ints=True)
    if x.ndim == 0:
        raise ValueError(f"{op}: needs a tensor of at least 1 dim, got {describe(x)}")
    a = axis_of(axis, x.ndim, op)
    kern = x._kern
    shape = tuple(np.shape(index)) if not (kern.name != "cpu" and kern.is_device_array(index)) \
        else tuple(index.shape)
    if len(shape) != x.ndim or any(m > n for d, (m, n) in enumerate(zip(shape, x.shape))
                                   if d != a):
        raise ValueError(f"{op}: index of shape {shape} does not fit a tensor of "
                         f"{describe(x)} along axis {a} (same rank, at most its size "
                         "along the other axes)")
    index, check = _indices(kern, index, op, 0, x.shape[a], a)
    part = tuple(slice(None) if d == a else slice(0, m) for d, m in enumerate(shape))
    whole = all(m == n for d, (m, n) in enumerate(zip(shape, x.shape)) if d != a)
    view = x._data if whole else _view(kern, x._data, lambda t: t[part])
    out = buffers.take(kern, shape, x.dtype)
    idx3 = reshaped(index, _three(shape, a))
    if whole and (_merges(view, a) or 0 in shape):
        kernels.call(kern, "gather", out.size, _grouped(kern, view, a), idx3,
                     reshaped(out, _three(shape, a)), *check[:3])
    else:    # read x in place, the axis moved last (a smaller index reads a corner of x)
        last = x.ndim - 1
        kernels.call(kern, "gather_nd", out.size, _moved(x._data, a, last),
                     _moved(index, a, last), _moved(out, a, last), *check[:3])
    saved = (idx3, tuple(view.shape), a, None if whole else index)
    return result(out, kern, (x,), _gather_backward, saved)


def _gather_backward(ctx: _Backward, node: Node, gout: Any) -> None:
    (x,) = node.inputs
    idx3, vshape, a, index = node.saved
    kern, dtype = x._kern, x._data.dtype
    if gout is None:
        gout = ones(kern, tuple(idx3.shape), dtype)
    dest, beta = ctx.dest(x)
    if index is None:
        kernels.call(kern, "scatter_add", dest.size, reshaped(gout, tuple(idx3.shape)), idx3,
                     reshaped(dest, _three(vshape, a)), beta)
        return
    # a smaller index: its corner of dest gets the gradient, the rest none, in one kernel
    last = len(vshape) - 1
    kernels.call(kern, "scatter_add_nd", dest.size, _moved(reshaped(gout, tuple(index.shape)), a,
                                                           last),
                 _moved(index, a, last), _moved(dest, a, last), beta)

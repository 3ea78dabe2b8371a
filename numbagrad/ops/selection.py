"""Writing at indices and selecting by pattern: ``scatter``, ``scatter_add``,
``scatter_reduce`` (PyTorch's, with its gradients), ``masked_select`` and
``unfold`` (Tensor.unfold's windows).

The scatters are made of one primitive, ``_scattered`` (values folded into
a zero tensor at their indices along one dim; gradient: ``gather``), and
differentiable ops (``where``, +, *, /). ``amax``/``amin``/``prod`` take
their values from one ``scatter_reduce_nd`` kernel and their gradient
from a surrogate (x * w_self + _scattered(src * w_src)) whose weights are
PyTorch's: ties share evenly, a product's gradient is the product of the
others (exact with zeros). ``masked_select`` and ``unfold`` are indexing
(``x[mask]``, ``x[..., windows, ...]``), so repeated elements accumulate.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import _dtypes, buffers, kernels
from ..kernels.cpu.indexing import first_out_of_range, index_error
from ..kernels.cpu.scatter import ASSIGN, MAXIMUM, MINIMUM, MULTIPLY
from ..tape import Node, _Backward
from ..tensor import Tensor
from . import creation, indexing, masks, shape
from ._common import (IndexDtypeError, axis_of, broadcast_shape, copy_strided, describe,
                      index_data, ones, operand, permuted, reshaped, result, scalar_of)

_REDUCES = ("sum", "prod", "mean", "amax", "amin")


# ------------------------------------------------------------ the primitive
def _moved_last(array: Any, a: int) -> Any:
    """``array`` (rank >= 1) with a leading size-1 dim when of rank 1, and its
    dim ``a`` moved last: the layout of the ``*_nd`` kernels."""
    if len(array.shape) == 1:
        array, a = reshaped(array, (1,) + tuple(array.shape)), a + 1
    rank = len(array.shape)
    return permuted(array, tuple(d for d in range(rank) if d != a) + (a,))


def _scattered(values: Tensor, out_shape: tuple, a: int, idx: Any, mode: int | None) -> Tensor:
    """A zero tensor of ``out_shape`` with ``values`` folded in at ``idx`` along
    dim ``a`` (None: added; else a ``scatter_reduce_nd`` mode); its
    gradient is ``gather(gout, a, idx)``, the values' places."""
    kern = values._kern
    out = buffers.take(kern, out_shape, values._data.dtype)
    v, i, o = (_moved_last(t, a) for t in (values._data, idx, out))
    if mode is None:
        kernels.call(kern, "scatter_add_nd", out.size, v, i, o, scalar_of(out.dtype, 0.0))
    else:
        kernels.call(kern, "fill", 0, out, 0.0)
        kernels.call(kern, "scatter_reduce_nd", out.size, v, i, o, mode)
    return result(out, kern, (values,), _scattered_backward, (a, idx, out_shape))


def _scattered_backward(ctx: _Backward, node: Node, gout: Any) -> None:
    (values,) = node.inputs
    a, idx, out_shape = node.saved
    kern = values._kern
    g = ones(kern, out_shape, values._data.dtype) if gout is None else gout
    dest, beta = ctx.dest(values)
    work = dest if beta == 0 else buffers.take(kern, dest.shape, dest.dtype)
    kernels.call(kern, "gather_nd", work.size, _moved_last(g, a), _moved_last(idx, a),
                 _moved_last(work, a))
    if beta != 0:
        copy_strided(kern, work, dest, scalar_of(dest.dtype, 1.0), scalar_of(dest.dtype, beta))


def _valued(data: Any, kern: Any, surrogate: Tensor) -> Tensor:
    """A tensor holding ``data`` whose gradient goes to ``surrogate`` unchanged."""
    return result(data, kern, (surrogate,), _valued_backward)


def _valued_backward(ctx: _Backward, node: Node, gout: Any) -> None:
    (s,) = node.inputs
    kern, dtype = s._kern, s._data.dtype
    g = ones(kern, tuple(s.shape), dtype) if gout is None else gout
    dest, beta = ctx.dest(s)
    copy_strided(kern, g, dest, scalar_of(dtype, 1.0), scalar_of(dtype, beta))


# ------------------------------------------------------------ arguments
def _prepare(x: Any, dim: Any, index: Any, src: Any, op: str) -> tuple:
    """(x, dim, checked int64 indices, src cut to the index's shape, whether a
    dim was hit) after PyTorch's checks: index of x's rank, at most src's
    size along every dim and x's along the others, values in [0, n). The
    scatter ops compute in floats: an integer or bool input is refused (it
    became float64, which rounds int64 values past 2**53)."""
    if isinstance(x, (Tensor, np.ndarray)) and not _dtypes.is_float(x.dtype):
        raise TypeError(f"{op}: the input is an {x.dtype} tensor (shape {x.shape}); the scatter "
                        f"ops take float tensors here (PyTorch also takes integers): convert "
                        f"it with .double() (exact up to 2**53) or .float()")
    x = operand(x, op)
    index = index_data(index)     # an int64 tensor indexes as its array does
    if x.ndim == 0:
        raise ValueError(f"{op}: needs a tensor of at least 1 dim, got {describe(x)}")
    a = axis_of(dim, x.ndim, op, "dim")
    kern = x._kern
    device_index = kern.name != "cpu" and kern.is_device_array(index)
    if isinstance(index, Tensor):
        raise IndexDtypeError(f"{op}: index must be an integer array (as argmax returns), got "
                              f"a {index.dtype} Tensor")
    ishape = tuple(index.shape) if device_index else tuple(np.shape(index))
    if isinstance(src, Tensor):
        if src._kern is not kern or src.dtype != x.dtype:
            raise ValueError(f"{op}: src ({describe(src)}) must have the dtype and device of "
                             f"the input ({describe(x)})")
    else:
        if isinstance(src, (np.ndarray, list)) or (kern.name != "cpu"
                                                   and kern.is_device_array(src)):
            src = operand(src, op, "src")
        else:     # a scalar value: the index's shape of it
            src = creation.full(ishape, float(src), dtype=x.dtype, device=x.device)
    if len(ishape) != x.ndim or src.ndim != x.ndim or any(
            m > s or (d != a and m > n)
            for d, (m, s, n) in enumerate(zip(ishape, src.shape, x.shape))):
        raise ValueError(f"{op}: index of shape {ishape} does not fit src of shape "
                         f"{tuple(src.shape)} and input of {describe(x)} along dim {a} (one "
                         "rank, at most src's size on every dim and the input's off dim)")
    idx, check = indexing._indices(kern, index, op, 0, x.shape[a], a)
    if check:     # device indices: read back and checked before anything is written
        host = kernels.to_host(kern, idx).reshape(-1)
        bad = first_out_of_range(host, 0, x.shape[a])
        if bad >= 0:
            raise index_error(op, host.reshape(ishape), bad, 0, x.shape[a], a)
    if tuple(src.shape) != ishape:
        src = src[tuple(slice(0, m) for m in ishape)]
    return x, a, idx, src


def _counts(x: Tensor, a: int, idx: Any, ishape: tuple) -> tuple[Tensor, Tensor]:
    """(how many values land on each element of x, as x's dtype; whether any)."""
    one = Tensor(ones(x._kern, ishape, x._data.dtype), x._kern)
    count = _scattered(one, tuple(x.shape), a, idx, None)
    return count, masks.gt(count, 0.0)


# ------------------------------------------------------------ the ops
def scatter_add(x: Any, dim: int, index: Any, src: Any) -> Tensor:
    """x with ``src`` added at ``index`` along ``dim``, as ``torch.scatter_add``
    (out[i][index[i][j]] += src[i][j] for dim 1): repeated indices add up.
    ``index`` is an integer array of x's rank (NumPy, or as ``argmax``
    returns), at most src's size on every dim and x's off ``dim``, with
    values in [0, x.shape[dim]) (else IndexError, before anything is
    written). Gradients: x's passes through, src's is gout gathered."""
    x, a, idx, src = _prepare(x, dim, index, src, "scatter_add")
    return x + _scattered(src, tuple(x.shape), a, idx, None)


def scatter(x: Any, dim: int, index: Any, src: Any = None, *, value: Any = None,
            reduce: str | None = None) -> Tensor:
    """x with ``src`` (a tensor, or a number ``value``) written at ``index``
    along ``dim``, as ``torch.scatter``: among repeated indices the last
    written wins (PyTorch leaves that unspecified). The gradient of x is 0
    where written; src's is gout gathered at its index (every repeat, as
    PyTorch's). ``reduce="add"``/``"multiply"`` are ``scatter_reduce``'s
    "sum"/"prod" with include_self. Index rules: ``scatter_add``."""
    op = "scatter"
    if (src is None) == (value is None):
        raise TypeError(f"{op}: pass exactly one of src and value")
    if reduce is not None:
        if reduce not in ("add", "multiply"):
            raise ValueError(f"{op}: reduce must be 'add' or 'multiply', got {reduce!r}")
        return scatter_reduce(x, dim, index, value if src is None else src,
                              "sum" if reduce == "add" else "prod")
    x, a, idx, src = _prepare(x, dim, index, value if src is None else src, op)
    _, hit = _counts(x, a, idx, tuple(src.shape))
    return masks.where(hit, _scattered(src, tuple(x.shape), a, idx, ASSIGN), x)


def scatter_reduce(x: Any, dim: int, index: Any, src: Any, reduce: str, *,
                   include_self: bool = True) -> Tensor:
    """x with ``src`` reduced into it at ``index`` along ``dim``, as
    ``torch.scatter_reduce``: ``reduce`` is "sum", "prod", "mean", "amax" or
    "amin", over the values landing on each element and, with
    ``include_self``, the element itself (an element nothing lands on stays
    as it is). Gradients are PyTorch's: "mean" divides by the count; "prod"
    gives each factor the product of the others (exact with zeros);
    "amax"/"amin" share evenly among the values equal to the result
    (counting x's element even without ``include_self``, as PyTorch does,
    though it then gets none). Index rules: ``scatter_add``."""
    op = "scatter_reduce"
    if reduce not in _REDUCES:
        raise ValueError(f"{op}: reduce must be one of {_REDUCES}, got {reduce!r}")
    if not isinstance(include_self, (bool, np.bool_)):
        raise TypeError(f"{op}: include_self must be a bool, got {include_self!r}")
    x, a, idx, src = _prepare(x, dim, index, src, op)
    out_shape = tuple(x.shape)
    count, hit = _counts(x, a, idx, tuple(src.shape))
    if reduce == "sum":
        total = _scattered(src, out_shape, a, idx, None)
        return x + total if include_self else masks.where(hit, total, x)
    if reduce == "mean":
        total = _scattered(src, out_shape, a, idx, None)
        if include_self:
            return (x + total) / (count + 1.0)
        return masks.where(hit, total / masks.where(hit, count, 1.0), x)
    return _extreme_or_product(x, a, idx, src, reduce, include_self, hit)


def _folded(start: Tensor, values: Tensor, a: int, idx: Any, mode: int) -> Tensor:
    """A detached copy of ``start`` with ``values`` folded in (``mode``)."""
    kern = start._kern
    out = buffers.take(kern, tuple(start.shape), start._data.dtype)
    copy_strided(kern, start._data, out)
    kernels.call(kern, "scatter_reduce_nd", out.size, _moved_last(values._data, a),
                 _moved_last(idx, a), _moved_last(out, a), mode)
    return Tensor(out, kern)


def _extreme_or_product(x: Tensor, a: int, idx: Any, src: Tensor, reduce: str,
                        include_self: bool, hit: Tensor) -> Tensor:
    """scatter_reduce's "prod", "amax" and "amin": the values of one kernel,
    the gradient of a surrogate with PyTorch's weights (module docstring)."""
    xd, sd = x.detach(), src.detach()
    mode = {"prod": MULTIPLY, "amax": MAXIMUM, "amin": MINIMUM}[reduce]
    identity = {"prod": 1.0, "amax": -math.inf, "amin": math.inf}[reduce]
    first = xd if include_self else masks.where(hit, identity, xd)
    r = _folded(first, sd, a, idx, mode)

    def gathered(t: Tensor) -> Tensor:
        return indexing._gather(t, a, idx, "scatter_reduce")

    if reduce == "prod":
        zero = masks.eq(sd, 0.0)
        one = creation.ones_like(xd)
        w_self = _folded(one, sd, a, idx, MULTIPLY) if include_self else \
            masks.where(hit, 0.0, one)
        unzeroed = masks.where(zero, 1.0, sd)
        others = _folded(xd if include_self else one, unzeroed, a, idx, MULTIPLY)
        zeros = _scattered(masks.astype(zero, x.dtype), tuple(x.shape), a, idx, None).detach()
        w_src = masks.where(zero, masks.where(masks.eq(gathered(zeros), 1.0), gathered(others),
                                              0.0), gathered(r) / unzeroed)
    else:
        on_self = masks.astype(masks.eq(xd, r), x.dtype)
        on_src = masks.astype(masks.eq(sd, gathered(r)), x.dtype)
        ties = on_self + _scattered(on_src, tuple(x.shape), a, idx, None).detach()
        ties = masks.where(masks.eq(ties, 0.0), 1.0, ties)
        w_self = on_self / ties if include_self else masks.where(hit, 0.0, on_self / ties)
        w_src = on_src / gathered(ties)
    surrogate = x * w_self + _scattered(src * w_src, tuple(x.shape), a, idx, None)
    return _valued(r._data, x._kern, surrogate)


# ------------------------------------------------------------ masked_select / unfold
def masked_select(x: Any, mask: Any) -> Tensor:
    """The elements of ``x`` where the boolean ``mask`` is True, as a 1-d
    tensor in row-major order: ``torch.masked_select`` (x and mask broadcast
    together). A mask on "cuda" is read on the host (one synchronisation,
    as PyTorch's); the gradient goes back to the selected elements."""
    op = "masked_select"
    x = operand(x, op, ints=True)
    if isinstance(mask, Tensor):
        if mask.dtype != np.bool_:
            raise IndexDtypeError(f"{op}: mask must be boolean, got a tensor of {describe(mask)}")
        host = mask.numpy()
    else:
        host = kernels.to_host(x._kern, mask) if (x._kern.name != "cpu" and
                                                  x._kern.is_device_array(mask)) \
            else np.asarray(mask)
        if host.dtype != np.bool_:
            raise IndexDtypeError(f"{op}: mask must be boolean, got dtype {host.dtype}")
    full = broadcast_shape(tuple(x.shape), host.shape, op)
    xb = x if tuple(x.shape) == full else shape.broadcast_to(x, full)
    flat = shape.reshape(xb, (math.prod(full),))
    indexing._note_unreplayable("masked_select turns the mask into positions on the host",
                                (host, mask))
    return indexing.getitem(flat, np.flatnonzero(np.broadcast_to(host, full)))


def unfold(x: Any, dimension: int, size: int, step: int) -> Tensor:
    """Every window of ``size`` elements along ``dimension``, ``step`` apart,
    as ``Tensor.unfold``: that dim becomes the number of windows,
    (n - size) // step + 1, and a new last dim of ``size`` holds each
    window. A gather of the windows' indices (a copy, where PyTorch's is a
    strided view); overlapping windows add their gradients up."""
    op = "unfold"
    x = operand(x, op, ints=True)
    for name, v in (("size", size), ("step", step)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
            raise TypeError(f"{op}: {name} must be an int, got {v!r}")
    if x.ndim == 0:
        axis_of(dimension, 1, op, "dimension")
        x, a = shape.reshape(x, (1,)), 0
        squeeze = True
    else:
        a, squeeze = axis_of(dimension, x.ndim, op, "dimension"), False
    n = x.shape[a]
    if step <= 0 or size < 0 or size > n:
        raise ValueError(f"{op}: size {size} must be in [0, {n}] (dim {a} of {describe(x)}) "
                         f"and step {step} positive")
    windows = (n - size) // step + 1
    starts = np.arange(windows, dtype=np.int64)[:, None] * step
    idx = starts + np.arange(size, dtype=np.int64)[None, :]
    y = indexing.getitem(x, (slice(None),) * a + (idx,))
    if squeeze:
        return shape.reshape(y, (size,))
    order = tuple(d for d in range(y.ndim) if d != a + 1) + (a + 1,)
    return shape.permute(y, *order)

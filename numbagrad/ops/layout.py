"""Ops that rearrange, repeat or mask elements: ``flip``, ``roll``, ``tril``,
``triu``, ``masked_fill``, ``chunk``, ``unflatten``, ``repeat``, ``tile``,
``repeat_interleave``, ``diagonal``, ``diag``, ``meshgrid``.

Each is built from ops that have kernels and backwards on every device
(views and slices, ``cat``, ``pad``, ``reshape``, ``broadcast_to``,
``where``, one-axis integer indexing), so each is differentiable wherever
those are, on the tape and under ``ng.compile``, and adds no kernel. The
masks of ``tril``/``triu`` are made on the host and uploaded once per call.
Arguments follow PyTorch (``dims``, ``diagonal``, ``Tensor.repeat``'s
sizes); where NumPy differs the docstring says so.
"""
from __future__ import annotations

import numbers
import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import kernels
from ..tensor import Tensor
from ._common import axis_of, describe, int_value, is_scalar, operand
from .indexing import _note_unreplayable, getitem
from .join import cat, pad, split
from .masks import where
from .shape import broadcast_to, permute, reshape


def _ints(value: Any, op: str, what: str) -> tuple[int, ...]:
    """An int or a sequence of ints, as a tuple (TypeError naming ``op``)."""
    items = value if isinstance(value, (Sequence, np.ndarray)) else (value,)
    try:
        if any(isinstance(v, (bool, np.bool_)) for v in items):
            raise TypeError
        return tuple(operator.index(v) for v in items)
    except TypeError:
        raise TypeError(f"{op}: {what} must be an int or a sequence of ints, got "
                        f"{value!r}") from None


def _axes(dims: Any, ndim: int, op: str) -> tuple[int, ...]:
    axes = tuple(axis_of(d, ndim, op, "dim") for d in _ints(dims, op, "dims"))
    if len(set(axes)) != len(axes):
        raise ValueError(f"{op}: dims {dims!r} name a dim twice")
    return axes


def flip(x: Any, dims: Any) -> Tensor:
    """``x`` reversed along each of ``dims`` (``torch.flip``; NumPy's
    ``np.flip`` also takes no axis, meaning all). A view's copy."""
    x = operand(x, "flip", ints=True)
    axes = _axes(dims, x.ndim, "flip")
    return getitem(x, tuple(slice(None, None, -1) if d in axes else slice(None)
                            for d in range(x.ndim)))


def roll(x: Any, shifts: Any, dims: Any = None) -> Tensor:
    """Elements shifted by ``shifts`` along ``dims``, wrapping around
    (``torch.roll``); without ``dims`` the flattened tensor is rolled and
    reshaped back."""
    x = operand(x, "roll", ints=True)
    steps = _ints(shifts, "roll", "shifts")
    if dims is None:
        if len(steps) != 1:
            raise ValueError(f"roll: without dims, shifts must be one int, got {shifts!r}")
        return reshape(roll(reshape(x, (x.size,)), steps, 0), x.shape)
    axes = _axes(dims, x.ndim, "roll")
    if len(axes) != len(steps):
        raise ValueError(f"roll: shifts {shifts!r} and dims {dims!r} differ in length")
    for s, a in zip(steps, axes):
        n = x.shape[a]
        k = s % n if n else 0
        if k:
            lead = (slice(None),) * a
            x = cat([getitem(x, lead + (slice(n - k, None),)),
                     getitem(x, lead + (slice(0, n - k),))], a)
    return x


def _band(x: Tensor, k: int, lower: bool, op: str) -> Tensor:
    if x.ndim < 2:
        raise ValueError(f"{op}: needs a tensor of at least 2 dims, got {describe(x)}")
    try:
        k = operator.index(k)
    except TypeError:
        raise TypeError(f"{op}: diagonal must be an int, got {k!r}") from None
    n, m = x.shape[-2:]
    keep = np.tri(n, m, k, dtype=np.bool_) if lower else ~np.tri(n, m, k - 1, dtype=np.bool_)
    mask = Tensor(kernels.from_host(x._kern, keep), x._kern)
    return where(mask, x, x.dtype.type(0))     # (a zero of x's dtype: ints stay ints)


def tril(x: Any, diagonal: int = 0) -> Tensor:
    """The lower triangle of the last two dims: elements with j - i <=
    ``diagonal`` kept, the rest 0 (``torch.tril``; gradient 0 there)."""
    return _band(operand(x, "tril", ints=True), diagonal, True, "tril")


def triu(x: Any, diagonal: int = 0) -> Tensor:
    """The upper triangle: elements with j - i >= ``diagonal`` kept
    (``torch.triu``)."""
    return _band(operand(x, "triu", ints=True), diagonal, False, "triu")


def masked_fill(x: Any, mask: Any, value: float) -> Tensor:
    """``value`` where the boolean ``mask`` (broadcast to x) holds, else x
    (``torch.masked_fill``: the filled places get no gradient; ``value`` is
    cast to an integer x's dtype). ``mask`` is
    a boolean tensor or a host boolean array (uploaded to x's device).
    Unlike PyTorch's, the result may broadcast beyond x's shape, as
    ``where``'s does."""
    x = operand(x, "masked_fill", ints=True)
    if isinstance(mask, np.ndarray) and mask.dtype == np.bool_ and x.device != "cpu":
        mask = Tensor(kernels.from_host(x._kern, np.ascontiguousarray(mask)), x._kern)
    if x.dtype.kind in "biu" and is_scalar(value):     # x's dtype, as PyTorch's
        value = int_value(value, x.dtype, "masked_fill", wrap=False) \
            if isinstance(value, numbers.Integral) else x.dtype.type(value)
    return where(mask, value, x)


def chunk(x: Any, chunks: int, dim: int = 0) -> list[Tensor]:
    """``x`` cut along ``dim`` into parts of ceil(n / chunks) elements, the
    last smaller, and fewer than ``chunks`` parts where they run out
    (``torch.chunk``; ``np.array_split`` balances the sizes instead)."""
    x = operand(x, "chunk", ints=True)
    (parts,) = _ints(chunks, "chunk", "chunks")
    if parts <= 0:
        raise ValueError(f"chunk: chunks must be > 0, got {parts}")
    if x.ndim == 0:
        raise ValueError("chunk: a 0-d tensor cannot be chunked")
    a = axis_of(dim, x.ndim, "chunk", "dim")
    n = x.shape[a]
    if not n:    # as many empty parts as asked for, as torch's
        return [x] + [getitem(x, (slice(None),) * a + (slice(0, 0),)) for _ in range(parts - 1)]
    size = -(-n // parts)
    return split(x, list(range(size, n, size)), a)


def unflatten(x: Any, dim: int, sizes: Any) -> Tensor:
    """Dim ``dim`` split into ``sizes`` (one may be -1), as ``torch.unflatten``."""
    x = operand(x, "unflatten", ints=True)
    a = axis_of(dim, x.ndim, "unflatten", "dim")
    shape = _ints(sizes, "unflatten", "sizes")
    return reshape(x, x.shape[:a] + shape + x.shape[a + 1:])


def repeat(x: Any, *sizes: Any) -> Tensor:
    """``x`` repeated ``sizes[i]`` times along each dim (``Tensor.repeat``,
    which is ``np.tile``; NumPy's ``np.repeat`` is ``repeat_interleave``).
    ``sizes`` may have more entries than x has dims (new leading dims),
    not fewer."""
    x = operand(x, "repeat", ints=True)
    reps = _ints(sizes[0] if len(sizes) == 1 else sizes, "repeat", "sizes")
    if len(reps) < x.ndim:
        raise ValueError(f"repeat: {len(reps)} sizes for a tensor of {x.ndim} dims "
                         f"(give at least one per dim)")
    if any(r < 0 for r in reps):
        raise ValueError(f"repeat: sizes must be >= 0, got {reps}")
    shape = (1,) * (len(reps) - x.ndim) + x.shape
    # (1, n0, 1, n1, ...) broadcast to (r0, n0, r1, n1, ...), then merged
    spread = reshape(x, tuple(v for n in shape for v in (1, n)))
    wide = broadcast_to(spread, tuple(v for r, n in zip(reps, shape) for v in (r, n)))
    return reshape(wide, tuple(r * n for r, n in zip(reps, shape)))


def tile(x: Any, dims: Any) -> Tensor:
    """``torch.tile``: ``repeat`` with ``dims`` padded by leading ones to x's
    rank."""
    x = operand(x, "tile", ints=True)
    reps = _ints(dims, "tile", "dims")
    return repeat(x, (1,) * (x.ndim - len(reps)) + reps)


def repeat_interleave(x: Any, repeats: Any, dim: int | None = None) -> Tensor:
    """Each element repeated ``repeats`` times along ``dim`` in place
    (``torch.repeat_interleave``, NumPy's ``np.repeat``); ``repeats`` an
    int or one int per element of the dim; without ``dim`` x is flattened
    first."""
    x = operand(x, "repeat_interleave", ints=True)
    if dim is None:
        x, dim = reshape(x, (x.size,)), 0
    a = axis_of(dim, x.ndim, "repeat_interleave", "dim")
    n = x.shape[a]
    given = repeats
    if isinstance(repeats, Tensor) and repeats.dtype.kind in "iu":
        # an int64 tensor of counts (0-d: one count), as torch's
        repeats = int(repeats.item()) if repeats.shape == () else repeats.numpy()
    counts = _ints(repeats, "repeat_interleave", "repeats")
    if any(c < 0 for c in counts):
        raise ValueError(f"repeat_interleave: repeats must be >= 0, got {repeats!r}")
    if len(counts) == 1 and not isinstance(repeats, (Sequence, np.ndarray)):
        r = counts[0]
        spread = reshape(x, x.shape[:a + 1] + (1,) + x.shape[a + 1:])
        wide = broadcast_to(spread, x.shape[:a + 1] + (r,) + x.shape[a + 1:])
        return reshape(wide, x.shape[:a] + (n * r,) + x.shape[a + 1:])
    if len(counts) == 1 and n != 1:
        counts = counts * n           # one count for every element, as torch's
    if len(counts) != n:
        raise ValueError(f"repeat_interleave: {len(counts)} repeats for dim {a} of size {n}")
    index = np.repeat(np.arange(n, dtype=np.int64), counts)
    _note_unreplayable("repeat_interleave turns per-element repeats into positions on the host",
                       (repeats, given))
    return getitem(x, (slice(None),) * a + (index,))


def diagonal(x: Any, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
    """The diagonal of dims ``dim1`` and ``dim2`` (above it for ``offset`` >
    0), as the last dim of the result (``torch.diagonal``, ``np.diagonal``);
    a copy, not a view."""
    x = operand(x, "diagonal", ints=True)
    if x.ndim < 2:
        raise ValueError(f"diagonal: needs a tensor of at least 2 dims, got {describe(x)}")
    a = axis_of(dim1, x.ndim, "diagonal", "dim1")
    b = axis_of(dim2, x.ndim, "diagonal", "dim2")
    if a == b:
        raise ValueError(f"diagonal: dim1 and dim2 are both dim {a}")
    (k,) = _ints(offset, "diagonal", "offset")
    rest = [d for d in range(x.ndim) if d not in (a, b)]
    lead = (slice(None),) * len(rest)
    y = getitem(permute(x, *rest, a, b),
                lead + ((slice(None), slice(k, None)) if k >= 0 else (slice(-k, None),)))
    n, m = y.shape[-2:]
    # flattened, the diagonal is every (m + 1)-th element from the first
    flat = reshape(y, y.shape[:-2] + (n * m,))
    return getitem(flat, lead + (slice(0, min(n, m) * (m + 1), m + 1),))


_diagonal = diagonal


def diag(x: Any, diagonal: int = 0) -> Tensor:
    """``torch.diag``: a 1-D x gives the square matrix with x on its
    ``diagonal``-th diagonal (0 elsewhere); a 2-D x gives that diagonal."""
    x = operand(x, "diag", ints=True)
    (k,) = _ints(diagonal, "diag", "diagonal")
    if x.ndim == 2:
        return _diagonal(x, k)
    if x.ndim != 1:
        raise ValueError(f"diag: needs a 1-D or 2-D tensor, got {describe(x)}")
    n = x.shape[0]
    # (n, 1) padded to (n, n + 1) and flattened puts x[i] at i (n + 1): the diagonal
    rows = pad(reshape(x, (n, 1)), ((0, 0), (0, n)))
    square = reshape(getitem(reshape(rows, (n * (n + 1),)), slice(0, n * n)), (n, n))
    if k == 0:
        return square
    return pad(square, ((0, k), (k, 0)) if k > 0 else ((-k, 0), (0, -k)))


def meshgrid(*tensors: Any, indexing: str = "ij") -> list[Tensor]:
    """Coordinate grids from 1-D tensors, as ``torch.meshgrid`` (``indexing``
    "ij", PyTorch's default, or "xy", NumPy's, which swaps the first two
    dims): each a broadcast view, so the gradient sums back."""
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    if indexing not in ("ij", "xy"):
        raise ValueError(f"meshgrid: indexing must be 'ij' or 'xy', got {indexing!r}")
    ts = [operand(t, "meshgrid", ints=True) for t in tensors]
    if any(t.ndim != 1 for t in ts):
        raise ValueError(f"meshgrid: takes 1-D tensors, got shapes {[t.shape for t in ts]}")
    swap = indexing == "xy" and len(ts) >= 2
    order = [1, 0, *range(2, len(ts))] if swap else list(range(len(ts)))
    shape = tuple(ts[k].shape[0] for k in order)
    out = []
    for i, t in enumerate(ts):
        dim = order.index(i)
        view = reshape(t, tuple(-1 if d == dim else 1 for d in range(len(ts))))
        out.append(broadcast_to(view, shape))
    return out

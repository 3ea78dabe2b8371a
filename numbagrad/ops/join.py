"""Joining ops: concatenate (``cat``), stack, split and pad, any rank.

``concatenate`` and ``stack`` write their inputs into a new array with one
``concat`` kernel call (one CUDA launch) per eight C-contiguous inputs, the
output and each input read as 3-D (before, along, after the axis); an
input that is a strided view is written by a ``place_nd`` of its own. Each
input's gradient is one ``expand_nd`` read of its slice of the output
gradient. ``split`` returns views (``x[..., a:b]``), ``pad`` a new array
(one launch).
"""
from __future__ import annotations

import functools
import math
import numbers
import operator
from typing import Any

import numpy as np

from .. import _dtypes, buffers, kernels
from ..kernels.cpu.join import SLOTS
from ..tape import Node, _Backward
from ..tensor import Tensor
from ._common import (alias, axis_of, cast, copy_strided, is_scalar, ones, operand, pair,
                      reshaped, result)
from .indexing import getitem
from .shape import _expand_into, _view, broadcast_to


def _tensors(tensors: Any, op: str) -> list[Tensor]:
    """The inputs as tensors of one device and dtype (all promoted to one)."""
    if isinstance(tensors, Tensor) or not isinstance(tensors, (list, tuple)):
        raise TypeError(f"{op}: expects a list or tuple of tensors, got "
                        f"{type(tensors).__name__}")
    if not tensors:
        raise ValueError(f"{op}: needs at least one tensor")
    first = operand(tensors[0], op, "tensor 0", ints=True)
    rest = [pair(first, t, op, ("tensor 0", f"tensor {i}"), ints=True)[1]
            for i, t in enumerate(tensors[1:], 1)]
    want = functools.reduce(_dtypes.promote_types, [t.dtype for t in rest], first.dtype)
    return [cast(t, want) for t in [first] + rest]    # PyTorch's promotion, as torch.cat


def concatenate(tensors: Any, axis: int = 0, *, dim: Any = None) -> Tensor:
    """``np.concatenate`` / ``torch.cat``: tensors of one rank (at least 1) and
    equal sizes except along ``axis``, joined along it. A new array (one
    kernel per eight contiguous inputs, see the module docstring; one per
    gradient)."""
    if dim is not None:
        axis = alias("concatenate", None if axis == 0 else axis, "axis", dim, "dim")
    ts = _tensors(tensors, "concatenate")
    ndim = ts[0].ndim
    if ndim == 0:
        raise ValueError("concatenate: 0-d tensors cannot be concatenated (use stack)")
    a = axis_of(axis, ndim, "concatenate")
    for i, t in enumerate(ts):
        if t.ndim != ndim or t.shape[:a] + t.shape[a + 1:] != ts[0].shape[:a] + \
                ts[0].shape[a + 1:]:
            raise ValueError(f"concatenate: tensor {i} has shape {t.shape} but tensor 0 has "
                             f"{ts[0].shape}: all must match except along axis {a}")
    return _join(ts, a, [t._data for t in ts], "concatenate")


def cat(tensors: Any, axis: int = 0, *, dim: Any = None) -> Tensor:
    """``torch.cat``, the same as ``concatenate``."""
    if dim is not None:
        axis = alias("cat", None if axis == 0 else axis, "axis", dim, "dim")
    return concatenate(tensors, axis)


def stack(tensors: Any, axis: int = 0, *, dim: Any = None) -> Tensor:
    """``np.stack`` / ``torch.stack``: tensors of one shape joined along a new
    ``axis`` (in [-ndim - 1, ndim]). A new array."""
    if dim is not None:
        axis = alias("stack", None if axis == 0 else axis, "axis", dim, "dim")
    ts = _tensors(tensors, "stack")
    for i, t in enumerate(ts):
        if t.shape != ts[0].shape:
            raise ValueError(f"stack: tensor {i} has shape {t.shape} but tensor 0 has "
                             f"{ts[0].shape}: all must match")
    a = axis_of(axis, ts[0].ndim + 1, "stack")
    kern = ts[0]._kern
    pieces = [_view(kern, t._data, lambda d: np.expand_dims(d, a)) for t in ts]
    return _join(ts, a, pieces, "stack")


def _join(ts: list, a: int, pieces: list, op: str) -> Tensor:
    """``pieces`` (the inputs' data, of one rank) written one after another along ``a``:
    C-contiguous ones in one ``concat`` call per eight, others one ``place_nd`` each."""
    kern = ts[0]._kern
    shape = list(pieces[0].shape)
    shape[a] = sum(p.shape[a] for p in pieces)
    out = buffers.take(kern, tuple(shape), ts[0].dtype)
    outer, inner = math.prod(shape[:a]), math.prod(shape[a + 1:])
    out3 = reshaped(out, (outer, shape[a], inner))
    start, step = np.zeros(len(shape), np.int64), np.ones(len(shape), np.int64)
    offsets, chunk = [], []
    at = 0
    for piece in pieces:
        offsets.append(at)
        n = piece.shape[a]
        if kern.is_c_contiguous(piece):
            if not chunk:
                chunk_at = at
            chunk.append((reshaped(piece, (outer, n, inner)), n))
            if len(chunk) == SLOTS:
                _concat(kern, out3, chunk, chunk_at)
                chunk = []
        else:   # a strided view: the pieces before it first, then its own place_nd
            if chunk:
                _concat(kern, out3, chunk, chunk_at)
                chunk = []
            if piece.size:
                start[a] = at
                kernels.call(kern, "place_nd", piece.size, piece, out, start.copy(), step, 0.0,
                             0.0, False)
        at += n
    if chunk:
        _concat(kern, out3, chunk, chunk_at)
    sizes = tuple(p.shape[a] for p in pieces)
    return result(out, kern, tuple(ts), _join_backward, (a, tuple(offsets), sizes, op == "stack",
                                                         tuple(shape)))


def _concat(kern: Any, out3: Any, chunk: list, at: int) -> None:
    """One ``concat`` call writing ``chunk`` [(3-D piece, its length), ...] from ``at`` on."""
    filler = chunk[0][0]
    arrays = [p for p, _ in chunk] + [filler] * (SLOTS - len(chunk))
    lengths = [n for _, n in chunk] + [0] * (SLOTS - len(chunk))
    size = out3.shape[0] * sum(lengths) * out3.shape[2]
    if size:
        kernels.call(kern, "concat", size, out3, *arrays, *lengths, at)


def _join_backward(ctx: _Backward, node: Node, gout: Any) -> None:
    a, offsets, sizes, stacked, shape = node.saved
    kern = node.inputs[0]._kern
    if gout is None:
        gout = ones(kern, shape, node.inputs[0]._data.dtype)
    for t, at, n in zip(node.inputs, offsets, sizes):
        if not t.requires_grad:
            continue
        dest, beta = ctx.dest(t)
        part = (slice(None),) * a + (slice(at, at + n),)
        g = _view(kern, gout, lambda d: d[part])
        if stacked:
            dest = reshaped(dest, tuple(g.shape))
        copy_strided(kern, g, dest, 1.0, beta)


def split(x: Any, indices_or_sections: Any, axis: int = 0, *, dim: Any = None) -> list[Tensor]:
    """``np.split``: an int N cuts ``x`` into N equal parts along ``axis`` (an
    error when they are not equal), a sequence of ints cuts it at those
    indices (NumPy's slicing rules). A list of views (``x[..., a:b]``); note
    ``torch.split``'s second argument means part sizes instead."""
    if dim is not None:
        axis = alias("split", None if axis == 0 else axis, "axis", dim, "dim")
    x = operand(x, "split", ints=True)
    if x.ndim == 0:
        raise ValueError("split: a 0-d tensor cannot be split")
    a = axis_of(axis, x.ndim, "split")
    n = x.shape[a]
    if isinstance(indices_or_sections, numbers.Integral):
        parts = operator.index(indices_or_sections)
        if parts <= 0 or n % parts:
            raise ValueError(f"split: axis {a} of size {n} does not split into "
                             f"{parts} equal parts")
        bounds = [k * (n // parts) for k in range(parts + 1)]
    else:
        try:
            cuts = [operator.index(i) for i in indices_or_sections]
        except TypeError:
            raise TypeError(f"split: indices_or_sections must be an int or a sequence of "
                            f"ints, got {indices_or_sections!r}") from None
        bounds = [0] + cuts + [n]
    lead = (slice(None),) * a
    return [getitem(x, lead + (slice(lo, hi),)) for lo, hi in zip(bounds, bounds[1:])]


def _pad_pairs(pad_width: Any, ndim: int) -> np.ndarray:
    """NumPy's ``pad_width`` forms as an (ndim, 2) int array of (before, after)."""
    widths = np.asarray(pad_width)
    if widths.dtype.kind not in "iu" or widths.ndim > 2:
        raise TypeError(f"pad: pad_width must be integers: an int, (before, after) or one "
                        f"(before, after) per dim, got {pad_width!r}")
    if widths.size == 2 and widths.shape != (2, 1):
        widths = widths.reshape(2)
    try:
        widths = np.broadcast_to(widths, (ndim, 2))
    except ValueError:
        raise ValueError(f"pad: pad_width {pad_width!r} does not fit a tensor of {ndim} "
                         "dims") from None
    if (widths < 0).any():
        raise ValueError(f"pad: pad_width cannot be negative, got {pad_width!r}")
    return widths.astype(np.int64)


# pad's modes by NumPy's name, and PyTorch's names for them
_MODES = {"constant": "constant", "reflect": "reflect", "edge": "edge", "replicate": "edge",
          "wrap": "wrap", "circular": "wrap"}


def pad(x: Any, pad_width: Any, value: float = 0.0, mode: str = "constant") -> Tensor:
    """``np.pad(x, pad_width, mode, constant_values=value)``: ``pad_width``
    in NumPy's forms (an int, (before, after), or one pair per dim, first
    dim first; ``F.pad``'s flat tuple runs from the last dim). ``mode``:
    "constant" (one launch; the gradient is the inner part's), "reflect"
    (mirrored without the edge), "edge" (PyTorch's "replicate") or "wrap"
    (PyTorch's "circular"), the last three made of slices, flips and joins
    per padded dim, so their gradients add up where an element is copied."""
    x = operand(x, "pad", ints=True)
    if not is_scalar(value):
        raise TypeError(f"pad: value must be a real number, got {value!r}")
    if mode not in _MODES:
        raise ValueError(f"pad: mode must be one of {sorted(_MODES)}, got {mode!r}")
    widths = _pad_pairs(pad_width, x.ndim)
    if _MODES[mode] != "constant":
        return _pad_copied(x, widths, _MODES[mode])
    kern = x._kern
    before = np.ascontiguousarray(widths[:, 0])
    shape = tuple(int(n + b + e) for n, (b, e) in zip(x.shape, widths))
    out = buffers.take(kern, shape, x.dtype)
    kernels.call(kern, "place_nd", out.size, x._data, out, before, np.ones(x.ndim, np.int64),
                 float(value), 0.0, True)
    inner = tuple(slice(int(b), int(b) + n) for n, b in zip(x.shape, before))
    return result(out, kern, (x,), _pad_backward, (inner, shape))


def _pad_copied(x: Tensor, widths: np.ndarray, mode: str) -> Tensor:
    """``pad``'s reflect, edge and wrap modes: one join per padded dim."""
    for a, (b, e) in enumerate(widths.tolist()):
        if not b and not e:
            continue
        n = x.shape[a]
        limit = n - 1 if mode == "reflect" else (n if mode == "wrap" else None)
        if n == 0 or (limit is not None and max(b, e) > limit):
            raise ValueError(f"pad: mode {mode!r} pads dim {a} of size {n} by at most "
                             f"{limit if n else 0} on a side, got ({b}, {e})")
        lead = (slice(None),) * a

        def part(lo: int, hi: int, step: int = 1) -> Tensor:
            return getitem(x, lead + (slice(lo, hi if hi >= 0 else None, step),))

        if mode == "reflect":        # x[b], ..., x[1] | x | x[n-2], ..., x[n-1-e]
            left, right = part(b, 0, -1), part(n - 2, n - 2 - e, -1)
        elif mode == "wrap":         # x[n-b:] | x | x[:e]
            left, right = part(n - b, n), part(0, e)
        else:                        # x[0] b times | x | x[n-1] e times
            left = broadcast_to(part(0, 1), x.shape[:a] + (b,) + x.shape[a + 1:])
            right = broadcast_to(part(n - 1, n), x.shape[:a] + (e,) + x.shape[a + 1:])
        x = concatenate([t for t, w in ((left, b), (x, 1), (right, e)) if w], a)
    return x


def _pad_backward(ctx: _Backward, node: Node, gout: Any) -> None:
    (x,) = node.inputs
    inner, shape = node.saved
    kern = x._kern
    if gout is None:
        gout = ones(kern, shape, x._data.dtype)
    dest, beta = ctx.dest(x)
    _expand_into(kern, _view(kern, gout, lambda d: d[inner + (Ellipsis,)]), dest, beta)

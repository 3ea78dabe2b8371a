"""Resampling: ``interpolate`` (PyTorch's ``F.interpolate``), made of ops
that exist, so its gradient and ``ng.compile`` follow from theirs.

Each spatial dim is resampled on its own, with PyTorch's source-index
formulas. "nearest" (and "nearest-exact") selects input rows with an
integer array (``x[..., idx]``: the gradient adds repeated rows up);
"linear", "bilinear" and "trilinear" multiply by a small (out, in) matrix
per dim, whose row o holds the two weights of output o's neighbours (one
GEMM per dim, exact: the other entries are zeros). A dim whose size does
not change is skipped where PyTorch's is the identity: the linear modes and
2-D "nearest"; the other nearest modes pick rows by ``1 / scale_factor``
even then (scale 1.09 on 10 rows: 0, 0, 1, ..., 8), as PyTorch's forward.
The gradient is that of the rows picked (PyTorch's backward passes such a
dim's gradient through unchanged, which is not its forward's).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..tensor import Tensor, tensor
from ._common import ArgumentLengthError, describe, operand
from .indexing import getitem
from .matmul import matmul
from .shape import reshape

# the linear mode of each input rank
_LINEAR = {3: "linear", 4: "bilinear", 5: "trilinear"}
_MODES = ("nearest", "nearest-exact", "linear", "bilinear", "trilinear")


def _sizes(x: Tensor, size: Any, scale_factor: Any, recompute: Any, op: str) -> tuple:
    """(output sizes, the scale of each dim its indices use or None: in/out)."""
    rank = x.ndim - 2
    if (size is None) == (scale_factor is None):
        raise ValueError(f"{op}: give exactly one of size and scale_factor, got size={size!r}, "
                         f"scale_factor={scale_factor!r}")
    if size is not None:
        items = tuple(size) if isinstance(size, (tuple, list)) else (size,) * rank
        if len(items) != rank:
            raise ArgumentLengthError(f"{op}: size must be an int or a tuple of {rank} ints for "
                                      f"input {describe(x)}, got {size!r}")
        if any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1
               for v in items):
            raise ValueError(f"{op}: size must hold positive ints, got {size!r}")
        return tuple(int(v) for v in items), (None,) * rank
    items = tuple(scale_factor) if isinstance(scale_factor, (tuple, list)) \
        else (scale_factor,) * rank
    if len(items) != rank:
        raise ArgumentLengthError(f"{op}: scale_factor must be a number or a tuple of {rank} "
                                  f"numbers for input {describe(x)}, got {scale_factor!r}")
    if any(isinstance(v, bool) or not isinstance(v, (int, float, np.number)) or not v > 0
           or not math.isfinite(v) for v in items):
        raise ValueError(f"{op}: scale_factor must hold positive finite numbers, got "
                         f"{scale_factor!r}")
    out = tuple(math.floor(n * float(s)) for n, s in zip(x.shape[2:], items))
    if any(o < 1 for o in out):
        raise ValueError(f"{op}: scale_factor {scale_factor!r} gives the empty output size "
                         f"{out} for input {describe(x)}")
    return out, (None,) * rank if recompute else tuple(float(s) for s in items)


def _nearest(n_in: int, n_out: int, scale: float | None, exact: bool) -> np.ndarray:
    """PyTorch's nearest source rows, computed in float32 as its kernels do:
    floor(o * s) (nearest-exact: floor((o + 0.5) * s)), s = 1 / scale_factor
    or in / out, clipped to the last row."""
    s = np.float32(1.0 / scale) if scale is not None else np.float32(n_in) / np.float32(n_out)
    o = np.arange(n_out, dtype=np.float32)
    src = np.floor(((o + np.float32(0.5)) if exact else o) * s).astype(np.int64)
    return np.minimum(src, n_in - 1)


def _linear(n_in: int, n_out: int, scale: float | None, align_corners: bool,
            dtype: Any) -> np.ndarray:
    """The (n_out, n_in) matrix of PyTorch's linear interpolation along one
    dim: row o has 1 - l at i0 and l at i1 (the same cell at the last row),
    computed in the input's float type as PyTorch's kernels."""
    t = np.dtype(dtype).type
    if align_corners:
        s = t(n_in - 1) / t(n_out - 1) if n_out > 1 else t(0)
    else:
        s = t(1.0 / scale) if scale is not None else t(n_in) / t(n_out)
    o = np.arange(n_out, dtype=dtype)
    src = s * o if align_corners else np.maximum(s * (o + t(0.5)) - t(0.5), t(0))
    i0 = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
    lam = np.clip(src - i0.astype(dtype), 0, 1).astype(dtype)
    i1 = i0 + (i0 < n_in - 1)
    a = np.zeros((n_out, n_in), dtype)
    rows = np.arange(n_out)
    np.add.at(a, (rows, i0), t(1) - lam)
    np.add.at(a, (rows, i1), lam)
    return a


def interpolate(x: Any, size: Any = None, scale_factor: Any = None, mode: str = "nearest",
                align_corners: bool | None = None, recompute_scale_factor: bool | None = None,
                antialias: bool = False) -> Tensor:
    """PyTorch's ``F.interpolate`` of a batched (N, C, *spatial) input with 1
    to 3 spatial dims: ``size`` (an int or one per dim) or ``scale_factor``
    (a number or one per dim: the output is floor(in * scale_factor), and
    the indices use 1 / scale_factor unless ``recompute_scale_factor``).
    ``mode``: "nearest" (PyTorch's default: source floor(o * in / out)),
    "nearest-exact", or "linear" (3-D), "bilinear" (4-D), "trilinear" (5-D)
    with ``align_corners`` (default False; True maps the corner cells onto
    each other). Differentiable in x (for a nearest dim whose size the
    scale keeps, PyTorch's backward differs: see the module docstring).
    Where the linear modes meet an inf, a row of the matrix that is 0 there
    makes a nan, where PyTorch may keep the inf. ``antialias`` is not supported."""
    op = "interpolate"
    x = operand(x, op)
    if x.ndim not in (3, 4, 5):
        raise ValueError(f"{op}: input must be 3-D, 4-D or 5-D (N, C, *spatial), got "
                         f"{describe(x)}")
    if mode not in _MODES:
        raise ValueError(f"{op}: mode must be one of {_MODES}, got {mode!r}")
    nearest = mode.startswith("nearest")
    if not nearest and mode != _LINEAR[x.ndim]:
        raise ValueError(f"{op}: mode {mode!r} needs a {_MODES.index(mode) + 1}-D input, got "
                         f"{describe(x)} (use {_LINEAR[x.ndim]!r})")
    if nearest and align_corners is not None:
        raise ValueError(f"{op}: align_corners can only be set with the linear modes "
                         f"(linear, bilinear, trilinear), not {mode!r}")
    if antialias:
        raise NotImplementedError(f"{op}: antialias=True is not supported")
    if 0 in x.shape[1:]:
        raise ValueError(f"{op}: input {describe(x)} has an empty channel or spatial dim "
                         "(only the batch dim may be 0)")
    out_sizes, scales = _sizes(x, size, scale_factor, recompute_scale_factor, op)
    align = bool(align_corners)
    y = x
    for d in range(x.ndim - 1, 1, -1):    # the last dim first, as a GEMM from the right
        n_in, n_out, scale = x.shape[d], out_sizes[d - 2], scales[d - 2]
        if n_in == n_out and (not nearest or (mode == "nearest" and x.ndim == 4)):
            continue    # PyTorch's identity (its 2-D "nearest" too, whatever the scale)
        if nearest:
            idx = _nearest(n_in, n_out, scale, mode == "nearest-exact")
            if n_in == n_out and np.array_equal(idx, np.arange(n_in)):
                continue
            y = getitem(y, (slice(None),) * d + (idx,))
            continue
        a = _linear(n_in, n_out, scale, align, y.dtype)
        if d == x.ndim - 1:
            y = matmul(y, tensor(a.T, device=y.device))
        else:
            a = tensor(a, device=y.device)
            rest = y.shape[d + 1:]
            flat = reshape(y, y.shape[:d + 1] + (math.prod(rest),))
            y = reshape(matmul(a, flat), y.shape[:d] + (n_out,) + rest)
    return getitem(y, ...) if y is x else y

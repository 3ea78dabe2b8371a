"""Shape ops: reshape, permute, transpose, squeeze, unsqueeze, flatten and
broadcasts, any rank.

On the CPU each returns a view of its input's data (reshape and flatten of
a strided view copy first). On CUDA a result that is C-contiguous
(or a 2-D transpose, which a GEMM reads through its flag) is a view too; any
other (a permute, a broadcast) is a C-contiguous copy made by one
``expand_nd`` launch, since the other CUDA kernels read C-contiguous or 2-D
operands. No op writes its inputs, so a view of a param's data is never
written through by an op.
"""
from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import buffers, kernels
from ..tape import Node, _Backward
from ..tensor import Tensor, _root, _seen, _wrappers
from ._common import (alias, axis_of, contiguous, contiguous_array, copy_strided, describe, ones,
                      operand, reduce_into, reshaped, result, scalar_of)


# ------------------------------------------------------------ views
def _view(kern: Any, data: Any, fn: Callable) -> Any:
    """``fn(data)`` for a NumPy function ``fn`` that only re-strides (indexing,
    transposes, broadcasts), as an array of ``data``'s device."""
    if kern.name == "cpu":
        return fn(data)
    base = np.empty(1, data.dtype)   # a probe with data's layout: fn never reads it
    probe = np.lib.stride_tricks.as_strided(base, tuple(data.shape), tuple(data.strides))
    view = fn(probe)
    offset = view.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    return kern.as_strided(data, view.shape, view.strides, offset)


def _is_transpose2d(view: Any) -> bool:
    """A 2-D F-contiguous view: a C-contiguous matrix's transpose."""
    return len(view.shape) == 2 and view.strides[0] == view.dtype.itemsize \
        and view.strides[1] == view.shape[0] * view.dtype.itemsize


def _viewed(x: Tensor, fn: Callable, backward: Callable, saved: tuple = ()) -> Tensor:
    """The op output ``fn(x's data)``: a view where the module docstring says,
    else a C-contiguous copy (one ``expand_nd``)."""
    kern = x._kern
    view = _view(kern, x._data, fn)
    if kern.name == "cpu" or kern.is_c_contiguous(view) or _is_transpose2d(view):
        if kern.name == "cpu" and not view.flags.writeable:
            _writable(view)
        return _view_of(x, result(view, kern, (x,), backward, saved, pool=x._pool))
    out = buffers.take(kern, tuple(view.shape), view.dtype)
    copy_strided(kern, view, out)
    return result(out, kern, (x,), backward, saved)


def _expand_into(kern: Any, g: Any, dest: Any, beta: float) -> None:
    """dest = g + beta * dest for ``g`` of dest's shape, any strides (0-d too)."""
    if len(dest.shape) == 0:
        kernels.call(kern, "axpby", 1, 1.0, g, beta, dest)
    else:
        copy_strided(kern, g, dest, 1.0, beta)


def _writable(view: np.ndarray) -> None:
    """Mark a broadcast view writable like its base: the kernels are compiled
    for writable arrays (a read-only one is another Numba type), and no op
    writes its inputs."""
    try:
        view.flags.writeable = True
    except ValueError:   # the base itself is read-only
        pass


def _view_of(x: Tensor, out: Tensor) -> Tensor:
    """``out``, a view of ``x``'s data: it shares ``x``'s writes (PyTorch's
    version counter: an in-place write to either is a write to both, see
    ``tape._check_unmodified``), and is noted as wrapping an accumulator
    when ``x`` is."""
    out._base = _root(x)
    if _seen.wrapped and x in _wrappers:
        _wrappers.add(out)
    return out


def _dims(args: tuple) -> tuple:
    """``f(x, 1, 0)`` and ``f(x, (1, 0))`` alike."""
    return tuple(args[0]) if len(args) == 1 and isinstance(args[0], (tuple, list)) else args


# ------------------------------------------------------------ permutes
def permute(x: Any, *dims: Any) -> Tensor:
    """``x.permute(*dims)`` / ``ng.permute(x, dims)``: the dims reordered, as
    ``torch.permute`` (a view on the CPU; on CUDA a copy unless it is a 2-D
    transpose)."""
    x = operand(x, "permute", ints=True)
    dims = _dims(dims)
    perm = tuple(axis_of(d, x.ndim, "permute", "dim") for d in dims) if x.ndim else dims
    if len(dims) != x.ndim or sorted(perm) != list(range(x.ndim)):
        raise ValueError(f"permute: dims {dims} are not a permutation of the {x.ndim} dims "
                         f"of a tensor of {describe(x)}")
    return _permuted(x, perm)


def _permuted(x: Tensor, perm: tuple) -> Tensor:
    return _viewed(x, lambda a: a.transpose(perm), _permute_backward, (perm,))


def _permute_backward(ctx: _Backward, node: Node, gout: Any) -> None:
    (x,) = node.inputs
    (perm,) = node.saved
    kern, dtype = x._kern, x._data.dtype
    if gout is None:
        gout = ones(kern, tuple(x.shape[p] for p in perm), dtype)
    inverse = tuple(int(d) for d in np.argsort(perm))
    dest, beta = ctx.dest(x)
    _expand_into(kern, _view(kern, gout, lambda a: a.transpose(inverse)), dest, beta)


def transpose(x: Any, dim0: int = -2, dim1: int = -1) -> Tensor:
    """``torch.transpose``: dims ``dim0`` and ``dim1`` swapped (by default the
    last two, so a 2-D call is the matrix transpose). A view on the CPU and
    for 2-D on CUDA (a GEMM reads it through its transpose flag), else on
    CUDA a copy. Needs 2 dims for the defaults, as PyTorch."""
    x = operand(x, "transpose", ints=True)
    a = axis_of(dim0, max(x.ndim, 1), "transpose", "dim0")
    b = axis_of(dim1, max(x.ndim, 1), "transpose", "dim1")
    perm = list(range(x.ndim))
    if x.ndim:
        perm[a], perm[b] = perm[b], perm[a]
    return _permuted(x, tuple(perm))


def _matrix_transpose(x: Tensor) -> Tensor:
    """``x.mT``: the last two dims swapped (PyTorch's; needs 2 dims)."""
    if x.ndim < 2:
        raise ValueError(f"mT: needs a tensor of at least 2 dims, got {describe(x)}")
    return transpose(x, -2, -1)


def _reversed_dims(x: Tensor) -> Tensor:
    """``x.T``: every dim reversed, as NumPy (vectors and 0-d: the tensor itself)."""
    if x.ndim < 2:
        return x
    return _permuted(x, tuple(range(x.ndim - 1, -1, -1)))


# ------------------------------------------------------------ reshapes
def reshape(x: Any, *shape: Any) -> Tensor:
    """``x.reshape(*shape)`` with NumPy's rules (one -1 allowed), any rank.

    A view when the data is C-contiguous, else a copy.
    """
    x = operand(x, "reshape", ints=True)
    return _reshaped(x, _new_shape(x, _dims(shape), "reshape"))


def view(x: Any, *shape: Any) -> Tensor:
    """``x.view(*shape)``: ``reshape`` that is always a view, so it needs
    C-contiguous data (PyTorch also views some strided layouts; use
    ``reshape``, which copies them)."""
    x = operand(x, "view", ints=True)
    new = _new_shape(x, _dims(shape), "view")
    if not x._kern.is_c_contiguous(x._data):
        raise ValueError(f"view: the data of a tensor of {describe(x)} is not "
                         f"C-contiguous (a permute or slice); use reshape, which copies")
    return _reshaped(x, new)


def _new_shape(x: Tensor, shape: tuple, op: str) -> tuple:
    """``shape`` for ``x``'s elements, its one -1 filled in; as PyTorch, a size
    below -1 is refused (NumPy takes any negative size as the unknown one)."""
    try:
        dims = tuple(operator.index(n) for n in shape)
    except TypeError:
        raise TypeError(f"{op}: a shape must be integers, got {shape!r}") from None
    unknown = [i for i, n in enumerate(dims) if n == -1]
    known = math.prod(n for n in dims if n != -1)
    problem = None
    if any(n < -1 for n in dims):
        problem = f"invalid shape dimension {min(dims)}"
    elif len(unknown) > 1:
        problem = "only one dimension can be -1"
    elif unknown and known == 0:
        problem = "the size of the -1 dimension is ambiguous with a 0 among the others"
    elif unknown and x.size % known:
        problem = f"{x.size} elements are not a multiple of {known}"
    elif not unknown and known != x.size:
        problem = f"{known} elements, not {x.size}"
    if problem is not None:
        raise ValueError(f"{op}: cannot reshape a tensor of {describe(x)} to {dims}: {problem}")
    return tuple(x.size // known if n == -1 else n for n in dims)


def _reshaped(x: Tensor, new: tuple) -> Tensor:
    data = contiguous(x)
    if data is not x._data:   # a copy: its own data
        return result(reshaped(data, new), x._kern, (x,), _reshape_backward, (), pool=data)
    out = reshaped(data, new)
    return _view_of(x, result(out, x._kern, (x,), _reshape_backward, (), pool=x._pool))


def _reshape_backward(ctx: _Backward, node: Node, gout: Any) -> None:
    (x,) = node.inputs
    kern = x._kern
    dest, beta = ctx.dest(x)
    if gout is None:
        gout = ones(kern, x.shape, x._data.dtype)
    kernels.call(kern, "axpby", dest.size, 1.0, reshaped(gout, dest.shape), beta, dest)


def flatten(x: Any, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    """``torch.flatten``: dims ``start_dim`` to ``end_dim`` merged into one (a
    0-d tensor becomes 1-D); a view when the data is C-contiguous, else a copy."""
    x = operand(x, "flatten", ints=True)
    n = max(x.ndim, 1)
    a, b = axis_of(start_dim, n, "flatten", "start_dim"), axis_of(end_dim, n, "flatten", "end_dim")
    if a > b:
        raise ValueError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim} "
                         f"for a tensor of {describe(x)}")
    shape = x.shape or (1,)
    return _reshaped(x, shape[:a] + (int(np.prod(shape[a:b + 1])),) + shape[b + 1:])


def squeeze(x: Any, axis: Any = None, *, dim: Any = None) -> Tensor:
    """``np.squeeze``: size-1 dims removed (all, or the int/tuple ``axis``).
    As NumPy, naming an axis whose size is not 1 raises (PyTorch would
    silently keep it). A view (on CUDA a copy when the data is strided)."""
    if dim is not None:
        axis = alias("squeeze", axis, "axis", dim, "dim")
    x = operand(x, "squeeze", ints=True)
    if axis is None:
        axes = tuple(d for d, n in enumerate(x.shape) if n == 1)
    else:
        axes = tuple(axis_of(a, x.ndim, "squeeze") for a in
                     (axis if isinstance(axis, (tuple, list)) else (axis,)))
        bad = [a for a in axes if x.shape[a] != 1]
        if bad:
            raise ValueError(f"squeeze: axis {bad[0]} has size {x.shape[bad[0]]}, not 1, in a "
                             f"tensor of {describe(x)}")
    return _viewed(x, lambda a: np.squeeze(a, axes), _reshape_backward)


def unsqueeze(x: Any, axis: Any = None, *, dim: Any = None) -> Tensor:
    """``torch.unsqueeze``: a size-1 dim inserted at ``axis`` (in
    [-ndim - 1, ndim]). A view (on CUDA a copy when the data is strided)."""
    if dim is not None:
        axis = alias("unsqueeze", axis, "axis", dim, "dim")
    elif axis is None:
        raise TypeError("unsqueeze: missing the axis (or dim) to insert")
    x = operand(x, "unsqueeze", ints=True)
    a = axis_of(axis, x.ndim + 1, "unsqueeze")
    return _viewed(x, lambda d: np.expand_dims(d, a), _reshape_backward)


# ------------------------------------------------------------ broadcasts
def broadcast_to(x: Any, shape: Any) -> Tensor:
    """``np.broadcast_to``: ``x`` repeated along new leading dims and along its
    size-1 dims to ``shape``. A view on the CPU (stride 0), a copy on CUDA;
    its gradient sums over the repeated dims."""
    x = operand(x, "broadcast_to", ints=True)
    shape = _shape_of(shape, "broadcast_to")
    if len(shape) < x.ndim or any(n != m and n != 1 for n, m in
                                  zip(x.shape, shape[len(shape) - x.ndim:])):
        raise ValueError(f"broadcast_to: a tensor of {describe(x)} cannot be broadcast to "
                         f"shape {shape}")
    if math.prod(shape) > _MAX_ELEMENTS:
        raise ValueError(f"broadcast_to: shape {shape} has {math.prod(shape):,} elements, "
                         f"more than an array can index ({_MAX_ELEMENTS:,}); tensor of "
                         f"{describe(x)}")
    return _viewed(x, lambda a: np.broadcast_to(a, shape), _broadcast_backward, (shape,))


_MAX_ELEMENTS = np.iinfo(np.intp).max   # NumPy's index type bounds any array's size


def expand(x: Any, *shape: Any) -> Tensor:
    """``x.expand(*shape)``, PyTorch's: ``broadcast_to`` where -1 keeps a dim's size."""
    x = operand(x, "expand", ints=True)
    shape = _shape_of(_dims(shape), "expand")
    lead = len(shape) - x.ndim
    if lead < 0 or -1 in shape[:lead]:
        raise ValueError(f"expand: shape {shape} cannot expand a tensor of {describe(x)} "
                         "(-1 only for its own dims)")
    return broadcast_to(x, shape[:lead] + tuple(n if m == -1 else m for n, m in
                                                zip(x.shape, shape[lead:])))


def _shape_of(shape: Any, op: str) -> tuple:
    try:
        shape = (operator.index(shape),) if not isinstance(shape, (tuple, list)) else \
            tuple(operator.index(n) for n in shape)
    except TypeError:
        raise TypeError(f"{op}: a shape must be integers, got {shape!r}") from None
    if any(n < -1 or (n == -1 and op != "expand") for n in shape):
        raise ValueError(f"{op}: a shape cannot have negative sizes, got {shape}")
    return shape


def _broadcast_backward(ctx: _Backward, node: Node, gout: Any) -> None:
    (x,) = node.inputs
    (shape,) = node.saved
    kern, dtype = x._kern, x._data.dtype
    dest, beta = ctx.dest(x)
    if gout is None:
        gout = ones(kern, shape, dtype)
    # collapsed first: any rank, 0-d included, on both devices
    reduce_into(kern, contiguous_array(kern, gout), dest, scalar_of(dtype, 1.0),
                scalar_of(dtype, beta))

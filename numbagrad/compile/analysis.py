"""Analysis: a recording resolved into roots and views, and two recordings compared.

Every array a kernel received becomes a ``_Ref``: a view (offset, shape,
strides) of an argument, an op output (a "tmp" root), a host copy of an
argument ("der") or a persistent or constant array ("fix").
"""
from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import numba
import numpy as np

from ..tensor import Tensor
from .geometry import _address, _extent, _is_array, _owner, _same_values, _shape, _strides
from .geometry import _Unsupported
from .recording import _copied_from, _Recording


class _Ref:
    """Where one array a kernel received comes from: ``kind`` and ``index``
    name its root, (off, shape, strides) the view of it, in bytes."""

    __slots__ = ("dtype", "index", "kind", "layout", "off", "shape", "strides")

    def __init__(self, kind, index, off, shape, strides, dtype, layout):
        self.kind, self.index, self.off = kind, index, off
        self.shape, self.strides, self.dtype, self.layout = shape, strides, dtype, layout

    def desc(self) -> tuple:
        return (self.kind, self.index, self.off, self.shape, self.strides, self.dtype.str,
                self.layout)


class _Program:
    """A recording resolved into roots and references (device-independent)."""

    def __init__(self) -> None:
        self.calls: list[tuple[Callable, str, list, dict]] = []   # args: _Ref or ("s", v)
        self.originals: list[tuple[tuple, dict]] = []   # the arrays each call received
        self.inputs: dict[int, Any] = {}    # arg index -> its array at record time
        self.temps: list[Any] = []          # root arrays of kind "tmp"
        self.fixed: list[Any] = []          # "fix": persistent or constant root arrays
        self.derived: list[tuple[int, Any]] = []   # "der": (arg index, dtype) host copies
        self.derived_shapes: list[tuple] = []
        self.loss: _Ref | None = None
        self.outputs: list[_Ref] | None = None   # inference: the returned tensors' arrays
        self.pack: Callable | None = None        # inference: output tensors -> fn's structure
        # host integers of an argument that an op range-checked, checked again on
        # every call: (ref, low, high, exclude, allow), valid values lying in
        # [low, high) and other than exclude, or equal to allow (exclude=high
        # and allow=low when the op gave none)
        self.checks: list[tuple[_Ref, int, int, int, int]] = []
        self.kern: ModuleType | None = None
        self.params: list[Tensor] = []
        self.param_args: list[int] = []     # args that are params themselves
        self.alias: list[tuple[int, int]] = []   # args recorded as one array

    def structure(self) -> list:
        out = []
        for fn, name, args, kwargs in self.calls:
            out.append((name, id(fn), tuple(_desc(a) for a in args),
                        tuple(sorted((k, _desc(v)) for k, v in kwargs.items()))))
        return out


def _desc(a: Any) -> tuple:
    if isinstance(a, _Ref):
        return a.desc()
    return ("s", type(a[1]).__name__, repr(a[1]))


def _analyze(rec: _Recording, args: tuple, loss: Tensor, params: list[Tensor],
             host_owner: bool, outputs: list[Tensor] | None = None) -> _Program:
    """Resolve every array of the recording to a root. ``host_owner``: CPU
    arrays are grouped by their owning buffer (for the generated code).
    ``outputs``: an inference step's returned tensors (``loss`` is the first)."""
    prog = _Program()
    prog.params = params
    inputs: list[tuple[int, Any, int, int]] = []
    for i, a in enumerate(args):
        data = a._data if isinstance(a, Tensor) else a
        if isinstance(a, Tensor) and a.requires_grad:
            prog.param_args.append(i)
        if _is_array(data):
            lo, hi = _extent(data)
            for j, _, lo2, hi2 in inputs:
                if lo < hi2 and lo2 < hi:
                    other = args[j]._data if isinstance(args[j], Tensor) else args[j]
                    if other is not data:
                        raise _Unsupported(f"arguments {j} and {i} overlap in memory")
                    prog.alias.append((j, i))
            inputs.append((i, data, lo, hi))
    temps = [(t, *_extent(t)) for t in rec.temps]
    temp_ids = {id(t): k for k, t in enumerate(rec.temps)}
    fixed_ids: dict[int, int] = {}
    numpy_args = [(i, a) for i, a in enumerate(args) if isinstance(a, np.ndarray)]

    def ref(a: Any, fix: bool = True) -> _Ref | None:
        """``a``'s _Ref; with ``fix=False``, None for a persistent or constant array
        (not registered)."""
        lo, hi = _extent(a)
        at = _address(a)          # views are placed by their data pointer
        shape, strides = _shape(a), _strides(a)
        layout = numba.typeof(a).layout if isinstance(a, np.ndarray) else "?"
        for i, data, rlo, rhi in inputs:
            if a is data or (rlo <= lo and hi <= rhi and a.dtype == data.dtype
                             and type(a) is type(data)):
                prog.inputs[i] = data
                return _Ref("in", i, at - _address(data), shape, strides, a.dtype, layout)
        if host_owner and isinstance(a, np.ndarray):
            root = _owner(a)
            k = temp_ids.get(id(root))
            if k is not None:
                return _Ref("tmp", k, at - _address(root), shape, strides, a.dtype, layout)
        else:
            for k, (t, rlo, rhi) in enumerate(temps):
                if rlo <= lo and hi <= rhi and a.dtype == t.dtype:
                    return _Ref("tmp", k, at - _address(t), shape, strides, a.dtype, layout)
            root = a
        source = _copied_from(rec, root)
        if source is not None and isinstance(root, np.ndarray):
            for i, arg in numpy_args:     # a host copy of an argument (coerce, labels)
                if source is arg and arg.shape == root.shape:
                    key = (i, root.dtype)
                    if key not in prog.derived:
                        prog.derived.append(key)
                        prog.derived_shapes.append(_shape(root))
                    return _Ref("der", prog.derived.index(key), at - _address(root), shape,
                                strides, a.dtype, layout)
        k = fixed_ids.get(id(root))
        if k is None and not fix:
            return None
        if k is None:
            k = fixed_ids[id(root)] = len(prog.fixed)
            prog.fixed.append(root)
        return _Ref("fix", k, at - _address(root), shape, strides, a.dtype, layout)

    for fn, name, cargs, kwargs in rec.calls:
        if name == "fill" and cargs and any(cargs[0] is f for f in rec.fresh):
            continue    # zeroing a new accumulator: a one-time init, not part of the step
        rargs = [ref(a) if _is_array(a) else ("s", a) for a in cargs]
        rkw = {k: (ref(v) if _is_array(v) else ("s", v)) for k, v in kwargs.items()}
        prog.calls.append((fn, name, rargs, rkw))
        prog.originals.append((cargs, kwargs))
    prog.temps = rec.temps
    prog.loss = ref(loss._data)
    if outputs is not None:
        prog.outputs = [ref(t._data) for t in outputs]
    prog.kern = loss._kern
    # what the ops checked of the arguments' integers (indices, labels; on CUDA
    # the host arrays they uploaded): a replay checks each call's values again
    seen = set()
    for array, low, high, exclude, allow in rec.checks:
        r = ref(array, fix=False) if isinstance(array, np.ndarray) else None
        if r is None or r.kind not in ("in", "der") or r.dtype.kind not in "iu":
            continue          # a constant: compared by the verifying calls instead
        check = (r, low, high, high if exclude is None else int(exclude),
                 low if allow is None else int(allow))
        key = (r.desc(), *check[1:])
        if key not in seen:
            seen.add(key)
            prog.checks.append(check)
    return prog


def _device_of(args: tuple) -> str | None:
    """"cuda" for a call given a device array, "cpu" for one given host arrays only."""
    device = None
    for a in args:
        if isinstance(a, np.ndarray):
            device = "cpu"
        elif _is_array(a):
            return "cuda"
    return device


def _compare(old: _Program, new: _Program, args: tuple) -> str | None:
    """Why ``new`` is not the graph ``old`` recorded, or None."""
    a, b = old.structure(), new.structure()
    for n, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return (f"kernel call #{n} was {_call_text(old.calls[n])} and is now "
                    f"{_call_text(new.calls[n])}")
    if len(a) != len(b):
        return (f"the step made {len(a)} kernel calls when recorded and {len(b)} now")
    if (old.outputs is None) != (new.outputs is None) or old.outputs is not None and [
            r.desc() for r in old.outputs] != [r.desc() for r in new.outputs]:
        return "it returns different tensors"
    if [id(p) for p in old.params] != [id(p) for p in new.params]:
        return "it reaches a different set of params"
    for k, (x, y) in enumerate(zip(old.fixed, new.fixed)):
        if not _same_values(x, y):
            return (f"an array created inside fn (shape {_shape(x)}, {x.dtype}) holds "
                    f"different values than when the step was recorded; pass such data as "
                    f"an argument")
    return None


def _call_text(call: tuple) -> str:
    _, name, rargs, _ = call
    parts = []
    for r in rargs:
        if isinstance(r, _Ref):
            parts.append(f"{r.dtype}{list(r.shape)}")
        else:
            parts.append(repr(r[1]))
    return f"{name}({', '.join(parts)})"

"""``ng.compile``: record a training step's kernels once, replay them as compiled code.

    step = ng.compile(loss_fn, optimizer=opt)
    for x, y in batches:
        loss = step(x, y)      # forward, backward into .grad, opt.step()

The first call with a new signature runs ``loss_fn`` eagerly on a tape (so it
raises exactly what eager mode raises) while every kernel call is recorded;
the recording becomes one generated ``@njit`` function (CPU) that issues the
same kernels in the same order on buffers allocated once for that signature.
On CUDA the recorded launches are replayed back to back from Python. See
``compile`` for the rules.

How arrays reach the generated function: op outputs become slices of one
flat arena per dtype that the compiled step owns; params, gradient
accumulators and other persistent arrays are reached through their owning
buffer's address, and the arguments' arrays are passed in. The generated
function therefore takes one int64 ``meta`` array (addresses, shapes, flags)
plus one array per argument, so a call unboxes a handful of arrays however
big the graph.

How kernels are called: through the address of the C wrapper Numba compiles
for every @njit overload (``_call``), the overload eager dispatch picks for
the same argument types. The generated function runs the kernels' own
machine code (bit-identical results by construction), nothing is linked into
it or optimized again (so it compiles in a fraction of a second), and since
addresses, shapes and integer/boolean arguments live in ``meta``, one
compiled function serves every batch size of a graph and is cached on disk
without depending on the kernels' code.
"""
from __future__ import annotations

import builtins
import contextlib
import hashlib
import math
import os
import sys
import threading
import time
import warnings
from collections import OrderedDict
from collections.abc import Callable
from stat import S_IMODE, S_ISDIR, S_ISLNK
from types import ModuleType
from typing import Any

import numba
import numpy as np
from llvmlite import ir as llvmir
from numba import types as _nbtypes
from numba.core import cgutils
from numba.extending import intrinsic
from numba.np.arrayobj import make_array, populate_array

from . import _atomic, _cache, buffers, tape
from . import tensor as tensor_module
from .kernels.cpu.losses import first_bad_label
from .ops import losses as losses_module
from .optim.fused import FusedUpdate
from .optim.window import Window
from .tensor import Tensor

__all__ = ["CompiledStep", "GraphChangedError", "compile"]

MAX_SIGNATURES = 8
_STALE = object()        # a runner's answer: the recorded state no longer holds, record again
_EAGER = object()        # a runner's answer: run this call eagerly (it reproduces eager's error)
# kernel-module attributes that are not kernels: never recorded
_NOT_KERNELS = frozenset({"empty", "from_host", "to_host", "is_device_array", "is_c_contiguous",
                          "launch_count", "transfer_count", "synchronize", "kernel_sources"})
_capture_lock = threading.RLock()


class GraphChangedError(RuntimeError):
    """``fn`` recorded a different graph for a signature already compiled."""


class _Unsupported(Exception):
    """The recording cannot become an @njit function (the Python replay is used)."""


@intrinsic
def _array(typingctx, meta, index, spec):
    """The array described by ``meta[index:]`` (address, shape, strides in
    bytes) with the type ``spec`` names ("<f4:2:C": dtype, ndim, layout); no
    copy, no owner (used by generated code, for buffers the step keeps alive)."""
    if not isinstance(spec, _nbtypes.StringLiteral) \
            or not isinstance(index, _nbtypes.IntegerLiteral):
        return None
    code, ndim, layout = spec.literal_value.split(":")
    ndim = int(ndim)
    array_type = _nbtypes.Array(numba.from_dtype(np.dtype(code)), ndim, layout)

    def codegen(context, builder, signature, args):
        meta_array = make_array(signature.args[0])(context, builder, args[0])
        k = signature.args[1].literal_value
        intp = context.get_value_type(_nbtypes.intp)

        def load(j):
            return builder.load(builder.gep(meta_array.data,
                                            [context.get_constant(_nbtypes.intp, k + j)]))
        out = make_array(array_type)(context, builder)
        item = context.get_data_type(array_type.dtype)
        populate_array(out, data=builder.inttoptr(load(0), item.as_pointer()),
                       shape=cgutils.pack_array(builder, [load(1 + d) for d in range(ndim)],
                                                intp),
                       strides=cgutils.pack_array(builder,
                                                  [load(1 + ndim + d) for d in range(ndim)], intp),
                       itemsize=context.get_constant(_nbtypes.intp, context.get_abi_sizeof(item)),
                       meminfo=None)
        return out._getvalue()
    return array_type(meta, index, spec), codegen


def _type_text(t: Any) -> str:
    """A kernel argument's numba type as the generated code checks it (an
    array's read-only flag is left out: kernels never write their inputs)."""
    t = _nbtypes.unliteral(t)
    if isinstance(t, _nbtypes.Array):
        return f"{t.dtype}[{t.ndim}{t.layout}]"
    return str(t)


@intrinsic
def _call(typingctx, address, args, expect):
    """Call the compiled kernel whose C wrapper is at ``address`` with the
    tuple ``args``, whose types must read ``expect`` (used by generated code).

    The wrapper is the one Numba builds for every @njit overload; calling it
    runs the machine code eager mode runs, and nothing is linked into (or
    re-optimized with) the generated function."""
    if not isinstance(args, _nbtypes.BaseTuple) or not isinstance(expect,
                                                                  _nbtypes.StringLiteral):
        return None
    got = "|".join(_type_text(t) for t in args.types)
    if got != expect.literal_value:
        raise numba.core.errors.TypingError(
            f"ng.compile: kernel arguments typed {got}, the kernel takes {expect.literal_value}")

    def codegen(context, builder, signature, llargs):
        addr, tup, _ = llargs
        argtys = [_nbtypes.unliteral(t) for t in signature.args[1].types]
        values = cgutils.unpack_tuple(builder, tup, len(argtys))
        fnty = llvmir.FunctionType(context.get_value_type(_nbtypes.none),
                                   [context.get_value_type(t) for t in argtys])
        builder.call(builder.inttoptr(addr, fnty.as_pointer()), values)
        return context.get_dummy_value()
    return _nbtypes.none(address, args, expect), codegen


# ---------------------------------------------------------------- arrays
def _is_array(x: Any) -> bool:
    return isinstance(x, np.ndarray) or type(x).__module__.startswith("numba.cuda")


def _address(a: Any) -> int:
    if isinstance(a, np.ndarray):
        return a.__array_interface__["data"][0]
    iface = getattr(a, "__cuda_array_interface__", None)
    if iface is None:                      # the simulator's fake device array
        return getattr(a, "_ary", a).__array_interface__["data"][0]
    return iface["data"][0]


def _shape(a: Any) -> tuple:
    return tuple(int(n) for n in a.shape)


def _strides(a: Any) -> tuple:
    return tuple(int(s) for s in a.strides)


def _extent(a: Any) -> tuple[int, int]:
    """[lo, hi) bytes an array's elements occupy."""
    lo = hi = _address(a)
    for n, s in zip(_shape(a), _strides(a)):
        if n == 0:
            return lo, lo
        if s >= 0:
            hi += (n - 1) * s
        else:
            lo += (n - 1) * s
    return lo, hi + a.dtype.itemsize


def _c_contiguous(shape: tuple, strides: tuple, itemsize: int) -> bool:
    expect = itemsize
    for n, s in zip(reversed(shape), reversed(strides)):
        if n != 1 and s != expect:
            return False
        expect *= n
    return True


def _c_strides(shape: tuple, itemsize: int) -> tuple:
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


def _owner(a: np.ndarray) -> np.ndarray:
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def _view(root: Any, off: int, shape: tuple, strides: tuple) -> Any:
    """The array at byte offset ``off`` of ``root`` with ``shape``/``strides``
    (host or device arrays; the shapes numbagrad's ops make)."""
    rshape, rstrides = _shape(root), _strides(root)
    if off == 0 and shape == rshape and strides == rstrides:
        return root
    if off == 0 and len(shape) == 2 and shape == rshape[::-1] and strides == rstrides[::-1]:
        return root.T
    item = root.dtype.itemsize
    size = math.prod(shape)
    if not _c_contiguous(rshape, rstrides, item):
        raise _Unsupported(f"a view of a non-contiguous array (shape {rshape})")
    if _c_contiguous(shape, strides, item):
        if off == 0 and size == math.prod(rshape):
            return root.reshape(shape)
        flat = root.reshape(math.prod(rshape))
        return flat[off // item:off // item + size].reshape(shape)
    if len(shape) == 2 and _c_contiguous(shape[::-1], strides[::-1], item):
        flat = root.reshape(math.prod(rshape))
        return flat[off // item:off // item + size].reshape(shape[::-1]).T
    raise _Unsupported(f"a strided view (shape {shape}, strides {strides})")


def _same_values(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if _shape(a) != _shape(b) or a.dtype != b.dtype:
        return False
    ha = a if isinstance(a, np.ndarray) else a.copy_to_host()
    hb = b if isinstance(b, np.ndarray) else b.copy_to_host()
    return bool(np.array_equal(ha, hb, equal_nan=True))


def _describe_args(args: tuple) -> str:
    parts = []
    for a in args:
        if isinstance(a, Tensor):
            parts.append(f"Tensor{a.shape} {a.dtype} {a.device}")
        elif _is_array(a):
            parts.append(f"{type(a).__name__}{_shape(a)} {a.dtype}")
        else:
            parts.append(repr(a))
    return "(" + ", ".join(parts) + ")"


# ---------------------------------------------------------------- signature
def _arg_key(a: Any) -> tuple:
    if isinstance(a, Tensor):
        d = a._data
        return (type(a), d.shape, d.strides, d.dtype, a._kern, a.requires_grad)
    if isinstance(a, np.ndarray) or _is_array(a):
        return (type(a), a.shape, a.strides, a.dtype)
    if a is None or isinstance(a, (bool, int, float, str, np.generic)):
        return (type(a), a)
    raise TypeError(f"ng.compile: an argument of type {type(a).__name__} cannot be part of a "
                    f"compiled step's signature; pass tensors, arrays or Python numbers "
                    f"(reach other objects through fn's closure)")


def _key(args: tuple) -> tuple:
    return tuple([_arg_key(a) for a in args])


# ---------------------------------------------------------------- recording
class _Recording:
    """Kernel calls and buffers of one eager run of ``fn`` in one thread."""

    def __init__(self) -> None:
        self.thread = threading.get_ident()
        self.calls: list[tuple[Callable, str, tuple, dict]] = []
        self.temps: list[Any] = []       # what buffers.take handed out (fresh arrays)
        self.fresh: list[Any] = []       # other arrays made by kern.empty (accumulators)
        self.host_reads = 0              # kern.to_host calls: fn read a value
        # Host copies that ops made of their operands (coerce, labels): id of
        # the copy -> (copy, the object it was made from). An argument's copy
        # is re-made from the new argument at replay; any other is a constant.
        self.copies: dict[int, tuple[Any, Any]] = {}


@contextlib.contextmanager
def _recording():
    """Record every kernel call of this thread; ``buffers.take`` hands out
    fresh arrays (so nothing recorded aliases the pool). Restored on exit."""
    rec = _Recording()
    tid = rec.thread
    get_ident = threading.get_ident
    patched: list[tuple[Any, str, Any]] = []

    def kernel(name: str, fn: Callable) -> Callable:
        def recorded(*args, **kwargs):
            if get_ident() == tid:
                rec.calls.append((fn, name, args, kwargs))
            return fn(*args, **kwargs)
        return recorded

    def empty(fn: Callable) -> Callable:
        def recorded(shape, dtype):
            array = fn(shape, dtype)
            if get_ident() == tid:
                rec.fresh.append(array)
            return array
        return recorded

    def to_host(fn: Callable) -> Callable:
        def recorded(array):
            if get_ident() == tid:
                rec.host_reads += 1
            return fn(array)
        return recorded

    def host_copy(fn: Callable) -> Callable:
        def recorded(source, *args, **kwargs):
            array = fn(source, *args, **kwargs)
            if get_ident() == tid:
                rec.copies[id(array)] = (array, source)
            return array
        return recorded

    take = buffers.take

    def fresh_take(kern, shape, dtype):
        if get_ident() != tid:
            return take(kern, shape, dtype)
        array = getattr(kern.empty, "__wrapped_empty__", kern.empty)(shape, dtype)
        rec.temps.append(array)
        return array

    with _capture_lock:
        try:
            for modname in ("numbagrad.kernels.cpu", "numbagrad.kernels.cuda"):
                module = sys.modules.get(modname)
                if module is None:
                    continue
                for name, value in list(vars(module).items()):
                    if name.startswith("_") or not callable(value) \
                            or isinstance(value, (type, ModuleType)):
                        continue
                    if name == "empty":
                        wrapper = empty(value)
                        wrapper.__wrapped_empty__ = value
                    elif name == "to_host":
                        wrapper = to_host(value)
                    elif name == "from_host":
                        wrapper = host_copy(value)
                    elif name in _NOT_KERNELS:
                        continue
                    else:
                        wrapper = kernel(name, value)
                    patched.append((module, name, value))
                    setattr(module, name, wrapper)
            for module, name in ((tensor_module, "_host_array"), (losses_module, "_as_int64")):
                patched.append((module, name, getattr(module, name)))
                setattr(module, name, host_copy(getattr(module, name)))
            buffers.take = fresh_take
            yield rec
        finally:
            buffers.take = take
            for module, name, value in reversed(patched):
                setattr(module, name, value)


def _copied_from(rec: _Recording, array: Any) -> Any:
    """The object ``array`` was copied from through a chain of recorded host
    copies (``ng.tensor(x)`` copies x, then copies that to the device), or
    None when it is no such copy."""
    source = None
    entry = rec.copies.get(id(array))
    while entry is not None and entry[0] is array:
        source = array = entry[1]
        entry = rec.copies.get(id(array))
    return source


def _reached_params(loss: Tensor) -> list[Tensor]:
    """Leaf params the recorded graph of ``loss`` reads, in first-seen order."""
    params: list[Tensor] = []
    seen_p: set[int] = set()
    seen_n: set[int] = set()
    stack = [loss._node]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen_n:
            continue
        seen_n.add(id(node))
        for t in node.inputs:
            if t._node is not None:
                stack.append(t._node)
            elif t.requires_grad and id(t) not in seen_p:
                seen_p.add(id(t))
                params.append(t)
    return params


# ---------------------------------------------------------------- analysis
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
        self.labels: list[tuple[_Ref, int]] = []   # (labels ref, classes) to range-check
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
             host_owner: bool) -> _Program:
    """Resolve every array of the recording to a root. ``host_owner``: CPU
    arrays are grouped by their owning buffer (for the generated code)."""
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

    def ref(a: Any) -> _Ref:
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
    prog.kern = loss._kern
    for fn, name, rargs, _ in prog.calls:
        if name == "cross_entropy" and len(rargs) >= 2 and isinstance(rargs[1], _Ref):
            labels = rargs[1]
            classes = rargs[0].shape[1]
            if labels.kind == "tmp":      # CUDA: the labels were uploaded from the host
                for fn2, name2, r2, _ in prog.calls:
                    if name2 == "upload" and isinstance(r2[1], _Ref) \
                            and r2[1].desc() == labels.desc():
                        labels = r2[0] if isinstance(r2[0], _Ref) else None
                        break
                else:
                    labels = None
            if labels is not None and labels.kind in ("in", "der") \
                    and labels.dtype.kind in "iu":
                prog.labels.append((labels, classes))
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


# ---------------------------------------------------------------- CPU codegen
_ALIGN = 64   # bytes between arena slots


def _scalar_expr(value: Any, meta: list) -> str:
    """Source for a kernel's scalar argument, typed as eager mode types it."""
    if isinstance(value, (bool, np.bool_)):
        meta.append(int(bool(value)))
        return f"(m[{len(meta) - 1}] != 0)"
    if isinstance(value, int):
        meta.append(value)
        return f"m[{len(meta) - 1}]"
    if isinstance(value, np.integer):
        meta.append(int(value))
        return f"np.{value.dtype.name}(m[{len(meta) - 1}])"
    if isinstance(value, float) and type(value) is float:
        return _float_literal(value)
    if isinstance(value, np.floating) and value.dtype in (np.float32, np.float64):
        if value.dtype == np.float64:
            return _float_literal(float(value))
        return f"np.float32({_float_literal(float(value))})"
    raise _Unsupported(f"a kernel argument of type {type(value).__name__}")


def _float_literal(x: float) -> str:
    if math.isnan(x):
        return "np.nan"
    if math.isinf(x):
        return "np.inf" if x > 0 else "(-np.inf)"
    return repr(x)


class _Codegen:
    """Source of the generated @njit step and the ``meta`` it reads.

    A view of a buffer the step keeps (an arena slot, a param's flat buffer)
    is ``_array(m, k, spec)``: its address, shape and strides are ``meta``
    entries. A view of an argument is built from the array passed in."""

    def __init__(self, prog: _Program, boundary: FusedUpdate | None = None) -> None:
        self.prog = prog
        self.boundary = boundary
        self.opt_roots: list[np.ndarray] = []   # kind "opt": the optimizer's buffers
        self.meta: list[int] = []
        self.lines: list[str] = []
        self.params: list[str] = ["m"]
        self.per_call: list[tuple[str, int]] = []   # ("in"|"der", index) per array param
        self.keep: list[Any] = []                   # arrays the meta addresses point into
        self.args: dict[tuple, str] = {}
        self.views: dict[tuple, str] = {}
        self.arena_slots: dict[int, tuple[str, int]] = {}
        self.arenas: dict[str, np.ndarray] = {}

    def slot(self, value: int) -> str:
        self.meta.append(int(value))
        return f"m[{len(self.meta) - 1}]"

    def plan_arenas(self) -> None:
        sizes: dict[str, int] = {}
        for k, t in enumerate(self.prog.temps):
            dt = np.dtype(t.dtype)
            at = sizes.get(dt.str, 0)
            step = max(1, _ALIGN // dt.itemsize)
            self.arena_slots[k] = (dt.str, at)
            sizes[dt.str] = at + -(-max(t.size, 1) // step) * step
        for dts, total in sizes.items():
            self.arenas[dts] = np.zeros(max(total, 1), np.dtype(dts))
        self.keep += list(self.arenas.values())

    def address(self, r: _Ref) -> int:
        """Where the view ``r`` of a kept buffer starts in this process."""
        if r.kind == "tmp":
            dts, at = self.arena_slots[r.index]
            return self.arenas[dts].__array_interface__["data"][0] + at * int(
                np.dtype(dts).itemsize) + r.off
        root = (self.opt_roots if r.kind == "opt" else self.prog.fixed)[r.index]
        if not isinstance(root, np.ndarray):
            raise _Unsupported("a persistent array that is not a host array")
        self.keep.append(root)
        return root.__array_interface__["data"][0] + r.off

    def arg_root(self, r: _Ref) -> tuple[str, tuple, tuple]:
        key = (r.kind, r.index)
        var = self.args.get(key)
        if var is None:
            var = self.args[key] = f"a{len(self.per_call)}"
            self.params.append(var)
            self.per_call.append(key)
        if r.kind == "in":
            data = self.prog.inputs[r.index]
            return var, _shape(data), _strides(data)
        shape = self.prog.derived_shapes[r.index]    # a C-contiguous converted copy
        return var, shape, _c_strides(shape, r.dtype.itemsize)

    def view(self, r: _Ref) -> str:
        key = r.desc()
        if key in self.views:
            return self.views[key]
        if r.off % r.dtype.itemsize:
            raise _Unsupported("a misaligned view")
        if r.kind in ("tmp", "fix", "opt"):
            k = len(self.meta)
            self.meta += [self.address(r), *r.shape, *r.strides]
            spec = f"{r.dtype.str}:{len(r.shape)}:{r.layout}"
            return self.bind(key, f"_array(m, {k}, {spec!r})")
        var, rshape, rstrides = self.arg_root(r)
        item = r.dtype.itemsize
        if r.off == 0 and (r.shape, r.strides) == (rshape, rstrides):
            self.views[key] = var
            return var
        if r.off == 0 and len(r.shape) == 2 and r.shape == rshape[::-1] \
                and r.strides == rstrides[::-1]:
            return self.bind(key, f"{var}.T")
        if _c_contiguous(rshape, rstrides, item):
            flat = f"{var}.reshape(({self.slot(math.prod(rshape))},))"
        elif len(rshape) == 2 and _c_contiguous(rshape[::-1], rstrides[::-1], item):
            flat = f"{var}.T.reshape(({self.slot(math.prod(rshape))},))"
        else:
            raise _Unsupported("a view of a non-contiguous argument")
        o, size, shape = r.off // item, math.prod(r.shape), r.shape
        if r.layout == "C" or len(shape) == 0:
            dims = "".join(f"{self.slot(n)}, " for n in shape)
            return self.bind(key, f"{flat}[{o}:{o + size}].reshape(({dims}))")
        if r.layout == "F" and len(shape) == 2:
            dims = f"{self.slot(shape[1])}, {self.slot(shape[0])}"
            return self.bind(key, f"{flat}[{o}:{o + size}].reshape(({dims})).T")
        raise _Unsupported("a strided view of an argument")

    def bind(self, key: tuple, expr: str) -> str:
        var = f"v{len(self.views)}"
        self.lines.append(f"    {var} = {expr}")
        self.views[key] = var
        return var

    def kernel(self, fn: Callable, cargs: tuple, kwargs: dict) -> tuple[str, str]:
        """(meta slot of the address, type text) of the overload eager mode ran."""
        if not isinstance(fn, numba.core.registry.CPUDispatcher):
            raise _Unsupported(f"{getattr(fn, '__name__', fn)} is not an @njit kernel")
        if kwargs:
            raise _Unsupported("a kernel called with keyword arguments")
        sig = tuple(numba.typeof(a) for a in cargs)
        cres = fn.overloads.get(sig)
        if cres is None:   # eager dispatch converted to another overload: keep that one
            raise _Unsupported(f"no exact overload of {fn.__name__} for {sig}")
        if cres.signature.return_type != _nbtypes.none:
            raise _Unsupported(f"kernel {fn.__name__} returns a value")
        addr = cres.library.get_pointer_to_function(cres.fndesc.llvm_cfunc_wrapper_name)
        if not addr:
            raise _Unsupported(f"kernel {fn.__name__} has no C wrapper")
        return self.slot(addr), "|".join(_type_text(t) for t in sig)

    def arg(self, a: Any) -> str:
        return self.view(a) if isinstance(a, _Ref) else _scalar_expr(a[1], self.meta)

    def opt_ref(self, a: np.ndarray) -> _Ref:
        root = _owner(a)
        for k, r in enumerate(self.opt_roots):
            if r is root:
                break
        else:
            k = len(self.opt_roots)
            self.opt_roots.append(root)
        return _Ref("opt", k, _address(a) - _address(root), _shape(a), _strides(a), a.dtype,
                    numba.typeof(a).layout)

    def boundary_call(self) -> list[str]:
        """The optimizer's window boundary, run when its ``ctl[0]`` says so."""
        fused = self.boundary
        refs = [self.opt_ref(a) if isinstance(a, np.ndarray) else ("s", a)
                for a in fused.args]
        addr, expect = self.kernel(fused.kernel, fused.args, {})
        ctl = self.view(self.opt_ref(fused.ctl))
        parts = ", ".join(self.arg(a) for a in refs)
        return [f"    if {ctl}[0] != 0.0:",
                f"        _call({addr}, ({parts},), {expect!r})   # the optimizer's update"]

    def source(self) -> str:
        prog = self.prog
        self.plan_arenas()
        # label checks come before any kernel: a bad label raises before anything is written
        checks = []
        for labels, classes in prog.labels:
            var = self.view(labels)
            c = self.slot(classes)
            checks += [f"    for i in range({var}.size):",
                       f"        if {var}[i] < 0 or {var}[i] >= {c}:",
                       "            raise ValueError('ng.compile: a class label is out of range')"]
        body = []
        for (fn, name, rargs, _), (cargs, kwargs) in zip(prog.calls, prog.originals):
            addr, expect = self.kernel(fn, cargs, kwargs)
            parts = [self.arg(a) for a in rargs]
            body.append(f"    _call({addr}, ({', '.join(parts)},), {expect!r})   # {name}")
        if self.boundary is not None:
            body += self.boundary_call()
        loss = self.view(prog.loss)
        index = ", ".join(["0"] * len(prog.loss.shape)) or "()"
        lines = ['"""Generated by numbagrad.compile (a recorded training step); do not edit.',
                 "",
                 "Kernels are called through the addresses in ``m`` (their compiled C",
                 'wrappers), arrays are views of the buffers whose addresses ``m`` holds."""',
                 "import numpy as np",
                 "from numba import njit",
                 "from numbagrad.compile import _array, _call",
                 "",
                 "",
                 "@njit(cache=True)",
                 f"def step({', '.join(self.params)}):",
                 *self.lines, *checks, *body,
                 f"    return {loss}[{index}]",
                 ""]
        return "\n".join(lines)


# ---------------------------------------------------------------- the cache folder
def cache_dir(path: str | None = None) -> str:
    """Where generated modules (and Numba's cache of them) are written:
    ``path``, else ``$NUMBAGRAD_CACHE_DIR``, else ``~/.cache/numbagrad``
    (``$XDG_CACHE_HOME`` respected), each with a ``compiled`` subfolder. It is
    used only while it is this user's private folder (see ``_folder_problem``)."""
    base = path or os.environ.get("NUMBAGRAD_CACHE_DIR")
    if not base:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        base = os.path.join(xdg, "numbagrad")
    return os.path.join(base, "compiled")


_modules: dict[str, ModuleType] = {}
_refused: dict[str, str] = {}      # a refused cache folder -> the private one used instead


def _folder_problem(folder: str) -> str | None:
    """Why ``folder`` (created with mode 0700 if missing) may not hold code that
    is executed: None when it is a real folder owned by this user that no one
    else can write (its mode is then made 0700)."""
    try:
        os.makedirs(os.path.dirname(os.path.abspath(folder)), exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder, 0o700)
        st = os.lstat(folder)
    except OSError as exc:
        return f"it cannot be created: {exc.strerror or exc}"
    if S_ISLNK(st.st_mode):
        return "it is a symlink"
    if not S_ISDIR(st.st_mode):
        return "it is not a folder"
    if hasattr(os, "geteuid"):
        if st.st_uid != os.geteuid():
            return f"it is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
        if st.st_mode & 0o022:
            return f"it is group- or world-writable (mode {S_IMODE(st.st_mode):o})"
        if S_IMODE(st.st_mode) != 0o700:
            try:
                os.chmod(folder, 0o700)
            except OSError as exc:
                return f"its mode cannot be set to 700: {exc.strerror or exc}"
    return None


def _refuse(folder: str, problem: str) -> str:
    """The private temporary folder used instead of ``folder`` (warned once per folder)."""
    fallback = _refused.get(folder)
    if fallback is None:
        fallback = os.path.join(_cache.private_tempdir(), "compiled")
        os.makedirs(fallback, 0o700, exist_ok=True)
        _refused[folder] = fallback
        warnings.warn(f"ng.compile: not using the cache folder {folder} ({problem}); generated "
                      f"steps go to the private folder {fallback} for this process only. Set "
                      f"NUMBAGRAD_CACHE_DIR (or cache_dir=) to a folder of your own to keep "
                      f"them across runs", RuntimeWarning, stacklevel=6)
    return fallback


def _write(path: str, data: bytes) -> None:
    """Write ``path`` whole or not at all (a private pid-named temporary, then
    a rename); the temporaries of killed writers to ``path`` go first."""
    folder, base = os.path.split(path)
    _atomic.remove_stale_temporaries(folder, base)
    fd, tmp = _atomic.create_temporary(folder, base)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _check_or_write(path: str, source: str) -> None:
    """Make ``path`` hold exactly ``source``: write it if missing, and rewrite
    it (with a warning) if it holds anything else."""
    data = source.encode()
    try:
        with open(path, "rb", opener=_no_follow) as f:
            found: bytes | None = f.read()
    except FileNotFoundError:
        found = None
    except OSError:          # a symlink, a folder: not a module this process wrote
        found = b""
    if found is not None and found != data:
        warnings.warn(f"ng.compile: the cached module {path} does not match the source hash "
                      f"in its name (truncated or modified); writing it again", RuntimeWarning,
                      stacklevel=7)
    if found != data:
        _write(path, data)


def _no_follow(path: str, flags: int) -> int:
    return os.open(path, flags | getattr(os, "O_NOFOLLOW", 0))


def _load_module(source: str, folder: str) -> tuple[ModuleType, str]:
    """Import ``source`` from a file named by its hash in ``folder``, or in a
    private temporary folder when ``folder`` is not private or not writable.
    The file is written once, and one found there is used only if it holds
    exactly ``source``. What runs is ``source`` itself, so nothing planted or
    changed after the check runs; the file is what Numba's ``cache=True`` keys on."""
    name = f"ngstep_{hashlib.sha256(source.encode()).hexdigest()[:20]}"
    fallback, problem = _refused.get(folder), ""
    if fallback is None:
        problem = _folder_problem(folder)
        if problem is None:
            try:
                return _load_from(folder, name, source)
            except OSError as exc:
                problem = f"it is not writable: {exc.strerror or exc}"
    try:
        return _load_from(fallback or _refuse(folder, problem), name, source)
    except OSError as exc:
        warnings.warn(f"ng.compile: no writable private cache folder ({exc}); the generated "
                      f"step {name} is not cached on disk", RuntimeWarning, stacklevel=5)
    return _exec(name, source), ""


def _load_from(folder: str, name: str, source: str) -> tuple[ModuleType, str]:
    path = os.path.join(folder, name + ".py")
    module = _modules.get(path)
    if module is None:
        _check_or_write(path, source)
        module = _modules[path] = _exec(name, source, path)
    return module, path


def _exec(name: str, source: str, path: str = "") -> ModuleType:
    """The module of ``source``, run from memory; backed by the file ``path``
    (which holds ``source``) when given, without a file Numba cannot cache it."""
    module = ModuleType(name)
    if path:
        module.__file__ = path
        sys.modules[name] = module
    else:
        source = source.replace("@njit(cache=True)", "@njit")
    code = builtins.compile(source, path or f"<{name}>", "exec")   # not this module's compile
    exec(code, module.__dict__)   # noqa: S102
    return module


# ---------------------------------------------------------------- entries
_MISS = object()         # a runner's answer: these arguments are not its signature
_VERIFY = object()       # a runner's answer: record this call again and compare


class _Entry:
    """One signature's compiled step. ``run(args)`` returns the loss tensor
    (the optimizer stepped) or one of the sentinels above."""

    mode = "?"

    def __init__(self, prog: _Program | None, args: tuple, key: tuple, owner: CompiledStep
                 ) -> None:
        self.prog = prog
        self.key = key
        self.count = [1, 2 if owner.verify else 0]   # calls so far, next verifying call
        self.opt_step = owner.optimizer.step if owner.optimizer is not None else _no_step
        if prog is not None:
            self.state = [(p, p._data, p._acc) for p in prog.params]
            self.param_args = [(i, args[i]) for i in prog.param_args]

    def tick(self) -> bool:
        """Count a call; True when this one should be recorded again and compared."""
        count = self.count
        count[0] += 1
        if count[0] == count[1]:
            count[1] *= 2
            return True
        return False

    def fresh(self, args: tuple) -> bool:
        for p, d, g in self.state:
            if p._data is not d or p._acc is not g:
                return False
        for i, t in self.param_args:
            if args[i] is not t:
                return False
        for i, j in self.prog.alias:
            if _data(args[i]) is not _data(args[j]):
                return False
        return True


def _no_step() -> None:
    return None


def _window_of(optimizer: Any) -> Window | None:
    """A numbagrad optimizer's window (also through DistributedOptimizer), else None."""
    win = getattr(optimizer, "_window", None)
    return win if isinstance(win, Window) else None


def _data(a: Any) -> Any:
    return a._data if isinstance(a, Tensor) else a


class _NjitEntry(_Entry):
    """CPU: one generated @njit function, called by a generated Python runner
    that checks the arguments against the signature itself (no key tuple)."""

    mode = "njit"

    def __init__(self, prog: _Program, args: tuple, key: tuple, owner: CompiledStep,
                 gen: _Codegen, fn: Any) -> None:
        super().__init__(prog, args, key, owner)
        self.fn = fn
        self.fused = gen.boundary
        self.meta = np.array(gen.meta, np.int64)
        self.keep = gen.keep
        self.run = self._runner(gen, args)
        # the recording's own arrays are not needed any more (the arena replaces them)
        prog.originals, prog.temps, prog.inputs = [], [], {}

    def _runner(self, gen: _Codegen, args: tuple) -> Callable:
        prog = self.prog
        loss = prog.loss
        env: dict[str, Any] = {
            "_fn": self.fn, "_meta": self.meta, "_MISS": _MISS, "_STALE": _STALE,
            "_EAGER": _EAGER, "_VERIFY": _VERIFY, "_count": self.count, "_step": self.opt_step,
            "_asc": np.ascontiguousarray, "_data": _data, "_rc": sys.getrefcount,
            "_new": _LossMaker(prog.kern, loss.dtype, loss.shape), "_nd": np.ndarray}
        fused = self.fused
        if fused is not None:
            env.update(_begin=fused.begin, _commit=fused.commit, _disarm=fused.disarm,
                       _win=fused.win)
        lines = ["def run(args):", f"    if len(args) != {len(args)}:", "        return _MISS"]
        for i, a in enumerate(args):      # the signature, checked in place
            env[f"_ty{i}"] = type(a)
            lines.append(f"    a{i} = args[{i}]")
            if isinstance(a, Tensor):
                d = a._data
                env[f"_s{i}"], env[f"_st{i}"], env[f"_dt{i}"] = d.shape, d.strides, d.dtype
                env[f"_k{i}"] = a._kern
                lines += [f"    if type(a{i}) is not _ty{i}:", "        return _MISS",
                          f"    d{i} = a{i}._data",
                          (f"    if d{i}.shape != _s{i} or d{i}.strides != _st{i} or "
                           f"(d{i}.dtype is not _dt{i} and d{i}.dtype != _dt{i}) or "
                           f"a{i}._kern is not _k{i} or "
                           f"a{i}.requires_grad is not {a.requires_grad}:"),
                          "        return _MISS"]
            elif _is_array(a):
                env[f"_s{i}"], env[f"_st{i}"], env[f"_dt{i}"] = a.shape, a.strides, a.dtype
                lines += [(f"    if type(a{i}) is not _ty{i} or a{i}.shape != _s{i} or "
                           f"a{i}.strides != _st{i} or "
                           f"(a{i}.dtype is not _dt{i} and a{i}.dtype != _dt{i}):"),
                          "        return _MISS",
                          f"    d{i} = a{i}"]
            else:
                env[f"_v{i}"] = a
                lines += [f"    if type(a{i}) is not _ty{i} or a{i} != _v{i}:",
                          "        return _MISS"]
        for k, (p, d, g) in enumerate(self.state):
            env[f"_p{k}"], env[f"_pd{k}"], env[f"_pg{k}"] = p, d, g
            lines += [f"    if _p{k}._data is not _pd{k} or _p{k}._acc is not _pg{k}:",
                      "        return _STALE"]
        for k, (i, t) in enumerate(self.param_args):
            env[f"_t{k}"] = t
            lines += [f"    if a{i} is not _t{k}:", "        return _STALE"]
        for i, j in prog.alias:
            lines += [f"    if d{i} is not d{j}:", "        return _STALE"]
        lines += ["    c = _count[0] + 1", "    _count[0] = c", "    if c == _count[1]:",
                  "        _count[1] = 2 * c", "        return _VERIFY"]
        names = ["_meta"]
        for j, (kind, idx) in enumerate(gen.per_call):
            if kind == "in":
                names.append(f"d{idx}")
            else:
                i, dtype = prog.derived[idx]
                env[f"_ddt{j}"] = dtype
                lines.append(f"    x{j} = _asc(d{i}, _ddt{j})")
                names.append(f"x{j}")
        if fused is not None:
            # FusedUpdate.begin() inlined for a micro-step inside the window (the
            # optimizer was adopted by no other: the params' buffers were checked)
            lines += ["    w = _win",
                      ("    if w.pos + 1 < w.accumulate_steps and w.hook is None and "
                       "w.mode != 'map' and w.average != 'samples':"),
                      f"        fz = {FusedUpdate.COUNT}", "    else:", "        fz = _begin()"]
        # the step did not run: no window boundary stays armed
        disarm = ["        _disarm()"] if fused is not None else []
        lines += ["    try:", f"        v = _fn({', '.join(names)})",
                  "    except ValueError:", *disarm, "        return _EAGER"]
        if fused is not None:
            lines += ["    except BaseException:", *disarm, "        raise"]
        lines += [f"    _p{k}._live = True" for k in range(len(self.state))]
        # a loss tensor nothing else holds (nor its array) is refilled, else a new one
        lines += ["    for loss in _ring:", ("        if _rc(loss) == _idle[0] and "
                                                "_rc(loss._data) == _idle[1]:"),
                  "            loss._data[_index] = v", "            break", "    else:",
                  "        loss = _new(v)",
                  *([f"    if fz == {FusedUpdate.COUNT}:", "        w.mode = 'grad'",
                     "        w.pos += 1", f"    elif fz == {FusedUpdate.CLOSE}:",
                     "        _commit()", "    else:", "        _step()"]
                    if fused is not None else ["    _step()"]),
                  "    return loss",
                  "", "", "def calibrate():",     # the same frame shape as the loop above
                  "    for loss in _ring:", "        return _rc(loss), _rc(loss._data)"]
        maker = env["_new"]
        env.update(_ring=maker.ring, _idle=maker.idle, _index=maker.index)
        self.source = "\n".join(lines)
        exec(self.source, env)   # noqa: S102 (generated from the recording)
        maker.calibrate = env["calibrate"]
        return env["run"]


class _LossMaker:
    """Loss tensors for the values the @njit step returns. The runner refills
    a tensor of ``ring`` that nothing outside holds (nor its array), as the
    buffer pool reuses idle arrays; held ones are never touched. This makes
    the new ones, up to four kept in the ring."""

    __slots__ = ("calibrate", "dtype", "idle", "index", "kern", "ring", "shape")

    def __init__(self, kern: ModuleType, dtype: np.dtype, shape: tuple) -> None:
        self.kern, self.dtype, self.shape = kern, dtype, shape
        self.index = (0,) * len(shape)
        self.ring: list[Tensor] = []
        self.idle = [-1, -1]       # reference counts of an idle ring tensor and its array
        self.calibrate: Callable | None = None

    def __call__(self, value: Any) -> Tensor:
        t = Tensor(np.full(self.shape, value, self.dtype), self.kern)
        ring = self.ring
        if len(ring) < 4 and buffers.IDLE_REFS is not None and self.calibrate is not None:
            if not ring:
                ring.append(t)
                refs, data_refs = self.calibrate()   # `t` here is one reference more
                held = t._data
                if self.calibrate()[1] == data_refs + 1:   # counts behave as expected
                    self.idle[:] = [refs - 1, data_refs]
                else:
                    ring.clear()
                del held
            else:
                ring.append(t)
        return t


class _ReplayEntry(_Entry):
    """CUDA (or a CPU recording the generator cannot express): the recorded
    kernel calls issued back to back from Python, with no tape work."""

    mode = "replay"

    def __init__(self, prog: _Program, args: tuple, key: tuple, owner: CompiledStep) -> None:
        super().__init__(prog, args, key, owner)
        self.kern = prog.kern
        lref = prog.loss
        if lref.kind != "tmp":
            raise _Unsupported("the loss is not an op output")
        # The loss buffer rotates through a small ring, as the pool would, so a
        # loss tensor the caller keeps is never overwritten by a later call.
        self.loss_root = prog.temps[lref.index]
        self.loss_ref = lref
        self.loss_views: dict[tuple, _Ref] = {lref.desc(): lref}
        self.ring: list[list] = []
        plan = []
        for (fn, name, rargs, rkw), (cargs, kwargs) in zip(prog.calls, prog.originals):
            fixed, dyn = list(cargs), []
            for pos, a in enumerate(rargs):
                if not isinstance(a, _Ref):
                    continue
                if a.kind == "tmp" and a.index == lref.index:
                    dyn.append((pos, "loss", a.desc()))
                    self.loss_views[a.desc()] = a
                elif a.kind in ("in", "der"):
                    dyn.append((pos, a.kind, a))
                else:
                    continue
                fixed[pos] = None
            if any(isinstance(v, _Ref) and (v.kind in ("in", "der") or (
                    v.kind == "tmp" and v.index == lref.index)) for v in rkw.values()):
                raise _Unsupported("a per-call keyword array")
            plan.append((fn, tuple(fixed), dyn, kwargs))
        self.plan = plan
        self.labels = prog.labels
        for pos, kind, a in (d for _, _, dyn, _ in plan for d in dyn):
            if kind in ("in", "der"):   # fails now, not on a later call
                root = prog.inputs[a.index] if kind == "in" else None
                if root is not None:
                    _view(root, a.off, a.shape, a.strides)

    def ring_entry(self) -> list:
        for entry in self.ring:
            if sys.getrefcount(entry[0]) == entry[1]:
                return entry
        root = self.kern.empty(_shape(self.loss_root), self.loss_root.dtype)
        views = {key: _view(root, r.off, r.shape, r.strides)
                 for key, r in self.loss_views.items()}
        entry = [views[self.loss_ref.desc()], 0, root, views]
        if len(self.ring) < MAX_SIGNATURES:
            self.ring.append(entry)
            entry[1] = sys.getrefcount(entry[0])
        return entry

    def run(self, args: tuple) -> Any:
        if _key(args) != self.key:
            return _MISS
        if not self.fresh(args):
            return _STALE
        if self.tick():
            return _VERIFY
        prog = self.prog
        derived = [np.ascontiguousarray(args[i], dtype) for i, dtype in prog.derived]
        for labels, classes in self.labels:
            host = (_data(args[labels.index]) if labels.kind == "in"
                    else derived[labels.index])
            if isinstance(host, np.ndarray) and first_bad_label(host, classes) >= 0:
                return _EAGER
        ring = self.ring_entry()
        views = ring[3]
        for fn, fixed, dyn, kw in self.plan:
            if dyn:
                fixed = list(fixed)
                for pos, kind, a in dyn:
                    if kind == "loss":
                        fixed[pos] = views[a]
                    elif kind == "in":
                        fixed[pos] = _view(_data(args[a.index]), a.off, a.shape, a.strides)
                    else:
                        fixed[pos] = _view(derived[a.index], a.off, a.shape, a.strides)
            fn(*fixed, **kw)
        for p, _, _ in self.state:
            p._live = True
        loss = Tensor(ring[0], self.kern)
        self.opt_step()
        return loss


# ---------------------------------------------------------------- the public API
class CompiledStep:
    """A training micro-step recorded once per signature and replayed.

    Call it like ``fn``: ``loss = step(*args)``. Attributes: ``fn``,
    ``optimizer``, ``stats`` (one dict per recording: the signature, ``mode``
    "njit" / "replay" / "eager", ``record_s``, and for "njit" ``codegen_s``,
    ``jit_s``, ``cache`` ("hit": loaded from Numba's cache, "miss": compiled,
    "loaded": already in this process), the generated ``module`` and
    ``fused_update``: whether the optimizer's update runs inside it),
    ``signatures`` (the cached ones, oldest first).
    """

    def __init__(self, fn: Callable, optimizer: Any = None, *, verify: bool = True,
                 cache_dir: str | None = None, max_signatures: int = MAX_SIGNATURES,
                 fuse_update: bool = True) -> None:
        if not callable(fn):
            raise TypeError(f"ng.compile needs a callable, got {type(fn).__name__}")
        if optimizer is not None and not callable(getattr(optimizer, "step", None)):
            raise TypeError(f"optimizer must have a step() method, got "
                            f"{type(optimizer).__name__}")
        self.fn = fn
        self._optimizer = optimizer
        self._window = _window_of(optimizer)
        self.verify = bool(verify)
        self.fuse = bool(fuse_update)
        self.cache_dir = cache_dir
        self.max_signatures = max(1, int(max_signatures))
        self.stats: list[dict[str, Any]] = []
        self._entries: OrderedDict[tuple, _Entry] = OrderedDict()
        self._last: _Entry | None = None
        self.__wrapped__ = fn

    @property
    def signatures(self) -> list[tuple]:
        return list(self._entries)

    @property
    def optimizer(self) -> Any:
        return self._optimizer

    @optimizer.setter
    def optimizer(self, value: Any) -> None:
        """Another optimizer (or None): every signature records again."""
        if value is not None and not callable(getattr(value, "step", None)):
            raise TypeError(f"optimizer must have a step() method, got {type(value).__name__}")
        self._optimizer = value
        self._window = _window_of(value)
        self._entries.clear()
        self._last = None

    def __repr__(self) -> str:
        name = getattr(self.fn, "__qualname__", repr(self.fn))
        return f"ng.compile({name}, {len(self._entries)} signature(s))"

    def __call__(self, *args: Any) -> Tensor:
        win = self._window   # the optimizer's window is one thread's (optim/window.py)
        if win is not None and win.thread != threading.get_ident():
            win.claim("a compiled step (ng.compile)")
        try:   # one frame, no helper call: this is the compiled step's hot path
            entry = self._last
            if entry is not None:
                out = entry.run(args)
                if type(out) is Tensor:
                    return out
            else:
                out = _MISS
            if out is _MISS:
                key = _key(args)
                entry = self._entries.get(key)
                if entry is None:
                    return self._record(args, key, None)
                self._last = entry
                self._entries.move_to_end(key)
                out = entry.run(args)
                if type(out) is Tensor:
                    return out
                if out is _MISS:    # the key matched but the runner's guard did not: be safe
                    return self._eager(args)
            if out is _STALE:
                return self._record(args, entry.key, None)
            if out is _VERIFY:
                return self._record(args, entry.key, entry)
            if out is _EAGER:
                return self._eager(args)
            raise RuntimeError(f"ng.compile: internal error, unexpected runner answer {out!r}")
        except BaseException:
            if win is not None:
                win.release_if_idle()    # a step that raised before counting holds nothing
            raise

    # ------------------------------------------------------------ internals
    def _eager(self, args: tuple) -> Tensor:
        with tape.grad_tape():
            loss = self.fn(*args)
        loss.backward()
        self._step_optimizer()
        return loss

    def _step_optimizer(self) -> None:
        if self.optimizer is not None:
            self.optimizer.step()

    def _record(self, args: tuple, key: tuple, check: _Entry | None) -> Tensor:
        for i, a in enumerate(args):
            if isinstance(a, Tensor) and a._node is not None:
                raise TypeError(f"ng.compile: argument {i} is the output of a recorded op; "
                                f"pass leaf tensors (the graph is recorded inside fn)")
        t0 = time.perf_counter()
        with _recording() as rec:
            with tape.grad_tape():
                loss = self.fn(*args)
            if not isinstance(loss, Tensor):
                raise TypeError(f"ng.compile: fn must return the loss Tensor, got "
                                f"{type(loss).__name__}")
            params = _reached_params(loss) if loss._node is not None else []
            loss.backward()     # eager's errors (not recorded, not one element) as they are
        t1 = time.perf_counter()
        if rec.host_reads and check is None:
            warnings.warn("ng.compile: fn copied a tensor to the host (.item(), .numpy()) "
                          "while being recorded; replays run no Python code, so a decision "
                          "taken on that value is frozen into the compiled step",
                          RuntimeWarning, stacklevel=3)
        devices = {_device_of(call[2]) for call in rec.calls} - {None}
        host = loss.device == "cpu" and devices <= {"cpu"}   # else: Python replay
        reason = ""
        try:
            prog = _analyze(rec, args, loss, params, host)
        except Exception as exc:  # noqa: BLE001 (whatever fails, the call itself is done)
            prog, reason = None, _reason(exc)
        if check is not None:
            problem = ("its arrays cannot be mapped as before" if prog is None
                       else _compare(check.prog, prog, args))
            if problem is not None:
                raise GraphChangedError(
                    f"ng.compile: {getattr(self.fn, '__qualname__', 'fn')} recorded a different "
                    f"graph on call {check.count[0]} for the same signature "
                    f"{_describe_args(args)}: {problem}. A compiled step replays the graph "
                    f"recorded on the first call; Python control flow that depends on tensor "
                    f"values or on state outside the arguments is not captured. Make the "
                    f"choice an argument (each value is its own signature) or run this step "
                    f"eagerly.")
            self._step_optimizer()
            return loss
        stat: dict[str, Any] = {"signature": _describe_args(args), "record_s": t1 - t0}
        entry: _Entry | None = None
        if prog is not None and host:
            try:
                entry = self._njit_entry(prog, args, key, stat)
            except Exception as exc:  # noqa: BLE001 (replayed from Python instead)
                reason = _reason(exc)
        if prog is not None and entry is None:
            try:
                entry = _ReplayEntry(prog, args, key, self)
                if host:
                    warnings.warn(f"ng.compile: no @njit function for this step ({reason}); "
                                  f"its kernels are replayed from Python", RuntimeWarning,
                                  stacklevel=3)
            except Exception as exc:  # noqa: BLE001 (run eagerly instead)
                reason = _reason(exc)
        if entry is None:
            warnings.warn(f"ng.compile: this step cannot be replayed ({reason}); it runs "
                          f"eagerly for this signature", RuntimeWarning, stacklevel=3)
            entry = _EagerEntry(None, args, key, self)
        stat["mode"] = entry.mode
        stat["total_s"] = time.perf_counter() - t0
        self.stats.append(stat)
        self._entries[key] = entry
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_signatures:
            self._entries.popitem(last=False)
        self._last = entry
        self._step_optimizer()
        return loss

    def _njit_entry(self, prog: _Program, args: tuple, key: tuple, stat: dict) -> _NjitEntry:
        t0 = time.perf_counter()
        fused = None
        if self.optimizer is not None and self.fuse:
            fused = FusedUpdate.build(self.optimizer, prog.params)
            if fused is not None:
                try:
                    fused.kernel.compile(tuple(numba.typeof(a) for a in fused.args))
                except Exception as exc:  # noqa: BLE001 (the update then runs from Python)
                    warnings.warn(f"ng.compile: the optimizer update stays outside the "
                                  f"compiled step ({_reason(exc)})", RuntimeWarning,
                                  stacklevel=4)
                    fused = None
        gen = _Codegen(prog, fused)
        source = gen.source()
        module, path = _load_module(source, cache_dir(self.cache_dir))
        fn = module.step
        t1 = time.perf_counter()
        per_call = []
        for kind, idx in gen.per_call:
            if kind == "in":
                per_call.append(_data(args[idx]))
            else:
                i, dtype = prog.derived[idx]
                per_call.append(np.ascontiguousarray(args[i], dtype))
        meta = np.array(gen.meta, np.int64)
        sig = tuple(numba.typeof(a) for a in [meta, *per_call])
        loaded = sig in fn.overloads
        hits = sum(fn.stats.cache_hits.values())
        try:
            fn.compile(sig)
        except Exception as exc:  # noqa: BLE001 (a typing problem in generated code: replay)
            raise _Unsupported(f"Numba could not compile the generated step "
                               f"({_reason(exc)})") from None
        cache = ("loaded" if loaded else
                 "hit" if sum(fn.stats.cache_hits.values()) > hits else "miss")
        stat.update(codegen_s=t1 - t0, jit_s=time.perf_counter() - t1, cache=cache,
                    module=path, fused_update=fused is not None)
        # Tensors' arrays are numbagrad's own (aligned, and checked against the
        # signature by the runner), so those calls may skip Numba's dispatch
        direct = None
        if all(kind == "in" and isinstance(args[idx], Tensor) for kind, idx in gen.per_call):
            direct = getattr(fn.overloads.get(sig), "entry_point", None)
        return _NjitEntry(prog, args, key, self, gen, direct or fn)


def _reason(exc: Exception) -> str:
    if isinstance(exc, _Unsupported):
        return str(exc)
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


class _EagerEntry(_Entry):
    """A signature whose recording cannot be replayed: every call runs eagerly."""

    mode = "eager"

    def run(self, args: tuple) -> Any:
        return _MISS if _key(args) != self.key else _EAGER


def compile(fn: Callable, optimizer: Any = None, *, verify: bool = True,
            cache_dir: str | None = None, fuse_update: bool = True) -> CompiledStep:
    """Record ``fn``'s training step once per signature and replay it compiled.

    ``step = ng.compile(fn)``; ``loss = step(*args)`` does what
    ``with ng.grad_tape(): loss = fn(*args)`` then ``loss.backward()`` does
    (gradients added into every reached param's ``.grad``) and returns the
    loss tensor. With ``optimizer=opt`` it then calls ``opt.step()``, so one
    call is a whole micro-step, the window's update included.

    **Signatures.** A signature is each argument's shape, strides, dtype and
    device (a tensor's ``requires_grad`` too; Python numbers by value). The
    first call with a new signature runs ``fn`` eagerly on a tape, raising
    whatever eager mode raises (a shape an op rejects, say), records every
    kernel call, and generates one ``@njit`` function that issues them in the
    same order on buffers allocated once for that signature. Later calls
    replay it: no tape, no op dispatch, no allocation. The last
    ``MAX_SIGNATURES`` (8) signatures are kept. A param that no longer holds
    the arrays it was recorded with (a new optimizer adopted it) makes the
    next call record again.

    **What is captured.** Only kernels. Python code in ``fn`` runs on the
    recording call only: control flow that depends on tensor values
    (``if loss.item() > 1``) or on state outside the arguments (a counter, a
    random choice) is frozen as it went on that call, and arrays ``fn``
    creates itself (``ng.tensor(...)`` of closure data) are captured as
    constants; arrays passed as arguments are read fresh on every call. To
    catch the common mistake, the 2nd, 4th, 8th, ... call of a signature runs
    eagerly again and compares what it records: a different graph raises
    ``GraphChangedError`` (``verify=False`` skips these checks). Class labels
    are range-checked on every call, raising eager mode's error.

    **Results** are bit-identical to eager execution on the CPU: the same
    compiled kernels, called with the same arguments in the same order.

    **Cache.** The generated module is written to ``cache_dir`` (default
    ``$NUMBAGRAD_CACHE_DIR`` or ``~/.cache/numbagrad``, subfolder
    ``compiled``) under a hash of its source, so Numba's ``cache=True`` lets
    a later process skip compiling it. The source holds no addresses, shapes
    or kernels (they are data), so graphs of the same form share it: a new
    batch size records again but compiles nothing. ``step.stats`` reports
    each recording's record, codegen and jit time and the cache outcome. The
    folder must be this user's own with mode 0700 (created so); any other one
    (someone else's, group- or world-writable, a symlink, not writable) is
    refused, with one warning, for a private ``tempfile.mkdtemp`` folder, and a
    module found there runs only if it holds exactly the source its name is
    the hash of (else it is written again, with a warning).

    **Optimizer.** On the CPU the update is part of the compiled function:
    at a window boundary it checks the window's total, clips it and applies
    the SGD/Adam/AdamW update with the optimizer's own kernels (the same
    bits as ``opt.step()``), while the window's bookkeeping (positions,
    ``t``, schedules evaluated once per update) stays the optimizer's, in
    Python around the call. This needs a numbagrad optimizer whose params
    are all of one dtype and all reached by ``fn``, and fewer params than
    the threaded kernels' threshold (``NUMBAGRAD_PARALLEL_MIN``, 65536
    elements: above it the update dominates the step and eager dispatch
    picks its faster variant). Otherwise, and for micro-steps the window
    must handle itself (a ``step(grads)`` window, ``average="samples"``, a
    ``DistributedOptimizer``, a non-finite total), ``opt.step()`` runs after
    the compiled forward and backward, so every error and warning is eager
    mode's. ``fuse_update=False`` always calls ``opt.step()``.

    **CUDA.** numba-cuda offers no CUDA graphs, so the recorded launches are
    replayed back to back from Python: the same launches (and counts) as
    eager mode, without tape or op work between them. The returned loss
    stays on the device.

    Arguments are positional. A compiled step is not for concurrent calls
    from several threads (it owns one set of buffers per signature);
    recording holds a global lock.
    """
    return CompiledStep(fn, optimizer, verify=verify, cache_dir=cache_dir,
                        fuse_update=fuse_update)

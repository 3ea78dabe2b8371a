"""Tensor: an array on a device, and the trainable leaf ``param``.

Tensors have reference semantics: ops read ``.data`` in place, optimizers
update a param's data in place, and a param's ``.grad`` is one accumulator
that every backward pass adds into until it is cleared.
"""
from __future__ import annotations

import itertools
import weakref
from collections.abc import Iterable
from types import ModuleType
from typing import Any

import numpy as np

from . import _defaults, _dtypes, buffers, kernels

_ids = itertools.count(1)
# In-place writes so far, process-wide: ``_writes[0]`` stamps each write on
# the tensor written (``_stamp``) and each recorded node (``Node.stamp``), so
# a backward can tell an input written after its node was recorded (0 while
# nothing was ever written in place: the backward then checks nothing).
_writes = [0]
_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))

# Accumulators handed out by ``.grad`` (by id of the array and of its base:
# a view of an optimizer's flat buffer), and the tensors that wrap one
# without a copy (``as_tensor(W.grad)``). A backward that would write an
# accumulator one of its inputs reads defers that param's gradient (see
# ``tape.run_backward``), so the wrapper is read as it was.
_handed: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


class _WeakIdSet:
    """A weak set of tensors by identity: a WeakSet would compare its
    members with ``==``, which on tensors is elementwise."""

    __slots__ = ("_by_id",)

    def __init__(self) -> None:
        self._by_id: weakref.WeakValueDictionary = weakref.WeakValueDictionary()

    def add(self, t: Tensor) -> None:
        self._by_id[id(t)] = t

    def __contains__(self, t: object) -> bool:
        return self._by_id.get(id(t)) is t

    def __len__(self) -> int:
        return len(self._by_id)


_wrappers = _WeakIdSet()


class _Seen:
    """Whether ``_handed``/``_wrappers`` ever held anything: plain flags, so
    the hot paths test a bool, not a weak container's (Python-level) length."""
    handed = False
    wrapped = False


_seen = _Seen()


# dtype kinds from narrowest to widest (signed and unsigned integers alike): an
# arithmetic in-place op may not widen
_KINDS = {"b": 0, "u": 1, "i": 1, "f": 2}


class Tensor:
    """An n-dimensional array with an autograd identity.

    Build one with ``ng.tensor``, ``ng.param`` or ``ng.as_tensor``; ops
    return new tensors. ``.data`` is the live array (host ``numpy.ndarray``
    on "cpu", a Numba device array on "cuda"); ``.numpy()`` is a host copy.
    """

    # _stamp (the last in-place write, see _writes) and _base (the tensor a
    # view or a detach() shares data with) are set only on the tensors that
    # have them: read them with getattr
    __slots__ = ("_data", "_kern", "requires_grad", "id", "_node",
                 "_acc", "_live", "_owner", "_pool", "_stamp", "_base", "__weakref__")
    # NumPy defers to a Tensor's reflected operators and __array_ufunc__.
    __array_priority__ = 1000
    # == is elementwise (the op table's ``eq``); tensors hash by identity
    __hash__ = object.__hash__

    def __init__(self, data: Any, kern: ModuleType, requires_grad: bool = False,
                 node: Any = None, pool: Any = None) -> None:
        self._data = data
        self._kern = kern
        self.requires_grad = requires_grad
        self.id = next(_ids)
        self._node = node      # the tape record that produced it, if any
        self._acc = None       # gradient accumulator (params only)
        self._live = False     # whether _acc holds a gradient (.grad not None)
        self._owner = None     # the optimizer whose flat buffers hold it
        self._pool = pool      # the pooled array its data is (a view of), if any

    # ------------------------------------------------------------ views
    @property
    def data(self) -> Any:
        """The live array. Once handed out, a pooled op output is never
        reused for another result, so views of it stay valid."""
        if self._pool is not None:
            buffers.retire(self._kern, self._pool)
            self._pool = None
        return self._data

    @data.setter
    def data(self, value: Any) -> None:
        """Write ``value`` into the data in place, recording nothing (as
        PyTorch's ``p.data = ...``, but the shape stays: the array may be a
        view of an optimizer's flat buffer). ``p.data -= lr * p.grad`` has
        already written the array when Python calls this with it, which is
        then only noted. Values are cast to the tensor's dtype."""
        _refuse_while_compiling("t.data = value")
        if value is not self._data:
            _assign(self, value, "t.data = value")
        _note_write(self)

    @property
    def device(self) -> str:
        return self._kern.name

    @property
    def shape(self) -> tuple:
        shape = self._data.shape
        return shape if type(shape) is tuple else tuple(shape)   # the CUDA simulator's

    @property
    def dtype(self) -> np.dtype:
        return self._data.dtype

    @property
    def ndim(self) -> int:
        return len(self._data.shape)

    @property
    def size(self) -> _Size:
        """The element count (NumPy's ``a.size``), which can also be called
        as PyTorch's ``t.size()`` (the shape) and ``t.size(dim)``."""
        size = _sizes.get(self._data.shape)
        return size if size is not None else _size_of(self.shape)

    def numel(self) -> int:
        """The element count, as PyTorch's ``numel()``."""
        return self._data.size

    def dim(self) -> int:
        """The number of dims, as PyTorch's ``dim()``."""
        return len(self._data.shape)

    @property
    def is_leaf(self) -> bool:
        return self._node is None

    @property
    def is_param(self) -> bool:
        return self.requires_grad and self._node is None

    def numpy(self) -> np.ndarray:
        """A host copy of the data (never shares memory with the tensor)."""
        return kernels.to_host(self._kern, self._data)

    def tolist(self) -> Any:
        """The data as nested Python lists (a Python number for 0-d)."""
        return self.numpy().tolist()

    def item(self) -> float | int | bool:
        """The value of a one-element tensor as a Python number: a float, or
        an int or bool for an integer or bool tensor (as PyTorch's)."""
        if self.size != 1:
            raise ValueError(f"item() needs a one-element tensor, got shape {self.shape}")
        return self.numpy().reshape(-1)[0].item()

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __index__(self) -> int:
        """An integer one-element tensor as an index (``range(t)``, ``a[t]``)."""
        if self.dtype.kind not in "iu":
            raise TypeError(f"only integer tensors of one element can be an index, got a "
                            f"tensor of shape {self.shape}, {self.dtype}")
        return int(self.item())

    def __bool__(self) -> bool:
        """The truth of a one-element tensor (``if (x > 0):``), as PyTorch and
        NumPy; more elements are ambiguous (use ``.numpy().any()``/``all()``)."""
        if self.size != 1:
            raise ValueError(f"the truth value of a tensor of shape {self.shape} is "
                             "ambiguous; use t.numpy().any() or t.numpy().all()")
        return bool(self.numpy().reshape(-1)[0])

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        host = self.data if self._kern.name == "cpu" else self.numpy()
        if dtype is not None:
            host = host.astype(dtype, copy=False)
        return np.array(host, copy=True) if copy else host

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None,
                   copy: Any = None) -> Any:
        """A DLPack capsule sharing this "cpu" tensor's memory (the DLPack
        Python spec's signature, as NumPy 2.x takes it); see ``ng.interop``."""
        interop.check_exportable(self, "__dlpack__")
        # only the keywords given: NumPy before 2.1 takes ``stream`` alone
        given = {k: v for k, v in (("stream", stream), ("max_version", max_version),
                                   ("dl_device", dl_device), ("copy", copy)) if v is not None}
        if self._kern.name == "cpu":
            return self.data.__dlpack__(**given)
        export = getattr(type(self.data), "__dlpack__", None)   # a numba-cuda that has one
        if export is None:
            raise BufferError("__dlpack__: numba-cuda's device arrays have no DLPack "
                              "producer; a cuda tensor shares its memory through "
                              "__cuda_array_interface__ (torch.as_tensor(t, device='cuda'), "
                              "cupy.asarray(t))")
        return export(self.data, **given)

    def __dlpack_device__(self) -> tuple:
        """(DLPack device type, device id): (1, 0) on "cpu", (2, id) on "cuda"."""
        if self._kern.name == "cpu":
            return (1, 0)
        from numba import cuda
        return (2, getattr(cuda.get_current_device(), "id", 0))   # the simulator's: none

    @property
    def __cuda_array_interface__(self) -> dict:
        """A "cuda" tensor's device array's interface (zero-copy export)."""
        if self._kern.name != "cuda":
            raise AttributeError(f"a {self.device} tensor has no __cuda_array_interface__; "
                                 "use __dlpack__ or numpy()")
        interop.check_exportable(self, "__cuda_array_interface__")
        return interop.cuda_array_interface(self.data)

    def __len__(self) -> int:
        if not self._data.shape:
            raise TypeError("len() of a 0-d tensor")
        return self._data.shape[0]

    def __repr__(self) -> str:
        body = np.array2string(self.numpy(), separator=", ", prefix="tensor(")
        extra = ", param=True" if self.is_param else ""
        return f"tensor({body}, dtype={self.dtype}, device='{self.device}'{extra})"

    # ------------------------------------------------------------ operators
    # (the ops' operators and methods are added from the op table, below)
    def __pos__(self) -> Tensor:
        return self

    @property
    def T(self) -> Tensor:
        """Every dim reversed, as NumPy's ``.T`` (a 2-D tensor's transpose;
        vectors and 0-d tensors are returned as they are); a view where
        ``ng.permute``'s result is one."""
        return ops.shape._reversed_dims(self)

    @property
    def mT(self) -> Tensor:
        """The last two dims swapped, PyTorch's ``.mT`` (needs 2 dims)."""
        return ops.shape._matrix_transpose(self)

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        """NumPy ufuncs on tensors run the ng op (recorded on the tape), so a
        tensor never silently leaves the graph; others raise."""
        op = ops.table.UFUNCS.get(ufunc.__name__) if method == "__call__" and not kwargs \
            else None
        if op is None:
            alt = _UFUNC_HINTS.get(ufunc.__name__, "an ng op, or np.asarray(t) for the data")
            raise TypeError(f"numpy.{ufunc.__name__} ({method}) is not differentiable on a "
                            f"numbagrad Tensor; use {alt}")
        return op(*inputs)

    def __array_function__(self, func: Any, types: Any, args: tuple, kwargs: dict) -> Any:
        """NumPy functions on tensors run the ng op (recorded on the tape) or
        raise a TypeError naming the ng alternative: see ``ops/numpy_api.py``."""
        return _numpy_api.dispatch(func, args, kwargs)

    def to(self, *args: Any, device: str | None = None, dtype: Any = None,
           copy: bool = False) -> Tensor:
        """This tensor on another device and/or dtype, as PyTorch's ``to``:
        ``t.to("cuda")``, ``t.to(np.float32)``, ``t.to("cpu", np.float64)``,
        ``t.to(device=..., dtype=...)``, or ``t.to(other)`` (other's device
        and dtype). Itself when nothing changes (unless ``copy``).

        A dtype change is ``astype`` (recorded on the tape, so the gradient
        flows back in the original dtype). A device change copies: a param
        becomes a new, independent param (its ``.grad`` is not carried) and
        nothing is recorded.
        """
        for a in args:
            if isinstance(a, Tensor):
                device, dtype = device or a.device, dtype or a.dtype
            elif isinstance(a, str):
                if device is not None:
                    raise TypeError(f"to(): two devices given ({device!r}, {a!r})")
                device = a
            elif dtype is None:
                dtype = a
            else:
                raise TypeError(f"to(): two dtypes given ({dtype}, {a})")
        if len(args) > 2:
            raise TypeError(f"to() takes a device and a dtype, got {len(args)} arguments")
        out = self
        if dtype is not None and np.dtype(dtype) != self.dtype:
            out = ops.masks.astype(out, dtype)
        if device is not None and device != self.device:
            kern = kernels.get(device)
            out = Tensor(kernels.from_host(kern, out.numpy()), kern, out.is_param)
        elif copy and out is self:
            out = self.clone()
        return out

    def float(self) -> Tensor:
        """``to(np.float32)``, PyTorch's ``float()`` (``float(t)`` is still
        the Python number of a one-element tensor)."""
        return self.to(np.float32)

    def double(self) -> Tensor:
        """``to(np.float64)``, PyTorch's ``double()``."""
        return self.to(np.float64)

    def long(self) -> Tensor:
        """``to(np.int64)``, PyTorch's ``long()`` (floats round toward zero)."""
        return self.to(np.int64)

    def int(self) -> Tensor:
        """``to(np.int32)``, PyTorch's ``int()`` (``int(t)`` is still the
        Python number of a one-element tensor)."""
        return self.to(np.int32)

    def bool(self) -> Tensor:
        """``to(np.bool_)``, PyTorch's ``bool()``: non-zero is True."""
        return self.to(np.bool_)

    def is_floating_point(self) -> bool:
        """Whether this is a float tensor (the only kind that gets gradients)."""
        return _dtypes.is_float(self.dtype)

    def detach(self) -> Tensor:
        """A tensor sharing this one's data, outside the graph (no gradient),
        as PyTorch's ``detach()``. Writing it in place writes this tensor's
        data; that is refused while a recorded graph still needs it."""
        t = Tensor(self._data, self._kern)
        t._base = _root(self)
        return t

    def clone(self) -> Tensor:
        """A copy with its own data; recorded on the tape (the gradient passes
        through unchanged), as PyTorch's ``clone()``."""
        if not _dtypes.is_float(self.dtype):
            return Tensor(kernels.from_host(self._kern, self.numpy()), self._kern)
        return ops.masks.astype(self, self.dtype, copy=True)

    # ------------------------------------------------------------ in place
    # PyTorch's in-place methods, for params and constants outside a tape
    # (see _in_place for what is refused); each computes the out-of-place op
    # without recording and writes its result into the data, so ``x.add_(y)``
    # gives the bits of ``x + y``.
    def add_(self, other: Any, *, alpha: float = 1) -> Tensor:
        """``self += alpha * other`` in place."""
        return self._in_place("add_", lambda: self + (other if alpha == 1 else alpha * other),
                              other, arith=True)

    def sub_(self, other: Any, *, alpha: float = 1) -> Tensor:
        """``self -= alpha * other`` in place."""
        return self._in_place("sub_", lambda: self - (other if alpha == 1 else alpha * other),
                              other, arith=True)

    def mul_(self, other: Any) -> Tensor:
        """``self *= other`` in place."""
        return self._in_place("mul_", lambda: self * other, other, arith=True)

    def div_(self, other: Any) -> Tensor:
        """``self /= other`` in place."""
        return self._in_place("div_", lambda: self / other, other, arith=True)

    def clamp_(self, min: Any = None, max: Any = None) -> Tensor:
        """``ng.clamp(self, min, max)`` in place."""
        return self._in_place("clamp_", lambda: ops.clamp(self, min, max), min, max)

    def fill_(self, value: Any) -> Tensor:
        """Every element set to ``value`` in place."""
        return self._in_place("fill_", lambda: value, value)

    def zero_(self) -> Tensor:
        """Every element set to 0 in place."""
        return self._in_place("zero_", lambda: 0.0)

    def copy_(self, src: Any) -> Tensor:
        """``src`` (broadcast to this shape, cast to this dtype, from any
        device) written into the data in place."""
        return self._in_place("copy_", lambda: src, src)

    def __iadd__(self, other: Any) -> Tensor:
        return self._augmented("+=", "add_", other, lambda: self + other)

    def __isub__(self, other: Any) -> Tensor:
        return self._augmented("-=", "sub_", other, lambda: self - other)

    def __imul__(self, other: Any) -> Tensor:
        return self._augmented("*=", "mul_", other, lambda: self * other)

    def __itruediv__(self, other: Any) -> Tensor:
        return self._augmented("/=", "div_", other, lambda: self / other)

    def __setitem__(self, key: Any, value: Any) -> None:
        """``x[key] = value`` in place, NumPy's indexing and broadcasting
        (on "cuda": integers and slices only); refused as the in-place
        methods are."""
        self._check_in_place("x[...] = value", (value,))
        if isinstance(value, Tensor):
            value = value.data if value._kern is self._kern else value.numpy()
        if isinstance(key, Tensor):
            key = key.numpy()
        elif isinstance(key, tuple):
            key = tuple(k.numpy() if isinstance(k, Tensor) else k for k in key)
        for k in key if isinstance(key, tuple) else (key,):
            if isinstance(k, np.ndarray) and k.dtype.kind not in "iub":
                raise ops._common.IndexDtypeError(
                    f"x[key] = value: index arrays must be integers (or a boolean mask), "
                    f"got dtype {k.dtype}")
        if self._kern.name == "cpu":
            self._data[key] = value
        else:
            parts = key if isinstance(key, tuple) else (key,)
            if any(not isinstance(k, (int, np.integer, slice, type(None), type(Ellipsis)))
                   for k in parts):
                raise TypeError(f"x[key] = value on a cuda tensor takes integers and slices "
                                f"only, got {key!r}; use ng.where(mask, value, x)")
            self._data[key] = value
        _note_write(self)

    def _augmented(self, symbol: str, method: str, other: Any, out_of_place: Any) -> Tensor:
        """``x op= y``: in place as PyTorch's, except where the result must be
        recorded (inside a tape, x recorded or y needing a gradient), which
        numbagrad records no in-place op for: there it is ``x = x op y`` (the
        same value; only another name for the old tensor keeps the old one)."""
        if tape._state.box[0] and not self.is_param and (
                self._node is not None or (isinstance(other, Tensor) and other.requires_grad)):
            return out_of_place()
        return getattr(self, method)(other)

    def _in_place(self, what: str, compute: Any, *operands: Any, arith: bool = False
                  ) -> Tensor:
        """Write ``compute()`` into the data. ``arith``: an arithmetic op, whose
        result may not be of a wider kind (bool < integer < float) than the
        tensor, as PyTorch refuses ``int_tensor.div_(2)``; copy_ and fill_ cast."""
        if self._data.dtype.itemsize == 2 and self._data.dtype in _dtypes.HALVES:
            raise TypeError(f"{what}: in-place writes into a {self.dtype} tensor are not "
                            f"offered (shape {self.shape}); compute out of place, or keep "
                            f"float32 master weights (master_weights=True)")
        self._check_in_place(what, operands)
        with tape.no_grad():
            value = compute()
        if arith and isinstance(value, Tensor) and _KINDS.get(value.dtype.kind, 2) > \
                _KINDS.get(self._data.dtype.kind, 2):
            raise TypeError(f"{what}: the result is {value.dtype}, which the {self.dtype} tensor "
                            f"(shape {self.shape}) cannot hold (PyTorch refuses this cast "
                            f"too); write x = x op y (a new tensor), or convert x "
                            f"first (x.float())")
        _assign(self, value, what)
        _note_write(self)
        return self

    def _check_in_place(self, what: str, operands: tuple) -> None:
        """Refuse, before anything is written, an in-place write that the
        tape cannot record or that a recorded graph still needs."""
        _refuse_while_compiling(what)
        data = self._data
        if data.size and any(st == 0 and n > 1 for n, st in zip(data.shape, data.strides)):
            raise RuntimeError(
                f"{what}: the tensor of shape {self.shape} is a broadcast view (expand, "
                f"broadcast_to), so several of its elements are one memory location and "
                f"the write would keep whichever came last (PyTorch refuses it too); "
                f"write into a clone()")
        recording = tape._state.box[0] > 0
        if self.is_param:
            if recording:
                raise RuntimeError(
                    f"{what} on a param (shape {self.shape}) inside ng.grad_tape(): the "
                    f"tape records no in-place op (PyTorch: a leaf that requires grad is "
                    f"used in an in-place operation); write it outside the tape or inside "
                    f"ng.no_grad()")
            return
        t = self
        while t is not None:
            node = t._node
            if node is not None and not node.done:
                raise RuntimeError(
                    f"{what}: the tensor of shape {self.shape} is (shares data with) the "
                    f"output of a recorded op whose backward has not run, and the tape "
                    f"records no in-place op; write y = y + x (a new tensor), or write "
                    f"into y.clone()")
            t = getattr(t, "_base", None)
        if recording and any(isinstance(o, Tensor) and o.requires_grad for o in operands):
            raise RuntimeError(
                f"{what}: an operand needs a gradient but the tensor written (shape "
                f"{self.shape}) is a constant, and the tape records no in-place op; "
                f"write x = x + y (a new, recorded tensor)")

    def backward(self) -> None:
        """Add this loss's gradients into every reached param's ``.grad``.

        The fast path of ``ng.backward``: no per-call copies are made and
        nothing is returned.
        """
        tape.run_backward(self, False)

    # ------------------------------------------------------------ grad
    @property
    def grad(self) -> Any:
        """The accumulated gradient (same shape, dtype and device), or None.

        It is the accumulator itself, reused across windows: copy it if you
        need the values after the next clear (``opt.step``, ``zero_grad``).
        """
        if not self._live:
            return None
        acc = self._acc
        if _handed.get(id(acc)) is not self:
            _seen.handed = True
            _handed[id(acc)] = self
            base = getattr(acc, "base", None)
            if base is not None:
                _handed[id(base)] = self
        return acc

    @grad.setter
    def grad(self, value: Any) -> None:
        if not self.is_param:
            raise AttributeError("only a param (ng.param) has a settable .grad")
        if value is None:
            self._claim_window()
            if self._live:
                _zero(self._kern, self._acc)
                self._live = False
            if self._owner is not None:
                self._owner._window.release_if_idle()
            return
        if isinstance(value, Tensor):
            value = value.data
        if not self._kern.is_device_array(value):
            raise TypeError(
                f"grad for a {self.device} param must be a {self.device} array, "
                f"got {type(value).__name__}")
        if value.shape != self.shape or value.dtype != self.dtype:
            raise ValueError(
                f"grad of shape {value.shape} and dtype {value.dtype} does not match "
                f"param of shape {self.shape} and dtype {self.dtype}")
        self._claim_window()
        acc = self._accumulator()
        if value is not acc:
            kernels.call(self._kern, "axpby", 0, 1.0, value, 0.0, acc)
        self._live = True
        if self._owner is not None:
            self._owner._window.fed = True   # a step() after this counts (optim/window.py)

    def _claim_window(self) -> None:
        """Take this param's optimizer window for the calling thread, or raise
        (an optimizer's window is one thread's: optim/window.py)."""
        if self._owner is not None:
            self._owner._window.claim(".grad = ...")

    def _accumulator(self) -> Any:
        """This param's gradient buffer, created zeroed on first use."""
        if self._acc is None:
            acc = kernels.empty(self._kern, self.shape, self.dtype)
            _zero(self._kern, acc)
            self._acc = acc
        return self._acc


def _zero(kern: ModuleType, array: Any) -> None:
    """Fill ``array`` with zeros (a half one through its bits: +0.0 is 0)."""
    if array.dtype.itemsize == 2 and array.dtype in _dtypes.HALVES:
        array = array.view(np.uint16)
    kernels.call(kern, "fill", 0, array, 0.0)


class _Size(int):
    """A tensor's element count that is also callable as PyTorch's ``size()``:
    ``t.size == 6`` (NumPy), ``t.size()`` the shape, ``t.size(-1)`` one dim."""

    def __new__(cls, n: int, shape: tuple) -> _Size:
        obj = super().__new__(cls, n)
        obj._shape = shape
        return obj

    def __call__(self, dim: int | None = None) -> Any:
        if dim is None:
            return self._shape
        nd = len(self._shape)
        if not -nd <= dim < nd:
            raise np.exceptions.AxisError(
                f"size({dim}): dim out of range for a tensor of {nd} dims")
        return self._shape[dim]


def _refuse_while_compiling(what: str) -> None:
    """An in-place write is not a kernel call, so ``ng.compile``'s recording
    (a kernels observer) would not replay it: refuse it there."""
    if kernels._observer is not None:
        raise RuntimeError(f"{what}: an in-place write inside a function ng.compile records "
                           "is not replayed by the compiled step; write it outside the "
                           "function, or out of place (y = y + x)")


# one _Size per shape, so that ``t.size`` costs a dict lookup, not a new
# object (ops read it); bounded: cleared when it holds _MAX_SIZES shapes
_sizes: dict = {}
_MAX_SIZES = 4096


def _size_of(shape: tuple) -> _Size:
    if len(_sizes) >= _MAX_SIZES:
        _sizes.clear()
    size = _sizes[shape] = _Size(int(np.prod(shape, dtype=np.int64)), shape)
    return size


def _root(t: Tensor) -> Tensor:
    """The tensor ``t`` shares its data with (it is a view or a detach() of),
    or ``t``: a view's or a detach()'s ``_base`` is this root, so chains stay
    one link long."""
    base = getattr(t, "_base", None)
    return t if base is None else base


def _note_write(t: Tensor) -> None:
    """Stamp an in-place write on ``t`` and on what it is a view or a detach()
    of (``tape._check_unmodified`` reads the stamps)."""
    stamp = new_stamp()
    while t is not None:
        t._stamp = stamp
        t = getattr(t, "_base", None)


def new_stamp() -> int:
    """The stamp of an in-place write about to be noted (``_writes``)."""
    _writes[0] += 1
    return _writes[0]


def note_writes(tensors: Iterable[Tensor]) -> None:
    """Stamp one in-place write on each of ``tensors``, tensors that are no
    view of another (params and buffers that a ``load_state_dict`` or an
    initialiser wrote): their views see it through their ``_base``."""
    stamp = new_stamp()
    for t in tensors:
        t._stamp = stamp


def _assign(t: Tensor, value: Any, what: str) -> None:
    """Write ``value`` (a number, array or tensor of any device, broadcast to
    ``t``'s shape, cast to its dtype) into ``t``'s data; checked before the
    write, so a refused value changes nothing."""
    if isinstance(value, Tensor):
        value = value.data if value._kern is t._kern else value.numpy()
    kern = t._kern
    if kern.name == "cpu" or not kern.is_device_array(value):
        host = np.asarray(value)
        try:
            shape = np.broadcast_shapes(host.shape, t.shape)
        except ValueError:
            shape = None
        if shape != t.shape:
            raise ValueError(f"{what}: a value of shape {host.shape} does not broadcast to "
                             f"the tensor's shape {t.shape}")
        if kern.name == "cpu":
            np.copyto(t._data, host, casting="unsafe")
            return
        value = kernels.from_host(kern, np.ascontiguousarray(
            np.broadcast_to(host, t.shape), dtype=t.dtype))
    if (tuple(value.shape) != t.shape or value.dtype != t.dtype) and t.dtype in _FLOATS:
        v = _wrap(value, kern) if not isinstance(value, Tensor) else value
        try:
            shape = np.broadcast_shapes(v.shape, t.shape)
        except ValueError:
            shape = None
        if shape == t.shape:   # broadcast and cast on the device, no recording
            with tape.no_grad():
                value = ops.masks.astype(ops.broadcast_to(v, t.shape), t.dtype, copy=True).data
    if tuple(value.shape) != t.shape or value.dtype != t.dtype:
        raise ValueError(f"{what}: a {value.dtype} device array of shape {tuple(value.shape)} "
                         f"into a {t.dtype} tensor of shape {t.shape}; pass a tensor of "
                         f"the same shape and dtype")
    t._data.copy_to_device(value)


# ---------------------------------------------------------------- builders
@kernels.host_copy
def _host_array(data: Any, dtype: Any, default: Any = None, floats: bool = False
                ) -> np.ndarray:
    """``data`` as a new C-contiguous array: ``dtype`` if given; else the
    dtype of a NumPy array or tensor that a tensor may hold, int64 for Python
    ints, bool for bools (``floats``: those too take the default), else
    ``default`` (the default dtype when None)."""
    if isinstance(data, Tensor):
        data = data.numpy()
    typed = isinstance(data, (np.ndarray, np.generic))
    array = np.asarray(data)
    kind = array.dtype.kind
    if dtype is not None:
        want = _dtypes.tensor_dtype(dtype, "dtype")
        if floats and not _dtypes.is_float(want):
            raise TypeError(f"a param holds float32 or float64, or a half: float16, bfloat16 "
                            f"(only floats get gradients), not {want}")
    elif array.dtype in _dtypes.HALVES:
        want = array.dtype
    elif kind not in "biuf" or array.dtype == np.uint64:
        raise TypeError(f"tensor data must be real numbers or bools, got dtype {array.dtype}")
    elif array.dtype in _FLOATS and typed or kind in "biu" and not floats:
        want = array.dtype if typed or kind != "i" else _dtypes.INT64
        if want not in _dtypes.ALL:     # uint16, uint32: the next signed width
            want = np.promote_types(want, np.int8)
    else:
        want = np.dtype(default) if default is not None else _defaults.get_default_dtype()
    if want in _dtypes.HALVES:
        ops._half.enable()
        if array.dtype != want:   # through float32, as the kernels round (ops/_half.py)
            array = np.asarray(array, np.float32)
    return np.array(array, dtype=want, order="C", copy=True)


def tensor(data: Any, *, dtype: Any = None, device: str = "cpu") -> Tensor:
    """A tensor owning a C-contiguous copy of ``data`` on ``device``.

    NumPy arrays (and tensors) keep their dtype (float32, float64, float16,
    bfloat16, int8, int16, int32, int64, uint8, bool); Python ints become
    int64 and bools bool, as in PyTorch; Python floats take the default
    dtype (``ng.set_default_dtype``; float64 until set). ``dtype`` overrides
    all of it. Integer and bool tensors never get a gradient. Any rank NumPy
    allows, 0-d included.
    """
    kern = kernels.get(device)
    return Tensor(kernels.from_host(kern, _host_array(data, dtype)), kern)


def param(data: Any, *, dtype: Any = None, device: str = "cpu") -> Tensor:
    """A trainable leaf: ``ng.tensor`` with ``requires_grad=True``. Always a
    float tensor (only floats get gradients): integer and bool data take
    ``dtype``, else the default dtype."""
    kern = kernels.get(device)
    return Tensor(kernels.from_host(kern, _host_array(data, dtype, floats=True)), kern,
                  requires_grad=True)


def as_tensor(array: Any) -> Tensor:
    """Wrap an existing C-contiguous float32/float64 array without copying.

    Like ``torch.from_numpy``: the tensor and the array share memory. A
    host ``numpy.ndarray`` gives a "cpu" tensor, a Numba CUDA device array
    or any ``__cuda_array_interface__`` object (CuPy, PyTorch, JAX) a "cuda"
    one; ``ng.from_dlpack`` takes DLPack producers. Use ``ng.tensor`` to
    copy anything else. Wrapping a param's ``.grad`` is safe: a backward
    that reads it while adding into that param's gradient adds at the end,
    so the op reads the old values.
    """
    if isinstance(array, np.ndarray):
        kern = kernels.get("cpu")
        array = _plain(array, "as_tensor")
    elif type(array).__module__.startswith("numba.cuda"):
        kern = kernels.get("cuda")
    elif not isinstance(array, Tensor) and hasattr(array, "__cuda_array_interface__"):
        kern = kernels.get("cuda")
        array = interop.cuda_array(array, "as_tensor")
    else:
        raise TypeError(f"as_tensor wraps a numpy array, a Numba CUDA array or a "
                        f"__cuda_array_interface__ object, got "
                        f"{type(array).__name__}; use ng.tensor to copy other data")
    if array.dtype in _dtypes.HALVES:
        ops._half.enable()
    if array.dtype not in _dtypes.ALL:
        raise TypeError(f"as_tensor needs float32, float64, float16, bfloat16, integer or "
                        f"bool data, got "
                        f"{array.dtype}; use ng.tensor to convert")
    if not array.flags["C_CONTIGUOUS"]:
        raise ValueError("as_tensor needs a C-contiguous array; use ng.tensor to copy")
    if isinstance(array, np.ndarray) and not array.flags.writeable:
        raise ValueError(f"as_tensor: the {array.dtype} array of shape {array.shape} is "
                         "read-only (np.load(mmap_mode='r'), writeable=False), and a tensor "
                         "shares its memory; use ng.tensor to copy it (ops take read-only "
                         "arrays as they are, copying them)")
    return _wrap(array, kern)


def _plain(array: np.ndarray, what: str) -> np.ndarray:
    """A NumPy subclass's data as a plain ndarray sharing its memory (an
    ``np.matrix`` would keep every reshape 2-D); a masked array is refused,
    since its mask would be dropped."""
    if type(array) is np.ndarray:
        return array
    if isinstance(array, np.ma.MaskedArray):
        raise TypeError(f"{what}: a masked array (shape {array.shape}, {array.dtype}) would "
                        f"lose its mask; pass array.filled(value) or array.data")
    return np.asarray(array)


def _wrap(array: Any, kern: ModuleType) -> Tensor:
    """A tensor sharing ``array``, noted when it may be a param's accumulator."""
    t = Tensor(array, kern)
    if _seen.handed and (id(array) in _handed
                         or id(getattr(array, "base", None)) in _handed
                         or (not isinstance(array, np.ndarray) and _inside_handed(array))):
        _seen.wrapped = True
        _wrappers.add(t)
    return t


def _inside_handed(array: Any) -> bool:
    """Whether a device array shares bytes with a handed-out accumulator (a
    device array's view does not name its parent)."""
    lo, hi = kernels.extent(array)
    for owner in list(_handed.values()):
        acc = owner._acc
        if acc is not None and not isinstance(acc, np.ndarray):
            a, b = kernels.extent(acc)
            if lo < b and a < hi:
                return True
    return False


def coerce(value: Any, kern: ModuleType, what: str) -> Tensor:
    """``value`` as a Tensor on ``kern``'s device, for an op's operand.

    Tensors pass through. An array of ``like``'s device that is C-contiguous
    float32/float64 (and, on the host, writable) is wrapped without a copy;
    other host data, a read-only array (``np.load(mmap_mode="r")``) among
    it, is copied for a "cpu" op and refused for a "cuda" one (that would
    be a hidden copy).
    """
    if isinstance(value, Tensor):
        return value
    if type(value) is not np.ndarray and isinstance(value, np.ndarray):
        value = _plain(value, what)
    if kern.is_device_array(value) and value.dtype in _dtypes.ALL \
            and kern.is_c_contiguous(value) and (kern.name != "cpu" or value.flags.writeable):
        return _wrap(value, kern)
    if kern.name != "cpu":
        raise ValueError(f"{what} is {type(value).__name__} data on the host but the op "
                         f"runs on {kern.name}; pass ng.tensor(..., device={kern.name!r})")
    try:
        return Tensor(_host_array(value, None, np.float64), kern)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{what}: {exc}") from None


_UFUNC_HINTS = {"square": "x * x or x ** 2", "fmax": "ng.maximum",
                "fmin": "ng.minimum"}

# ops and tape build on Tensor, so they are imported once it exists.
from . import interop, ops, tape  # noqa: E402
from .ops import numpy_api as _numpy_api  # noqa: E402


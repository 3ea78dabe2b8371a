"""One table from device name to its kernel module.

Each module (``cpu``, ``cuda``) exposes the same kernel names with the same
destination-passing signatures, plus ``empty``, ``from_host``, ``to_host`` and
``is_device_array``. Callers look a module up here and never branch on the
device themselves. The CUDA module is imported on first use only, so CPU-only
programs never pay for importing ``numba.cuda``.

Code outside ``kernels/`` (the ops, the tape, the optimizers, ...) reaches a
device only through the entry points below: ``call`` runs a kernel (and
picks its threaded twin), ``empty``/``from_host``/``to_host`` allocate and
copy, ``host_copy`` marks a function that copies host data, and
``buffers.take`` hands out work arrays. ``observe`` subscribes one
observer (``ng.compile``'s recorder) to all of them; ``tests/test_hook.py``
fails if an op reaches a kernel any other way.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import ModuleType
from typing import Any, Protocol

import numpy as np

DEVICES = ("cpu", "cuda")
# Every kernel a device module exposes (its ``KERNELS`` table lists these):
# one name, one destination-passing signature, on every device.
NAMES = ("axpby", "binary", "binary_backward", "cross_entropy", "fill", "gemm", "bgemm",
         "linear", "mse", "pointwise_loss", "scaled_add", "softmax", "softmax_backward",
         "sum_to", "unary", "unary_backward", "upload", "expand_nd", "sum_to_nd", "compare",
         "where", "where_backward", "astype", "gather", "index_add", "index_select",
         "place_nd", "scatter_add", "adam_update", "sgd_update", "sumsq")
# Each family's kernels, one line each (kept apart so work on one family never
# touches another's line).
NAMES += ("binary_nd", "binary_nd_backward", "unary_nd", "unary_nd_backward", "softmax3",
          "softmax3_backward", "cross_entropy3", "index_select_nd", "index_add_nd",
          "gather_nd", "scatter_add_nd", "concat")   # N-d strided and fallback kernels

NAMES += ("extrema", "extrema_backward", "logsumexp", "logsumexp_backward", "variance",
          "variance_backward", "cumsum", "loss_terms", "loss_terms_backward", "nll",
          "nll_backward", "clamp", "clamp_backward")   # activations and reductions

NAMES += ("dropout", "dropout_backward", "embedding_backward")   # randomness, dropout and embedding

NAMES += ("im2col", "col2im", "max_pool2d", "max_pool2d_backward",   # convolution and pooling
          "avg_pool2d", "avg_pool2d_backward", "adaptive_avg_pool2d",
          "adaptive_avg_pool2d_backward")

NAMES += ("group_norm", "group_norm_backward", "batch_norm",   # normalisation and attention
          "batch_norm_backward", "attention", "attention_backward")
_loaded: dict[str, ModuleType] = {}


def env_int(key: str, default: int, minimum: int = 0) -> int:
    """The integer in environment variable ``key`` (``default`` when unset),
    checked to be at least ``minimum``; the kernel packages' settings read
    through this one function."""
    raw = os.environ.get(key)
    try:
        value = default if raw is None else int(raw)
    except ValueError:
        raise ValueError(f"{key} must be an integer >= {minimum}, got {raw!r}") from None
    if value < minimum:
        raise ValueError(f"{key} must be an integer >= {minimum}, got {value}")
    return value


def cuda_available() -> bool:
    """True when a CUDA device (or Numba's CUDA simulator) is usable."""
    return cuda_unavailable_reason() is None


def cuda_unavailable_reason() -> str | None:
    """Why device="cuda" cannot be used here, or None when it can.

    The CUDA kernels need numba-cuda (the ``cuda`` extra), on a GPU and on
    the simulator alike: without it ``numba.cuda`` is Numba's own built-in
    target, which imports (and, under NUMBA_ENABLE_CUDASIM=1, reports
    itself available) but cannot run numbagrad's kernels.
    """
    try:
        installed = importlib.util.find_spec("numba_cuda") is not None
    except (ImportError, ValueError):    # a broken or half-removed install
        installed = False
    if not installed:
        return ('numba-cuda is not installed (numba\'s own numba.cuda cannot run the CUDA '
                'kernels, not even on the simulator): pip install "numbagrad[cuda]"')
    try:
        from numba import cuda
    except Exception as exc:  # numba-cuda broken
        return f'numba.cuda cannot be imported ({exc}); reinstall "numbagrad[cuda]"'
    if getattr(cuda, "implementation", None) != "NVIDIA":
        return ("numba.cuda is Numba's built-in target, not numba-cuda's (its redirect did not "
                'apply, e.g. under python -S); reinstall "numbagrad[cuda]"')
    try:
        if cuda.is_available():
            return None
        cuda.current_context()
    except Exception as exc:
        return f"no usable CUDA GPU or driver ({str(exc).strip() or type(exc).__name__})"
    return "no usable CUDA GPU or driver"


def check_device(device: str) -> str:
    """Validate a device name; for "cuda" also check that one is usable."""
    if device not in DEVICES:
        raise ValueError(f"unknown device {device!r}; expected one of {DEVICES}")
    if device == "cuda" and "cuda" not in _loaded:
        reason = cuda_unavailable_reason()
        if reason is not None:
            raise RuntimeError(f'device "cuda" requested but not usable: {reason}')
    return device


def address(array: Any) -> int:
    """The address of ``array``'s first element (a NumPy array, a Numba
    device array or the CUDA simulator's stand-in for one)."""
    if isinstance(array, np.ndarray):
        return array.__array_interface__["data"][0]
    iface = getattr(array, "__cuda_array_interface__", None)
    if iface is None:                      # the simulator's fake device array
        return getattr(array, "_ary", array).__array_interface__["data"][0]
    return iface["data"][0]


def extent(array: Any) -> tuple[int, int]:
    """The bytes [lo, hi) that ``array``'s elements occupy (empty: lo == hi)."""
    lo = hi = address(array)
    for n, s in zip(array.shape, array.strides):
        if n == 0:
            return lo, lo
        if s >= 0:
            hi += (int(n) - 1) * int(s)
        else:
            lo += (int(n) - 1) * int(s)
    return lo, hi + array.dtype.itemsize


def get(device: str) -> ModuleType:
    """The kernel module for ``device`` (imported on first use)."""
    module = _loaded.get(device)
    if module is None:
        check_device(device)
        module = importlib.import_module(f"numbagrad.kernels.{device}")
        _loaded[device] = module
    return module


# ------------------------------------------------------------ the hook
class Observer(Protocol):
    """What ``observe`` subscribes: told of every kernel call, allocation and
    host copy (from any thread: the observer filters)."""

    def kernel(self, fn: Callable, name: str, args: tuple) -> None:
        """Kernel ``name`` (the variant that runs, e.g. "unary_mt") is about to
        run as ``fn(*args)``."""

    def allocated(self, array: Any) -> None:
        """``empty`` made ``array`` (an accumulator, a flat buffer)."""

    def temp(self, kern: ModuleType, shape: tuple, dtype: Any) -> Any:
        """A work array for ``buffers.take``, or None to take one from the pool."""

    def host_read(self) -> None:
        """``to_host`` is about to copy device data to the host."""

    def host_copy(self, copy: Any, source: Any) -> None:
        """``copy`` was made from ``source`` (host data, or a host copy of it)."""


_observer: Observer | None = None


@contextlib.contextmanager
def observe(observer: Observer) -> Iterator[Observer]:
    """Subscribe ``observer`` to every entry point while the block runs (one
    observer at a time: a second one raises)."""
    global _observer
    if _observer is not None:
        raise RuntimeError("kernels.observe: another observer is subscribed (one at a time)")
    _observer = observer
    clear_hot_tables()   # their calls would pass the observer by
    try:
        yield observer
    finally:
        _observer = None


def table(namespace: Mapping[str, Any], names: Iterable[str]) -> dict[str, tuple]:
    """A device module's ``KERNELS``: name -> ((serial, name), (threaded, its name)),
    the threaded twin being ``name + "_mt"`` where ``namespace`` has one (else
    the serial kernel again)."""
    out = {}
    for name in names:
        serial = (namespace[name], name)
        twin = name + "_mt"
        out[name] = (serial, (namespace[twin], twin) if twin in namespace else serial)
    return out


def split(kernels: Mapping[str, tuple]) -> tuple[dict, dict]:
    """A device module's ``KERNEL_FNS``: (name -> serial kernel, name -> threaded
    kernel), the table ``call`` indexes with ``size >= MT_MIN``."""
    return ({n: pair[0][0] for n, pair in kernels.items()},
            {n: pair[1][0] for n, pair in kernels.items()})


def call(kern: ModuleType, name: str, size: int, *args: Any) -> Any:
    """Run kernel ``name`` of device module ``kern`` on ``args``: its threaded
    twin when the call touches ``size >= kern.MT_MIN`` elements (on CUDA,
    never), or, for a memory-bound call (``kern.memory_bound``: an add, a
    relu, an axpby), ``size >= kern.MT_MIN_MEMORY``. The one way code
    outside ``kernels/`` runs a kernel."""
    threaded = size >= kern.MT_MIN and (size >= kern.MT_MIN_MEMORY
                                        or not kern.memory_bound(name, args))
    try:
        fn = kern.KERNEL_FNS[threaded][name]
    except KeyError:
        raise LookupError(f"the {kern.name} kernels have no kernel {name!r}; known: "
                          f"{sorted(kern.KERNELS)}") from None
    if _observer is not None:
        _observer.kernel(fn, kern.KERNELS[name][threaded][1], args)
    return fn(*args)


# (kern, name, key) -> the compiled specialisation ``call_typed`` runs directly
_typed: dict[tuple, Callable] = {}
_typed_signature: dict[tuple, Any] = {}   # what CHECK_TYPED compares with
# NUMBAGRAD_CHECK_TYPED=1 (the test suite sets it): every typed call checks
# that its arguments still have the types its key stood for the first time
CHECK_TYPED = os.environ.get("NUMBAGRAD_CHECK_TYPED") == "1"


def call_typed(kern: ModuleType, name: str, size: int, key: Any, *args: Any) -> Any:
    """``call`` for a small serial kernel call whose arguments' Numba types
    follow from ``key`` at its call site (say the dtype, where the site has
    checked that its arrays are C-contiguous of fixed ranks and its other
    arguments are Python ints and floats). From the second call on, the CPU
    runs the compiled specialisation itself, skipping Numba's per-call type
    dispatch (0.1-0.3 µs, a third of a tiny kernel's time); with an observer,
    for a call big enough for the threaded twin, on other devices, or where
    the lookup finds nothing, it is ``call``. ``typed`` is the same call in
    two steps."""
    return typed(kern, name, size, key)(*args)


def typed(kern: ModuleType, name: str, size: int, key: Any,
          hot: dict | None = None) -> Callable:
    """What ``call_typed(kern, name, size, key, *args)`` runs, to be called
    with ``*args`` at once: the compiled specialisation, or a function that
    takes ``call_typed``'s other paths. The hot sites call it so, which spares
    them a variadic call and its argument tuple. ``hot``, a table from
    ``hot_table``, gets the specialisation under ``key`` when it is returned
    bare."""
    fn = _typed.get((kern, name, key))
    if fn is None or _observer is not None or CHECK_TYPED or size >= kern.MT_MIN:
        return functools.partial(_call_typed_slow, kern, name, size, key, fn)
    if hot is not None:
        hot[key] = fn
    return fn


# every table hot_table made: observe() empties them
_hot_tables: list[dict] = []


def hot_table() -> dict:
    """A call site's own table, key -> ``typed``'s bare specialisation, for
    the few sites of the tiny eager step, where ``typed``'s call and tuple
    key cost as much as the kernel: the site reads ``table.get(key)`` first
    and, on a miss, calls ``typed(..., hot=table)``, which fills it. Only
    for serial CPU calls: the site checks that the call is on the CPU and
    below ``MT_MIN``. Never filled under an observer (``observe`` empties
    every table) or with ``CHECK_TYPED``, so those see every call."""
    table: dict = {}
    _hot_tables.append(table)
    return table


def clear_hot_tables() -> None:
    """Empty every ``hot_table``: from now on their sites go through ``typed``."""
    for table in _hot_tables:
        table.clear()


def _call_typed_slow(kern: ModuleType, name: str, size: int, key: Any, fn: Any,
                     *args: Any) -> Any:
    if size >= kern.MT_MIN:
        return call(kern, name, size, *args)
    dispatcher = kern.KERNEL_FNS[0][name]
    if fn is not None and _observer is None:   # CHECK_TYPED
        if kern.signature(dispatcher, args) != _typed_signature[(kern, name, key)]:
            raise TypeError(f"kernels.call_typed({name!r}, key={key!r}): the arguments' "
                            f"types {kern.signature(dispatcher, args)} differ from the first "
                            f"call's with this key, {_typed_signature[(kern, name, key)]}; "
                            f"the call site must key every type it passes")
        return fn(*args)
    out = call(kern, name, 0, *args)
    if fn is None and _observer is None:
        entry = kern.entry_point(dispatcher, args)
        if entry is not None:
            _typed_signature[(kern, name, key)] = kern.signature(dispatcher, args)
            _typed[(kern, name, key)] = entry
    return out


def empty(kern: ModuleType, shape: tuple, dtype: Any) -> Any:
    """An uninitialised array on ``kern``'s device that its caller keeps
    (work arrays come from ``buffers.take`` instead)."""
    array = kern.empty(shape, dtype)
    if _observer is not None:
        _observer.allocated(array)
    return array


def from_host(kern: ModuleType, host: Any) -> Any:
    """Host data as a new array on ``kern``'s device (a copy)."""
    array = kern.from_host(host)
    if _observer is not None:
        _observer.host_copy(array, host)
    return array


def to_host(kern: ModuleType, array: Any) -> Any:
    """A host copy of ``array``, a device array of ``kern``."""
    if _observer is not None:
        _observer.host_read()
    return kern.to_host(array)


def host_copy(fn: Callable) -> Callable:
    """Mark ``fn(source, ...)`` as returning a host copy of ``source``, so an
    observer knows where the copy came from."""
    @functools.wraps(fn)
    def copied(source: Any, *args: Any, **kwargs: Any) -> Any:
        copy = fn(source, *args, **kwargs)
        if _observer is not None:
            _observer.host_copy(copy, source)
        return copy
    return copied

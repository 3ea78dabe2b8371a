"""The entry points code outside ``kernels/`` reaches a device through, and
the one observer subscribed to all of them.

``call`` runs a kernel (and picks its threaded twin), ``call_fn`` one that
no device registers (a user's, ``ng.custom_op``), ``empty``/``from_host``/
``to_host`` allocate and copy, ``host_copy`` marks a function that copies host
data. ``observe`` subscribes one observer (``ng.compile``'s recorder) to every
one of them; ``tests/test_hook.py`` fails if an op reaches a kernel any other
way.

The subscribed observer is ``_observer`` here. ``observe`` also keeps the
package's ``kernels._observer`` equal to it, for the hot paths outside
``kernels/`` (``buffers``, the ops' fast paths) that test ``kernels._observer
is None`` directly: set it only through ``observe``.
"""
from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any, Protocol

from numba.core.errors import TypingError

from . import _registry


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
# run when an observer subscribes (``_typed_calls`` empties its hot tables,
# whose calls would pass the observer by)
_on_subscribe: list[Callable[[], None]] = []


def _set_observer(observer: Observer | None) -> None:
    global _observer
    _observer = observer
    sys.modules[__package__]._observer = observer   # the package's copy, for hot readers


@contextlib.contextmanager
def observe(observer: Observer) -> Iterator[Observer]:
    """Subscribe ``observer`` to every entry point while the block runs (one
    observer at a time: a second one raises)."""
    if _observer is not None:
        raise RuntimeError("kernels.observe: another observer is subscribed (one at a time)")
    _set_observer(observer)
    try:
        for hook in _on_subscribe:
            hook()
        yield observer
    finally:
        _set_observer(None)


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
        raise LookupError(_unknown(kern, name)) from None
    if _observer is not None:
        _observer.kernel(fn, kern.KERNELS[name][threaded][1], args)
    try:
        return fn(*args)
    except (NotImplementedError, TypingError) as exc:
        raise _no_half_kernel(name, args) or exc


def call_fn(fn: Callable, name: str, *args: Any) -> Any:
    """Run ``fn(*args)``, a kernel no device registers (a user's @njit
    dispatcher, a CUDA launcher: ``ng.custom_op``), seen by the observer as
    ``call``'s kernels are, so that ``ng.compile`` records it as ``name``.
    For the generated CPU step ``fn`` must be an @njit dispatcher returning
    nothing; the CUDA replay calls any ``fn`` again with the recorded args."""
    if _observer is not None:
        _observer.kernel(fn, name, args)
    try:
        return fn(*args)
    except (NotImplementedError, TypingError) as exc:
        raise _no_half_kernel(name, args) or exc


def _no_half_kernel(name: str, args: tuple) -> TypeError | None:
    """The error for a kernel handed a float16/bfloat16 array (Numba types
    neither: it raises NotImplementedError): the ops of the op table compute
    halves in float32 (ops/_half.py), a layer or op outside it does not."""
    halves = [str(a.dtype) for a in args if getattr(a, "dtype", None) is not None
              and a.dtype.itemsize == 2 and a.dtype.kind in "fV"]
    if not halves:
        return None
    return TypeError(f"{name}: got {halves[0]} data, which this kernel does not take. Half "
                     f"tensors compute through the op table's ops (ng.<op>, Tensor methods, "
                     f"ng.nn), which are swapped for half-aware ones when the first half "
                     f"tensor is made: a reference to an op taken before then (from numbagrad "
                     f"import linear; ng.linear(x.to(ng.bfloat16), ...) with that .to making "
                     f"the first half tensor) still reaches the float-only op. Other ops and "
                     f"layers do not take halves: compute them in float32 (x.float())")


def _unknown(kern: ModuleType, name: str) -> str:
    """Why ``call`` found no kernel ``name`` on ``kern``'s device."""
    others = [m.name for m in _registry._loaded.values()
              if m.name != kern.name and name in m.KERNELS]
    where = (f" (the {' and '.join(others)} kernels have it: a family module of "
             f"{kern.__name__} must list it in its __all__)" if others else "")
    return (f"device {kern.name!r} has no kernel {name!r}{where}; known: "
            f"{sorted(kern.KERNELS)}")


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

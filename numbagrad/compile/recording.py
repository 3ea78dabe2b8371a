"""Recording: every kernel call, buffer and host copy of one eager run of ``fn``.

The recorder patches the public kernel attributes of the kernel modules,
``tensor._host_array``, ``losses._as_int64`` and ``buffers.take`` for the
duration of the run (so ops must reach kernels only as ``kern.<name>``).
"""
from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

from .. import buffers
from .. import tensor as tensor_module
from ..ops import losses as losses_module
from ..tensor import Tensor

# kernel-module attributes that are not kernels: never recorded
_NOT_KERNELS = frozenset({"empty", "from_host", "to_host", "is_device_array", "is_c_contiguous",
                          "launch_count", "transfer_count", "synchronize", "kernel_sources"})
_capture_lock = threading.RLock()


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

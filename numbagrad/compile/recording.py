"""Recording: every kernel call, buffer and host copy of one eager run of ``fn``.

The recorder subscribes to the kernels' entry points (``kernels.observe``):
ops reach a device only through ``kernels.call``, ``kernels.empty``,
``kernels.from_host``/``to_host``, functions marked ``kernels.host_copy`` and
``buffers.take``, so it sees everything the step does without patching a
module. Ops that range-check host integers (indices, class labels) also
tell it so through ``checked`` when it listens (``ops.indexing._note_checked``),
which the replays repeat on each call's new values.
"""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import numpy as np

from .. import kernels
from ..tensor import Tensor

_capture_lock = threading.RLock()


class _Recording:
    """Kernel calls and buffers of one eager run of ``fn`` in one thread (a
    ``kernels.Observer``: other threads' calls are not recorded)."""

    def __init__(self) -> None:
        self.thread = threading.get_ident()
        self.calls: list[tuple[Callable, str, tuple, dict]] = []
        self.temps: list[Any] = []       # what buffers.take handed out (fresh arrays)
        self.fresh: list[Any] = []       # other arrays made by kernels.empty (accumulators)
        self.host_reads = 0              # kernels.to_host calls: fn read a value
        # Host copies that ops made of their operands (coerce, labels): id of
        # the copy -> (copy, the object it was made from). An argument's copy
        # is re-made from the new argument at replay; any other is a constant.
        self.copies: dict[int, tuple[Any, Any]] = {}
        # Host integer arrays an op range-checked: (array, low, high, exclude,
        # allow), every value in [low, high) and not exclude, or allow.
        self.checks: list[tuple[Any, int, int, int | None, int | None]] = []
        self.eager_only = ""             # why no replay may run this recording, if one may not
        # (host arrays, why): ops that made positions from these on the host, which
        # no replay may repeat when one is an argument's (``from_arguments``)
        self.host_positions: list[tuple[tuple, str]] = []

    def kernel(self, fn: Callable, name: str, args: tuple) -> None:
        if threading.get_ident() == self.thread:
            self.calls.append((fn, name, args, {}))

    def allocated(self, array: Any) -> None:
        if threading.get_ident() == self.thread:
            self.fresh.append(array)

    def temp(self, kern: ModuleType, shape: tuple, dtype: Any) -> Any:
        """A fresh array for ``buffers.take`` (so nothing recorded aliases the pool)."""
        if threading.get_ident() != self.thread:
            return None
        array = kern.empty(shape, dtype)
        self.temps.append(array)
        return array

    def host_read(self) -> None:
        if threading.get_ident() == self.thread:
            self.host_reads += 1

    def host_copy(self, copy: Any, source: Any) -> None:
        if threading.get_ident() == self.thread:
            self.copies[id(copy)] = (copy, source)

    def unreplayable(self, why: str, sources: tuple | None = None) -> None:
        """An op computed something from this call's argument values that a
        replay would keep as a constant: every call of the signature runs
        eagerly. With ``sources``, only if one of them is an argument's data
        (``from_arguments``)."""
        if threading.get_ident() == self.thread:
            if sources is None:
                self.eager_only = why
            else:
                self.host_positions.append((sources, why))

    def from_arguments(self, args: tuple) -> str:
        """Why the recording may not be replayed: an op made host positions
        from an argument's data (the array, a view of it or a host copy);
        "" when none did."""
        datas = [a._data if isinstance(a, Tensor) else a for a in args]
        hosts = [d for d in datas if isinstance(d, np.ndarray)]
        for sources, why in self.host_positions:
            for s in sources:
                if any(s is a for a in args) or any(s is d for d in datas):
                    return why    # an argument, or its data (a device array too)
                root = _copied_from(self, s) if isinstance(s, np.ndarray) else None
                s = root if root is not None else s
                if isinstance(s, np.ndarray) and any(np.shares_memory(s, d) for d in hosts):
                    return why
        return ""

    def checked(self, array: Any, low: int, high: int, exclude: int | None,
                allow: int | None) -> None:
        """An op checked the host integers ``array`` (see ``checks``); the array
        is kept, so that its id stays its own until the recording is resolved."""
        if threading.get_ident() == self.thread:
            self.checks.append((array, int(low), int(high), exclude, allow))


@contextlib.contextmanager
def _recording() -> Iterator[_Recording]:
    """Record every kernel call of this thread until the block ends."""
    with _capture_lock, kernels.observe(_Recording()) as rec:
        yield rec


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

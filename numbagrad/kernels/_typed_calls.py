"""The typed-call fast path: a keyed small CPU kernel call runs its compiled
specialisation directly, skipping Numba's per-call type dispatch.

``call_typed`` (and ``typed``, the same call in two steps) remember, per
(device module, kernel, call-site key), the entry point the first call
dispatched to; ``hot_table`` gives the tiny eager step's sites their own
key -> entry tables. The state lives here: ``_typed`` and
``_typed_signature`` (what ``CHECK_TYPED`` compares with), and
``CHECK_TYPED`` itself (``NUMBAGRAD_CHECK_TYPED=1``, set by the test suite),
which tests patch on this module. An observer (``_hook``) sees every call:
none of these paths bypasses it while one is subscribed.
"""
from __future__ import annotations

import functools
import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

from . import _hook
from ._hook import call

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
    if fn is None or _hook._observer is not None or CHECK_TYPED or size >= kern.MT_MIN:
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


_hook._on_subscribe.append(clear_hot_tables)   # their calls would pass the observer by


def _call_typed_slow(kern: ModuleType, name: str, size: int, key: Any, fn: Any,
                     *args: Any) -> Any:
    if size >= kern.MT_MIN:
        return call(kern, name, size, *args)
    dispatcher = kern.KERNEL_FNS[0][name]
    if fn is not None and _hook._observer is None:   # CHECK_TYPED
        if kern.signature(dispatcher, args) != _typed_signature[(kern, name, key)]:
            raise TypeError(f"kernels.call_typed({name!r}, key={key!r}): the arguments' "
                            f"types {kern.signature(dispatcher, args)} differ from the first "
                            f"call's with this key, {_typed_signature[(kern, name, key)]}; "
                            f"the call site must key every type it passes")
        return fn(*args)
    out = call(kern, name, 0, *args)
    if fn is None and _hook._observer is None:
        entry = kern.entry_point(dispatcher, args)
        if entry is not None:
            _typed_signature[(kern, name, key)] = kern.signature(dispatcher, args)
            _typed[(kern, name, key)] = entry
    return out

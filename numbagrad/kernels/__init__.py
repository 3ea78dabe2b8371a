"""The kernels: one package per device, and the entry points that reach them.

Each device package (``cpu``, ``cuda``) exposes the same kernel names with
the same destination-passing signatures, plus ``empty``, ``from_host``,
``to_host`` and ``is_device_array``. Callers look a package up here
(``get``) and never branch on the device themselves. A package registers its
kernels itself: each of its family modules lists the kernels it defines in
``__all__`` (``_registry``'s docstring has the rule), and ``NAMES`` is every
registered name, derived, never kept by hand.

Code outside ``kernels/`` (the ops, the tape, the optimizers, ...) reaches a
device only through the entry points re-exported here: ``call`` runs a
kernel (and picks its threaded twin), ``empty``/``from_host``/``to_host``
allocate and copy, ``host_copy`` marks a function that copies host data, and
``buffers.take`` hands out work arrays. ``observe`` subscribes one observer
(``ng.compile``'s recorder) to all of them; ``tests/test_hook.py`` fails if
an op reaches a kernel any other way.

One private module per concept, their public names re-exported here:

* ``_registry``: the devices (``DEVICES``, ``get``, ``check_device``) and
  kernel registration (``registry``, ``split``, ``register``, ``missing``).
* ``_env``: ``env_int``, the reader of the packages' environment settings.
* ``_diagnose``: ``cuda_available``, ``cuda_unavailable_reason``.
* ``_hook``: the observer hook and the entry points (``Observer``,
  ``observe``, ``call``, ``call_fn``, ``empty``, ``from_host``, ``to_host``,
  ``host_copy``).
* ``_typed_calls``: the typed-call fast path (``call_typed``, ``typed``,
  ``hot_table``, ``clear_hot_tables``) and its state (``CHECK_TYPED``,
  ``_typed``), read and patched on that module.
* ``_geometry``: ``address``, ``extent``.

``codes`` (the op-code records and their formulas) and ``bodies`` (the loop
bodies) hold the per-element math both devices compile; ``dispatch`` writes
the op-code ladders.

Module state lives with its functions in those modules (patch it there:
``_registry._loaded``, ``_typed_calls.CHECK_TYPED``, ...). The one copy kept
here is ``_observer``, the subscribed observer or None, which ``observe``
keeps equal to ``_hook._observer`` for the hot paths that read
``kernels._observer``.
"""
from __future__ import annotations

from typing import Any

from ._env import env_int
from ._diagnose import cuda_available, cuda_unavailable_reason
from ._geometry import address, extent
from ._registry import (DEVICES, check_device, get, missing, missing_report, register,
                        registry, split)
from ._hook import Observer, call, call_fn, empty, from_host, host_copy, observe, to_host
from ._typed_calls import call_typed, clear_hot_tables, hot_table, typed
from . import _registry

__all__ = ["DEVICES", "NAMES", "Observer", "address", "call", "call_fn", "call_typed",
           "check_device", "clear_hot_tables", "cuda_available", "cuda_unavailable_reason", "empty",
           "env_int", "extent", "from_host", "get", "host_copy", "hot_table", "missing",
           "missing_report", "observe", "register", "registry", "split", "to_host", "typed"]

_observer: Observer | None = None   # ``_hook._observer``'s copy (see above)


def __getattr__(name: str) -> Any:
    """``NAMES``: every registered kernel name (``_registry.names``), derived
    from the CPU package on first read."""
    if name == "NAMES":
        globals()["NAMES"] = names = _registry.names()
        return names
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

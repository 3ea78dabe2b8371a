"""CPU kernels: ``@njit`` functions with destination-passing signatures.

Every kernel writes into an array the caller passes; none allocates a
parameter-sized result. ``kernels/cuda`` exposes the same names with the
same signatures, so the op and optimizer layers never branch on the device.
One module per op family, each listing the kernels it registers in
``__all__`` (the rule is in ``kernels/_registry.py``); this package imports
them all, binds their kernels here (``cpu.unary``, ``cpu.unary_mt``) beside
the memory helpers, and registers ``upload`` itself. No import list is kept
by hand: a new family module is found by its ``__all__``.

A kernel ``foo`` that pays for threads on large arrays has a twin
``foo_mt`` (``parallel=True``, same signature, same bits) in its module;
``kernels.call(kern, "foo", n, ...)`` runs the twin for a call that touches
n >= ``MT_MIN`` elements (a memory-bound call: ``MT_MIN_MEMORY``; for
the GEMMs n counts multiply-adds, and their twins split from 2^22). Both
come from the environment (see ``_threads``). ``KERNELS`` maps every
registered name to its serial and threaded variants (``kernels.NAMES`` lists
them); the CUDA package's has the same names.
"""
from __future__ import annotations

import operator

import numpy as np

from .. import _registry
from ._threads import MT_MIN, MT_MIN_MEMORY, memory_bound  # noqa: F401

name = "cpu"


# --------------------------------------------------------------- memory
def empty(shape: tuple, dtype) -> np.ndarray:
    """An uninitialised C-contiguous host array."""
    return np.empty(shape, dtype)


def from_host(array: np.ndarray) -> np.ndarray:
    """Host data as this device's array: a copy the caller owns."""
    return np.array(array, order="C", copy=True)


def to_host(array: np.ndarray) -> np.ndarray:
    """A host copy of a device array."""
    return np.array(array, copy=True)


def upload(host: np.ndarray, out: np.ndarray) -> None:
    """Copy host data into an existing device array of the same shape."""
    np.copyto(out, host)


def is_device_array(obj) -> bool:
    return isinstance(obj, np.ndarray)


def synchronize() -> None:
    """Nothing to wait for: CPU kernels finish before they return."""


def entry_point(dispatcher, args: tuple):
    """The compiled specialisation Numba's ``dispatcher`` runs for ``args``
    (its CPython entry point), or None: what ``kernels.call_typed`` calls
    directly. Read from Numba's dispatcher internals (``typeof_pyval``,
    ``overloads``), so any surprise there gives None: the dispatched path."""
    try:
        types = tuple(dispatcher.typeof_pyval(a) for a in args)
        return dispatcher.overloads[types].entry_point
    except Exception:   # noqa: BLE001 (a Numba version without these: dispatch)
        return None


def signature(dispatcher, args: tuple) -> tuple:
    """The Numba types of ``args`` that a call site's key must fix: every
    array's dtype, rank and layout (not whether it is read-only or aligned,
    which only the arrays a kernel writes must be, and those come from the
    pool) and every other argument's type."""
    out = []
    for a in args:
        t = dispatcher.typeof_pyval(a)
        out.append((t.dtype, t.ndim, t.layout) if isinstance(a, np.ndarray) else t)
    return tuple(out)


# (a C-level getter: the ops' fast paths ask it several times per op)
is_c_contiguous = operator.attrgetter("flags.c_contiguous")


# every family module's kernels (and their _mt twins), bound here
KERNELS = _registry.register(globals(), own=("upload",))
KERNEL_FNS = _registry.split(KERNELS)

"""Reusable work buffers for op outputs and saved residuals.

A training loop asks for the same shapes every micro-step. Instead of a fresh
allocation each time, ``take`` hands back a pooled array that nothing else
references any more, so a steady-state micro-step allocates nothing.

"Nothing references it" is read from ``sys.getrefcount``, whose value for an
idle array is a CPython implementation detail: it is calibrated at import by
running the same scan over a known-idle array, checked against a held
reference and a held view, and pooling is switched off (every ``take``
allocates) if anything is inconsistent. Views that do not reference their
parent object (slices of Numba device arrays) are covered differently: an
array handed to the user (``Tensor.data``, ``np.asarray``) is ``retire``d,
removed from the pool for good. ``NUMBAGRAD_NO_POOL=1`` disables pooling.
"""
from __future__ import annotations

import os
import sys
import threading
import weakref
from types import ModuleType

import numpy as np

from . import kernels

_MAX_PER_KEY = 8
# Host arrays of at most FRESH elements: NumPy's own small-block cache makes
# ``np.empty`` (``fresh``) cheaper than the pool's lookup, so the hot fast
# paths of the CPU ops (matmul, mse_loss) allocate those directly, when
# ``ng.compile`` is not recording (``kernels._observer`` is None).
FRESH = 256
fresh = np.empty
HOST = kernels.get("cpu")   # the CPU kernel module
_lock = threading.Lock()     # taken by retire and clear only


class _Free(dict):
    """One thread's pools: (shape, dtype, kernel module) -> arrays; compared
    and hashed by identity, so a WeakSet can hold every thread's."""
    __slots__ = ("__weakref__",)
    __hash__ = object.__hash__
    __eq__ = object.__eq__


class _Pools(threading.local):
    """Each thread has its own pools. Only the owning thread takes from (and
    appends to) them, so ``take`` needs no lock: two threads can never be
    handed the same idle array. A finished thread's pools are dropped."""

    def __init__(self) -> None:
        self.free = _Free()
        with _lock:
            _all.add(self.free)


_all: weakref.WeakSet = weakref.WeakSet()   # every live thread's pools
_local = _Pools()


def _scan(pool: list, idle: int, refs=sys.getrefcount):
    """The first array in ``pool`` whose reference count is ``idle``."""
    for array in pool:
        if refs(array) == idle:
            return array
    return None


def _calibrate(refs=sys.getrefcount) -> int | None:
    """The idle reference count ``_scan`` sees, or None if it is not
    consistent (then nothing is ever reused)."""
    for idle in range(1, 16):
        pool = [np.empty(4)]
        if _scan(pool, idle, refs) is pool[0]:
            break
    else:
        return None
    held = [np.empty(4)]
    keep = held[0]
    view = [np.empty(4)]
    part = view[0][1:3]
    tensor_like = [np.empty(4)]
    owner = type("Owner", (), {})()
    owner.data = tensor_like[0]
    fresh = [np.empty(4)]
    if _scan(held, idle, refs) is not None or _scan(view, idle, refs) is not None \
            or _scan(tensor_like, idle, refs) is not None \
            or _scan(fresh, idle, refs) is not fresh[0]:
        return None
    del keep, part, owner
    return idle


def take(kern: ModuleType, shape: tuple, dtype) -> object:
    """An array of ``shape``/``dtype`` on ``kern``'s device, contents undefined."""
    observer = kernels._observer
    if observer is not None:        # ng.compile recording: a fresh array, never pooled
        array = observer.temp(kern, shape, dtype)
        if array is not None:
            return array
    idle = IDLE_REFS
    if idle is None:
        return kern.empty(shape, dtype)
    key = (shape, dtype, kern)
    free = _local.free
    try:
        pool = free[key]
    except KeyError:
        pool = free[key] = []
    # the scan of ``_scan``, inline (one call less per op): ``_verify``
    # checks at import that it sees the same counts
    for array in pool:
        if _refs(array) == idle:
            return array
    array = kern.empty(shape, dtype)
    if len(pool) < _MAX_PER_KEY:
        pool.append(array)
    return array


_refs = sys.getrefcount


class _Host:
    """A stand-in device module for ``_verify``: host arrays, its own pool key."""
    empty = staticmethod(np.empty)


def _verify() -> bool:
    """Whether ``take`` (its inline scan) reuses an idle array and never a
    held one, or a view's parent, under the calibrated count."""
    key_shape, f64 = (3,), np.dtype(np.float64)
    first = take(_Host, key_shape, f64)
    first_id = id(first)
    del first
    again = take(_Host, key_shape, f64)          # idle: the same array back
    other = take(_Host, key_shape, f64)          # `again` is held: a new one
    view = other[1:]
    third = take(_Host, key_shape, f64)          # `other` is referenced by a view
    ok = id(again) == first_id and other is not again and third is not other \
        and third is not again
    del view
    _local.free.pop((key_shape, f64, _Host), None)
    return ok


IDLE_REFS: int | None = None if os.environ.get("NUMBAGRAD_NO_POOL") == "1" else _calibrate()
if IDLE_REFS is not None and not _verify():
    IDLE_REFS = None


def retire(kern: ModuleType, array: object) -> None:
    """Never hand ``array`` out again (it, or a view of it, left numbagrad)."""
    key = (array.shape, array.dtype, kern)
    with _lock:
        for free in list(_all):
            pool = free.get(key)
            if pool is not None:
                for i, held in enumerate(pool):
                    if held is array:
                        del pool[i]
                        return


def clear() -> None:
    """Forget every pooled buffer (arrays still in use stay valid)."""
    with _lock:
        for free in list(_all):
            free.clear()

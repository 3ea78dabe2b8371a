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

Each thread's pool holds at most ``MAX_BYTES`` bytes of arrays, in use or
idle (``NUMBAGRAD_POOL_BYTES``, 64 MiB by default; 0 turns pooling off): when
a new array would take it past that, whole keys gone cold are dropped
(``_drop_cold``), so a run over ever new shapes (a batch size per step)
keeps a bounded pool; when none is cold the new array is not pooled, so a
step that needs more than the bound keeps reusing the part that fits. A
dropped array still in use stays valid; it is just never reused.
"""
from __future__ import annotations

import inspect
import math
import os
import sys
import threading
import weakref
from types import ModuleType
from typing import Any

import numpy as np

from . import kernels

_MAX_PER_KEY = 8
# The most bytes one thread's pool holds: past what a step of the models this package
# trains needs (scripts/train_gpt.py: 30 MiB), and small next to the ~180 MiB of a
# process that imported numbagrad: a 784-512-512-10 MLP trained over batch sizes
# 100..899 peaks at 1.3x the memory it takes without a pool (with 256 MiB: 2.3x).
# A bad value fails the import, naming the variable.
MAX_BYTES = kernels.env_int("NUMBAGRAD_POOL_BYTES", 64 << 20)
# What the pool charges per array beyond its data (the array object, its slot and
# key), so that arrays of size 0 are bounded too.
_OBJECT_BYTES = 128
# Host arrays of at most FRESH elements: NumPy's own small-block cache makes
# ``np.empty`` (``fresh``) cheaper than the pool's lookup, so the hot fast
# paths of the CPU ops (matmul, mse_loss) allocate those directly, when
# ``ng.compile`` is not recording (``kernels._observer`` is None).
FRESH = 256
fresh = np.empty
HOST = kernels.get("cpu")   # the CPU kernel module
_lock = threading.Lock()     # taken by retire and clear only


class _Free(dict):
    """One thread's pools: (shape, dtype, kernel module) -> ``_Pool``. ``held``
    is the bytes their arrays are charged; ``tick`` counts this thread's
    allocations (the pool's clock: it stands still while every take hits).
    Compared and hashed by identity, so a WeakSet can hold every thread's."""
    __slots__ = ("held", "tick", "__weakref__")
    __hash__ = object.__hash__
    __eq__ = object.__eq__

    def __init__(self) -> None:
        super().__init__()
        self.held = 0
        self.tick = 0


class _Pool(list):
    """One key's arrays; ``charge`` is what they count in ``held``, ``used`` the
    tick of the last take of the key, ``gap`` the most ticks seen between two."""
    __slots__ = ("charge", "used", "gap")

    def __init__(self, tick: int) -> None:
        super().__init__()
        self.charge = 0
        self.used = tick
        self.gap = 0


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
        try:
            return kern.empty(shape, dtype)
        except _ALLOCATION_ERRORS as exc:
            raise allocation_error(kern, shape, dtype, exc) from exc
    key = (shape, dtype, kern)
    free = _local.free
    pool = free.get(key)
    if pool is not None:
        tick = free.tick
        if pool.used != tick:       # (never so in a step that allocates nothing)
            if tick - pool.used > pool.gap:
                pool.gap = tick - pool.used
            pool.used = tick
        # the scan of ``_scan``, inline (one call less per op): ``_verify``
        # checks at import that it sees the same counts
        for array in pool:
            if _refs(array) == idle:
                return array
    try:
        array = kern.empty(shape, dtype)
    except _ALLOCATION_ERRORS as exc:
        raise allocation_error(kern, shape, dtype, exc) from exc
    _keep(free, key, pool, array)
    return array


def _allocation_errors() -> tuple:
    """What an allocation raises for a size it cannot have: NumPy's MemoryError
    and ValueError, and numba-cuda's driver error (out of memory), where present."""
    errors: list = [MemoryError, ValueError]
    try:
        from numba.cuda.cudadrv.driver import CudaAPIError
        errors.append(CudaAPIError)
    except ImportError:
        pass
    return tuple(errors)


_ALLOCATION_ERRORS = _allocation_errors()
_OPS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ops") + os.sep


def allocation_error(kern: ModuleType, shape: tuple, dtype: Any, exc: BaseException
                     ) -> Exception:
    """The error for an output that cannot be allocated, naming the public op
    that asked (the outermost ``numbagrad.ops`` function on the stack), the
    shape, dtype, size and device: a MemoryError, or a ValueError for a shape
    NumPy refuses (negative dims). Built on the error path only."""
    import numbagrad
    op = "numbagrad"
    frame = inspect.currentframe()   # None where the interpreter keeps no frames
    while frame is not None:
        code = frame.f_code
        if code.co_filename.startswith(_OPS_DIR) and hasattr(numbagrad, code.co_name):
            op = code.co_name   # keep walking: the outermost one is the user's call
        frame = frame.f_back
    try:
        size = f"{math.prod(shape) * np.dtype(dtype).itemsize:,} bytes"
    except (TypeError, ValueError):
        size = "an invalid size"
    negative = any(isinstance(n, int) and n < 0 for n in shape)
    kind = ValueError if negative or (isinstance(exc, ValueError)
                                      and "negative" in str(exc)) else MemoryError
    what = "is not a valid shape" if kind is ValueError else "cannot be allocated"
    return kind(f"{op}: an output of shape {tuple(shape)} ({np.dtype(dtype)}, {size}) on "
                f"{kern.name} {what}: {type(exc).__name__}: {exc}")


def _keep(free: _Free, key: tuple, pool: _Pool | None, array: object) -> None:
    """Pool ``array``, just made for ``key`` (whose pool is ``pool``), if its key
    has room and the pool stays within ``MAX_BYTES``, dropping cold keys (see
    ``_drop_cold``) to make room; else leave it unpooled."""
    size = array.nbytes + _OBJECT_BYTES
    bound = MAX_BYTES
    free.tick += 1
    count = 1 if pool is None else len(pool) + 1
    if count > _MAX_PER_KEY or count * size > bound:   # one key never exceeds the bound
        return
    if free.held + size > bound and not _drop_cold(free, size, pool):
        return
    if pool is None:
        pool = free[key] = _Pool(free.tick)
    pool.append(array)
    charge = len(pool) * size       # exact: also settles arrays another thread retired
    free.held += charge - pool.charge
    pool.charge = charge


def _drop_cold(free: _Free, size: int, keep: _Pool | None) -> bool:
    """Drop keys not taken for over twice the longest gap any key has shown
    between two takes (in allocations; at least twice the number of keys,
    for keys never taken again), oldest first, until ``size`` more
    bytes fit; whether they do. Keys a steady step still uses stay: a step
    whose arrays exceed the bound reuses a fixed part of them instead of
    dropping each key just before its next use, as least-recently-used would.
    (``held`` is counted afresh first: retires and clears from other threads
    settle here.)"""
    free.held = sum(p.charge for p in free.values())
    need = free.held + size - MAX_BYTES
    horizon = 2 * max(len(free), max(p.gap for p in free.values()) if free else 0)
    now = free.tick
    cold = [(p.used, k) for k, p in free.items() if p is not keep and now - p.used > horizon]
    cold.sort(key=lambda item: item[0])
    for _, k in cold:
        if need <= 0:
            break
        charge = free.pop(k).charge
        free.held -= charge
        need -= charge
    return need <= 0


def _held_bytes() -> int:
    """The bytes the calling thread's pool is charged: its arrays' data plus
    ``_OBJECT_BYTES`` each (for tests and diagnostics)."""
    return _local.free.held


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
    free = _local.free
    pool = free.pop((key_shape, f64, _Host), None)
    if pool is not None:
        free.held -= pool.charge
    return ok


IDLE_REFS: int | None = None if os.environ.get("NUMBAGRAD_NO_POOL") == "1" else _calibrate()
if IDLE_REFS is not None and not _verify():
    IDLE_REFS = None


def retire(kern: ModuleType, array: object) -> None:
    """Never hand ``array`` out again (it, or a view of it, left numbagrad)."""
    key = (array.shape, array.dtype, kern)
    mine = _local.free
    with _lock:
        for free in list(_all):
            pool = free.get(key)
            if pool is not None:
                for i, held in enumerate(pool):
                    if held is array:
                        del pool[i]
                        # Only the owning thread changes its counts (take holds no
                        # lock); another thread's are settled by its next _keep.
                        if free is mine:
                            size = array.nbytes + _OBJECT_BYTES
                            pool.charge -= size
                            free.held -= size
                        return


def clear() -> None:
    """Forget every pooled buffer (arrays still in use stay valid)."""
    with _lock:
        for free in list(_all):
            free.clear()
            free.held = 0

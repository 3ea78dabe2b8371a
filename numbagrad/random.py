"""numbagrad's random generator: what ``dropout`` draws from.

    ng.manual_seed(0)                  # the same seed gives the same masks
    state = ng.random.get_state()      # plain ints: ng.save can write it
    ng.random.set_state(state)         # continue exactly from there

The generator is counter-based (see ``kernels/cpu/random.py``): each device
has a small uint64 array ``[seed, counter, ticket]`` that every dropout
kernel reads and then advances itself, on the device. So no mask is drawn
twice (every micro-step of an accumulation window draws fresh ones), a
compiled step (``ng.compile``) draws fresh masks on every call, since its
recorded kernel reads the counter anew each time, and eager and compiled runs
from one seed draw the same bits on the CPU. The devices keep separate
counters, so CPU and CUDA masks differ. Until ``manual_seed`` is called the
seed is PyTorch's default seed, 67280421310721 (runs are repeatable, as
PyTorch's are). One generator serves the whole process: threads that run
dropout at the same moment may draw one mask twice, so give each thread its
own ``generator=`` (a NumPy Generator) where that matters.
"""
from __future__ import annotations

import operator
import threading
from collections.abc import Mapping
from types import ModuleType
from typing import Any

import numpy as np

from . import kernels

__all__ = ["manual_seed", "initial_seed", "get_state", "set_state"]

DEFAULT_SEED = 67280421310721
_U64 = 1 << 64
_lock = threading.Lock()
_seed = DEFAULT_SEED
_start: dict[str, int] = {}       # counters for devices whose state array is not made yet
_states: dict[str, Any] = {}      # device name -> its uint64 [seed, counter, ticket] array


def _checked(value: Any, what: str) -> int:
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"ng.random: {what} must be an integer, got {value!r}")
    try:
        n = operator.index(value)
    except TypeError:
        raise TypeError(f"ng.random: {what} must be an integer, got {value!r}") from None
    if not 0 <= n < _U64:
        raise ValueError(f"ng.random: {what} must lie in [0, 2**64), got {n}")
    return n


def manual_seed(seed: int) -> None:
    """Seed numbagrad's generator on every device and restart its counters;
    as ``torch.manual_seed``, a negative seed counts from 2**64."""
    if not isinstance(seed, (bool, np.bool_)) and isinstance(seed, (int, np.integer)) \
            and -(1 << 63) <= int(seed) < 0:
        seed = int(seed) + _U64
    set_state({"seed": seed, "counters": {}})


def initial_seed() -> int:
    """The seed the generator was last seeded with."""
    return _seed


def get_state() -> dict[str, Any]:
    """``{"seed": int, "counters": {device: int}}``: plain Python ints, which
    ``ng.save`` writes and ``set_state`` restores (reading a CUDA counter is
    one device-to-host copy)."""
    with _lock:
        counters = dict(_start)
        for name, array in _states.items():
            counters[name] = int(kernels.to_host(kernels.get(name), array)[1])
        return {"seed": _seed, "counters": counters}


def set_state(state: Mapping[str, Any]) -> None:
    """Restore what ``get_state`` returned: the seed and each device's counter
    (a device left out restarts from 0). Everything is checked before the
    generator changes; the state arrays are written in place, so compiled
    steps keep reading them."""
    global _seed
    if not isinstance(state, Mapping) or set(state) != {"seed", "counters"} \
            or not isinstance(state["counters"], Mapping):
        raise ValueError(f"ng.random.set_state: expected {{'seed': int, 'counters': "
                         f"{{device: int}}}} as get_state() returns, got {state!r:.200}")
    seed = _checked(state["seed"], "the seed")
    counters = {}
    for name, value in state["counters"].items():
        if name not in kernels.DEVICES:
            raise ValueError(f"ng.random.set_state: unknown device {name!r} in counters "
                             f"(expected one of {kernels.DEVICES})")
        counters[name] = _checked(value, f"the {name} counter")
    with _lock:
        _seed = seed
        _start.clear()
        _start.update({k: v for k, v in counters.items() if k not in _states})
        for name, array in _states.items():
            kernels.call(kernels.get(name), "upload", 0, _row(seed, counters.get(name, 0)),
                         array)


def _row(seed: int, counter: int) -> np.ndarray:
    return np.array([seed, counter, 0], np.uint64)


def state(kern: ModuleType) -> Any:
    """The generator's state array on ``kern``'s device (made on first use),
    which the dropout kernels read and advance."""
    array = _states.get(kern.name)
    if array is None:
        with _lock:
            array = _states.get(kern.name)
            if array is None:
                array = kernels.from_host(kern, _row(_seed, _start.pop(kern.name, 0)))
                _states[kern.name] = array
    return array


def drawn_state(kern: ModuleType, generator: np.random.Generator) -> Any:
    """A one-call state array on ``kern``'s device whose seed is drawn from
    ``generator`` (a NumPy Generator: saving it is its owner's business)."""
    seed = int(generator.integers(0, _U64, dtype=np.uint64))
    return kernels.from_host(kern, _row(seed, 0))

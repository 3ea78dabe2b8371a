"""CPU kernel that copies the random generator's state array on the device.

Activation checkpointing and ``ng.vjp`` run a function's forward again and
must draw the dropout masks it drew the first time: they copy the
generator's uint64 ``[seed, counter, ticket]`` array (``numbagrad/random.py``)
aside before the forward and back before the rerun, on the device, so a
compiled step (``ng.compile``) replays the copies too.
"""
from __future__ import annotations

__all__ = ["copy_state"]   # the kernels this module registers

from numba import njit


@njit(cache=True)
def copy_state(src, dst):
    """dst[i] = src[i] (uint64 generator states of one length)."""
    for i in range(dst.size):
        dst[i] = src[i]

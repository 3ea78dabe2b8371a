"""The join kernel: up to ``SLOTS`` C-contiguous pieces written one after
another along the middle dim of a 3-D view (outer, n, inner) of the output,
so that ``concatenate`` and ``stack`` of up to eight inputs are one kernel
call (one CUDA launch)."""
from __future__ import annotations

__all__ = ["concat"]   # the kernels this module registers

from numba import njit

SLOTS = 8


@njit(error_model="numpy", inline="always")
def _place(out, a, n, at):
    for o in range(out.shape[0]):
        for j in range(n):
            for i in range(out.shape[2]):
                out[o, at + j, i] = a[o, j, i]
    return at + n


@njit(cache=True, error_model="numpy")
def concat(out, a0, a1, a2, a3, a4, a5, a6, a7, n0, n1, n2, n3, n4, n5, n6, n7, start):
    """out[:, start:start + n0 + ... + n7, :] = a0, ..., a7 joined along dim 1:
    ``out`` (outer, total, inner) and each ``a_i`` (outer, n_i, inner), all
    3-D C-contiguous of one dtype; a slot with n_i = 0 is never read."""
    at = _place(out, a0, n0, start)
    at = _place(out, a1, n1, at)
    at = _place(out, a2, n2, at)
    at = _place(out, a3, n3, at)
    at = _place(out, a4, n4, at)
    at = _place(out, a5, n5, at)
    at = _place(out, a6, n6, at)
    _place(out, a7, n7, at)

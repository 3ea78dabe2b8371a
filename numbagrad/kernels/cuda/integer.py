"""CUDA kernels of integer and bool tensors: the CPU kernels' formulas
(``kernels/cpu/integer.py``), one thread per output element (per row for
``int_reduce``), one launch per call."""
from __future__ import annotations

__all__ = ["int_binary", "int_reduce", "int_unary"]   # the kernels this module registers

import numpy as np
from numba import config, cuda, int32, int64

from ..cpu.integer import N_BINARY, N_REDUCE, N_UNARY, int_reduce_row, int_scalar, \
    int_unary_scalar
from ..cpu.masks import RANK, offset
from ._core import THREADS, Config, array_type, checked_code, flat, grid, kernel, launch

_scalar = cuda.jit(device=True)(int_scalar)
_unary_scalar = cuda.jit(device=True)(int_unary_scalar)
_reduce_row = cuda.jit(device=True)(int_reduce_row)
_offset = cuda.jit(device=True)(offset)
_INTS = (int32, int64)    # the dtypes compiled ahead for the PTX check

if config.ENABLE_CUDASIM:
    def _narrow(v, like):
        """``v`` (int64) wrapped into ``like``'s dtype: the simulator's store of
        an out-of-range NumPy int64 raises, where a GPU's truncates."""
        return np.array(v).astype(like.dtype)[()]
else:
    @cuda.jit(device=True)
    def _narrow(v, like):
        return v


def _n(dt):
    return array_type(dt, RANK)


@kernel("int_binary", lambda dt: (int64, _n(dt), array_type(dt, 1), _n(dt), array_type(dt, 1),
                                  _n(dt), array_type(dt, 1)), dtypes=_INTS)
def _int_binary_source(config: Config, dtype):
    def int_binary_kernel(code, a, av, b, bv, out, o):
        k = cuda.grid(1)
        stride = cuda.gridsize(1)
        while k < o.size:
            o[k] = _narrow(_scalar(code, av[_offset(k, out, a)], bv[_offset(k, out, b)]), o)
            k += stride

    return int_binary_kernel


@kernel("int_unary", lambda dt: (int64, array_type(dt, 1), array_type(dt, 1)), dtypes=_INTS)
def _int_unary_source(config: Config, dtype):
    def int_unary_kernel(code, x, o):
        k = cuda.grid(1)
        stride = cuda.gridsize(1)
        while k < o.size:
            o[k] = _unary_scalar(code, x[k])
            k += stride

    return int_unary_kernel


@kernel("int_reduce", lambda dt: (int64, array_type(dt, 2), array_type(int64, 1)),
        dtypes=_INTS)
def _int_reduce_source(config: Config, dtype):
    def int_reduce_kernel(code, x, out):
        r = cuda.grid(1)
        stride = cuda.gridsize(1)
        while r < out.size:
            out[r] = _reduce_row(code, x, r)
            r += stride

    return int_reduce_kernel


# ------------------------------------------------------------ launchers
def int_binary(code, a, b, out) -> None:
    """See ``kernels.cpu.int_binary``."""
    code = checked_code("int_binary", code, N_BINARY)
    if out.size:
        launch("int_binary", out.dtype, grid(out.size), THREADS, code, a, flat(a), b, flat(b),
               out, flat(out))


def int_unary(code, x, out) -> None:
    """See ``kernels.cpu.int_unary``."""
    code = checked_code("int_unary", code, N_UNARY)
    if out.size:
        launch("int_unary", out.dtype, grid(out.size), THREADS, code, flat(x), flat(out))


def int_reduce(code, x, out) -> None:
    """See ``kernels.cpu.int_reduce``."""
    code = checked_code("int_reduce", code, N_REDUCE)
    if out.size:
        launch("int_reduce", x.dtype, grid(out.size), THREADS, code, x, out)

"""CUDA kernels of the half-precision casts (see ``kernels/cpu/half.py``):
the CPU module's bit conversions as device functions, one thread per
element of a grid-stride loop, one launch per call."""
from __future__ import annotations

__all__ = ["float_to_half", "half_to_float"]   # the kernels this module registers

from numba import cuda, int64, uint16, uint32

from ..cpu.half import (BFLOAT16, bf16_to_f32_bits, f16_to_f32_bits, f32_to_bf16_bits,
                        f32_to_f16_bits)
from ._core import THREADS, Config, array_type, flat, grid, kernel, launch

_f16_to_f32 = cuda.jit(device=True)(f16_to_f32_bits)
_f32_to_f16 = cuda.jit(device=True)(f32_to_f16_bits)
_bf16_to_f32 = cuda.jit(device=True)(bf16_to_f32_bits)
_f32_to_bf16 = cuda.jit(device=True)(f32_to_bf16_bits)
_U16, _U32 = array_type(uint16, 1), array_type(uint32, 1)


@kernel("half_to_float", lambda dt: (_U16, _U32, int64), dtypes=(uint32,))
def _half_to_float_source(config: Config, dtype):
    def half_to_float_kernel(s, o, kind):
        k = cuda.grid(1)
        stride = cuda.gridsize(1)
        while k < o.size:
            o[k] = _bf16_to_f32(s[k]) if kind == BFLOAT16 else _f16_to_f32(s[k])
            k += stride

    return half_to_float_kernel


@kernel("float_to_half", lambda dt: (_U32, _U16, int64), dtypes=(uint16,))
def _float_to_half_source(config: Config, dtype):
    def float_to_half_kernel(s, o, kind):
        k = cuda.grid(1)
        stride = cuda.gridsize(1)
        while k < o.size:
            o[k] = _f32_to_bf16(s[k]) if kind == BFLOAT16 else _f32_to_f16(s[k])
            k += stride

    return float_to_half_kernel


def half_to_float(src, out, kind) -> None:
    """See ``kernels.cpu.half_to_float``."""
    if out.size:
        launch("half_to_float", out.dtype, grid(out.size), THREADS, flat(src), flat(out),
               int(kind))


def float_to_half(src, out, kind) -> None:
    """See ``kernels.cpu.float_to_half``."""
    if out.size:
        launch("float_to_half", out.dtype, grid(out.size), THREADS, flat(src), flat(out),
               int(kind))

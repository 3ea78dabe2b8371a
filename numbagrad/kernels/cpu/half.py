"""CPU kernels of the half-precision casts: float16 / bfloat16 <-> float32.

Numba types neither NumPy's float16 nor ml_dtypes' bfloat16, so the casts
work on the bits: a half array is passed as its uint16 view, a float32 one
as its uint32 view. ``kind`` picks the format: ``FLOAT16`` (IEEE binary16)
or ``BFLOAT16`` (the top half of a float32). Float32 -> half rounds to
nearest even, overflows to +-inf and keeps nan a (quiet) nan, as NumPy's and
ml_dtypes' casts. The plain-Python scalar helpers are jitted by
``kernels/cuda/half.py`` too, so both devices give the same bits.
"""
from __future__ import annotations

__all__ = ["float_to_half", "half_to_float"]   # the kernels this module registers

from numba import njit

FLOAT16, BFLOAT16 = 0, 1


def f16_to_f32_bits(h):
    """The float32 bits of the binary16 value with bits ``h``."""
    h = int(h)
    sign = (h & 0x8000) << 16
    exp = (h >> 10) & 0x1F
    man = h & 0x3FF
    if exp == 0:
        if man == 0:
            return sign
        e = 113   # a subnormal: normalise the mantissa
        while (man & 0x400) == 0:
            man <<= 1
            e -= 1
        return sign | (e << 23) | ((man & 0x3FF) << 13)
    if exp == 31:
        return sign | 0x7F800000 | (man << 13)
    return sign | ((exp + 112) << 23) | (man << 13)


def f32_to_f16_bits(x):
    """The binary16 bits nearest (ties to even) the float32 with bits ``x``."""
    x = int(x)
    sign = (x >> 16) & 0x8000
    exp = (x >> 23) & 0xFF
    man = x & 0x7FFFFF
    if exp == 255:
        return sign | 0x7C00 | (0x200 if man != 0 else 0)
    e = exp - 112
    if e >= 31:
        return sign | 0x7C00
    if e <= 0:   # a binary16 subnormal (or zero): units of 2^-24
        shift = 14 - e
        if shift > 24:
            return sign
        full = man | 0x800000
        h = full >> shift
        rem = full & ((1 << shift) - 1)
        mid = 1 << (shift - 1)
        if rem > mid or (rem == mid and (h & 1) == 1):
            h += 1
        return sign | h
    h = (e << 10) | (man >> 13)
    rem = man & 0x1FFF
    if rem > 0x1000 or (rem == 0x1000 and (h & 1) == 1):
        h += 1   # a carry into the exponent is right, up to inf
    return sign | h


def bf16_to_f32_bits(h):
    return int(h) << 16


def f32_to_bf16_bits(x):
    """The bfloat16 bits nearest (ties to even) the float32 with bits ``x``."""
    x = int(x)
    if (x & 0x7F800000) == 0x7F800000 and (x & 0x7FFFFF) != 0:
        return (x >> 16) | 0x40   # a quiet nan
    return (x + 0x7FFF + ((x >> 16) & 1)) >> 16


_f16_to_f32 = njit(cache=True)(f16_to_f32_bits)
_f32_to_f16 = njit(cache=True)(f32_to_f16_bits)
_bf16_to_f32 = njit(cache=True)(bf16_to_f32_bits)
_f32_to_bf16 = njit(cache=True)(f32_to_bf16_bits)


@njit(cache=True)
def half_to_float(src, out, kind):
    """out (a float32 array's uint32 view) = the half values of ``src`` (a
    uint16 view), flat arrays of one size."""
    s, o = src.ravel(), out.ravel()
    if kind == BFLOAT16:
        for k in range(o.size):
            o[k] = _bf16_to_f32(s[k])
    else:
        for k in range(o.size):
            o[k] = _f16_to_f32(s[k])


@njit(cache=True)
def float_to_half(src, out, kind):
    """out (a half array's uint16 view) = ``src`` (a float32 array's uint32
    view) rounded to the half format ``kind``."""
    s, o = src.ravel(), out.ravel()
    if kind == BFLOAT16:
        for k in range(o.size):
            o[k] = _f32_to_bf16(s[k])
    else:
        for k in range(o.size):
            o[k] = _f32_to_f16(s[k])

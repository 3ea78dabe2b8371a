"""CPU kernels of randomness, dropout and embedding.

Dropout draws its mask from a counter-based generator: the bits of element
``i`` of a call are a hash of (seed, counter, i), where ``state`` is a small
uint64 array ``[seed, counter, ticket]`` that the kernel reads and then
advances (counter += 1) itself. A recorded call (``ng.compile``) that is
replayed therefore reads a fresh counter every time, and a run from the
same seed draws the same masks eagerly and compiled. The hash works on
32-bit words held in uint64 (products of two 32-bit words never overflow),
so the CUDA simulator's NumPy scalars compute it without overflow and the
CUDA kernels (``kernels/cuda/random.py``) share it via ``generator``.
"""
from __future__ import annotations

# the kernels this module registers
__all__ = ["dropout", "dropout_backward", "embedding_backward", "random_fill"]

import math

import numpy as np
from numba import njit

from ._threads import _cast_like

_M32 = np.uint64(0xFFFFFFFF)
_S15, _S16, _S32 = np.uint64(15), np.uint64(16), np.uint64(32)
_C1, _C2 = np.uint64(0x7FEB352D), np.uint64(0x846CA68B)
_K0, _K1 = np.uint64(0x9E3779B9), np.uint64(0x85EBCA6B)
_ONE = np.uint64(1)
TWO32 = 4294967296.0


def generator(jit):
    """(stream_key, element_bits) compiled with ``jit`` (njit or a CUDA device jit).

    ``stream_key(seed, counter)`` -> (key, key2) names one call's stream;
    ``element_bits(key, key2, i)`` -> 32 uniform bits (in a uint64) for its
    element ``i`` (a uint64). The mixer is Wellons' "lowbias32".
    """
    @jit
    def mix32(x):
        x ^= x >> _S16
        x = (x * _C1) & _M32
        x ^= x >> _S15
        x = (x * _C2) & _M32
        x ^= x >> _S16
        return x

    @jit
    def stream_key(seed, counter):
        k = mix32((seed >> _S32) ^ _K0)
        k = mix32(k ^ (seed & _M32))
        k = mix32(k ^ (counter >> _S32))
        k = mix32(k ^ (counter & _M32))
        return k, mix32(k ^ _K1)

    @jit
    def element_bits(key, key2, i):
        return mix32(mix32(mix32(key ^ (i & _M32)) ^ key2) ^ (i >> _S32))

    return stream_key, element_bits


_stream_key, _element_bits = generator(njit(error_model="numpy", inline="always"))

# random_fill's kinds: a + (b - a) u with u uniform in [0, 1) (53 bits, or
# 24 for float32, which then never rounds u up to 1), or a + b z with z
# standard normal (Box-Muller over two 53-bit u).
UNIFORM, UNIFORM24, NORMAL = 0, 1, 2
_S8, _S11, _S21 = np.uint64(8), np.uint64(11), np.uint64(21)
_TWO_M53 = 1.0 / 9007199254740992.0     # 2**-53
_TWO_M24 = 1.0 / 16777216.0             # 2**-24
_TWO_PI = 6.283185307179586


def sampler(jit):
    """``sample(key, key2, k, kind, a, b)`` -> element ``k``'s float64 draw,
    compiled with ``jit`` (each device's): a uniform takes 53 bits from
    elements 2k and 2k + 1 of the call's stream (UNIFORM24: 24 of 2k), a
    normal two uniforms from 4k .. 4k + 3, so every element is a function of
    (seed, counter, k)."""
    _, bits = generator(jit)

    @jit
    def uniform53(key, key2, i):
        hi = bits(key, key2, i)
        lo = bits(key, key2, i + _ONE)
        return float((hi << _S21) | (lo >> _S11)) * _TWO_M53

    @jit
    def sample(key, key2, k, kind, a, b):
        if kind == UNIFORM:
            return a + (b - a) * uniform53(key, key2, np.uint64(2) * k)
        if kind == UNIFORM24:
            return a + (b - a) * (float(bits(key, key2, np.uint64(2) * k) >> _S8) * _TWO_M24)
        u1 = uniform53(key, key2, np.uint64(4) * k)
        u2 = uniform53(key, key2, np.uint64(4) * k + np.uint64(2))
        return a + b * (math.sqrt(-2.0 * math.log(1.0 - u1)) * math.cos(_TWO_PI * u2))

    return sample


_sample = sampler(njit(error_model="numpy", inline="always"))


@njit(cache=True, error_model="numpy")
def dropout(x, out, mask, state, p, scale):
    """mask[i] = scale where element i's bits (seed state[0], counter state[1])
    lie at or above p * 2**32, else 0; out = x * mask; then state[1] += 1.
    ``x``, ``out``, ``mask`` flat, of one dtype; ``state`` uint64 [seed,
    counter, ticket]. p = 0 keeps everything, p = 1 nothing."""
    s, zero = _cast_like(out, scale), _cast_like(out, 0.0)
    key, key2 = _stream_key(state[0], state[1])
    cut = p * TWO32
    for i in range(out.size):
        m = s if _element_bits(key, key2, np.uint64(i)) >= cut else zero
        mask[i] = m
        out[i] = x[i] * m
    state[1] += _ONE


@njit(cache=True, error_model="numpy")
def random_fill(out, state, kind, a, b):
    """out[k] = element k's draw (``sampler``: UNIFORM in [a, b), NORMAL of
    mean a and std b) from the stream of (seed state[0], counter state[1]),
    rounded to out's dtype; then state[1] += 1. ``out`` flat."""
    key, key2 = _stream_key(state[0], state[1])
    for k in range(out.size):
        out[k] = _sample(key, key2, np.uint64(k), kind, a, b)
    state[1] += _ONE


@njit(cache=True, error_model="numpy")
def dropout_backward(g, mask, dest, beta):
    """dest = g * mask + beta * dest (flat arrays; beta == 0 never reads dest)."""
    b = _cast_like(dest, beta)
    for i in range(dest.size):
        v = g[i] * mask[i]
        dest[i] = v if b == 0 else v + b * dest[i]


@njit(cache=True, error_model="numpy")
def embedding_backward(g, index, dest, beta, padding):
    """dest = beta * dest + (row g[i] added into dest[index[i]] for every i
    whose index is not ``padding``), in order of i: ``nn.Embedding``'s weight
    gradient. ``g`` (N, D), ``index`` (N,) int64, ``dest`` (V, D); an index
    outside [0, V) adds nothing (the op checks host indices)."""
    b = _cast_like(dest, beta)
    rows, cols = dest.shape
    for r in range(rows):
        for q in range(cols):
            dest[r, q] = 0.0 if b == 0 else b * dest[r, q]
    for i in range(g.shape[0]):
        r = index[i]
        if r != padding and 0 <= r < rows:
            for q in range(cols):
                dest[r, q] += g[i, q]

"""CUDA kernels of the selection ops: comparisons, ``where`` and casts.

The launchers take the CPU kernels' arguments (C-contiguous operands of one
rank, broadcast where a dim is 1) and pass each array twice: as is, for its
shape, and as a flat view to read or write. One thread per output element
(per destination element for ``where_backward``, summing in the CPU
kernel's order), one launch per call.
"""
from __future__ import annotations

__all__ = ["astype", "compare", "where", "where_backward"]   # the kernels this module registers

from numba import cuda, float64, int64, types

from ..cpu.masks import N_COMPARE, RANK, compare_scalar, joined, offset
from ._core import THREADS, Config, array_type, checked_code, flat, grid, kernel, launch

_compare = cuda.jit(device=True)(compare_scalar)
_offset = cuda.jit(device=True)(offset)
_joined = cuda.jit(device=True)(joined)
_BN = array_type(types.boolean, RANK)
_B1 = array_type(types.boolean, 1)


def _n(dt):
    return array_type(dt, RANK)


@kernel("compare", lambda dt: (int64, _n(dt), array_type(dt, 1), _n(dt), array_type(dt, 1), _BN,
                               _B1, dt, types.boolean))
def _compare_source(config: Config, dtype):
    def compare_kernel(code, a, av, b, bv, out, o, s, b_scalar):
        k = cuda.grid(1)
        stride = cuda.gridsize(1)
        while k < o.size:
            x = av[_offset(k, out, a)]
            y = s if b_scalar else bv[_offset(k, out, b)]
            o[k] = _compare(code, x, y)
            k += stride

    return compare_kernel


@kernel("where", lambda dt: (_BN, _B1, _n(dt), array_type(dt, 1), _n(dt), array_type(dt, 1),
                             _n(dt), array_type(dt, 1), dt, dt, int64))
def _where_source(config: Config, dtype):
    def where_kernel(cond, c, a, av, b, bv, out, o, sa, sb, mode):
        k = cuda.grid(1)
        stride = cuda.gridsize(1)
        while k < o.size:
            if c[_offset(k, out, cond)]:
                o[k] = sa if mode & 1 else av[_offset(k, out, a)]
            else:
                o[k] = sb if mode & 2 else bv[_offset(k, out, b)]
            k += stride

    return where_kernel


@kernel("where_backward", lambda dt: (_BN, _B1, _n(dt), array_type(dt, 1), _n(dt),
                                      array_type(dt, 1), float64, types.boolean))
def _where_backward_source(config: Config, dtype):
    def where_backward_kernel(cond, c, g, gv, dest, d, beta, pick):
        n = d.size
        m = gv.size // n
        j = cuda.grid(1)
        stride = cuda.gridsize(1)
        while j < n:
            total = 0.0    # float64, as the CPU kernel adds
            for t in range(m):
                k = _joined(j, t, g, dest)
                if c[_offset(k, g, cond)] == pick:
                    total += gv[k]
            d[j] = total if beta == 0.0 else total + beta * d[j]
            j += stride

    return where_backward_kernel


@kernel("astype", lambda dt: (array_type(dt, 1), array_type(dt, 1), float64))
def _astype_source(config: Config, dtype):
    def astype_kernel(x, o, beta):
        k = cuda.grid(1)
        stride = cuda.gridsize(1)
        while k < o.size:
            if beta == 0.0:
                o[k] = x[k]
            else:
                o[k] = x[k] + beta * o[k]
            k += stride

    return astype_kernel


# ------------------------------------------------------------ launchers
def compare(code, a, b, out, s, b_scalar) -> None:
    """See ``kernels.cpu.compare``."""
    code = checked_code("compare", code, N_COMPARE)
    if out.size:
        b = a if b_scalar else b
        launch("compare", a.dtype, grid(out.size), THREADS, int(code), a, flat(a), b, flat(b),
               out, flat(out), a.dtype.type(s), bool(b_scalar))


def where(cond, a, b, out, sa, sb, mode) -> None:
    """See ``kernels.cpu.where``."""
    if out.size:
        dt = out.dtype.type
        launch("where", out.dtype, grid(out.size), THREADS, cond, flat(cond), a, flat(a), b,
               flat(b), out, flat(out), dt(sa), dt(sb), int(mode))


def where_backward(cond, g, dest, beta, pick) -> None:
    """See ``kernels.cpu.where_backward``."""
    if dest.size:
        launch("where_backward", dest.dtype, grid(dest.size), THREADS, cond, flat(cond), g,
               flat(g), dest, flat(dest), float(beta), bool(pick))


def astype(x, out, beta) -> None:
    """See ``kernels.cpu.astype``."""
    if out.size:
        launch("astype", out.dtype, grid(out.size), THREADS, flat(x), flat(out), float(beta))

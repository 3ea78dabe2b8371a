"""CUDA indexing kernels: the launchers of ``kernels/cpu/indexing.py``'s
names and signatures, one launch each.

``place_nd`` sees its operands as 6-D (leading size-1 dims added on the host),
so one compiled kernel serves every rank up to 6. The scatter-adds run one
thread per destination element looping over the indices in order, so they
are deterministic and add in the CPU kernels' order (no atomics).

The selecting kernels (``index_select``, ``gather`` and their N-d forms)
range-check every index they read: one outside the range reads as nan and
sets the shared error flag (``_core.index_flag``). Host indices were checked
before upload, so their launches never read the flag; a launcher given the
indices' ``source`` (a device array the host never saw) reads it back once
and raises ``IndexError`` naming the op, the value, its position and the
valid range. (The scatter-adds only compare indices: they never write
outside ``dest``, and the forward has raised before they run.)
"""
from __future__ import annotations

# the kernels this module registers
__all__ = ["gather", "gather_nd", "index_add", "index_add_nd", "index_select", "index_select_nd",
           "place_nd", "scatter_add", "scatter_add_nd"]

import numpy as np
from numba import config, cuda, int32, int64, types

from ..cpu.indexing import index_error
from ._core import (THREADS, Config, array_type, grid, index_flag, index_flag_raised, kernel,
                    launch, to_host)

# what kernels.call may run (the rest are host helpers)

from .strided import MAX_RANK as RANK  # noqa: E402  (the highest rank place_nd takes)


class _Window:
    """An object whose ``__array_interface__`` views ``owner``'s memory (the
    simulator's device arrays are NumPy arrays)."""

    def __init__(self, owner, interface: dict) -> None:
        self.owner = owner
        self.__array_interface__ = interface


def as_strided(array, shape: tuple, strides: tuple, offset: int):
    """A device array viewing ``array``'s memory: ``shape`` and byte ``strides``
    from ``offset`` bytes after its first element (no data moves). It keeps
    ``array`` referenced, as ``ops._common.reshaped`` does."""
    shape, strides = tuple(int(s) for s in shape), tuple(int(s) for s in strides)
    if config.ENABLE_CUDASIM:
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray
        host = array._ary
        start = host.__array_interface__["data"][0] + offset
        view = FakeCUDAArray(np.asarray(_Window(host, {
            "data": (start, False), "shape": shape, "strides": strides,
            "typestr": host.dtype.str, "version": 3})))
    else:
        from numba.cuda.cudadrv.devicearray import DeviceNDArray
        view = DeviceNDArray(shape, strides, array.dtype, stream=array.stream,
                             gpu_data=array.gpu_data.view(offset))
    view._numbagrad_base = array
    return view


def _as6(array):
    """``array`` with leading size-1 dims up to rank 6 (a view)."""
    pad = RANK - len(array.shape)
    if pad == 0:
        return array
    return as_strided(array, (1,) * pad + tuple(array.shape), (0,) * pad + tuple(array.strides),
                      0)


def _a6(dt):
    return array_type(dt, RANK, "A")


def _a3(dt):
    return array_type(dt, 3, "A")


_I3 = array_type(int64, 3, "A")
_I1 = array_type(int64, 1, "A")
_FLAG = array_type(int32, 1)


@cuda.jit(device=True)
def _lattice(c, s, t, n):
    """j with c == s + t * j and 0 <= j < n, or -1."""
    off = c - s
    if t < 0:
        off, t = -off, -t
    if off < 0 or off % t != 0 or off // t >= n:
        return -1
    return off // t


@kernel("place_nd", lambda dt: (_a6(dt), _a6(dt), *([int64] * 12), dt, dt, types.boolean))
def _place_nd_source(config: Config, dtype):
    def place_nd_kernel(x, out, s0, s1, s2, s3, s4, s5, t0, t1, t2, t3, t4, t5, fill, beta,
                        whole):
        n = out.size if whole else x.size
        shape = out.shape if whole else x.shape
        k = cuda.grid(1)
        stride = cuda.gridsize(1)
        while k < n:
            m = k
            c5 = m % shape[5]
            m //= shape[5]
            c4 = m % shape[4]
            m //= shape[4]
            c3 = m % shape[3]
            m //= shape[3]
            c2 = m % shape[2]
            m //= shape[2]
            c1 = m % shape[1]
            c0 = m // shape[1]
            if whole:   # (c0..c5) indexes out: find x's element there, if any
                j0 = _lattice(c0, s0, t0, x.shape[0])
                j1 = _lattice(c1, s1, t1, x.shape[1])
                j2 = _lattice(c2, s2, t2, x.shape[2])
                j3 = _lattice(c3, s3, t3, x.shape[3])
                j4 = _lattice(c4, s4, t4, x.shape[4])
                j5 = _lattice(c5, s5, t5, x.shape[5])
                inside = j0 >= 0 and j1 >= 0 and j2 >= 0 and j3 >= 0 and j4 >= 0 and j5 >= 0
                v = x[j0, j1, j2, j3, j4, j5] if inside else fill
                if beta == 0.0:
                    out[c0, c1, c2, c3, c4, c5] = v
                else:
                    out[c0, c1, c2, c3, c4, c5] = v + beta * out[c0, c1, c2, c3, c4, c5]
            else:       # (c0..c5) indexes x
                v = x[c0, c1, c2, c3, c4, c5]
                o0, o1, o2 = s0 + t0 * c0, s1 + t1 * c1, s2 + t2 * c2
                o3, o4, o5 = s3 + t3 * c3, s4 + t4 * c4, s5 + t5 * c5
                if beta == 0.0:
                    out[o0, o1, o2, o3, o4, o5] = v
                else:
                    out[o0, o1, o2, o3, o4, o5] = v + beta * out[o0, o1, o2, o3, o4, o5]
            k += stride

    return place_nd_kernel


@kernel("index_select", lambda dt: (_a3(dt), _I1, _a3(dt), int64, _FLAG))
def _index_select_source(config: Config, dtype):
    def index_select_kernel(x, index, out, low, flag):
        # indices in [low, n), negative ones counting from the end (low is -n
        # for NumPy's rules, 0 for embedding's); any other sets the flag
        n = x.shape[1]
        rows, cols = out.shape[1], out.shape[2]
        k = cuda.grid(1)
        stride = cuda.gridsize(1)
        while k < out.size:
            p, i, q = k // (rows * cols), (k // cols) % rows, k % cols
            r = index[i]
            if r < low or r >= n:
                flag[0] = 1
                out[p, i, q] = np.nan
            else:
                if r < 0:
                    r += n
                out[p, i, q] = x[p, r, q]
            k += stride

    return index_select_kernel


@kernel("index_add", lambda dt: (_a3(dt), _I1, _a3(dt), dt))
def _index_add_source(config: Config, dtype):
    def index_add_kernel(g, index, dest, beta):
        n, cols, m = dest.shape[1], dest.shape[2], g.shape[1]
        k = cuda.grid(1)
        stride = cuda.gridsize(1)
        while k < dest.size:
            p, r, q = k // (n * cols), (k // cols) % n, k % cols
            acc = dtype(0.0) if beta == 0.0 else beta * dest[p, r, q]
            for i in range(m):
                j = index[i]
                if j < 0:
                    j += n
                if j == r:
                    acc += g[p, i, q]
            dest[p, r, q] = acc
            k += stride

    return index_add_kernel


@kernel("gather", lambda dt: (_a3(dt), _I3, _a3(dt), _FLAG))
def _gather_source(config: Config, dtype):
    def gather_kernel(x, index, out, flag):
        n = x.shape[1]
        rows, cols = out.shape[1], out.shape[2]
        k = cuda.grid(1)
        stride = cuda.gridsize(1)
        while k < out.size:
            p, i, q = k // (rows * cols), (k // cols) % rows, k % cols
            r = index[p, i, q]
            if 0 <= r < n:
                out[p, i, q] = x[p, r, q]
            else:
                flag[0] = 1
                out[p, i, q] = np.nan
            k += stride

    return gather_kernel


@kernel("scatter_add", lambda dt: (_a3(dt), _I3, _a3(dt), dt))
def _scatter_add_source(config: Config, dtype):
    def scatter_add_kernel(g, index, dest, beta):
        n, cols, m = dest.shape[1], dest.shape[2], g.shape[1]
        k = cuda.grid(1)
        stride = cuda.gridsize(1)
        while k < dest.size:
            p, r, q = k // (n * cols), (k // cols) % n, k % cols
            acc = dtype(0.0) if beta == 0.0 else beta * dest[p, r, q]
            for i in range(m):
                if index[p, i, q] == r:
                    acc += g[p, i, q]
            dest[p, r, q] = acc
            k += stride

    return scatter_add_kernel


@kernel("index_select_nd", lambda dt: (_a6(dt), _I1, _a6(dt), int64, _FLAG))
def _index_select_nd_source(config: Config, dtype):
    def index_select_nd_kernel(x, index, out, low, flag):
        n = x.shape[5]
        k = cuda.grid(1)
        stride = cuda.gridsize(1)
        while k < out.size:
            m = k
            c5 = m % out.shape[5]
            m //= out.shape[5]
            c4 = m % out.shape[4]
            m //= out.shape[4]
            c3 = m % out.shape[3]
            m //= out.shape[3]
            c2 = m % out.shape[2]
            m //= out.shape[2]
            c1 = m % out.shape[1]
            c0 = m // out.shape[1]
            r = index[c5]
            if r < low or r >= n:     # as index_select
                flag[0] = 1
                out[c0, c1, c2, c3, c4, c5] = np.nan
            else:
                if r < 0:
                    r += n
                out[c0, c1, c2, c3, c4, c5] = x[c0, c1, c2, c3, c4, r]
            k += stride

    return index_select_nd_kernel


@kernel("index_add_nd", lambda dt: (_a6(dt), _I1, _a6(dt), *([int64] * 13), dt))
def _index_add_nd_source(config: Config, dtype):
    def index_add_nd_kernel(g, index, dest, s0, s1, s2, s3, s4, s5, t0, t1, t2, t3, t4, t5,
                            axis, beta):
        # One thread per element of dest: off the lattice it is beta * dest; on
        # it, the indices i with index[i] == its coordinate on ``axis`` add g.
        n = dest.shape[axis]
        k = cuda.grid(1)
        stride = cuda.gridsize(1)
        while k < dest.size:
            m = k
            c5 = m % dest.shape[5]
            m //= dest.shape[5]
            c4 = m % dest.shape[4]
            m //= dest.shape[4]
            c3 = m % dest.shape[3]
            m //= dest.shape[3]
            c2 = m % dest.shape[2]
            m //= dest.shape[2]
            c1 = m % dest.shape[1]
            c0 = m // dest.shape[1]
            j0 = 0 if axis == 0 else _lattice(c0, s0, t0, g.shape[0])
            j1 = 0 if axis == 1 else _lattice(c1, s1, t1, g.shape[1])
            j2 = 0 if axis == 2 else _lattice(c2, s2, t2, g.shape[2])
            j3 = 0 if axis == 3 else _lattice(c3, s3, t3, g.shape[3])
            j4 = 0 if axis == 4 else _lattice(c4, s4, t4, g.shape[4])
            j5 = 0 if axis == 5 else _lattice(c5, s5, t5, g.shape[5])
            acc = dtype(0.0) if beta == 0.0 else beta * dest[c0, c1, c2, c3, c4, c5]
            if j0 >= 0 and j1 >= 0 and j2 >= 0 and j3 >= 0 and j4 >= 0 and j5 >= 0:
                c = (c0, c1, c2, c3, c4, c5)[axis]
                for i in range(g.shape[axis]):
                    r = index[i]
                    if r < 0:
                        r += n
                    if r == c:
                        acc += g[i if axis == 0 else j0, i if axis == 1 else j1,
                                 i if axis == 2 else j2, i if axis == 3 else j3,
                                 i if axis == 4 else j4, i if axis == 5 else j5]
            dest[c0, c1, c2, c3, c4, c5] = acc
            k += stride

    return index_add_nd_kernel


_I6 = array_type(int64, RANK, "A")


@kernel("gather_nd", lambda dt: (_a6(dt), _I6, _a6(dt), _FLAG))
def _gather_nd_source(config: Config, dtype):
    def gather_nd_kernel(x, index, out, flag):
        n = x.shape[5]
        k = cuda.grid(1)
        stride = cuda.gridsize(1)
        while k < out.size:
            m = k
            c5 = m % out.shape[5]
            m //= out.shape[5]
            c4 = m % out.shape[4]
            m //= out.shape[4]
            c3 = m % out.shape[3]
            m //= out.shape[3]
            c2 = m % out.shape[2]
            m //= out.shape[2]
            c1 = m % out.shape[1]
            c0 = m // out.shape[1]
            r = index[c0, c1, c2, c3, c4, c5]
            if 0 <= r < n:
                out[c0, c1, c2, c3, c4, c5] = x[c0, c1, c2, c3, c4, r]
            else:
                flag[0] = 1
                out[c0, c1, c2, c3, c4, c5] = np.nan
            k += stride

    return gather_nd_kernel


@kernel("scatter_add_nd", lambda dt: (_a6(dt), _I6, _a6(dt), dt))
def _scatter_add_nd_source(config: Config, dtype):
    def scatter_add_nd_kernel(g, index, dest, beta):
        k = cuda.grid(1)
        stride = cuda.gridsize(1)
        while k < dest.size:
            m = k
            c5 = m % dest.shape[5]
            m //= dest.shape[5]
            c4 = m % dest.shape[4]
            m //= dest.shape[4]
            c3 = m % dest.shape[3]
            m //= dest.shape[3]
            c2 = m % dest.shape[2]
            m //= dest.shape[2]
            c1 = m % dest.shape[1]
            c0 = m // dest.shape[1]
            acc = dtype(0.0) if beta == 0.0 else beta * dest[c0, c1, c2, c3, c4, c5]
            if c0 < g.shape[0] and c1 < g.shape[1] and c2 < g.shape[2] and c3 < g.shape[3] \
                    and c4 < g.shape[4]:
                for i in range(g.shape[5]):
                    if index[c0, c1, c2, c3, c4, i] == c5:
                        acc += g[c0, c1, c2, c3, c4, i]
            dest[c0, c1, c2, c3, c4, c5] = acc
            k += stride

    return scatter_add_nd_kernel


# ------------------------------------------------------------ launchers
def place_nd(x, out, start, step, fill, beta, whole) -> None:
    """See ``kernels.cpu.place_nd``; ranks up to 6."""
    rank = len(out.shape)
    if rank > RANK:
        raise ValueError(f"place_nd: the cuda kernels take at most {RANK} dims, got shape "
                         f"{tuple(out.shape)}")
    n = out.size if whole else x.size
    if n:
        pad = [0] * (RANK - rank)
        s = pad + [int(v) for v in start]
        t = [1] * (RANK - rank) + [int(v) for v in step]
        dt = out.dtype.type
        launch("place_nd", out.dtype, grid(n), THREADS, _as6(x), _as6(out), *s, *t, dt(fill),
               dt(beta), bool(whole))


def _check(source, op: str, axis: int, low: int, high: int, launched: bool) -> None:
    """Raise the IndexError of ``index_error`` when the device indices ``source``
    hold a value outside [low, high): after a launch, when the kernel raised
    the flag (one 4-byte read); with no launch (nothing to select), by
    reading ``source`` itself. The indices are copied only to name the bad one."""
    if launched and not index_flag_raised():
        return
    if source.size == 0:
        return
    host = to_host(source)
    flat = host.reshape(-1)
    bad = np.flatnonzero((flat < low) | (flat >= high))
    if bad.size:
        raise index_error(op, host, int(bad[0]), low, high, axis,
                          " (device indices, checked by the kernel)")


def index_select(x, index, out, source=None, op: str = "", axis: int = 0, low: int = 0
                 ) -> None:
    """See ``kernels.cpu.index_select``. With ``source`` (the device array
    ``index`` views, unchecked on the host), indices outside [low, n) raise
    IndexError naming ``op`` and ``axis``; without, the CPU kernel's rule
    (negative ones count from the end) and no read back."""
    n = x.shape[1]
    if out.size:
        launch("index_select", out.dtype, grid(out.size), THREADS, x, index, out,
               -n if source is None else int(low), index_flag())
    if source is not None:
        _check(source, op, axis, int(low), n, out.size > 0)


def index_add(g, index, dest, beta) -> None:
    """See ``kernels.cpu.index_add``."""
    if dest.size:
        launch("index_add", dest.dtype, grid(dest.size), THREADS, g, index, dest,
               dest.dtype.type(beta))


def gather(x, index, out, source=None, op: str = "", axis: int = 0) -> None:
    """See ``kernels.cpu.gather``; with ``source``, as ``index_select``'s
    (indices in [0, n))."""
    if out.size:
        launch("gather", out.dtype, grid(out.size), THREADS, x, index, out, index_flag())
    if source is not None:
        _check(source, op, axis, 0, x.shape[1], out.size > 0)


def scatter_add(g, index, dest, beta) -> None:
    """See ``kernels.cpu.scatter_add``."""
    if dest.size:
        launch("scatter_add", dest.dtype, grid(dest.size), THREADS, g, index, dest,
               dest.dtype.type(beta))


def _check_rank(name: str, array) -> None:
    if len(array.shape) > RANK:
        raise ValueError(f"{name}: the cuda kernels take at most {RANK} dims, got shape "
                         f"{tuple(array.shape)}")


def index_select_nd(x, index, out, source=None, op: str = "", axis: int = 0, low: int = 0
                    ) -> None:
    """See ``kernels.cpu.index_select_nd``; ranks up to 6; ``source`` as
    ``index_select``'s."""
    _check_rank("index_select_nd", out)
    n = x.shape[len(x.shape) - 1]
    if out.size:
        launch("index_select_nd", out.dtype, grid(out.size), THREADS, _as6(x), index, _as6(out),
               -n if source is None else int(low), index_flag())
    if source is not None:
        _check(source, op, axis, int(low), n, out.size > 0)


def index_add_nd(g, index, dest, start, step, axis, beta) -> None:
    """See ``kernels.cpu.index_add_nd``; ranks up to 6."""
    _check_rank("index_add_nd", dest)
    rank = len(dest.shape)
    if dest.size:
        pad = RANK - rank
        s = [0] * pad + [int(v) for v in start]
        t = [1] * pad + [int(v) for v in step]
        launch("index_add_nd", dest.dtype, grid(dest.size), THREADS, _as6(g), index, _as6(dest),
               *s, *t, int(axis) + pad, dest.dtype.type(beta))


def gather_nd(x, index, out, source=None, op: str = "", axis: int = 0) -> None:
    """See ``kernels.cpu.gather_nd``; ranks up to 6; ``source`` as ``gather``'s."""
    _check_rank("gather_nd", out)
    if out.size:
        launch("gather_nd", out.dtype, grid(out.size), THREADS, _as6(x), _as6(index), _as6(out),
               index_flag())
    if source is not None:
        _check(source, op, axis, 0, x.shape[len(x.shape) - 1], out.size > 0)


def scatter_add_nd(g, index, dest, beta) -> None:
    """See ``kernels.cpu.scatter_add_nd``; ranks up to 6."""
    _check_rank("scatter_add_nd", dest)
    if dest.size:
        launch("scatter_add_nd", dest.dtype, grid(dest.size), THREADS, _as6(g), _as6(index),
               _as6(dest), dest.dtype.type(beta))

"""CUDA kernels: ``@cuda.jit`` functions from numba-cuda behind host launchers.

The launchers here have the names and destination-passing signatures of
``kernels/cpu.py``. Each one issues exactly one kernel launch, counted by
``launch_count()``; every host<->device copy goes through ``from_host``,
``to_host`` or ``upload`` and is counted by ``transfer_count()``.

Launch shapes come from the environment, read once at import:
``NUMBAGRAD_CUDA_TILE`` (GEMM threads per block side, default 16),
``NUMBAGRAD_CUDA_WPT`` (GEMM outputs per thread per side, default 4),
``NUMBAGRAD_CUDA_THREADS`` (threads per block of the 1-D kernels, a power
of two, default 256) and ``NUMBAGRAD_CUDA_BLOCKS`` (grid cap of the 1-D
grid-stride kernels, default 1024). Tests shrink them under the simulator.
"""
from __future__ import annotations

import math
import os

import numpy as np
from numba import cuda, float32, float64, int32, int64, types, uint8

name = "cuda"


def _env_int(key: str, default: int) -> int:
    value = int(os.environ.get(key, default))
    if value < 1:
        raise ValueError(f"{key} must be a positive integer, got {value}")
    return value


TILE = _env_int("NUMBAGRAD_CUDA_TILE", 16)
WPT = _env_int("NUMBAGRAD_CUDA_WPT", 4)
THREADS = _env_int("NUMBAGRAD_CUDA_THREADS", 256)
MAX_BLOCKS = _env_int("NUMBAGRAD_CUDA_BLOCKS", 1024)
if THREADS & (THREADS - 1):
    raise ValueError(f"NUMBAGRAD_CUDA_THREADS must be a power of two, got {THREADS}")

_counts = {"launches": 0, "transfers": 0}


def launch_count() -> int:
    """Kernel launches issued by numbagrad so far."""
    return _counts["launches"]


def transfer_count() -> int:
    """Host<->device copies made by numbagrad so far."""
    return _counts["transfers"]


# --------------------------------------------------------------- memory
def empty(shape: tuple, dtype) -> object:
    """An uninitialised C-contiguous device array."""
    return cuda.device_array(shape, dtype)


def from_host(array: np.ndarray) -> object:
    """Host data as a new device array."""
    _counts["transfers"] += 1
    return cuda.to_device(np.ascontiguousarray(array))


def to_host(array) -> np.ndarray:
    """A host copy of a device array."""
    _counts["transfers"] += 1
    return array.copy_to_host()


def upload(host: np.ndarray, out) -> None:
    """Copy host data into an existing device array of the same shape."""
    _counts["transfers"] += 1
    out.copy_to_device(np.ascontiguousarray(host, dtype=out.dtype).reshape(out.shape))


def is_device_array(obj) -> bool:
    return cuda.devicearray.is_cuda_ndarray(obj)


def synchronize() -> None:
    cuda.synchronize()


# --------------------------------------------------- kernel definitions
# Each factory returns a plain Python function for one configuration and
# dtype; ``_compiled`` jits it on first use. ``kernel_sources`` lists them
# with explicit signatures so tests can compile every one to PTX.
def _gemm_source(tile: int, wpt: int, dtype):
    bm = tile * wpt

    def gemm_kernel(a, b, out, trans_a, trans_b, alpha, beta):
        sa = cuda.shared.array((bm, tile), dtype)    # sa[row, k]
        sb = cuda.shared.array((tile, bm), dtype)    # sb[k, col]
        acc = cuda.local.array((wpt, wpt), dtype)
        ra = cuda.local.array(wpt, dtype)
        rb = cuda.local.array(wpt, dtype)
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        row0 = cuda.blockIdx.y * bm
        col0 = cuda.blockIdx.x * bm
        m, n = out.shape
        kdim = a.shape[0] if trans_a else a.shape[1]
        for i in range(wpt):
            for j in range(wpt):
                acc[i, j] = 0.0
        for k0 in range(0, kdim, tile):
            # Loads walk the contiguous axis of each operand with threadIdx.x.
            for i in range(wpt):
                if trans_a:      # a is (k, m)
                    r = row0 + tx + i * tile
                    kk = k0 + ty
                    sa[tx + i * tile, ty] = a[kk, r] if r < m and kk < kdim else 0.0
                else:            # a is (m, k)
                    r = row0 + ty + i * tile
                    kk = k0 + tx
                    sa[ty + i * tile, tx] = a[r, kk] if r < m and kk < kdim else 0.0
            for j in range(wpt):
                if trans_b:      # b is (n, k)
                    c = col0 + ty + j * tile
                    kk = k0 + tx
                    sb[tx, ty + j * tile] = b[c, kk] if c < n and kk < kdim else 0.0
                else:            # b is (k, n)
                    c = col0 + tx + j * tile
                    kk = k0 + ty
                    sb[ty, tx + j * tile] = b[kk, c] if c < n and kk < kdim else 0.0
            cuda.syncthreads()
            for kk in range(tile):
                for i in range(wpt):
                    ra[i] = sa[ty + i * tile, kk]
                for j in range(wpt):
                    rb[j] = sb[kk, tx + j * tile]
                for i in range(wpt):
                    for j in range(wpt):
                        acc[i, j] += ra[i] * rb[j]
            cuda.syncthreads()
        for i in range(wpt):
            r = row0 + ty + i * tile
            for j in range(wpt):
                c = col0 + tx + j * tile
                if r < m and c < n:
                    if beta == 0.0:
                        out[r, c] = alpha * acc[i, j]
                    else:
                        out[r, c] = alpha * acc[i, j] + beta * out[r, c]

    return gemm_kernel


def _mse_source(threads: int, dtype):
    def mse_kernel(pred, target, loss_out, resid, scale, partial, counter):
        # Grid-stride pass writing the residual, a shared-memory tree per
        # block, then the last block to finish adds the block partials: one
        # launch, no pre-zeroed output, deterministic for a fixed grid.
        cache = cuda.shared.array(threads, float64)
        tid = cuda.threadIdx.x
        c = 2.0 * scale
        total = 0.0
        i = cuda.grid(1)
        stride = cuda.gridsize(1)
        while i < pred.size:
            d = pred[i] - target[i]
            resid[i] = c * d
            total += d * d
            i += stride
        cache[tid] = total
        cuda.syncthreads()
        half = threads // 2
        while half > 0:
            if tid < half:
                cache[tid] += cache[tid + half]
            cuda.syncthreads()
            half //= 2
        if tid == 0:
            partial[cuda.blockIdx.x] = cache[0]
            cuda.threadfence()
            ticket = cuda.atomic.add(counter, 0, 1)
            if ticket == cuda.gridDim.x - 1:
                grand = 0.0
                for blk in range(cuda.gridDim.x):
                    grand += cuda.atomic.add(partial, blk, 0.0)   # a coherent read
                loss_out[()] = grand * scale
                counter[0] = 0

    return mse_kernel


def _fill_source(dtype):
    def fill_kernel(out, value):
        i = cuda.grid(1)
        stride = cuda.gridsize(1)
        while i < out.size:
            out[i] = value
            i += stride

    return fill_kernel


def _axpby_source(dtype):
    def axpby_kernel(alpha, x, beta, y):
        i = cuda.grid(1)
        stride = cuda.gridsize(1)
        while i < y.size:
            if beta == 0.0:
                y[i] = alpha * x[i]
            else:
                y[i] = alpha * x[i] + beta * y[i]
            i += stride

    return axpby_kernel


# The optimizer kernels walk the params (segments) in order, each with its
# own grid-stride loop, so per-param constants are computed once per thread
# and no element needs to search for its segment.
def _sgd_source(dtype):
    def sgd_kernel(w, g, v, seg, live, lr, momentum, scale):
        start = cuda.grid(1)
        stride = cuda.gridsize(1)
        for s in range(seg.size - 1):
            if not live[s]:
                continue
            i = seg[s] + start
            while i < seg[s + 1]:
                gi = scale * g[i]
                if momentum != 0.0:
                    v[i] = momentum * v[i] + gi
                    w[i] = w[i] - lr * v[i]
                else:
                    w[i] = w[i] - lr * gi
                g[i] = 0.0
                i += stride

    return sgd_kernel


def _adam_source(dtype):
    def adam_kernel(w, g, m, v, seg, live, steps_in, steps_out,
                    lr, beta1, beta2, eps, scale):
        start = cuda.grid(1)
        stride = cuda.gridsize(1)
        for s in range(seg.size - 1):
            t = steps_in[s] + (1 if live[s] else 0)
            if start == 0:
                steps_out[s] = t
            if not live[s]:
                continue
            step_size = lr / (1.0 - beta1 ** t)
            bc2_sqrt = math.sqrt(1.0 - beta2 ** t)
            i = seg[s] + start
            while i < seg[s + 1]:
                gi = scale * g[i]
                m[i] = m[i] + (1.0 - beta1) * (gi - m[i])
                v[i] = v[i] * beta2 + (1.0 - beta2) * gi * gi
                w[i] = w[i] - step_size * (m[i] / (math.sqrt(v[i]) / bc2_sqrt + eps))
                g[i] = 0.0
                i += stride

    return adam_kernel


def kernel_sources(tile: int = TILE, wpt: int = WPT, threads: int = THREADS):
    """(name, python function, signature) for every kernel and dtype."""
    out = []
    for dt in (float32, float64):
        a1, a2 = types.Array(dt, 1, "C"), types.Array(dt, 2, "C")
        a0 = types.Array(dt, 0, "C")
        seg, live = types.Array(int64, 1, "C"), types.Array(uint8, 1, "C")
        f, b = float64, types.boolean
        out += [
            ("gemm", _gemm_source(tile, wpt, dt), (a2, a2, a2, b, b, f, f)),
            ("mse", _mse_source(threads, dt),
             (a1, a1, a0, a1, f, types.Array(float64, 1, "C"), types.Array(int32, 1, "C"))),
            ("fill", _fill_source(dt), (a1, f)),
            ("axpby", _axpby_source(dt), (f, a1, f, a1)),
            ("sgd_update", _sgd_source(dt), (a1, a1, a1, seg, live, f, f, f)),
            ("adam_update", _adam_source(dt),
             (a1, a1, a1, a1, seg, live, seg, seg, f, f, f, f, f)),
        ]
    return out


_SOURCES = {
    "gemm": lambda dt: _gemm_source(TILE, WPT, dt),
    "mse": lambda dt: _mse_source(THREADS, dt),
    "fill": _fill_source,
    "axpby": _axpby_source,
    "sgd_update": _sgd_source,
    "adam_update": _adam_source,
}
_NUMBA_TYPES = {np.dtype(np.float32): float32, np.dtype(np.float64): float64}
_jitted: dict[tuple, object] = {}


def _compiled(kernel: str, dtype) -> object:
    key = (kernel, dtype)
    fn = _jitted.get(key)
    if fn is None:
        fn = _jitted[key] = cuda.jit(_SOURCES[kernel](_NUMBA_TYPES[np.dtype(dtype)]))
    return fn


def _grid(n: int) -> int:
    return max(1, min(MAX_BLOCKS, -(-n // THREADS)))


def _flat(array):
    return array if len(array.shape) == 1 else array.ravel()


# ------------------------------------------------------------ launchers
def gemm(a, b, out, trans_a, trans_b, alpha, beta) -> None:
    """out = alpha * op(a) @ op(b) + beta * out (tiled, shared memory)."""
    m, n = out.shape
    if m == 0 or n == 0:
        return
    block = TILE * WPT
    _counts["launches"] += 1
    _compiled("gemm", out.dtype)[(-(-n // block), -(-m // block)), (TILE, TILE)](
        a, b, out, bool(trans_a), bool(trans_b), float(alpha), float(beta))


_mse_scratch: list = []   # [block partials, finished-blocks counter], made once


def mse(pred, target, loss_out, resid_out, scale) -> None:
    """loss_out[()] = scale * sum((pred - target)**2); resid = 2*scale*(pred - target)."""
    if not _mse_scratch:
        _mse_scratch[:] = [cuda.device_array(MAX_BLOCKS, np.float64),
                           from_host(np.zeros(1, np.int32))]
    _counts["launches"] += 1
    _compiled("mse", pred.dtype)[_grid(pred.size), THREADS](
        _flat(pred), _flat(target), loss_out, _flat(resid_out), float(scale), *_mse_scratch)


def fill(out, value) -> None:
    """out[...] = value."""
    if out.size:
        _counts["launches"] += 1
        _compiled("fill", out.dtype)[_grid(out.size), THREADS](_flat(out), float(value))


def axpby(alpha, x, beta, y) -> None:
    """y = alpha * x + beta * y; with beta == 0 ``y`` is never read."""
    if y.size:
        _counts["launches"] += 1
        _compiled("axpby", y.dtype)[_grid(y.size), THREADS](
            float(alpha), _flat(x), float(beta), _flat(y))


def sgd_update(w, g, v, seg, live, lr, momentum, scale) -> None:
    """Fused SGD over flat buffers; see ``kernels.cpu.sgd_update``."""
    if w.size:
        _counts["launches"] += 1
        _compiled("sgd_update", w.dtype)[_grid(w.size), THREADS](
            w, g, v, seg, live, float(lr), float(momentum), float(scale))


def adam_update(w, g, m, v, seg, live, steps_in, steps_out,
                lr, beta1, beta2, eps, scale) -> None:
    """Fused Adam over flat buffers; see ``kernels.cpu.adam_update``."""
    _counts["launches"] += 1
    _compiled("adam_update", w.dtype)[_grid(w.size), THREADS](
        w, g, m, v, seg, live, steps_in, steps_out,
        float(lr), float(beta1), float(beta2), float(eps), float(scale))

"""CUDA loss kernels: each computes the loss and its input gradient in one launch."""
from __future__ import annotations

import numpy as np
from numba import cuda, float64, int32

from ._core import MAX_BLOCKS, THREADS, Config, array_type, flat, from_host, grid, kernel, launch


@kernel("mse", lambda dt: (array_type(dt, 1), array_type(dt, 1), array_type(dt, 0),
                           array_type(dt, 1), float64, array_type(float64, 1),
                           array_type(int32, 1)))
def _mse_source(config: Config, dtype):
    threads = config.threads
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



# ------------------------------------------------------------ launchers
_mse_scratch: list = []   # [block partials, finished-blocks counter], made once


def mse(pred, target, loss_out, resid_out, scale) -> None:
    """loss_out[()] = scale * sum((pred - target)**2); resid = 2*scale*(pred - target)."""
    if not _mse_scratch:
        _mse_scratch[:] = [cuda.device_array(MAX_BLOCKS, np.float64),
                           from_host(np.zeros(1, np.int32))]
    launch("mse", pred.dtype, grid(pred.size), THREADS,
           flat(pred), flat(target), loss_out, flat(resid_out), float(scale), *_mse_scratch)

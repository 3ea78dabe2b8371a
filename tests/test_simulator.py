"""The suite's own fixes to Numba's CUDA simulator (tests/conftest.py):
its blocks no longer wait on a polling loop that holds the GIL, and every
thread of a block gets the same ``cuda.shared.array``."""
import sys

import numpy as np
import pytest
from numba import cuda

from conftest import SIMULATED

pytestmark = pytest.mark.skipif(not SIMULATED, reason="checks the CUDA simulator")


@cuda.jit
def _block_sums(out):
    # each thread writes its index into the block's shared array; after the
    # barrier thread 0 adds them up
    cache = cuda.shared.array(16, np.float64)
    tid = cuda.threadIdx.x
    cache[tid] = tid + 1.0
    cuda.syncthreads()
    if tid == 0:
        total = 0.0
        for i in range(cuda.blockDim.x):
            total += cache[i]
        out[cuda.blockIdx.x] = total


def test_the_suite_runs_the_quicker_block_loop():
    # Fails where numba-cuda's simulator changed: the suite then runs several
    # times slower under it, and conftest's copy of its loop needs a look.
    from numba.cuda.simulator import kernel, kernelapi
    assert kernel.BlockManager.run.__module__ == "conftest", \
        "the simulator's internals differ from what tests/conftest.py patches"
    assert kernelapi.FakeCUDAShared.array.__module__ == "conftest"


def test_every_thread_of_a_block_shares_one_array_when_threads_switch_often():
    # The simulator's own allocation let two threads each make an array when
    # a switch fell between its lookup and its store; a 1 us switch interval
    # makes that likely within a few launches.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _ in range(20):
            out = np.zeros(3)
            _block_sums[3, 16](out)
            np.testing.assert_array_equal(out, [136.0] * 3)
    finally:
        sys.setswitchinterval(interval)


def test_an_exception_in_one_thread_reaches_the_caller():
    @cuda.jit
    def fails(out):
        if cuda.threadIdx.x == 3:
            raise ValueError("thread 3 fails")
        cuda.syncthreads()
        out[cuda.threadIdx.x] = 1.0

    with pytest.raises(ValueError, match="thread 3 fails"):
        fails[1, 8](np.zeros(8))
